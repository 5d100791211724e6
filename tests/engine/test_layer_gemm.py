"""The integer GEMMs of dense and conv1d (qtool.layers.integer.gemm_dtype, matmul, rescale_into,
gemm_rescale): float32 BLAS below 2^24, float64 below 2^53, int64 beyond, each bit for bit an
int64 reference (np.int64 matmul, a loop over the taps), on random int8/int16 data with its
extreme values and on cases built just below and above each bound. Each case asserts the path
forward_int takes (gemm_path, the helper forward_int itself calls), and the cases above a bound
hold sums a float of the lower width cannot hold, so a wrong choice fails."""

from __future__ import annotations

import numpy as np
import pytest

from qtool.core.graph import Node
from qtool.core.qmodel import TensorQ
from qtool.layers import dense, integer
from qtool.layers.conv import conv1d
from qtool.layers.integer import (
    EXACT_FLOAT,
    EXACT_FLOAT32,
    LayerBits,
    gemm_dtype,
    gemm_params,
    matmul,
    rescale,
    rescale_into,
)
from qtool.numerics.qparams import qrange

WIDE = TensorQ(62, False, 0, 0, 0.0, 0.0)  # an output grid that holds every accumulator: rescale by 0 is acc


def grid(bits, zp=0):
    return TensorQ(bits, False, 4, zp, 0.0, 0.0)


def ints(rng, shape, bits):
    """Random integers of `bits`, a quarter of them the extremes."""
    lo, hi = qrange(bits)
    q = rng.integers(lo, hi + 1, shape)
    pick = rng.random(shape)
    return np.where(pick < 0.125, lo, np.where(pick < 0.25, hi, q)).astype(np.int64)


def unreachable_in(acc, dtype) -> bool:
    """Whether some accumulator is an integer `dtype` cannot hold (so computing in it would fail)."""
    acc = np.asarray(acc, np.int64)
    return bool((acc.astype(dtype).astype(np.int64) != acc).any())


# ---- the bounds ---------------------------------------------------------------------------------

def test_gemm_dtype_boundaries():
    assert gemm_dtype(0) is np.float32
    assert gemm_dtype(EXACT_FLOAT32 - 1) is np.float32
    assert gemm_dtype(EXACT_FLOAT32) is np.float64
    assert gemm_dtype(EXACT_FLOAT - 1) is np.float64
    assert gemm_dtype(EXACT_FLOAT) is np.int64
    assert gemm_dtype(1 << 70) is np.int64
    # an int8 layer of 40 channels x 3 taps (int8 weights reach -128): float32
    assert gemm_dtype(120 * 128 * 128) is np.float32


@pytest.mark.parametrize("bits_x,bits_w", [(8, 8), (16, 8), (8, 16), (16, 16)])
def test_matmul_random_extremes(bits_x, bits_w):
    rng = np.random.default_rng(bits_x * 100 + bits_w)
    for k in (1, 7, 64, 300):
        x, W = ints(rng, (33, k), bits_x), ints(rng, (17, k), bits_w)
        assert np.array_equal(matmul(x, W), x @ W.T)


@pytest.mark.parametrize("x,w,dtype", [
    ([4095, 1], [2048, 1], np.float32),        # bound 2 * 4095 * 2048 < 2^24
    ([4097, 1], [4096, 1], np.float64),        # 2^24 + 4097: odd, beyond float32
    ([2**27 - 1, 1], [2**25 - 1, 1], np.float64),  # bound just below 2^53
    ([2**27 + 1, 1], [2**26, 1], np.int64),    # 2^53 + 2^26 + 1: odd, beyond float64
])
def test_matmul_across_the_bounds(x, w, dtype):
    x, w = np.array([x, [-v for v in x]], np.int64), np.array([w], np.int64)
    ref = x @ w.T
    qp = {"q_W": w}
    assert dense.gemm_path(qp, x)[0] is dtype
    assert np.array_equal(matmul(x, w), ref)
    if dtype is not np.float32:  # the case is one the narrower float gets wrong
        assert unreachable_in(ref, np.float32 if dtype is np.float64 else np.float64)


# ---- the epilogue -------------------------------------------------------------------------------

