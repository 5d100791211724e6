"""concat: inputs joined on the channel axis, in order (all sequences or all vectors)."""

from __future__ import annotations

import numpy as np

from qtool.core.graph import Node
from qtool.layers import fail, is_seq, only, want_inputs, with_channels

OP = "concat"


def out_shape(node: Node, shapes: list[tuple]) -> list[tuple]:
    only(node)
    want_inputs(node, shapes, count=None)
    if len({is_seq(s) for s in shapes}) > 1:
        raise fail(node, f"joins sequences and vectors: {', '.join(map(str, shapes))}")
    return [with_channels(shapes[0], sum(s[-1] for s in shapes))]


def forward(node: Node, xs: list[np.ndarray]) -> list[np.ndarray]:
    return [np.concatenate(xs, axis=-1)]
