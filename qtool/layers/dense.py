"""dense: `y = x @ W.T + b` on the channel axis, for sequences (every step) and vectors alike
(Keras' Dense with its kernel transposed, PyTorch's Linear, ONNX's Gemm/MatMul+Add).

Integers: per output channel int weights `q_W`, the bias on the accumulator's grid, and

    acc[c] = sum_k q_W[c, k] * q_x[k] - W_sum_mul_x_zp[c] + q_b[c]
    q_y[c] = clamp(rshift_round(acc[c], exp2_inv_x + exp2_inv_W[c] - exp2_inv_y) + zp_y)

|acc| <= C_in * 2^(bits_x + bits_W - 2) + |q_b| < 2^62 for every width qtool accepts.
"""

from __future__ import annotations

import numpy as np

from qtool.core.edges import channels, with_channels
from qtool.core.graph import Node
from qtool.core.node_args import f32, fail, only, param, want_inputs
from qtool.core.qmodel import TensorQ
from qtool.layers.c import CNode, gemm_c
from qtool.layers.integer import (
    LayerBits,
    abs_max,
    dequantized_weights,
    fold_output_affine,
    gemm_dtype,
    gemm_params,
    gemm_rescale,
)

OP = "dense"


def out_shape(node: Node, shapes: list[tuple]) -> list[tuple]:
    only(node, params=("W",), optional=("b",))
    want_inputs(node, shapes)
    W = param(node, "W", (None, None))
    if W.shape[1] != channels(shapes[0]):
        raise fail(node, f"W is {list(W.shape)} ([C_out, C_in]) but the input has {channels(shapes[0])} channels")
    param(node, "b", (W.shape[0],), optional=True)
    return [with_channels(shapes[0], W.shape[0])]


def forward(node: Node, xs: list[np.ndarray]) -> list[np.ndarray]:
    y = xs[0] @ f32(node.params["W"]).T
    if "b" in node.params:
        y = y + f32(node.params["b"])
    return [y]


def scale_input(node: Node, shifts: np.ndarray) -> None:
    """The same layer on its input's channels times 2^shifts: W's columns divided by them (exact)."""
    node.params["W"] = np.ldexp(f32(node.params["W"]), -shifts[None, :]).astype(np.float32)


fold_affine = fold_output_affine  # a batchnorm after it folds into W and b


def quantize(node: Node, g_in: list[TensorQ], g_out: list[TensorQ], bits: LayerBits) -> dict:
    return gemm_params(node.params["W"], node.params.get("b"), g_in[0], g_out[0], bits)


def gemm_path(qp: dict, q_x: np.ndarray) -> tuple[type, int]:
    """forward_int's GEMM dtype and the bound on its partial sums, C_in * max|q_x| * max|q_W| (the
    raw q_x: its zero point is W_sum_mul_x_zp's)."""
    q_W = qp["q_W"]
    bound = q_W.shape[1] * abs_max(q_x) * abs_max(q_W)
    return gemm_dtype(bound), bound


def forward_fq(node: Node, qp: dict, g_in: list[TensorQ], g_out: list[TensorQ], xs: list[np.ndarray]
               ) -> list[np.ndarray]:
    """The fake-quant layer (simulate --mode fakequant): the float layer on its dequantized weights."""
    return forward(dequantized_weights(node, qp, g_in[0]), xs)


def forward_int(node: Node, qp: dict, qs: list[np.ndarray], g_in: list[TensorQ], g_out: list[TensorQ]
                ) -> list[np.ndarray]:
    """One GEMM in the cheapest exact dtype (gemm_path), a chunk of rows at a time, each rescaled
    in place."""
    q_W, x = qp["q_W"], np.asarray(qs[0])
    dt, bound = gemm_path(qp, x)
    out = np.empty((*x.shape[:-1], len(q_W)), np.int64)
    gemm_rescale(x.reshape(-1, x.shape[-1]), q_W.astype(dt), qp["q_b"] - qp["W_sum_mul_x_zp"], qp["sh_acc"],
                 g_out[0], out.reshape(-1, len(q_W)), bound)
    return [out]


def c_code(node: Node, qp: dict, g_in: list[TensorQ], g_out: list[TensorQ], f: str, widths: list[int]) -> CNode:
    return gemm_c(f, node.label, qp["q_W"], qp["q_b"] - qp["W_sum_mul_x_zp"], qp["sh_acc"], g_in[0], g_out[0])
