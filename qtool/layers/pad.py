"""zero_pad1d: `pad` (before, after) steps of zeros around a sequence (Keras' ZeroPadding1D,
ONNX's Pad on the time axis)."""

from __future__ import annotations

import numpy as np

from qtool.core.graph import Node
from qtool.layers import MAX_STEPS, attr_steps, fail, only, want_inputs

OP = "zero_pad1d"


def _pad(node: Node) -> tuple[int, int]:
    pair = attr_steps(node, "pad")
    if pair is None:
        raise fail(node, f"attribute 'pad' must be (before, after) steps in 0..{MAX_STEPS}, "
                         f"got {node.attrs.get('pad')!r:.40}")
    return pair


def out_shape(node: Node, shapes: list[tuple]) -> list[tuple]:
    only(node, ("pad",))
    want_inputs(node, shapes, seq=True)
    _pad(node)
    return [shapes[0]]


def forward(node: Node, xs: list[np.ndarray]) -> list[np.ndarray]:
    return [np.pad(xs[0], ((0, 0), _pad(node), (0, 0)))]
