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
    square        x * x   (PyTorch's x.pow(2), ONNX's Pow(x, 2) or Mul(x, x) of one value); in
                  integers no table: (q_x - zp_x)^2 rescaled, exact
    sqrt          sqrt(max(x, 0))   (a magnitude, sqrt(re^2 + im^2 + eps); ONNX's Sqrt)
    linear        x

Integers: the exact table of the function on the input's grid: for every input integer, the
float function of its value rounded onto the output's grid (2^bits_x entries). Inputs wider
than that table should be (2^16 entries at 16 bits, 128 KiB), and a relu on its input's own grid
(fuse_clamps), which needs none:
- relu, relu6 and linear run as what their table holds: the input requantized onto the output's
  grid, then clamped to the outputs of 0 and 6 (rounding is monotone, so it commutes with max and
  min: the same integers);
- every other kind, on more than LUT_INDEX_BITS bits, as the GRU's wide tables do: knots every
  2^shift inputs, each the exact table's entry, and linear interpolation between them in integers
  (`interpolate`, intops.lut_eval's arithmetic), with the largest shift (at most bits_x -
  LUT_INDEX_BITS: 1025 knots) whose difference from the exact table, measured over every input,
  is at most LUT_ERROR output steps (kept as `lut_error`); the exact table where none is.
"""

from __future__ import annotations

import math

import numpy as np

from qtool.core.graph import Node
from qtool.core.node_args import attr_float, fail, only, want_inputs
from qtool.core.qmodel import TensorQ
from qtool.layers.c import CNode, ctype, lit, requantize_expr
from qtool.layers.integer import LayerBits, lookup, requantize, rescale, same_grid, table
from qtool.numerics.lut import LUT_INDEX_BITS, lut_values
from qtool.numerics.qparams import dequantize, qrange
from qtool.numerics.qparams import quantize as quantize_values

OP = "activation"
KINDS = ("relu", "relu6", "leaky_relu", "sigmoid", "tanh", "hard_sigmoid", "softplus", "gelu", "square", "sqrt",
         "linear")
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
    elif kind == "square":
        y = x * x
    elif kind == "sqrt":
        y = np.sqrt(np.maximum(x, 0))
    else:
        y = x
    return [np.asarray(y, np.float32)]


CLAMPS = {"relu": (0.0, None), "relu6": (0.0, 6.0), "linear": (None, None)}  # kind -> (low, high) of x
TABLE_BITS = 8  # inputs up to this width take the table; wider ones of CLAMPS the requantize and clamp
LUT_ERROR = 1  # an interpolated table may differ from the exact one by this many output steps, no more


def clamps_only(node: Node) -> bool:
    """A relu or relu6: the layer writing its input may write onto its output's grid, and the
    clamp then clamps on that one grid (qtool.graph.calibrate, fuse_clamps)."""
    return _kind(node) in ("relu", "relu6")


def fused_reference(node: Node, x: np.ndarray, low: float, high: float) -> np.ndarray:
    """The float values that a layer fused into this clamp (`clamps_only`) writes onto its grid
    [low, high] stand for: x raised to `low` (the clamp drops what lies below), and relu6's
    beyond both 6 and `high` lowered to them (the clamp drops that too)."""
    top = CLAMPS[_kind(node)][1]
    return np.clip(x, np.float32(low), None if top is None else np.float32(max(top, high)))


def quantize(node: Node, g_in: list[TensorQ], g_out: list[TensorQ], bits: LayerBits) -> dict:
    kind, gx, gy = _kind(node), g_in[0], g_out[0]
    if kind == "square":  # exact in integers, no table: (q - zp)^2 rescaled
        return {"sh_sq": np.array([2 * int(gx.exp2_inv) - int(gy.exp2_inv)], np.int64)}
    f = lambda v: forward(node, [v])[0]  # noqa: E731
    if kind in CLAMPS and (gx.bits > TABLE_BITS or same_grid(gx, gy)):
        qmin, qmax = qrange(gy.bits)
        low, high = (qmin if v is None else int(quantize_values(np.array([v]), int(gy.exp2_inv), gy.zp, gy.bits)[0])
                     for v, qmin in zip(CLAMPS[kind], (qmin, qmax)))
        return {"clamp": np.array([low, high], np.int64)}
    exact = table(f, gx, gy)
    u = np.arange(exact.size, dtype=np.int64)
    for shift in range(gx.bits - LUT_INDEX_BITS, 0, -1):  # the fewest knots within LUT_ERROR of the table
        # every 2^shift inputs from qmin_x, the last one past qmax_x
        knots = (np.arange((exact.size >> shift) + 1, dtype=np.int64) << shift) + qrange(gx.bits)[0]
        v = dequantize(knots, int(gx.exp2_inv), gx.zp).astype(np.float32)
        lut = quantize_values(np.asarray(f(v), np.float64), int(gy.exp2_inv), gy.zp, gy.bits).astype(np.int64)
        err = int(np.abs(interpolate(lut, u, shift) - exact).max())
        if err <= LUT_ERROR:
            return {"lut": lut, "lut_shift": np.array([shift], np.int64), "lut_error": np.array([err], np.int64)}
    return {"table": exact}


def interpolate(lut: np.ndarray, u: np.ndarray, shift: int) -> np.ndarray:
    """The table at u = q_x - qmin_x by linear interpolation between knots every 2^shift inputs:
    the GRU's wide tables' arithmetic (intops.lut_eval, which the C mirrors)."""
    u = np.asarray(u, np.int64)
    return lut_values(np.ascontiguousarray(lut, np.int64), shift, np.ascontiguousarray(u.reshape(-1))).reshape(u.shape)


def forward_fq(node: Node, qp: dict, g_in: list[TensorQ], g_out: list[TensorQ], xs: list[np.ndarray]
               ) -> list[np.ndarray]:
    """The fake-quant layer on values on the input's grid: the float function, or where an
    interpolated table stands for it, what that table's integers stand for."""
    if "sh_sq" in qp:  # float64 holds the square of a 16-bit value: the integers' to the bit
        return [np.square(np.asarray(xs[0], np.float64))]
    if "lut" not in qp:
        return forward(node, [np.asarray(xs[0], np.float32)])
    gx, gy = g_in[0], g_out[0]
    q = quantize_values(np.asarray(xs[0], np.float64), int(gx.exp2_inv), gx.zp, gx.bits)
    (y,) = forward_int(node, qp, [q], g_in, g_out)
    return [dequantize(y, int(gy.exp2_inv), gy.zp)]


def forward_int(node: Node, qp: dict, qs: list[np.ndarray], g_in: list[TensorQ], g_out: list[TensorQ]
                ) -> list[np.ndarray]:
    if "sh_sq" in qp:
        v = np.asarray(qs[0], np.int64) - g_in[0].zp
        return [rescale(v * v, int(qp["sh_sq"][0]), g_out[0])]
    if "clamp" in qp:
        low, high = (int(v) for v in qp["clamp"])
        return [np.clip(requantize(qs[0], g_in[0], g_out[0]), low, high)]
    if "lut" in qp:
        u = np.asarray(qs[0], np.int64) - qrange(g_in[0].bits)[0]
        return [interpolate(qp["lut"], u, int(qp["lut_shift"][0]))]
    return [lookup(qp["table"], qs[0], g_in[0])]


def c_code(node: Node, qp: dict, g_in: list[TensorQ], g_out: list[TensorQ], f: str, widths: list[int]) -> CNode:
    """y[c] = table[x[c] - qmin_x]; or x[c] requantized and clamped (`forward_int`)."""
    gx, gy = g_in[0], g_out[0]
    if "sh_sq" in qp:
        y = f"QGRU_SAT64(qgru_rshift_round64(v * v, {int(qp['sh_sq'][0])}) + {lit(gy.zp)}, {gy.bits})"
        code = f"""/* {node.label}: square, (x - zp)^2 rescaled (no table) */
static void {f}(const {ctype(gx)} *x0, {ctype(gy)} *y)
{{
    int32_t c;
    for (c = 0; c < {widths[0]}; c++) {{
        const int64_t v = (int64_t)x0[c] - {lit(gx.zp)};
        y[c] = ({ctype(gy)}){y};
    }}
}}
"""
        return CNode("frame", code, [])
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
    if "lut" in qp:
        shift, lo, err = int(qp["lut_shift"][0]), lit(qrange(gx.bits)[0]), int(qp["lut_error"][0])
        code = f"""/* {node.label}: {_kind(node)}, knots every {1 << shift} inputs interpolated (at most {err}
 * from its exact table); |b - a| * f < 2^{gy.bits + shift}: int32 */
static void {f}(const {ctype(gx)} *x0, {ctype(gy)} *y)
{{
    int32_t c;
    for (c = 0; c < {widths[0]}; c++) {{
        const int32_t u = (int32_t)x0[c] - {lo};
        const int32_t i = u >> {shift};
        const int32_t a = {f}_lut[i];
        y[c] = ({ctype(gy)})(a + qgru_rshift_round32(({f}_lut[i + 1] - a) * (u - (i << {shift})), {shift}));
    }}
}}
"""
        return CNode("frame", code, [(ctype(gy), f"{f}_lut", qp["lut"])])
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
