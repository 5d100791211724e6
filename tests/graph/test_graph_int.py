"""Every op's integer semantics (`quantize` and `forward_int` in qtool.layers) against an
independent reference written here in Python integers and `fractions.Fraction`: a value on a
grid is `(q - zp) * 2^-exp2_inv` exactly, a result goes onto the output grid as
`clamp(floor(v * 2^exp2_inv_y + 1/2) + zp_y)`, with no shift, mask or numpy integer op of the
modules. Random grids (exponents, zero points, 8 and 16 bits) and random integer inputs that
always hold qmin, qmax and the zero point; whole rows at the extremes for the gemm layers. Then
the float passes: fold_batchnorm keeps the float outputs, prune drops linear activations and dead
branches, partition puts the float tail at the outputs and refuses it anywhere else."""

from __future__ import annotations

import copy
import math
from fractions import Fraction

import numpy as np
import pytest

from qtool.core.graph import Graph, Node
from qtool.core.qmodel import TensorQ
from qtool.errors import QtoolError
from qtool.graph.passes import fold_batchnorm, partition, prune
from qtool.layers import check, layer, run
from qtool.layers.activation import CLAMPS, KINDS, LUT_ERROR
from qtool.layers.activation import forward as forward_act
from qtool.layers.integer import LayerBits
from qtool.layers.integer import table as activation_table
from qtool.numerics.lut import LUT_INDEX_BITS
from qtool.numerics.qparams import E_MAX, E_MIN

HALF = Fraction(1, 2)


# ---- the reference: exact rationals ------------------------------------------------------------

def bounds(bits: int) -> tuple[int, int]:
    return -(2 ** (bits - 1)), 2 ** (bits - 1) - 1


def p2(e: int) -> Fraction:
    return Fraction(2) ** int(e)


def rhu(v: Fraction) -> int:
    """Round half up: floor(v + 1/2), exactly."""
    return math.floor(Fraction(v) + HALF)


def clamp(q: int, bits: int) -> int:
    lo, hi = bounds(bits)
    return min(max(q, lo), hi)


def value(q, g: TensorQ) -> Fraction:
    return (int(q) - g.zp) * p2(-int(g.exp2_inv))


def onto(v: Fraction, g: TensorQ) -> int:
    """The exact real `v` on grid g: clamp(floor(v * 2^exp2_inv + 1/2) + zp)."""
    return clamp(rhu(v * p2(int(g.exp2_inv))) + g.zp, g.bits)


def grid(bits: int, e: int, zp: int = 0) -> TensorQ:
    lo, hi = bounds(bits)
    return TensorQ(bits, zp == 0, int(e), int(zp), math.ldexp(lo - zp, -e), math.ldexp(hi - zp, -e))


