"""activation: one elementwise function, `kind`:

    relu          max(x, 0)
    relu6         min(max(x, 0), 6)
    leaky_relu    x if x >= 0 else alpha * x   (`alpha` required: Keras' default is 0.3, PyTorch's 0.01)
    sigmoid       1 / (1 + exp(-x))
    tanh          tanh(x)
    hard_sigmoid  clip(alpha * x + beta, 0, 1); alpha 1/6, beta 0.5 by default (Keras 3's
                  relu6(x + 3) / 6, PyTorch's Hardsigmoid); Keras 2's is alpha 0.2, beta 0.5
    softplus      log(1 + exp(x))
    gelu          x * Phi(x) (the exact erf form); `approximate` "tanh" (or true, Keras' flag):
                  0.5 * x * (1 + tanh(sqrt(2 / pi) * (x + 0.044715 x^3)))
    linear        x

Integers: the exact table of the function on the input's grid: for every input integer, the
float function of its value rounded onto the output's grid (2^bits_x entries). relu, relu6 and
linear on an input of more than 8 bits, where that table would take 2^16 entries, run instead as
what the table holds for them: the input requantized onto the output's grid, then clamped to the
outputs of 0 and 6 (rounding is monotone, so it commutes with max and min: the same integers).
"""

from __future__ import annotations

import math

import numpy as np

from qtool.core.graph import Node
from qtool.core.node_args import attr_float, fail, only, want_inputs
from qtool.core.qmodel import TensorQ
from qtool.layers.c import CNode, ctype, lit, requantize_expr
from qtool.layers.integer import LayerBits, lookup, requantize, table
from qtool.numerics.qparams import qrange
from qtool.numerics.qparams import quantize as quantize_values

OP = "activation"
KINDS = ("relu", "relu6", "leaky_relu", "sigmoid", "tanh", "hard_sigmoid", "softplus", "gelu", "linear")
ATTRS = {"leaky_relu": ("alpha",), "hard_sigmoid": ("alpha", "beta"), "gelu": ("approximate",)}


def _approximate(node: Node) -> bool:
    v = node.attrs.get("approximate", "none")
    if isinstance(v, (bool, np.bool_)):
        return bool(v)
    if v in ("none", "tanh"):
        return v == "tanh"
    raise fail(node, f"attribute 'approximate' must be \"none\", \"tanh\", true or false, got {v!r:.40}")


def _kind(node: Node) -> str:
    kind = node.attrs.get("kind")
    if kind not in KINDS:
        raise fail(node, f"attribute 'kind' must be one of {', '.join(KINDS)}, got {kind!r:.40}")
    return kind


def out_shape(node: Node, shapes: list[tuple]) -> list[tuple]:
    kind = _kind(node)
    only(node, ("kind", *ATTRS.get(kind, ())))
    want_inputs(node, shapes)
    if kind == "leaky_relu":
        attr_float(node, "alpha")
    elif kind == "hard_sigmoid":
        attr_float(node, "alpha", 1 / 6), attr_float(node, "beta", 0.5)
    elif kind == "gelu":
        _approximate(node)
    return [shapes[0]]


def sigmoid(x: np.ndarray) -> np.ndarray:
    # exp of a large |x| only on the side where it shrinks: no overflow warnings, no inf / inf
    e = np.exp(-np.abs(x))
    return np.where(x >= 0, 1 / (1 + e), e / (1 + e)).astype(np.float32)


def _erf(x: np.ndarray) -> np.ndarray:
    # numpy has no erf; math.erf per element in float64 is exact and the edges are small
    return np.vectorize(math.erf, otypes=[np.float64])(x.astype(np.float64))


def forward(node: Node, xs: list[np.ndarray]) -> list[np.ndarray]:
    x, kind = xs[0], _kind(node)
    if kind == "relu":
        y = np.maximum(x, 0)
    elif kind == "relu6":
        y = np.clip(x, 0, 6)
    elif kind == "leaky_relu":
        y = np.where(x >= 0, x, np.float32(attr_float(node, "alpha")) * x)
    elif kind == "sigmoid":
        y = sigmoid(x)
    elif kind == "tanh":
        y = np.tanh(x)
    elif kind == "hard_sigmoid":
        y = np.clip(np.float32(attr_float(node, "alpha", 1 / 6)) * x + np.float32(attr_float(node, "beta", 0.5)), 0, 1)
    elif kind == "softplus":
        y = np.logaddexp(np.float32(0), x)
    elif kind == "gelu" and _approximate(node):
        with np.errstate(over="ignore"):  # x^3 overflows to inf for |x| > 1e12: tanh saturates there anyway
            y = 0.5 * x * (1 + np.tanh(np.float32(math.sqrt(2 / math.pi)) * (x + np.float32(0.044715) * x ** 3)))
    elif kind == "gelu":
        y = 0.5 * x * (1 + _erf(x / math.sqrt(2)))
    else:
        y = x
    return [np.asarray(y, np.float32)]


CLAMPS = {"relu": (0.0, None), "relu6": (0.0, 6.0), "linear": (None, None)}  # kind -> (low, high) of x
TABLE_BITS = 8  # inputs up to this width take the table; wider ones of CLAMPS the requantize and clamp


def quantize(node: Node, g_in: list[TensorQ], g_out: list[TensorQ], bits: LayerBits) -> dict:
    kind, gy = _kind(node), g_out[0]
    if kind in CLAMPS and g_in[0].bits > TABLE_BITS:
        qmin, qmax = qrange(gy.bits)
        low, high = (qmin if v is None else int(quantize_values(np.array([v]), int(gy.exp2_inv), gy.zp, gy.bits)[0])
                     for v, qmin in zip(CLAMPS[kind], (qmin, qmax)))
        return {"clamp": np.array([low, high], np.int64)}
    return {"table": table(lambda v: forward(node, [v])[0], g_in[0], gy)}


def forward_int(node: Node, qp: dict, qs: list[np.ndarray], g_in: list[TensorQ], g_out: list[TensorQ]
                ) -> list[np.ndarray]:
    if "clamp" in qp:
        low, high = (int(v) for v in qp["clamp"])
        return [np.clip(requantize(qs[0], g_in[0], g_out[0]), low, high)]
    return [lookup(qp["table"], qs[0], g_in[0])]


def c_code(node: Node, qp: dict, g_in: list[TensorQ], g_out: list[TensorQ], f: str, widths: list[int]) -> CNode:
    """y[c] = table[x[c] - qmin_x]; or x[c] requantized and clamped (`forward_int`)."""
    gx, gy = g_in[0], g_out[0]
    if "clamp" in qp:
        low, high = (lit(int(v)) for v in qp["clamp"])
        code = f"""/* {node.label}: {_kind(node)}, requantized and clamped (its exact table's values) */
static void {f}(const {ctype(gx)} *x0, {ctype(gy)} *y)
{{
    int32_t c;
    for (c = 0; c < {widths[0]}; c++) {{
        int32_t v = {requantize_expr('x0[c]', gx, gy)};
        y[c] = ({ctype(gy)})(v < {low} ? {low} : v > {high} ? {high} : v);
    }}
}}
"""
        return CNode("frame", code, [])
    code = f"""/* {node.label}: {_kind(node)}, by its exact table */
static void {f}(const {ctype(gx)} *x0, {ctype(gy)} *y)
{{
    int32_t c;
    for (c = 0; c < {widths[0]}; c++) {{
        y[c] = {f}_table[x0[c] - {lit(qrange(gx.bits)[0])}];
    }}
}}
"""
    return CNode("frame", code, [(ctype(gy), f"{f}_table", qp["table"])])
