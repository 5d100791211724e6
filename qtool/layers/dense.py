"""dense: `y = x @ W.T + b` on the channel axis, for sequences (every step) and vectors alike
(Keras' Dense with its kernel transposed, PyTorch's Linear, ONNX's Gemm/MatMul+Add)."""

from __future__ import annotations

import numpy as np

from qtool.core.graph import Node
from qtool.layers import f32, fail, only, param, want_inputs, with_channels

OP = "dense"


def out_shape(node: Node, shapes: list[tuple]) -> list[tuple]:
    only(node, params=("W",), optional=("b",))
    want_inputs(node, shapes)
    W = param(node, "W", (None, None))
    if W.shape[1] != shapes[0][-1]:
        raise fail(node, f"W is {list(W.shape)} ([C_out, C_in]) but the input has {shapes[0][-1]} channels")
    param(node, "b", (W.shape[0],), optional=True)
    return [with_channels(shapes[0], W.shape[0])]


def forward(node: Node, xs: list[np.ndarray]) -> list[np.ndarray]:
    y = xs[0] @ f32(node.params["W"]).T
    if "b" in node.params:
        y = y + f32(node.params["b"])
    return [y]
