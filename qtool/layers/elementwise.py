"""add, sub, mul: the elementwise sum, difference (of two: x0 - x1) or product of two or more
inputs of one shape (Keras' Add, Subtract and Multiply, ONNX's Add, Sub and Mul between two
computed edges: GTCRN's complex mask, re = s_re m_re - s_im m_im). A sequence and a vector do not mix.
With `repeat` (size, stride), an input of W / size channels is repeated over groups of the
others' W, as reduce_mean's groups (the frame viewed as `[W / (size * stride), size, stride]`,
the narrow input as `[W / (size * stride), 1, stride]`): GTCRN's attention, a value per channel
and frame, multiplying every frequency of a map.

Integers, aligned on the finest input exponent E = max exp2_inv_i (shifts left, exact):
    add: q_y = clamp(rshift_round(sum_i (q_i - zp_i) << (E - exp2_inv_i), E - exp2_inv_y) + zp_y)
    sub: the same with the second term negated
    mul: q_y = clamp(rshift_round(prod_i (q_i - zp_i), sum_i exp2_inv_i - exp2_inv_y) + zp_y)
The product of inputs of b_i bits needs sum_i b_i bits; beyond 62 it is refused.
"""

from __future__ import annotations

import numpy as np

from qtool.core.edges import channels, is_sequence, with_channels
from qtool.core.graph import Node
from qtool.core.node_args import fail, only, same_steps, want_inputs
from qtool.core.qmodel import TensorQ
from qtool.layers.c import CNode, ctype, lit, max_abs, rescale_bits, rescale_expr
from qtool.layers.integer import LayerBits, rescale

OPS = ("add", "sub", "mul")


def _repeat(node: Node) -> tuple[int, int] | None:
    v = node.attrs.get("repeat")
    if v is None:
        return None
    if not (isinstance(v, (tuple, list)) and len(v) == 2 and all(isinstance(k, (int, np.integer)) and
                                                                   not isinstance(k, bool) and k >= 1 for k in v)):
        raise fail(node, f"attribute 'repeat' must be (size, stride), two positive integers, got {v!r:.40}")
    return int(v[0]), int(v[1])


def out_shape(node: Node, shapes: list[tuple]) -> list[tuple]:
    only(node, ("repeat",))
    want_inputs(node, shapes, count=2 if node.op == "sub" else None)
    rep, width = _repeat(node), max(channels(s) for s in shapes)
    narrow = width // rep[0] if rep and width % (rep[0] * rep[1]) == 0 else None
    if any(is_sequence(s) != is_sequence(shapes[0]) or channels(s) not in (width, narrow) for s in shapes):
        raise fail(node, f"inputs of different shapes: {', '.join(map(str, shapes))}"
                   + (f" (repeat {rep}: {width} or {narrow} channels)" if rep else ""))
    return [with_channels(shapes[0], width)]


def widen(node: Node, xs: list[np.ndarray]) -> list[np.ndarray]:
    """Each narrow input repeated over its groups, to the widest input's channels."""
    rep, width = _repeat(node), max(x.shape[-1] for x in xs)
    if rep is None:
        return xs
    size, stride = rep
    return [x if x.shape[-1] == width else np.broadcast_to(
        x.reshape(*x.shape[:-1], -1, 1, stride), (*x.shape[:-1], width // (size * stride), size, stride)
    ).reshape(*x.shape[:-1], width) for x in xs]


def forward(node: Node, xs: list[np.ndarray]) -> list[np.ndarray]:
    same_steps(node, xs)
    xs = widen(node, xs)
    y = xs[0]
    for x in xs[1:]:  # left to right, as the frameworks fold them
        y = y + x if node.op == "add" else y - x if node.op == "sub" else y * x
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
    terms = [np.asarray(q, np.int64) - g.zp for q, g in zip(widen(node, qs), g_in)]
    if node.op == "sub":
        terms[1] = -terms[1]
    if node.op == "mul":
        acc = terms[0]
        for t in terms[1:]:
            acc = acc * t
    else:
        acc = sum(np.left_shift(t, a) for t, a in zip(terms, qp["align"]))
    return [rescale(acc, qp["sh"], g_out[0])]


def c_code(node: Node, qp: dict, g_in: list[TensorQ], g_out: list[TensorQ], f: str, widths: list[int]) -> CNode:
    """add: the inputs aligned by left shifts and summed; mul: their product; then the rescale."""
    rep, width = _repeat(node), max(widths)
    at = [f"[(c / {rep[0] * rep[1]}) * {rep[1]} + c % {rep[1]}]" if rep and w != width else "[c]" for w in widths]
    terms = [f"((int64_t)x{i}{at[i]} - {lit(g.zp)})" for i, g in enumerate(g_in)]
    mags = [max_abs(g) + abs(g.zp) for g in g_in]
    if node.op == "mul":
        bound = 1
        for m in mags:
            bound *= m
        v = " * ".join(terms)
    else:
        bound = sum(m << a for m, a in zip(mags, qp["align"]))
        v = (" - " if node.op == "sub" else " + ").join(f"{t} * {1 << a}" if a else t
                                                      for t, a in zip(terms, qp["align"]))
    bits = rescale_bits(bound, np.array([qp["sh"]]))
    if bits == 32:
        v = f"(int32_t)({v})"
    y_t = ctype(g_out[0])
    args = ", ".join(f"const {ctype(g)} *x{i}" for i, g in enumerate(g_in))
    code = f"""/* {node.label}: {node.op} */
static void {f}({args}, {y_t} *y)
{{
    int32_t c;
    for (c = 0; c < {width}; c++) {{
        y[c] = ({y_t}){rescale_expr(v, qp["sh"], None, f, g_out[0], bits)};
    }}
}}
"""
    return CNode("frame", code)
