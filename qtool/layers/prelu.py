"""prelu: a learned slope per channel for the negative values (PyTorch's PReLU, ONNX's PRelu,
Keras' PReLU shared over time):

    y[c] = x[c]             where x[c] >= 0
    y[c] = alpha[c] * x[c]  otherwise

(one slope for every channel is the activation leaky_relu, an exact table). On a feature map the
slope of channel c is repeated at each of its frequencies (the importer writes one per edge channel).

Integers: the slope per channel symmetric on the weight bits (`q_alpha`, `exp2_inv_alpha[c]`), and
with v = q_x - zp_x,

    q_y[c] = clamp(rshift_round(v, exp2_inv_x - exp2_inv_y) + zp_y)                         v >= 0
    q_y[c] = clamp(rshift_round(v * q_alpha[c], exp2_inv_x + exp2_inv_alpha[c] - exp2_inv_y) + zp_y)  v < 0

|v * q_alpha| < 2^(bits_x + bits_W) fits int64 for every width qtool takes, int32 at 8 and 8 bits.
"""

from __future__ import annotations

import numpy as np

from qtool.core.edges import channels
from qtool.core.graph import Node
from qtool.core.node_args import f32, only, param, want_inputs
from qtool.core.qmodel import TensorQ
from qtool.layers.c import CNode, ctype, lit, max_abs, rescale_bits, rescale_expr, shift_table, table_type
from qtool.layers.integer import LayerBits, rescale, weights
from qtool.numerics.qparams import dequantize

OP = "prelu"


def out_shape(node: Node, shapes: list[tuple]) -> list[tuple]:
    only(node, params=("alpha",))
    want_inputs(node, shapes)
    param(node, "alpha", (channels(shapes[0]),))
    return [shapes[0]]


def forward(node: Node, xs: list[np.ndarray]) -> list[np.ndarray]:
    x = xs[0]
    return [np.where(x >= 0, x, x * f32(node.params["alpha"])).astype(np.float32)]


def quantize(node: Node, g_in: list[TensorQ], g_out: list[TensorQ], bits: LayerBits) -> dict:
    q_alpha, exp2_inv_alpha = weights(np.asarray(node.params["alpha"], np.float64)[:, None], bits.weight)
    e_x, e_y = int(g_in[0].exp2_inv), int(g_out[0].exp2_inv)
    return {"q_alpha": q_alpha[:, 0], "exp2_inv_alpha": exp2_inv_alpha, "sh_pos": e_x - e_y,
            "sh_neg": e_x + exp2_inv_alpha - e_y}


def forward_fq(node: Node, qp: dict, g_in: list[TensorQ], g_out: list[TensorQ], xs: list[np.ndarray]
               ) -> list[np.ndarray]:
    """The fake-quant layer: the float layer with its slopes on their grids."""
    alpha = dequantize(qp["q_alpha"], qp["exp2_inv_alpha"], 0)
    x = np.asarray(xs[0], np.float64)
    return [np.where(x >= 0, x, x * alpha)]


def forward_int(node: Node, qp: dict, qs: list[np.ndarray], g_in: list[TensorQ], g_out: list[TensorQ]
                ) -> list[np.ndarray]:
    v = np.asarray(qs[0], np.int64) - g_in[0].zp
    neg = rescale(v * qp["q_alpha"], qp["sh_neg"], g_out[0])
    return [np.where(v >= 0, rescale(v, qp["sh_pos"], g_out[0]), neg)]


def c_code(node: Node, qp: dict, g_in: list[TensorQ], g_out: list[TensorQ], f: str, widths: list[int]) -> CNode:
    a, gx, gy = qp["q_alpha"], g_in[0], g_out[0]
    v_max = max_abs(gx) + abs(gx.zp)
    pos_bits = rescale_bits(v_max, np.array([qp["sh_pos"]]))
    neg_bits = rescale_bits(v_max * int(np.abs(a).max(initial=1)), qp["sh_neg"])
    pos = rescale_expr(f"(int{pos_bits}_t)v", qp["sh_pos"], None, f, gy, pos_bits)
    neg = rescale_expr(f"(int{neg_bits}_t)v * {f}_a[c]", 0, qp["sh_neg"], f, gy, neg_bits)
    y_t = ctype(gy)
    code = f"""/* {node.label}: prelu */
static void {f}(const {ctype(gx)} *x0, {y_t} *y)
{{
    int32_t c;
    for (c = 0; c < {len(a)}; c++) {{
        const int32_t v = (int32_t)x0[c] - {lit(gx.zp)};
        y[c] = ({y_t})(v >= 0 ? {pos} : {neg});
    }}
}}
"""
    return CNode("frame", code, [(table_type(a), f"{f}_a", a), *shift_table(f, qp["sh_neg"])], macs=len(a))