@pytest.mark.parametrize("kind", ["int", "float32", "float64"])
def test_rescale_into_is_rescale(kind):
    rng = np.random.default_rng(3)
    for shifts in ([0, 1, 5, 20, 31], [-3, 0, 7, 9, 12], [40, 62, 63, 70, 2], [-70, -1, 0, 1, 64]):
        n = np.array(shifts, np.int64)
        for bits, zp in ((8, 0), (8, -5), (16, 3), (32, 0)):
            lim = EXACT_FLOAT32 if kind == "float32" else EXACT_FLOAT if kind == "float64" else 1 << 60
            acc = rng.integers(-lim + 1, lim, (4, 6, 5))
            acc[0, 0] = lim - 1
            add = rng.integers(-2**31, 2**31, 5)
            want = rescale(acc + add, n, grid(bits, zp))
            out = np.empty_like(acc)
            a = acc if kind == "int" else acc.astype(kind)
            rescale_into(out, a, add, n, grid(bits, zp), lim)
            assert np.array_equal(out, want), (shifts, bits, zp)


# ---- dense --------------------------------------------------------------------------------------

def dense_int(qp, x, g_out=WIDE):
    nd = Node("d", "dense", ["x"], ["y"], {}, {})
    return dense.forward_int(nd, qp, [x], [grid(8)], [g_out])[0]


def raw_qp(q_W, rng):
    c_out = len(q_W)
    return {"q_W": q_W, "q_b": rng.integers(-2**20, 2**20, c_out), "W_sum_mul_x_zp": rng.integers(-2**20, 2**20, c_out),
            "sh_acc": np.zeros(c_out, np.int64)}


@pytest.mark.parametrize("bits_x,bits_w,shape,dtype", [
    (8, 8, (9, 40), np.float32), (8, 8, (5, 7, 300), np.float32),
    (16, 8, (9, 3), np.float32), (16, 8, (4, 6, 40), np.float64),
    (16, 16, (9, 40), np.float64), (8, 16, (3, 5, 11), np.float64)])
def test_dense_random_extremes(bits_x, bits_w, shape, dtype, monkeypatch):
    rng = np.random.default_rng(shape[-1])
    x, q_W = ints(rng, shape, bits_x), ints(rng, (13, shape[-1]), bits_w)
    qp = raw_qp(q_W, rng)
    assert dense.gemm_path(qp, x)[0] is dtype
    want = x @ q_W.T - qp["W_sum_mul_x_zp"] + qp["q_b"]
    assert np.array_equal(dense_int(qp, x), want)
    monkeypatch.setattr(integer, "GEMM_CHUNK_BYTES", 64)  # many chunks of rows
    assert np.array_equal(dense_int(qp, x), want)


@pytest.mark.parametrize("x,w,dtype", [
    ([-32768, -32768, 32767], [-128] * 3, np.float32),  # bound 3 * 2^15 * 2^7 < 2^24
    ([32767] * 5, [127] * 5, np.float64),              # 5 * 32767 * 127: odd, beyond 2^24
    ([2**31 - 1] * 3, [2**20 - 1] * 3, np.float64),     # just below 2^53
    ([2**31 - 1] * 5, [2**20 - 1] * 5, np.int64),       # odd sums beyond 2^53
])
def test_dense_across_the_bounds(x, w, dtype):
    rng = np.random.default_rng(0)
    x = np.array([x, [-v for v in x], x[::-1]], np.int64)
    q_W = np.array([w, [-v for v in w]], np.int64)
    qp = raw_qp(q_W, rng)
    assert dense.gemm_path(qp, x)[0] is dtype
    ref = x @ q_W.T
    assert np.array_equal(dense_int(qp, x), ref - qp["W_sum_mul_x_zp"] + qp["q_b"])
    if dtype is not np.float32:
        assert unreachable_in(ref, np.float32 if dtype is np.float64 else np.float64)


