"""hypot: the magnitude of two inputs of one shape, channel by channel (a spectrum's real and
imaginary parts: GTCRN's `sqrt(re**2 + im**2 + 1e-12)`, which the `fuse_hypot` pass makes one node):

    y = sqrt(x0^2 + x1^2 + epsilon)

Its integers never round the squares: with A = (q_0 - zp_0) << (E - exp2_inv_0), B likewise,
E = max exp2_inv_i, the sum S = A^2 + B^2 + round(epsilon 4^E) is exact (the value times 4^E),
and with k = exp2_inv_y - E, N = S << 2 max(k, 0), D = 4^max(-k, 0):

    r   = isqrt(floor(N / D))                      floor(sqrt(N / D)), exact
    q_y = clamp(r + [N - D (r^2 + r) >= max(D / 4, 1)] + zp_y)    sqrt(N / D) rounded, exact

(the square, add and sqrt table it replaces round the power onto a grid, which squares the
range: a 16-bit power holds a magnitude to 48 dB; this holds it as well as its inputs). Every
bound is proved in `quantize`: N < 2^62.
"""

from __future__ import annotations

import numpy as np

from qtool.core.graph import Node
from qtool.core.node_args import attr_float, fail, only, same_steps, want_inputs
from qtool.core.qmodel import TensorQ
from qtool.layers.c import CNode, ctype, lit
from qtool.layers.integer import LayerBits
from qtool.layers.norm.layernorm import isqrt
from qtool.numerics.qparams import qrange

OP = "hypot"
MAX_N = 1 << 62


def out_shape(node: Node, shapes: list[tuple]) -> list[tuple]:
    only(node, ("epsilon",))
    want_inputs(node, shapes, count=2)
    attr_float(node, "epsilon", 0.0)
    if shapes[0] != shapes[1]:
        raise fail(node, f"inputs of different shapes: {shapes[0]}, {shapes[1]}")
    return [shapes[0]]


def forward(node: Node, xs: list[np.ndarray]) -> list[np.ndarray]:
    same_steps(node, xs)
    eps = attr_float(node, "epsilon", 0.0)
    return [np.sqrt(np.square(xs[0]) + np.square(xs[1]) + eps).astype(xs[0].dtype)]


def quantize(node: Node, g_in: list[TensorQ], g_out: list[TensorQ], bits: LayerBits) -> dict:
    e = [int(g.exp2_inv) for g in g_in]
    E = max(e)
    align = [E - k for k in e]
    Q = round(attr_float(node, "epsilon", 0.0) * 4.0 ** E)
    k = int(g_out[0].exp2_inv) - E
    mags = [(max(abs(q - g.zp) for q in qrange(g.bits))) << a for g, a in zip(g_in, align)]
    n_max = (mags[0] ** 2 + mags[1] ** 2 + Q) << 2 * max(k, 0)
    if n_max >= MAX_N or Q < 0:
        raise fail(node, f"its inputs' and output's grids (exponents {e[0]}, {e[1]} and {E + k}) need sums "
                         f"of {n_max.bit_length()} bits; at most 62")
    return {"align": align, "Q": Q, "up": 2 * max(k, 0), "down": 2 * max(-k, 0)}


def _root(S: np.ndarray, qp: dict) -> np.ndarray:
    N = S << qp["up"]
    D = 1 << qp["down"]
    r = isqrt(N >> qp["down"])
    return r + ((N - D * (r * r + r)) >= max(D >> 2, 1))


def forward_int(node: Node, qp: dict, qs: list[np.ndarray], g_in: list[TensorQ], g_out: list[TensorQ]
                ) -> list[np.ndarray]:
    same_steps(node, qs)
    A, B = ((np.asarray(q, np.int64) - g.zp) << a for q, g, a in zip(qs, g_in, qp["align"]))
    lo, hi = qrange(g_out[0].bits)
    return [np.clip(_root(A * A + B * B + qp["Q"], qp) + g_out[0].zp, lo, hi)]


def c_code(node: Node, qp: dict, g_in: list[TensorQ], g_out: list[TensorQ], f: str, widths: list[int]) -> CNode:
    """The sum of squares in int64, its root by qlayers_isqrt64, rounded by the remainder."""
    y_t, (lo, hi) = ctype(g_out[0]), qrange(g_out[0].bits)
    D = 1 << qp["down"]
    terms = [f"((int64_t)x{i}[c] - {lit(g.zp)}) * INT64_C({1 << a})" for i, (g, a) in enumerate(zip(g_in, qp["align"]))]
    code = f"""/* {node.label}: hypot */
static void {f}(const {ctype(g_in[0])} *x0, const {ctype(g_in[1])} *x1, {y_t} *y)
{{
    int32_t c;
    for (c = 0; c < {widths[0]}; c++) {{
        const int64_t a = {terms[0]}, b = {terms[1]};
        const int64_t n = (a * a + b * b + INT64_C({qp["Q"]})) * INT64_C({1 << qp["up"]});
        int64_t r = qlayers_isqrt64(n / INT64_C({D}));
        r += (n - INT64_C({D}) * (r * r + r)) >= {max(D >> 2, 1)};
        r += {lit(g_out[0].zp)};
        y[c] = ({y_t})(r < {lo} ? {lo} : r > {hi} ? {hi} : r);
    }}
}}
"""
    return CNode("frame", code, macs=2 * widths[0])
