"""last_step: `x[:, -1]`, a sequence's last step as a vector (PyTorch's `output[:, -1]`, ONNX's
Gather/Slice of the last step)."""

from __future__ import annotations

import numpy as np

from qtool.core.graph import Node
from qtool.layers import fail, only, want_inputs

OP = "last_step"


def out_shape(node: Node, shapes: list[tuple]) -> list[tuple]:
    only(node)
    want_inputs(node, shapes, seq=True)
    return [(shapes[0][-1],)]


def forward(node: Node, xs: list[np.ndarray]) -> list[np.ndarray]:
    if xs[0].shape[1] == 0:
        raise fail(node, "an empty sequence has no last step")
    return [xs[0][:, -1]]