def test_dense_quantized_layer_matches_rescale():
    """A real layer's integers (gemm_params: per channel shifts, bias, zero point) on an 8-bit output."""
    rng = np.random.default_rng(5)
    W, b = rng.standard_normal((12, 64)).astype(np.float32) / 8, rng.standard_normal(12).astype(np.float32)
    g_x, g_y = TensorQ(8, False, 5, -7, -4.0, 4.0), TensorQ(8, False, 3, 2, -16.0, 16.0)
    qp = gemm_params(W, b, g_x, g_y, LayerBits())
    x = ints(rng, (6, 20, 64), 8)
    want = rescale(x @ qp["q_W"].T - qp["W_sum_mul_x_zp"] + qp["q_b"], qp["sh_acc"], g_y)
    nd = Node("d", "dense", ["x"], ["y"], {}, {})
    assert np.array_equal(dense.forward_int(nd, qp, [x], [g_x], [g_y])[0], want)


# ---- conv1d -------------------------------------------------------------------------------------

def conv_node(kernel, stride=1, dilation=1, groups=1, padding="valid"):
    return Node("c", "conv1d", ["x"], ["y"], {"kernel": kernel, "stride": stride, "dilation": dilation,
                                               "groups": groups, "padding": padding}, {})


def conv_ref(nd, q_W, x, zp):
    """The int64 reference: pad with the zero point, then a loop over taps and output channels."""
    kernel, stride, dilation, groups, _ = conv1d._attrs(nd)
    left, right = conv1d._pads(nd, x.shape[1])
    xp = np.pad(np.asarray(x, np.int64), ((0, 0), (left, right), (0, 0)), constant_values=zp)
    c_out, c_g = q_W.shape[:2]
    t_out = (xp.shape[1] - (kernel - 1) * dilation - 1) // stride + 1
    acc = np.zeros((x.shape[0], t_out, c_out), np.int64)
    for j in range(kernel):
        xs = xp[:, j * dilation: j * dilation + (t_out - 1) * stride + 1: stride]
        for o in range(c_out):
            g = o // (c_out // groups)
            acc[:, :, o] += xs[:, :, g * c_g:(g + 1) * c_g] @ np.asarray(q_W[o, :, j], np.int64)
    return acc


def conv_int(nd, qp, x, zp, g_out=WIDE):
    return conv1d.forward_int(nd, qp, [x], [grid(8, zp)], [g_out])[0]


CONVS = [  # kernel, stride, dilation, groups, padding, C_in, C_out
    (3, 1, 1, 1, "causal", 40, 64), (3, 1, 1, 1, "valid", 5, 7), (5, 2, 1, 1, "same", 6, 4),
    (4, 1, 2, 1, "same", 3, 5), (3, 3, 2, 2, (2, 1), 8, 6), (2, 2, 3, 4, "causal", 8, 8),
    (3, 1, 1, 6, "same", 6, 6), (3, 2, 1, 4, "causal", 4, 8), (1, 1, 1, 1, "valid", 1, 3),
    (5, 1, 1, 1, (0, 4), 1, 2), (3, 1, 4, 3, "valid", 9, 3)]


