"""layernorm: each group of a frame's channels normalized to mean 0 and variance 1, then scaled
and shifted per channel (PyTorch's LayerNorm, ONNX's LayerNormalization, Keras' LayerNormalization):

    y[i] = (x[i] - mean_g) / sqrt(var_g + epsilon) * gamma[i] + beta[i]

over the groups of a frame of W channels viewed as `[W / (size * stride), size, stride]`, each
group the `size` channels along the middle axis (`size` W, `stride` 1: the whole frame, GTCRN's
LayerNorm over frequency and channels; on a map of "fc" frames, `size` C: each frequency's
channels; on "cf" frames, `size` C, `stride` F).

Integers, exact for every input (no float anywhere), with v = q_x - zp_x and n = `size`:

    S   = sum_g v                          d[i] = n v[i] - S          (= n (v[i] - mean))
    D   = sum_g d^2                        E = round(n^3 epsilon 2^(2 exp2_inv_x + 2P))
    r   = isqrt(floor((D 2^2P + E) / n))   (= n sqrt(var + epsilon) 2^P, floored)
    z[i] = div_round(d[i] 2^(Z+P), r)      (the normalized value on a grid of 2^-Z; 0 where r is 0)
    q_y[i] = clamp(rshift_round(z[i] q_gamma[i] + q_beta[i], Z + exp2_inv_gamma[i] - exp2_inv_y) + zp_y)

with gamma per channel symmetric on the weight bits and beta on the accumulator's grid
(exp2_inv = Z + exp2_inv_gamma), div_round rounding half away from zero, and P (0..Z) the most
fraction bits of r the bounds allow (a group of few channels close together has a small r,
which its fraction keeps exact to 2^-P). Bounds (proved by `quantize`, which refuses beyond
them): |d| <= 2 n 2^bits_x, D 2^2P + E < 2^62, |d 2^(Z+P)| < 2^62, |z| <= sqrt(n) 2^Z + 1,
|z q_gamma + q_beta| < 2^62.
"""

from __future__ import annotations

import math

import numpy as np

from qtool.core.edges import channels
from qtool.core.graph import Node
from qtool.core.node_args import attr_float, attr_int, fail, only, param, want_inputs
from qtool.core.qmodel import TensorQ
from qtool.layers.c import CNode, ctype, lit, table_type
from qtool.layers.integer import LayerBits, bias, rescale, weights
from qtool.numerics.fakequant import to_int
from qtool.numerics.qparams import dequantize, qrange

OP = "layernorm"
Z = 16  # the normalized value's fraction bits
INT62 = 1 << 62


def _groups(node: Node, width: int) -> tuple[int, int]:
    size, stride = attr_int(node, "size", width), attr_int(node, "stride", 1)
    if width % (size * stride):
        raise fail(node, f"groups of {size} channels {stride} apart do not tile the frame's {width} channels")
    return size, stride


def out_shape(node: Node, shapes: list[tuple]) -> list[tuple]:
    only(node, ("size", "stride", "epsilon"), params=("gamma", "beta"))
    want_inputs(node, shapes)
    _groups(node, channels(shapes[0]))
    attr_float(node, "epsilon", positive=True)
    for name in ("gamma", "beta"):
        param(node, name, (channels(shapes[0]),))
    return [shapes[0]]


def _view(node: Node, x: np.ndarray) -> np.ndarray:
    """x [..., W] as [..., W / (size * stride), size, stride]."""
    size, stride = _groups(node, x.shape[-1])
    return x.reshape(*x.shape[:-1], -1, size, stride)


def forward(node: Node, xs: list[np.ndarray]) -> list[np.ndarray]:
    x = xs[0]
    dt = np.float64 if x.dtype == np.float64 else np.float32
    g = _view(node, np.asarray(x, dt))
    mean = g.mean(axis=-2, keepdims=True)
    var = np.square(g - mean).mean(axis=-2, keepdims=True)
    y = ((g - mean) / np.sqrt(var + dt(attr_float(node, "epsilon", positive=True)))).reshape(x.shape)
    return [y * np.asarray(node.params["gamma"], dt) + np.asarray(node.params["beta"], dt)]


def fold_affine(node: Node, a: np.ndarray, c: np.ndarray) -> bool:
    """Fold a per-channel affine `y * a + c` of the output into gamma and beta (Keras writes its
    LayerNormalization's gamma and beta after a normalization of their own: tf2onnx's file)."""
    gamma, beta = (np.asarray(node.params[k], np.float64) for k in ("gamma", "beta"))
    node.params = {"gamma": (gamma * a).astype(np.float32), "beta": (beta * a + c).astype(np.float32)}
    return True


def quantize(node: Node, g_in: list[TensorQ], g_out: list[TensorQ], bits: LayerBits) -> dict:
    gx = g_in[0]
    n = _groups(node, len(node.params["gamma"]))[0]
    v_max = max(abs(q - gx.zp) for q in qrange(gx.bits))
    d_max = 2 * n * v_max
    eps = attr_float(node, "epsilon", positive=True) * 2.0 ** (2 * int(gx.exp2_inv))  # on the grid
    P = next((p for p in range(Z, -1, -1) if ((n * d_max ** 2) << 2 * p) + n ** 3 * eps * 4 ** p < INT62
              and d_max << (Z + p) < INT62), None)
    q_gamma, exp2_inv_gamma = weights(np.asarray(node.params["gamma"], np.float64)[:, None], bits.weight)
    q_beta = bias(node.params["beta"], exp2_inv_gamma + Z, bits.bias)
    z_max = math.isqrt(n) * (1 << Z) + (1 << Z) + 1
    acc_max = z_max * int(np.abs(q_gamma).max(initial=0)) + int(np.abs(q_beta).max(initial=0))
    sh = Z + exp2_inv_gamma - int(g_out[0].exp2_inv)
    if P is None or acc_max << max(0, -int(sh.min())) >= INT62:
        raise fail(node, f"normalizes {n} channels of {gx.bits} bits (epsilon {eps:.3g} on the grid): its sums "
                         "would pass 2^62; fewer channels a group or fewer bits")
    return {"n": n, "P": P, "E": round(n ** 3 * eps * 4 ** P), "q_gamma": q_gamma[:, 0],
            "exp2_inv_gamma": exp2_inv_gamma, "q_beta": q_beta, "sh": sh}


