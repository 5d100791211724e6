"""dense: `y = x @ W.T + b` on the channel axis, for sequences (every step) and vectors alike
(Keras' Dense with its kernel transposed, PyTorch's Linear, ONNX's Gemm/MatMul+Add).

Integers: per output channel int weights `q_W`, the bias on the accumulator's grid, and

    acc[c] = sum_k q_W[c, k] * q_x[k] - W_sum_mul_x_zp[c] + q_b[c]
    q_y[c] = clamp(rshift_round(acc[c], exp2_inv_x + exp2_inv_W[c] - exp2_inv_y) + zp_y)

|acc| <= C_in * 2^(bits_x + bits_W - 2) + |q_b| < 2^62 for every width qtool accepts.
"""

from __future__ import annotations

import numpy as np

from qtool.core.graph import Node
from qtool.core.qmodel import TensorQ
from qtool.layers import f32, fail, only, param, want_inputs, with_channels
from qtool.layers.c import CNode, gemm_c
from qtool.layers.integer import LayerBits, gemm_params, matmul, rescale

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


def quantize(node: Node, g_in: list[TensorQ], g_out: list[TensorQ], bits: LayerBits) -> dict:
    return gemm_params(node.params["W"], node.params.get("b"), g_in[0], g_out[0], bits)


def forward_int(node: Node, qp: dict, qs: list[np.ndarray], g_in: list[TensorQ], g_out: list[TensorQ]
                ) -> list[np.ndarray]:
    acc = matmul(qs[0], qp["q_W"]) - qp["W_sum_mul_x_zp"] + qp["q_b"]
    return [rescale(acc, qp["sh_acc"], g_out[0])]


def c_code(node: Node, qp: dict, g_in: list[TensorQ], g_out: list[TensorQ], f: str, widths: list[int]) -> CNode:
    return gemm_c(f, node.label, qp["q_W"], qp["q_b"] - qp["W_sum_mul_x_zp"], qp["sh_acc"], g_in[0], g_out[0])