def rand_grid(rng, bits: int, e_lo: int, e_hi: int) -> TensorQ:
    lo, hi = bounds(bits)
    zp = 0 if rng.rand() < 0.3 else int(rng.randint(lo // 2, hi // 2 + 1))
    return grid(bits, int(rng.randint(e_lo, e_hi + 1)), zp)


def fitted_grid(rng, bits: int, amax: float, spread: int = 1) -> TensorQ:
    """A grid about the size of [-amax, amax], one step coarser to one finer at random (finer:
    the results saturate), with a random zero point."""
    e = math.floor(math.log2((2 ** (bits - 1) - 1) / max(amax, 1e-30))) + int(rng.randint(-spread, spread + 1))
    lo, hi = bounds(bits)
    zp = 0 if rng.rand() < 0.3 else int(rng.randint(lo // 4, hi // 4 + 1))
    return grid(bits, e, zp)


def rand_q(rng, g: TensorQ, shape: tuple) -> np.ndarray:
    """Random integers of g, a tenth each at qmin and qmax and some at the zero point; the
    first entry is qmin and the last qmax."""
    lo, hi = bounds(g.bits)
    q = rng.randint(lo, hi + 1, size=shape).astype(np.int64)
    flat, pick = q.reshape(-1), rng.rand(q.size)
    flat[pick < 0.1], flat[(pick >= 0.1) & (pick < 0.2)], flat[(pick >= 0.2) & (pick < 0.25)] = lo, hi, g.zp
    flat[0], flat[-1] = lo, hi
    return q


def node(op, attrs=None, params=None, inputs=1, name="n1", ins=None, outs=None):
    return Node(name, op, ins or [f"x{i}" for i in range(inputs)], outs or ["y"], dict(attrs or {}),
                {k: np.asarray(v, np.float32) for k, v in (params or {}).items()}, source="Test")


def int_run(nd: Node, qs: list, g_in: list, g_out: TensorQ, bits: LayerBits | None = None, shapes=None):
    """quantize then forward_int of one node, after out_shape; (q_y, qp)."""
    mod = layer(nd.op, nd.label)
    mod.out_shape(nd, shapes or [(None, q.shape[-1]) if q.ndim == 3 else (q.shape[-1],) for q in qs])
    qp = mod.quantize(nd, list(g_in), [g_out], bits or LayerBits())
    (y,) = mod.forward_int(nd, qp, [np.asarray(q, np.int64) for q in qs], list(g_in), [g_out])
    y = np.asarray(y)
    assert y.dtype.kind == "i"
    return y, qp


def assert_ints(y: np.ndarray, ref: np.ndarray) -> None:
    assert y.shape == ref.shape
    bad = np.argwhere(np.asarray(y, np.int64) != np.asarray(ref, np.int64))
    assert not len(bad), f"{len(bad)} of {ref.size} differ; first at {tuple(bad[0])}: {y[tuple(bad[0])]} " \
                         f"!= {ref[tuple(bad[0])]}"


def ref_array(shape, f) -> np.ndarray:
    out = np.zeros(shape, np.int64)
    for idx in np.ndindex(*shape):
        out[idx] = f(idx)
    return out


# ---- dense, conv1d: weights and the accumulator -----------------------------------------------

def check_weights(W: np.ndarray, q_W: np.ndarray, e_W: np.ndarray, bits: int) -> None:
    """Per output channel symmetric: each row rounded half up onto its own power-of-two grid,
    every integer within the bits, within half a step of the float weight, and the grid the
    finest on which the row fits (one step finer, some weight would not)."""
    lo, hi = bounds(bits)
    rows, qrows = np.asarray(W, np.float64).reshape(W.shape[0], -1), np.asarray(q_W).reshape(W.shape[0], -1)
    assert q_W.shape == W.shape and np.asarray(e_W).shape == (W.shape[0],)
    for w, q, e in zip(rows, qrows, e_W):
        e, w, q = int(e), [Fraction(float(v)) for v in w], [int(v) for v in q]
        assert lo <= min(q) and max(q) <= hi
        if not any(w):
            assert not any(q)
            continue
        assert q == [rhu(v * p2(e)) for v in w]
        assert all(abs(qi * p2(-e) - wi) <= p2(-e - 1) for qi, wi in zip(q, w))
        finer = [rhu(v * p2(e + 1)) for v in w]
        assert e == E_MAX or min(finer) < lo or max(finer) > hi, "a finer grid would have held the row"


def check_bias(b, q_b, e_acc, bias_bits: int) -> None:
    want = [0] * len(e_acc) if b is None else \
        [clamp(rhu(Fraction(float(v)) * p2(int(e))), bias_bits) for v, e in zip(b, e_acc)]
    assert [int(v) for v in q_b] == want


def rand_weights(rng, shape, zero_row: bool) -> np.ndarray:
    W = rng.randn(*shape) * 2.0 ** rng.randint(-6, 4, size=(shape[0],) + (1,) * (len(shape) - 1))
    if zero_row:
        W[-1] = 0.0
    return W.astype(np.float32)


@pytest.mark.parametrize("seed", range(8))
def test_dense_integers(seed):
    rng = np.random.RandomState(seed)
    bx, bw, by = (int(rng.choice([8, 16])) for _ in range(3))
    c_in, c_out, seq = int(rng.randint(1, 7)), int(rng.randint(2, 6)), seed % 2 == 0
    W = rand_weights(rng, (c_out, c_in), zero_row=seed % 4 == 1)
    b = None if seed % 3 == 0 else (rng.randn(c_out) * 2.0 ** rng.randint(-3, 4)).astype(np.float32)
    nd = node("dense", params={"W": W} if b is None else {"W": W, "b": b})
    gx = rand_grid(rng, bx, bx - 5, bx + 2)
    qx = rand_q(rng, gx, (2, 5, c_in) if seq else (5, c_in))
    lo, hi = bounds(bx)
    qx.reshape(-1, c_in)[1], qx.reshape(-1, c_in)[2] = lo, hi  # whole rows at the extremes
    bits = LayerBits(bw, 32, by)
    _, qp = int_run(nd, [qx], [gx], gx, bits)
    e_W, q_W, q_b = [int(e) for e in qp["exp2_inv_W"]], qp["q_W"], qp["q_b"]
    check_weights(W, q_W, qp["exp2_inv_W"], bw)
    check_bias(b, q_b, [gx.exp2_inv + e for e in e_W], 32)

    rows = qx.reshape(-1, c_in)
    acc = [[sum(int(q_W[c, k]) * (int(r[k]) - gx.zp) for k in range(c_in)) + int(q_b[c]) for c in range(c_out)]
           for r in rows]
    real = [[a * p2(-(gx.exp2_inv + e_W[c])) for c, a in enumerate(row)] for row in acc]
    gy = fitted_grid(rng, by, float(max(abs(v) for row in real for v in row)))
    y, qp2 = int_run(nd, [qx], [gx], gy, bits)
    assert np.array_equal(qp2["q_W"], q_W) and np.array_equal(qp2["q_b"], q_b)
    ref = np.array([[onto(v, gy) for v in row] for row in real], np.int64).reshape(*qx.shape[:-1], c_out)
    assert_ints(y, ref)


def ref_pads(steps: int, kernel: int, stride: int, dilation: int, padding) -> tuple[int, int]:
    span = (kernel - 1) * dilation + 1
    if padding == "valid":
        return 0, 0
    if padding == "causal":
        return span - 1, 0
    if padding == "same":  # ceil(T / stride) outputs, the odd zero after
        total = max((-(-steps // stride) - 1) * stride + span - steps, 0)
        return total // 2, total - total // 2
    return tuple(padding)


CONVS = [  # kernel, stride, dilation, groups ("dw": depthwise, C_out = 2 C_in), padding
    (3, 1, 1, 1, "valid"), (3, 2, 1, 2, "same"), (2, 1, 2, "dw", "causal"), (4, 3, 1, 1, "same"),
    (3, 1, 2, 2, (2, 1)), (1, 2, 1, "dw", "same"), (5, 1, 1, "dw", (0, 3)), (3, 2, 3, 1, "causal"),
    (4, 1, 2, 2, "same"), (2, 2, 1, 1, (1, 1)),
]


@pytest.mark.parametrize("kernel,stride,dilation,groups,padding", CONVS)
def test_conv1d_integers(kernel, stride, dilation, groups, padding):
    rng = np.random.RandomState(kernel * 100 + stride * 10 + dilation)
    bx, bw, by = (int(rng.choice([8, 16])) for _ in range(3))
    c_in = 2 * int(rng.randint(1, 3))
    c_out = 2 * c_in if groups == "dw" else 2 * int(rng.randint(1, 3))
    groups = c_in if groups == "dw" else groups
    cg, T = c_in // groups, int(rng.randint(5, 10))
    W = rand_weights(rng, (c_out, cg, kernel), zero_row=False)
    b = (rng.randn(c_out) * 4).astype(np.float32) if rng.rand() < 0.7 else None
    attrs = {"kernel": kernel, "stride": stride, "dilation": dilation, "groups": groups, "padding": padding}
    nd = node("conv1d", attrs, {"W": W} if b is None else {"W": W, "b": b})
    gx = rand_grid(rng, bx, bx - 5, bx + 2)
    qx = rand_q(rng, gx, (2, T, c_in))
    lo, hi = bounds(bx)
    qx[1, : T // 2], qx[1, T // 2:] = lo, hi
    bits = LayerBits(bw, 32, by)
    _, qp = int_run(nd, [qx], [gx], gx, bits)
    e_W, q_W, q_b = [int(e) for e in qp["exp2_inv_W"]], qp["q_W"], qp["q_b"]
    check_weights(W, q_W, qp["exp2_inv_W"], bw)
    check_bias(b, q_b, [gx.exp2_inv + e for e in e_W], 32)

    left, right = ref_pads(T, kernel, stride, dilation, padding)
    t_out = (T + left + right - ((kernel - 1) * dilation + 1)) // stride + 1

    def acc(n, t, o):
        g, total = o // (c_out // groups), int(q_b[o])
        for j in range(kernel):
            step = t * stride + j * dilation - left
            if 0 <= step < T:  # a padded step is the zero point: it adds nothing
                total += sum(int(q_W[o, c, j]) * (int(qx[n, step, g * cg + c]) - gx.zp) for c in range(cg))
        return total * p2(-(gx.exp2_inv + e_W[o]))

    real = {idx: acc(*idx) for idx in np.ndindex(2, t_out, c_out)}
    gy = fitted_grid(rng, by, float(max(abs(v) for v in real.values())))
    y, _ = int_run(nd, [qx], [gx], gy, bits)
    assert_ints(y, ref_array((2, t_out, c_out), lambda idx: onto(real[idx], gy)))


# ---- batchnorm: the per-channel affine ---------------------------------------------------------

@pytest.mark.parametrize("seed", range(6))
def test_batchnorm_integers(seed):
    rng = np.random.RandomState(seed)
    bx, bw, by = (int(rng.choice([8, 16])) for _ in range(3))
    C, eps = int(rng.randint(2, 6)), float(rng.choice([1e-3, 1e-5]))
    p = {"gamma": rng.randn(C) * 2.0 ** rng.randint(-4, 3, C), "beta": rng.randn(C), "mean": rng.randn(C),
         "var": rng.rand(C) * 3}
    p["gamma"][0] = 0.0 if seed % 3 == 0 else p["gamma"][0]  # a dead channel: a = 0
    nd = node("batchnorm", {"epsilon": eps}, p)
    gx = rand_grid(rng, bx, bx - 4, bx + 1)
    qx = rand_q(rng, gx, (2, 6, C) if seed % 2 else (7, C))
    bits = LayerBits(bw, 32, by)
    _, qp = int_run(nd, [qx], [gx], gx, bits)
    gamma, beta, mean, var = (np.asarray(nd.params[k], np.float64) for k in ("gamma", "beta", "mean", "var"))
    a = gamma / np.sqrt(var + eps)
    q_a, e_a = qp["q_W"][:, 0], [int(e) for e in qp["exp2_inv_W"]]
    check_weights(a[:, None], qp["q_W"], qp["exp2_inv_W"], bw)
    check_bias(beta - mean * a, qp["q_b"], [gx.exp2_inv + e for e in e_a], 32)

    real = {idx: ((int(qx[idx]) - gx.zp) * int(q_a[idx[-1]]) + int(qp["q_b"][idx[-1]]))
            * p2(-(gx.exp2_inv + e_a[idx[-1]])) for idx in np.ndindex(*qx.shape)}
    gy = fitted_grid(rng, by, float(max(abs(v) for v in real.values())))
    y, _ = int_run(nd, [qx], [gx], gy, bits)
    assert_ints(y, ref_array(qx.shape, lambda idx: onto(real[idx], gy)))


# ---- activation: the tables --------------------------------------------------------------------

def _erf(v):
    return np.vectorize(math.erf, otypes=[np.float64])(v)


TENTHS3, SIXTH, FIFTH = Fraction(3, 10), Fraction(1, 6), Fraction(1, 5)
ACTS = [  # attrs, f in float64, f in Fractions, how exactly the module's float32 can hold to it
    ({"kind": "relu"}, lambda v: np.maximum(v, 0.0), lambda x: max(x, 0), "exact"),
    ({"kind": "relu6"}, lambda v: np.clip(v, 0.0, 6.0), lambda x: min(max(x, 0), 6), "exact"),
    ({"kind": "linear"}, lambda v: v, lambda x: x, "exact"),
    ({"kind": "leaky_relu", "alpha": 0.25}, lambda v: np.where(v >= 0, v, 0.25 * v),
     lambda x: x if x >= 0 else x / 4, "exact"),
    ({"kind": "hard_sigmoid", "alpha": 0.125, "beta": 0.5}, lambda v: np.clip(0.125 * v + 0.5, 0.0, 1.0),
     lambda x: min(max(x / 8 + HALF, 0), 1), "exact"),
    ({"kind": "leaky_relu", "alpha": 0.3}, lambda v: np.where(v >= 0, v, 0.3 * v),
     lambda x: x if x >= 0 else x * TENTHS3, "rational"),
    ({"kind": "hard_sigmoid"}, lambda v: np.clip(v / 6 + 0.5, 0.0, 1.0),
     lambda x: min(max(x * SIXTH + HALF, 0), 1), "rational"),
    ({"kind": "hard_sigmoid", "alpha": 0.2, "beta": 0.5}, lambda v: np.clip(0.2 * v + 0.5, 0.0, 1.0),
     lambda x: min(max(x * FIFTH + HALF, 0), 1), "rational"),
    ({"kind": "square"}, lambda v: v * v, None, "float"),  # float32 rounds a product of two 16-bit values
    ({"kind": "sqrt"}, lambda v: np.sqrt(np.maximum(v, 0.0)), None, "float"),
    ({"kind": "sigmoid"}, lambda v: 1 / (1 + np.exp(-v)), None, "float"),
    ({"kind": "tanh"}, np.tanh, None, "float"),
    ({"kind": "softplus"}, lambda v: np.logaddexp(0.0, v), None, "float"),
    ({"kind": "gelu"}, lambda v: 0.5 * v * (1 + _erf(v / math.sqrt(2))), None, "float"),
    ({"kind": "gelu", "approximate": "tanh"},
     lambda v: 0.5 * v * (1 + np.tanh(math.sqrt(2 / math.pi) * (v + 0.044715 * v ** 3))), None, "float"),
    ({"kind": "gelu", "approximate": True},
     lambda v: 0.5 * v * (1 + np.tanh(math.sqrt(2 / math.pi) * (v + 0.044715 * v ** 3))), None, "float"),
]


def test_activation_kinds_covered():
    assert {a["kind"] for a, *_ in ACTS} == set(KINDS)


@pytest.mark.parametrize("bx,by", [(8, 8), (8, 16), (16, 8), (16, 16)])
@pytest.mark.parametrize("attrs,f,fr,how", ACTS, ids=[f"{a['kind']}-{'-'.join(map(str, a.values()))}"
                                                     for a, *_ in ACTS])
def test_activation_table(attrs, f, fr, how, bx, by):
    """Every input integer: clamp(round_half_up(f(value) * 2^e_y) + zp_y).

    The module evaluates f in float32 on float32 inputs; the inputs are exact ((q - zp) is below
    2^16, times a power of two). "exact": relu, relu6, linear and, with power-of-two slopes,
    leaky_relu and hard_sigmoid; every float32 operation is exact too (a product by a power of
    two, a sum of dyadic numbers within 24 bits), so the table must equal the exact reference
    (Fractions) entry for entry. "rational": a slope of 0.3, 1/6 or 0.2 is not a binary number;
    float32 holds it to 2^-24, so where the exact value is a .5 tie (one entry in a few for such
    slopes on a binary grid) or within float32's error of one, the table may be one step off;
    anywhere else it must equal the exact reference. "float": transcendental functions rounded
    to float32's 24 bits: at a 16-bit output |f * 2^e_y| reaches 2^15, where float32 resolves
    2^-9 of a step, so exact equality with the true function cannot hold next to a .5 boundary;
    the reference is float64 and the table may be one step off only within the float32 error
    bound (2^-21 |f(v)| + 2^-23 |v|) 2^e_y of a boundary (8 ulps of the result, and 2 of v for
    gelu's 1 + tanh cancellation; numpy's float32 measures under half that), which must be a
    sliver of the entries."""
    nd = node("activation", attrs)
    rng = np.random.RandomState(bx * 7 + by + len(repr(attrs)))
    lo, hi = bounds(bx)
    gx = grid(bx, bx - 1 - int(rng.randint(-1, 5)), int(rng.randint(lo // 4, hi // 4 + 1)))
    qs = np.arange(lo, hi + 1, dtype=np.int64)
    v = (qs - gx.zp) * 2.0 ** -gx.exp2_inv  # exact in float64
    fv = np.asarray(f(v), np.float64)
    gy = fitted_grid(rng, by, float(np.abs(fv).max()))
    y, qp = int_run(nd, [qs[None, :, None]], [gx], gy, shapes=[(None, 1)])
    # relu, relu6 and linear on a 16-bit input keep no table: requantized and clamped, their
    # integers meet the same exact reference as the tables do
    assert ("clamp" in qp) == (attrs["kind"] in CLAMPS and bx > 8)
    assert "lut" not in qp or (attrs["kind"] not in CLAMPS and bx > LUT_INDEX_BITS)
    if "lut" in qp:  # knots every 2^shift inputs, interpolated: an independent Python-integer reference
        table = activation_table(lambda v: forward_act(nd, [v])[0], gx, gy)  # the exact table, checked below
        lut, shift = [int(k) for k in qp["lut"]], int(qp["lut_shift"][0])
        want = []
        for u in range(qs.size):
            i, frac = u >> shift, u & ((1 << shift) - 1)
            want.append(lut[i] + math.floor((lut[i + 1] - lut[i]) * frac / 2 ** shift + HALF))
        assert_ints(y.reshape(-1), np.array(want))
        err = int(np.abs(y.reshape(-1) - table).max())
        assert err == int(qp["lut_error"][0]) and err <= LUT_ERROR
    else:
        table = np.asarray(qp["table"]).reshape(-1) if "table" in qp else y.reshape(-1)
    assert table.shape == qs.shape and ("lut" in qp or np.array_equal(y.reshape(-1), table))
    e_y, (lo_y, hi_y) = int(gy.exp2_inv), bounds(by)
    allowance = np.ldexp(np.abs(fv), e_y - 21) + np.ldexp(np.abs(v), e_y - 23)  # float32's error, in steps
    scaled = np.ldexp(fv, e_y)  # exact: a power of two
    ref = np.clip(np.floor(scaled + 0.5) + gy.zp, lo_y, hi_y).astype(np.int64)
    near = np.abs(scaled - (np.floor(scaled) + 0.5)) <= allowance
    if how == "exact":  # float64 is exact here as float32 is: the whole table, to the integer
        assert_ints(table, ref)
    if how != "float":  # the exact reference in Fractions: every entry of an 8-bit table, 4096 of a 16-bit one
        pick = np.arange(qs.size) if bx == 8 else np.unique(np.r_[0, 1, qs.size - 2, qs.size - 1, gx.zp - lo,
                                                                    rng.randint(0, qs.size, 4096)])
        exact = [fr(value(qs[i], gx)) * p2(e_y) for i in pick]
        ref[pick] = [min(max(math.floor(s + HALF) + gy.zp, lo_y), hi_y) for s in exact]
        near[:] = False
        near[pick] = [abs(s - math.floor(s) - HALF) <= a for s, a in zip(exact, allowance[pick])]
        near[pick] &= how == "rational"
        table, ref, near = table[pick], ref[pick], near[pick]
    diff = table - ref
    assert np.all(np.abs(diff) <= 1)
    assert not np.any(diff[~near]), f"differs away from a .5 boundary: {np.flatnonzero(~near & (diff != 0))[:5]}"
    if how == "float":  # the allowance is a sliver, not the test
        assert near.mean() < (0.08 if by == 16 else 0.002)


# ---- add, mul, concat --------------------------------------------------------------------------

@pytest.mark.parametrize("op", ["add", "mul"])
@pytest.mark.parametrize("count", [2, 3])
@pytest.mark.parametrize("seed", range(4))
def test_add_mul_integers(op, count, seed):
    rng = np.random.RandomState(seed * 10 + count + (op == "mul"))
    shape = (2, 4, 3) if seed % 2 else (5, 3)
    gs = [rand_grid(rng, b, b - 6, b + 2) for b in (int(rng.choice([8, 16])) for _ in range(count))]
    while len({g.exp2_inv for g in gs}) < 2:  # different exponents
        gs[0] = rand_grid(rng, gs[0].bits, gs[0].bits - 6, gs[0].bits + 2)
    qs = [rand_q(rng, g, shape) for g in gs]
    qs[0].reshape(-1)[1] = bounds(gs[0].bits)[0]  # all inputs at an extreme together, somewhere
    for q, g in zip(qs, gs):
        q.reshape(-1)[2], q.reshape(-1)[3] = bounds(g.bits)

    def real(idx):
        vals = [value(q[idx], g) for q, g in zip(qs, gs)]
        return sum(vals) if op == "add" else math.prod(vals)

    reals = {idx: real(idx) for idx in np.ndindex(*shape)}
    by = int(rng.choice([8, 16]))
    amax = float(max(abs(v) for v in reals.values()))
    for gy in (fitted_grid(rng, by, amax), grid(by, max(g.exp2_inv for g in gs) + 3, 0)):  # the last: finer
        y, _ = int_run(node(op, inputs=count), qs, gs, gy)
        assert_ints(y, ref_array(shape, lambda idx, gy=gy: onto(reals[idx], gy)))


@pytest.mark.parametrize("seed", range(4))
def test_concat_requantizes(seed):
    rng = np.random.RandomState(seed)
    by = int(rng.choice([8, 16]))
    gy = rand_grid(rng, by, by - 4, by + 1)
    gs = [rand_grid(rng, b, b - 5, b + 3) for b in (int(rng.choice([8, 16])) for _ in range(2))] + [gy]
    rng.shuffle(gs)
    widths = [int(rng.randint(1, 4)) for _ in gs]
    qs = [rand_q(rng, g, (2, 3, w) if seed % 2 else (4, w)) for g, w in zip(gs, widths)]
    y, _ = int_run(node("concat", inputs=len(qs)), qs, gs, gy)
    parts = [ref_array(q.shape, lambda idx, q=q, g=g: onto(value(q[idx], g), gy)) for q, g in zip(qs, gs)]
    assert_ints(y, np.concatenate(parts, axis=-1))
    same = gs.index(gy)  # on the output's own grid: the integers themselves
    start = sum(widths[:same])
    assert np.array_equal(y[..., start:start + widths[same]], qs[same])


# ---- pools -------------------------------------------------------------------------------------

POOLS = [  # pool, stride (None: the pool), padding
    (2, None, "valid"), (3, 1, "same"), (3, 2, "same"), (4, 3, (1, 2)), (2, 1, (1, 1)), (5, 2, "valid"),
    (1, 2, "same"), (4, 1, "same"), (3, 3, (2, 0)),
]


def ref_windows(T, pool, stride, padding):
    """Each output's real steps (padded steps are no values)."""
    left, right = ref_pads(T, pool, stride, 1, padding)
    t_out = (T + left + right - pool) // stride + 1
    return [[t * stride + j - left for j in range(pool) if 0 <= t * stride + j - left < T] for t in range(t_out)]


def avg_onto(total: int, count: int, gx: TensorQ, gy: TensorQ) -> int:
    """q_y = floor(sum * 2^d / count + 1/2) + zp_y, d = exp2_inv_y - exp2_inv_x, saturated."""
    return clamp(math.floor(Fraction(total) * p2(gy.exp2_inv - gx.exp2_inv) / count + HALF) + gy.zp, gy.bits)


@pytest.mark.parametrize("op", ["avg_pool1d", "max_pool1d"])
@pytest.mark.parametrize("pool,stride,padding", POOLS)
def test_pool_integers(op, pool, stride, padding):
    rng = np.random.RandomState(pool * 31 + (stride or 0) * 7 + len(str(padding)) + (op == "max_pool1d"))
    bx = int(rng.choice([8, 16]))
    gx = rand_grid(rng, bx, bx - 4, bx + 2)
    T, C = int(rng.randint(6, 10)), 3
    qx = rand_q(rng, gx, (2, T, C))
    qx[1, :, 0] = bounds(bx)[1]  # a channel all at qmax, one all at qmin
    qx[1, :, 1] = bounds(bx)[0]
    attrs = {"pool": pool, "padding": padding} | ({} if stride is None else {"stride": stride})
    wins = ref_windows(T, pool, stride or pool, padding)
    by = int(rng.choice([8, 16]))
    for gy in (gx, rand_grid(rng, by, by - 5, by + 3), grid(by, gx.exp2_inv - 2, 0), grid(by, gx.exp2_inv + 3, 0)):
        y, _ = int_run(node(op, attrs), [qx], [gx], gy)

        def ref(idx, gy=gy):
            n, t, c = idx
            steps = wins[t]
            assert steps
            if op == "max_pool1d":
                return onto(value(max(int(qx[n, s, c]) for s in steps), gx), gy)
            return avg_onto(sum(int(qx[n, s, c]) - gx.zp for s in steps), len(steps), gx, gy)

        assert_ints(y, ref_array((2, len(wins), C), ref))
    if op == "max_pool1d":  # on its input's grid, a max is one of its inputs
        y, _ = int_run(node(op, attrs), [qx], [gx], gx)
        assert all(int(y[n, t, c]) in {int(qx[n, s, c]) for s in wins[t]} for n, t, c in np.ndindex(*y.shape))


@pytest.mark.parametrize("op", ["global_avg_pool1d", "global_max_pool1d"])
@pytest.mark.parametrize("seed", range(4))
def test_global_pool_integers(op, seed):
    rng = np.random.RandomState(seed + 10 * (op == "global_max_pool1d"))
    bx, by = int(rng.choice([8, 16])), int(rng.choice([8, 16]))
    gx = rand_grid(rng, bx, bx - 4, bx + 2)
    T, C = int(rng.randint(1, 12)), 4
    qx = rand_q(rng, gx, (3, T, C))
    qx[1, :, 0], qx[1, :, 1] = bounds(bx)
    for gy in (gx, rand_grid(rng, by, by - 5, by + 3), grid(by, gx.exp2_inv + 4, 0), grid(by, gx.exp2_inv - 3, 0)):
        y, _ = int_run(node(op), [qx], [gx], gy)

        def ref(idx, gy=gy):
            n, c = idx
            if op == "global_max_pool1d":
                return onto(value(max(int(q) for q in qx[n, :, c]), gx), gy)
            return avg_onto(sum(int(q) - gx.zp for q in qx[n, :, c]), T, gx, gy)

        assert_ints(y, ref_array((3, C), ref))
    if op == "global_avg_pool1d":  # every exponent step, through where the result turns 0 or saturates
        for d in range(-bx - 4, by + 8):
            gy = grid(by, gx.exp2_inv + d, int(rng.randint(-3, 4)))
            y, _ = int_run(node(op), [qx], [gx], gy)
            assert_ints(y, ref_array((3, C), lambda idx, gy=gy: avg_onto(
                sum(int(q) - gx.zp for q in qx[idx[0], :, idx[1]]), T, gx, gy)))


# ---- zero_pad1d, last_step ---------------------------------------------------------------------

@pytest.mark.parametrize("pad", [(0, 0), (2, 0), (0, 3), (1, 4)])
def test_zero_pad1d_integers(pad):
    rng = np.random.RandomState(sum(pad))
    for bits in (8, 16):
        gx = rand_grid(rng, bits, bits - 3, bits + 2)
        gx = gx if gx.zp else grid(bits, gx.exp2_inv, 5)  # a zero point that is not 0
        qx = rand_q(rng, gx, (2, 5, 3))
        nd = node("zero_pad1d", {"pad": pad})
        assert "zero_pad1d" in layer("zero_pad1d", "").SHARES_GRID
        y, _ = int_run(nd, [qx], [gx], gx)  # the grid kept
        assert y.shape == (2, 5 + sum(pad), 3)
        assert np.all(y[:, :pad[0]] == gx.zp) and np.all(y[:, 5 + pad[0]:] == gx.zp)
        assert np.array_equal(y[:, pad[0]:5 + pad[0]], qx)
        gy = rand_grid(rng, 24 - bits, 24 - bits - 4, 24 - bits + 1)  # another grid: requantized
        y, _ = int_run(nd, [qx], [gx], gy)
        assert np.all(y[:, :pad[0]] == gy.zp) and np.all(y[:, 5 + pad[0]:] == gy.zp)
        ref = ref_array(qx.shape, lambda idx, gy=gy, gx=gx, qx=qx: onto(value(qx[idx], gx), gy))
        assert_ints(y[:, pad[0]:5 + pad[0]], ref)


def test_last_step_integers():
    rng = np.random.RandomState(0)
    for bits in (8, 16):
        gx = rand_grid(rng, bits, bits - 3, bits + 2)
        qx = rand_q(rng, gx, (3, 4, 5))
        y, _ = int_run(node("last_step"), [qx], [gx], gx)
        assert np.array_equal(y, qx[:, -1])
        gy = rand_grid(rng, 24 - bits, 24 - bits - 4, 24 - bits + 1)
        y, _ = int_run(node("last_step"), [qx], [gx], gy)
        assert_ints(y, ref_array((3, 5), lambda idx, gy=gy, gx=gx, qx=qx: onto(value(qx[idx[0], -1, idx[1]], gx), gy)))


# ---- the farthest grids qparams gives: exponents E_MIN..E_MAX, shifts past 64 bits ---------------

def extreme_cases():
    """(name, node, input grids, output grid): grids E_MAX and E_MIN apart both ways, so that
    Rescale's shift, the pools' and the gemm accumulator's pass 63 bits (or stop short of it)."""
    out = []
    for e_in, e_out in ((E_MAX, E_MIN), (E_MIN, E_MAX)):
        gx, gy = grid(8, e_in, 3), grid(16, e_out, -7)
        out += [("concat", node("concat", inputs=2), [gx, gy], gy), ("last_step", node("last_step"), [gx], gy),
                ("zero_pad1d", node("zero_pad1d", {"pad": (1, 1)}), [gx], gy),
                ("max_pool1d", node("max_pool1d", {"pool": 2, "stride": 1}), [gx], gy),
                ("avg_pool1d", node("avg_pool1d", {"pool": 3, "stride": 1, "padding": "same"}), [gx], gy),
                ("global_avg_pool1d", node("global_avg_pool1d"), [gx], gy),
                ("global_max_pool1d", node("global_max_pool1d"), [gx], gy),
                ("add", node("add", inputs=2), [gx, grid(16, e_in - 20 if e_in > 0 else e_in + 20, 100)], gy),
                ("mul", node("mul", inputs=3), [gx, gx, grid(16, e_in, -50)], gy)]
    tiny, huge = (np.array([[1e-12, -3e-13], [-2e-12, 1.5e-12]]), np.array([[1e9, -3e8], [-2e9, 7e8]]))
    out += [("dense", node("dense", params={"W": tiny, "b": [1e-30, -1e-30]}), [grid(16, E_MAX, 0)], grid(8, E_MIN, 0)),
            ("dense", node("dense", params={"W": huge, "b": [1e7, -1e7]}), [grid(16, E_MIN, 9)], grid(8, E_MAX, 0))]
    return out


@pytest.mark.parametrize("case", range(len(extreme_cases())))
def test_extreme_grids(case):
    name, nd, gs, gy = extreme_cases()[case]
    rng = np.random.RandomState(case)
    qs = [rand_q(rng, g, (2, 4, 2)) for g in gs]
    if nd.op == "dense":
        qs = [q[:, 0, :] for q in qs]
    for q, g in zip(qs, gs):  # an exact zero in every input
        q[0, ..., -1] = g.zp
    y, qp = int_run(nd, qs, gs, gy)
    vals = [np.vectorize(lambda q, g=g: value(q, g), otypes=[object])(q) for q, g in zip(qs, gs)]
    if name == "dense":
        e_acc = [gs[0].exp2_inv + int(e) for e in qp["exp2_inv_W"]]
        assert min(abs(e - gy.exp2_inv) for e in e_acc) >= 64  # the accumulator's shift, each way
        check_bias(nd.params["b"], qp["q_b"], e_acc, 32)
        real = [[sum(int(qp["q_W"][c, k]) * (int(r[k]) - gs[0].zp) for k in range(2)) * p2(-e_acc[c])
                 + int(qp["q_b"][c]) * p2(-e_acc[c]) for c in range(2)] for r in qs[0]]
    elif name == "concat":
        real = np.concatenate(vals, axis=-1)
    elif name == "last_step":
        real = vals[0][:, -1]
    elif name == "zero_pad1d":
        real = np.pad(vals[0], ((0, 0), (1, 1), (0, 0)), constant_values=Fraction(0))
    elif name == "max_pool1d":
        real = np.maximum(vals[0][:, :-1], vals[0][:, 1:])
    elif name == "avg_pool1d":
        v = vals[0]
        real = np.stack([(v[:, 0] + v[:, 1]) / 2] + [(v[:, t - 1] + v[:, t] + v[:, t + 1]) / 3 for t in (1, 2)]
                        + [(v[:, 2] + v[:, 3]) / 2], axis=1)
    elif name == "global_avg_pool1d":
        real = vals[0].sum(axis=1) / 4
    elif name == "global_max_pool1d":
        real = vals[0].max(axis=1)
    elif name == "add":
        real = vals[0] + vals[1]
    else:
        real = vals[0] * vals[1] * vals[2]
    real = np.asarray(real, object)
    assert_ints(y, ref_array(real.shape, lambda idx: onto(real[idx], gy)))


# ---- passes ------------------------------------------------------------------------------------

def bn_params(rng, C):
    return {"gamma": rng.randn(C) * 2, "beta": rng.randn(C), "mean": rng.randn(C), "var": rng.rand(C) * 2 + 0.1}


def assert_close(a, b):
    np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-5 * float(np.abs(b).max()))


@pytest.mark.parametrize("first", ["dense", "dense_nobias", "conv1d"])
def test_fold_batchnorm_keeps_outputs(first):
    rng = np.random.RandomState(0)
    if first == "conv1d":
        prev = node("conv1d", {"kernel": 3, "groups": 2, "padding": "same"},
                    {"W": rng.randn(4, 3, 3), "b": rng.randn(4)}, name="prev", ins=["x"], outs=["h"])
        shape, x = (None, 6), rng.randn(3, 7, 6).astype(np.float32) * 3
    else:
        p = {"W": rng.randn(4, 5)} | ({} if first == "dense_nobias" else {"b": rng.randn(4)})
        prev = node("dense", params=p, name="prev", ins=["x"], outs=["h"])
        shape, x = (5,), rng.randn(6, 5).astype(np.float32) * 3
    bn = node("batchnorm", {"epsilon": 1e-3}, bn_params(rng, 4), name="bn", ins=["h"], outs=["y"])
    g = check(Graph([prev, bn], {"x": shape}, ["y"]))
    before = run(g, x)["y"]
    folded = copy.deepcopy(g)
    assert fold_batchnorm(folded) == "folded bn into prev"
    assert [n.name for n in folded.nodes] == ["prev"] and folded.nodes[0].outputs == ["y"]
    folded.shapes = {}
    assert_close(run(check(folded), x)["y"], before)


def test_fold_batchnorm_leaves_shared_input():
    rng = np.random.RandomState(1)
    d = node("dense", params={"W": rng.randn(4, 5), "b": rng.randn(4)}, name="d", ins=["x"], outs=["h"])
    bn = node("batchnorm", {"epsilon": 1e-5}, bn_params(rng, 4), name="bn", ins=["h"], outs=["y"])
    act = node("activation", {"kind": "relu"}, name="act", ins=["h"], outs=["z"])
    for outputs in (["y", "z"], ["y", "h"]):  # h read by a second node; h a model output
        nodes = [d, bn, act] if "z" in outputs else [d, bn]
        g = check(Graph(copy.deepcopy(nodes), {"x": (5,)}, outputs))
        W = g.nodes[0].params["W"].copy()
        assert fold_batchnorm(g) == ("kept bn as an integer per-channel affine (its input is no dense, conv or "
                                     "layernorm output that only it reads, or it differs along a map's frequencies)")
        assert [n.op for n in g.nodes][:2] == ["dense", "batchnorm"] and np.array_equal(g.nodes[0].params["W"], W)


def test_prune_linear_and_dead_branch():
    rng = np.random.RandomState(2)
    nodes = [node("dense", params={"W": rng.randn(4, 3)}, name="d1", ins=["x"], outs=["h1"]),
             node("activation", {"kind": "linear"}, name="lin", ins=["h1"], outs=["h2"]),
             node("activation", {"kind": "relu"}, name="dead1", ins=["h1"], outs=["h3"]),
             node("dense", params={"W": rng.randn(2, 4)}, name="dead2", ins=["h3"], outs=["h4"]),
             node("dense", params={"W": rng.randn(2, 4)}, name="d2", ins=["h2"], outs=["y"])]
    g = check(Graph(nodes, {"x": (3,)}, ["y"]))
    x = rng.randn(5, 3).astype(np.float32)
    before = run(g, x)["y"]
    what = prune(g)
    assert what.startswith("removed 3 node(s)") and all(n in what for n in ("lin", "dead1", "dead2"))
    assert [n.name for n in g.nodes] == ["d1", "d2"]
    g.shapes = {}
    assert np.array_equal(run(check(g), x)["y"], before)
    assert prune(g) == "nothing to remove"


def test_prune_linear_at_the_edges():
    # a linear activation on the model's input, and one that is the model's output
    nodes = [node("activation", {"kind": "linear"}, name="l_in", ins=["x"], outs=["a"]),
             node("activation", {"kind": "relu"}, name="r", ins=["a"], outs=["b"]),
             node("activation", {"kind": "linear"}, name="l_out", ins=["b"], outs=["y"])]
    g = check(Graph(nodes, {"x": (None, 3)}, ["y"]))
    x = np.random.RandomState(3).randn(2, 4, 3).astype(np.float32)
    before = run(g, x)["y"]
    prune(g)
    assert [n.name for n in g.nodes] == ["r"]
    g.shapes = {}
    assert np.array_equal(run(check(g), x)[g.outputs[0]], before)


@pytest.mark.parametrize("tail", [["softmax"], ["l2_normalize"], ["softmax", "l2_normalize"]])
def test_partition_float_tail(tail):
    rng = np.random.RandomState(4)
    nodes = [node("dense", params={"W": rng.randn(3, 4)}, name="d", ins=["x"], outs=["e0"])]
    nodes += [node(op, name=f"t{i}", ins=[f"e{i}"], outs=[f"e{i + 1}"]) for i, op in enumerate(tail)]
    g = check(Graph(nodes, {"x": (4,)}, [f"e{len(tail)}"]))
    core, tail_names, what = partition(g)
    assert core == ["d"] and tail_names == [f"t{i}" for i in range(len(tail))]
    assert "float tail" in what


def test_partition_refuses_softmax_before_dense():
    rng = np.random.RandomState(5)
    nodes = [node("dense", params={"W": rng.randn(3, 4)}, name="d1", ins=["x"], outs=["a"]),
             node("softmax", name="sm", ins=["a"], outs=["b"]),
             node("dense", params={"W": rng.randn(2, 3)}, name="d2", ins=["b"], outs=["y"])]
    g = check(Graph(nodes, {"x": (4,)}, ["y"]))
    with pytest.raises(QtoolError) as err:
        partition(g)
    msg = str(err.value)
    assert "\n" not in msg and "sm" in msg and "softmax" in msg