def isqrt(v: np.ndarray) -> np.ndarray:
    """floor(sqrt(v)) of int64 v in 0..2^62, exactly (float64's root, corrected by one either way)."""
    r = np.sqrt(v.astype(np.float64)).astype(np.int64)
    for _ in range(2):
        r = np.where(r * r > v, r - 1, r)
        r = np.where((r + 1) * (r + 1) <= v, r + 1, r)
    return r


def div_round(num: np.ndarray, den: np.ndarray) -> np.ndarray:
    """num / den rounded half away from zero, den > 0 (C's truncating division on magnitudes)."""
    return np.where(num >= 0, (num + den // 2) // den, -((-num + den // 2) // den))


def normalized(node: Node, qp: dict, q: np.ndarray, g_in: TensorQ) -> np.ndarray:
    """z: each channel's normalized value on a grid of 2^-Z."""
    v = _view(node, np.asarray(q, np.int64) - g_in.zp)
    n, P = qp["n"], qp["P"]
    d = n * v - v.sum(axis=-2, keepdims=True)
    r = isqrt(((np.square(d).sum(axis=-2, keepdims=True) << 2 * P) + qp["E"]) // n)
    z = div_round(d << (Z + P), np.maximum(r, 1))
    return np.where(r > 0, z, 0).reshape(q.shape)


def forward_fq(node: Node, qp: dict, g_in: list[TensorQ], g_out: list[TensorQ], xs: list[np.ndarray]
               ) -> list[np.ndarray]:
    """The fake-quant layer: the normalized values on their 2^-Z grid as the integers make them (a
    square root and a division that float would round otherwise), times gamma plus beta on
    their grids, in float64."""
    z = normalized(node, qp, to_int(np.asarray(xs[0], np.float64), g_in[0]), g_in[0])
    gamma = dequantize(qp["q_gamma"], qp["exp2_inv_gamma"], 0)
    return [np.ldexp(z.astype(np.float64), -Z) * gamma + dequantize(qp["q_beta"], qp["exp2_inv_gamma"] + Z, 0)]


def forward_int(node: Node, qp: dict, qs: list[np.ndarray], g_in: list[TensorQ], g_out: list[TensorQ]
                ) -> list[np.ndarray]:
    z = normalized(node, qp, qs[0], g_in[0])
    return [rescale(z * qp["q_gamma"] + qp["q_beta"], qp["sh"], g_out[0])]


def c_code(node: Node, qp: dict, g_in: list[TensorQ], g_out: list[TensorQ], f: str, widths: list[int]) -> CNode:
    """Per group: S and D in int64, r by qlayers_isqrt64, each channel's z by qlayers_div_round64,
    then the affine and rescale (int64 throughout: the bounds above)."""
    gx, gy = g_in[0], g_out[0]
    W = len(qp["q_gamma"])
    n, stride = _groups(node, W)
    sh = np.minimum(np.asarray(qp["sh"], np.int64), 63)
    y_t = ctype(gy)
    out = f"QGRU_SAT64(qgru_rshift_round64(z * {f}_g[c] + {f}_b[c], {f}_sh[c]) + {lit(gy.zp)}, {gy.bits})"
    code = f"""/* {node.label}: layernorm over groups of {n} channels {stride} apart */
static void {f}(const {ctype(gx)} *x0, {y_t} *y)
{{
    int32_t g, s, k;
    for (g = 0; g < {W // (n * stride)}; g++) {{
        for (s = 0; s < {stride}; s++) {{
            const int32_t base = g * {n * stride} + s;
            int64_t S = 0, D = 0, r;
            for (k = 0; k < {n}; k++) {{
                S += (int64_t)x0[base + k * {stride}] - {lit(gx.zp)};
            }}
            for (k = 0; k < {n}; k++) {{
                const int64_t d = {n} * ((int64_t)x0[base + k * {stride}] - {lit(gx.zp)}) - S;
                D += d * d;
            }}
            r = qlayers_isqrt64((D * {1 << 2 * qp["P"]} + INT64_C({qp["E"]})) / {n});
            for (k = 0; k < {n}; k++) {{
                const int32_t c = base + k * {stride};
                const int64_t d = {n} * ((int64_t)x0[c] - {lit(gx.zp)}) - S;
                const int64_t z = r > 0 ? qlayers_div_round64(d * INT64_C({1 << (Z + qp["P"])}), r) : 0;
                y[c] = ({y_t}){out};
            }}
        }}
    }}
}}
"""
    tables = [(table_type(qp["q_gamma"]), f"{f}_g", qp["q_gamma"]), (table_type(qp["q_beta"]), f"{f}_b", qp["q_beta"]),
              ("int8_t", f"{f}_sh", sh)]
    return CNode("frame", code, tables, macs=3 * W)
