"""batchnorm (inference): `(x - mean) / sqrt(var + epsilon) * gamma + beta` per channel.
`epsilon` has no default: Keras' is 1e-3, PyTorch's 1e-5, so the importer states it.

In integers (where no dense or conv before it takes it, qtool.graph.passes.fold_batchnorm): a
per-channel affine, `a = gamma / sqrt(var + epsilon)` as per channel weights q_a, `beta - mean * a`
as q_b on the accumulator's grid, `q_y = clamp(rshift_round((q_x - zp_x) * q_a + q_b, sh_acc) + zp_y)`."""

from __future__ import annotations

import numpy as np

from qtool.core.edges import channels
from qtool.core.graph import Node
from qtool.core.node_args import attr_float, f32, fail, only, param, want_inputs
from qtool.core.qmodel import TensorQ
from qtool.layers.c import CNode, ctype, lit, max_abs, rescale_bits, rescale_expr, shift_table, table_type
from qtool.layers.integer import LayerBits, dequantized_weights, gemm_params, rescale

OP = "batchnorm"
PARAMS = ("gamma", "beta", "mean", "var")


def out_shape(node: Node, shapes: list[tuple]) -> list[tuple]:
    only(node, ("epsilon",), params=PARAMS)
    want_inputs(node, shapes)
    attr_float(node, "epsilon", positive=True)
    for name in PARAMS:
        param(node, name, (channels(shapes[0]),))
    if np.any(node.params["var"] < 0):
        raise fail(node, "param 'var' has negative entries")
    return [shapes[0]]


def forward(node: Node, xs: list[np.ndarray]) -> list[np.ndarray]:
    gamma, beta, mean, var = (f32(node.params[k]) for k in PARAMS)
    eps = np.float32(attr_float(node, "epsilon", positive=True))
    return [(xs[0] - mean) / np.sqrt(var + eps) * gamma + beta]


def scale_input(node: Node, shifts: np.ndarray) -> None:
    """The same layer on its input's channels times 2^shifts: mean times, gamma divided by them
    (exact: (x s - m s) / q * g / s is (x - m) / q * g to the bit)."""
    for k, sign in (("mean", 1), ("gamma", -1)):
        node.params[k] = np.ldexp(f32(node.params[k]), sign * shifts).astype(np.float32)


def affine(node: Node) -> tuple[np.ndarray, np.ndarray]:
    """(a, c) with batchnorm(x) = x * a + c per channel."""
    gamma, beta, mean, var = (np.asarray(node.params[k], np.float64) for k in PARAMS)
    a = gamma / np.sqrt(var + attr_float(node, "epsilon", positive=True))
    return a, beta - mean * a


def quantize(node: Node, g_in: list[TensorQ], g_out: list[TensorQ], bits: LayerBits) -> dict:
    a, c = affine(node)
    return gemm_params(a[:, None], c, g_in[0], g_out[0], bits)


def forward_fq(node: Node, qp: dict, g_in: list[TensorQ], g_out: list[TensorQ], xs: list[np.ndarray]
               ) -> list[np.ndarray]:
    """The fake-quant layer: the integer per-channel affine x * a + c, dequantized."""
    fq = dequantized_weights(node, qp, g_in[0])
    return [xs[0] * fq.params["W"][:, 0] + fq.params["b"]]


def forward_int(node: Node, qp: dict, qs: list[np.ndarray], g_in: list[TensorQ], g_out: list[TensorQ]
                ) -> list[np.ndarray]:
    acc = (np.asarray(qs[0], np.int64) - g_in[0].zp) * qp["q_W"][:, 0] + qp["q_b"]
    return [rescale(acc, qp["sh_acc"], g_out[0])]


def c_code(node: Node, qp: dict, g_in: list[TensorQ], g_out: list[TensorQ], f: str, widths: list[int]) -> CNode:
    """y[c] = rescale((x[c] - zp_x) * q_a[c] + q_b[c], sh_acc[c])."""
    a, b, sh, gx, gy = qp["q_W"][:, 0], qp["q_b"], qp["sh_acc"], g_in[0], g_out[0]
    bound = int(np.abs(a).max(initial=0)) * (max_abs(gx) + abs(gx.zp)) + int(np.abs(b).max(initial=0))
    bits = rescale_bits(bound, sh)
    y = rescale_expr(f"(int{bits}_t)(x0[c] - {lit(gx.zp)}) * {f}_a[c] + {f}_b[c]", 0, sh, f, gy, bits)
    code = f"""/* {node.label}: per-channel affine */
static void {f}(const {ctype(gx)} *x0, {ctype(gy)} *y)
{{
    int32_t c;
    for (c = 0; c < {len(a)}; c++) {{
        y[c] = ({ctype(gy)}){y};
    }}
}}
"""
    return CNode("frame", code, [(table_type(a), f"{f}_a", a), (table_type(b), f"{f}_b", b), *shift_table(f, sh)],
                 macs=len(a))
