"""add, mul: the elementwise sum or product of two or more inputs of one shape (Keras' Add and
Multiply, ONNX's Add and Mul between two computed edges). No broadcasting: a sequence and a
vector do not mix.

Integers, aligned on the finest input exponent E = max exp2_inv_i (shifts left, exact):
    add: q_y = clamp(rshift_round(sum_i (q_i - zp_i) << (E - exp2_inv_i), E - exp2_inv_y) + zp_y)
    mul: q_y = clamp(rshift_round(prod_i (q_i - zp_i), sum_i exp2_inv_i - exp2_inv_y) + zp_y)
The product of inputs of b_i bits needs sum_i b_i bits; beyond 62 it is refused.
"""

from __future__ import annotations

import numpy as np

from qtool.core.graph import Node
from qtool.core.node_args import fail, only, same_steps, want_inputs
from qtool.core.qmodel import TensorQ
from qtool.layers.c import CNode, ctype, lit, max_abs, rescale_bits, rescale_expr
from qtool.layers.integer import LayerBits, rescale

OPS = ("add", "mul")


def out_shape(node: Node, shapes: list[tuple]) -> list[tuple]:
    only(node)
    want_inputs(node, shapes, count=None)
    if any(s != shapes[0] for s in shapes):
        raise fail(node, f"inputs of different shapes: {', '.join(map(str, shapes))}")
    return [shapes[0]]


def forward(node: Node, xs: list[np.ndarray]) -> list[np.ndarray]:
    same_steps(node, xs)
    y = xs[0]
    for x in xs[1:]:  # left to right, as the frameworks fold them
        y = y + x if node.op == "add" else y * x
    return [y]


def quantize(node: Node, g_in: list[TensorQ], g_out: list[TensorQ], bits: LayerBits) -> dict:
    e = [int(g.exp2_inv) for g in g_in]
    if node.op == "mul":
        if sum(g.bits for g in g_in) > 62:
            raise fail(node, f"the product of {len(g_in)} inputs of {', '.join(str(g.bits) for g in g_in)} bits "
                             "does not fit 62 bits; multiply two at a time")
        return {"sh": sum(e) - int(g_out[0].exp2_inv)}
    if max(e) - min(e) > 30:
        raise fail(node, f"the inputs' scales differ by 2^{max(e) - min(e)}; their sum would not fit")
    return {"align": [max(e) - k for k in e], "sh": max(e) - int(g_out[0].exp2_inv)}


def forward_int(node: Node, qp: dict, qs: list[np.ndarray], g_in: list[TensorQ], g_out: list[TensorQ]
                ) -> list[np.ndarray]:
    same_steps(node, qs)
    terms = [np.asarray(q, np.int64) - g.zp for q, g in zip(qs, g_in)]
    if node.op == "mul":
        acc = terms[0]
        for t in terms[1:]:
            acc = acc * t
    else:
        acc = sum(np.left_shift(t, a) for t, a in zip(terms, qp["align"]))
    return [rescale(acc, qp["sh"], g_out[0])]


def c_code(node: Node, qp: dict, g_in: list[TensorQ], g_out: list[TensorQ], f: str, widths: list[int]) -> CNode:
    """add: the inputs aligned by left shifts and summed; mul: their product; then the rescale."""
    terms = [f"((int64_t)x{i}[c] - {lit(g.zp)})" for i, g in enumerate(g_in)]
    mags = [max_abs(g) + abs(g.zp) for g in g_in]
    if node.op == "mul":
        bound = 1
        for m in mags:
            bound *= m
        v = " * ".join(terms)
    else:
        bound = sum(m << a for m, a in zip(mags, qp["align"]))
        v = " + ".join(f"{t} * {1 << a}" if a else t for t, a in zip(terms, qp["align"]))
    bits = rescale_bits(bound, np.array([qp["sh"]]))
    if bits == 32:
        v = f"(int32_t)({v})"
    y_t = ctype(g_out[0])
    args = ", ".join(f"const {ctype(g)} *x{i}" for i, g in enumerate(g_in))
    code = f"""/* {node.label}: {node.op} */
static void {f}({args}, {y_t} *y)
{{
    int32_t c;
    for (c = 0; c < {widths[0]}; c++) {{
        y[c] = ({y_t}){rescale_expr(v, qp["sh"], None, f, g_out[0], bits)};
    }}
}}
"""
    return CNode("frame", code)