@pytest.mark.parametrize("bits", [(8, 8), (16, 8), (16, 16)])
@pytest.mark.parametrize("path", ["im2col", "taps"])
@pytest.mark.parametrize("conv", CONVS)
def test_conv1d_random_extremes(conv, path, bits, monkeypatch):
    kernel, stride, dilation, groups, padding, c_in, c_out = conv
    rng = np.random.default_rng(sum(conv[:4]) + c_in * c_out + bits[0])
    nd = conv_node(kernel, stride, dilation, groups, padding)
    zp = int(qrange(bits[0])[0]) if rng.random() < 0.5 else 3  # the extreme zero point too
    x, q_W = ints(rng, (5, 17, c_in), bits[0]), ints(rng, (c_out, c_in // groups, kernel), bits[1])
    qp = raw_qp(q_W, rng)
    if path == "taps":
        monkeypatch.setattr(conv1d, "IM2COL_BYTES", 0)
    monkeypatch.setattr(integer, "GEMM_CHUNK_BYTES", 512)  # several chunks of sequences
    monkeypatch.setattr(conv1d, "GEMM_CHUNK_BYTES", 512)
    dt, taken, bound = conv1d.gemm_path(nd, qp, x, grid(8, zp))
    assert taken == ("taps" if path == "taps" or c_in == groups else "im2col")
    assert dt is gemm_dtype(bound)
    assert bound == kernel * (c_in // groups) * max(np.abs(x).max(), abs(zp) * any(conv1d._pads(nd, 17))) * np.abs(
        q_W).max()
    want = conv_ref(nd, q_W, x, zp) - qp["W_sum_mul_x_zp"] + qp["q_b"]
    assert np.array_equal(conv_int(nd, qp, x, zp), want)


@pytest.mark.parametrize("path", ["im2col", "taps"])
@pytest.mark.parametrize("x,w,c_g,dtype", [
    (-32768, -128, 3, np.float32),            # 3 taps x 1 channel: 3 * 2^22 < 2^24
    (32767, 127, 6, np.float64),              # 3 taps x 2 channels: odd sums beyond 2^24
    (2**31 - 1, 2**20 - 1, 3, np.float64),    # just below 2^53
    (2**31 - 1, 2**20 - 1, 6, np.int64),      # odd sums beyond 2^53
])
def test_conv1d_across_the_bounds(x, w, c_g, dtype, path, monkeypatch):
    """Inputs and weights at their extreme (every product the largest, of one sign, so the sums
    reach the bound), a few flipped so the sums differ; the padded zero point is the extreme too."""
    rng = np.random.default_rng(c_g)
    kernel, c_in = 3, c_g // 3 * 2  # c_g 3: depthwise-like 1 channel per group; 6: 2 channels per group
    nd = conv_node(kernel, groups=2, padding="causal")
    xs = np.full((3, 10, c_in), x, np.int64)
    xs[1, 4, 0] = -x
    xs[2, ::3, 0] -= 1  # an even product among odd ones: odd sums
    q_W = np.full((4, c_in // 2, kernel), w, np.int64)
    q_W[1] = -w
    q_W[3, 0, 1] = w - 2
    qp = raw_qp(q_W, rng)
    if path == "taps":
        monkeypatch.setattr(conv1d, "IM2COL_BYTES", 0)
    dt, taken, bound = conv1d.gemm_path(nd, qp, xs, grid(8, x))
    assert dt is dtype and taken == ("im2col" if path == "im2col" and c_in // 2 > 1 else "taps")
    ref = conv_ref(nd, q_W, xs, x)
    assert np.array_equal(conv_int(nd, qp, xs, x), ref - qp["W_sum_mul_x_zp"] + qp["q_b"])
    if dtype is not np.float32:
        assert unreachable_in(ref, np.float32 if dtype is np.float64 else np.float64)


def test_conv1d_zero_point_counts_in_the_bound_only_where_padded():
    nd = conv_node(3, padding="valid")
    qp = {"q_W": np.full((2, 4, 3), 127, np.int64)}
    x = np.full((1, 5, 4), 100, np.int64)
    assert conv1d.gemm_path(nd, qp, x, grid(16, -32768))[2] == 12 * 100 * 127
    assert conv1d.gemm_path(conv_node(3, padding="causal"), qp, x, grid(16, -32768))[2] == 12 * 32768 * 127


def test_conv1d_quantized_layer_matches_rescale():
    """A real layer (gemm_params) with the bench's shape: per channel shifts, bias, input zero point."""
    rng = np.random.default_rng(9)
    W, b = rng.standard_normal((64, 40, 3)).astype(np.float32) / 11, rng.standard_normal(64).astype(np.float32)
    g_x, g_y = TensorQ(8, False, 4, -3, -4.8, 5.0), TensorQ(8, False, 4, 0, -5.5, 5.5)
    qp = gemm_params(W, b, g_x, g_y, LayerBits())
    nd = conv_node(3, padding="causal")
    x = ints(rng, (16, 50, 40), 8)
    assert conv1d.gemm_path(nd, qp, x, g_x)[:2] == (np.float32, "im2col")
    want = rescale(conv_ref(nd, qp["q_W"], x, g_x.zp) - qp["W_sum_mul_x_zp"] + qp["q_b"], qp["sh_acc"], g_y)
    assert np.array_equal(conv1d.forward_int(nd, qp, [x], [g_x], [g_y])[0], want)


def test_conv1d_too_short_input_is_refused():
    from qtool.errors import QtoolError
    nd = conv_node(5)
    qp = raw_qp(np.ones((2, 3, 5), np.int64), np.random.default_rng(0))
    with pytest.raises(QtoolError, match="fewer than the window's 5"):
        conv_int(nd, qp, np.zeros((1, 3, 3), np.int64), 0)
