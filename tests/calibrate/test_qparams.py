"""The range -> (exp2_inv, zp) rule, with hand-computed expectations."""

import numpy as np
import pytest

from qtool.numerics.qparams import choose_qparams, dequantize, qrange, quantize


@pytest.mark.parametrize("lo,hi,bits,sym,want", [
    (-1.0, 1.0, 8, True, (6, 0)),      # 2^7 = 128 > 127 would clip 1.0
    (-0.99, 0.99, 8, True, (7, 0)),    # round(0.99 * 128) = 127 fits
    (0.0, 1.0, 8, False, (7, -65)),    # [0, 128] on 255 steps: slack 127, zp = -128 + 63
    (0.01, 0.99, 8, False, (8, -127)),  # widened to [0, 0.99]: 253 levels, slack 2
    (-3.2, 5.1, 8, False, (4, -16)),
    (-0.5, 0.5, 16, False, (15, -1)),
    (2.0, 3.0, 8, False, (6, -97)),    # widened to [0, 3]: 192 steps, slack 63, zp = -128 + 31
])
def test_hand_computed(lo, hi, bits, sym, want):
    assert choose_qparams(lo, hi, bits, sym) == want


@pytest.mark.parametrize("seed", range(20))
@pytest.mark.parametrize("bits,sym", [(8, False), (8, True), (16, False), (12, True)])
def test_no_clipping_zero_exact_and_tight(seed, bits, sym):
    rng = np.random.RandomState(seed)
    lo, hi = sorted(rng.randn(2) * 10 ** rng.uniform(-3, 3))
    e, zp = choose_qparams(lo, hi, bits, sym)
    qmin, qmax = qrange(bits)
    ends = quantize(np.array([min(lo, 0), max(hi, 0)]), e, zp, bits)
    step = 2.0 ** -e
    # the range's ends land on the grid without saturating, within half a step
    assert np.all(np.abs(dequantize(ends, e, zp) - [min(lo, 0), max(hi, 0)]) <= step / 2 + 1e-12)
    assert quantize(np.array([0.0]), e, zp, bits)[0] == zp and qmin <= zp <= qmax
    # one step finer would not fit: the scale is the finest possible
    e2 = e + 1
    a, b = np.floor(np.ldexp([min(lo, 0), max(hi, 0)], e2) + 0.5)
    assert (b > qmax or a < qmin) if sym else (b - a > qmax - qmin)


def test_degenerate_ranges():
    assert choose_qparams(0.0, 0.0, 8, False) == (7, 0)
    assert choose_qparams(0.0, 0.0, 16, True) == (15, 0)
    assert choose_qparams(-1e-30, 1e-30, 8, False) == (7, 0)


def test_quantize_rounds_half_up_and_saturates():
    q = quantize(np.array([0.5, -0.5, 1.5, -1.5, 1000.0, -1000.0]), 0, 0, 8)
    assert q.tolist() == [1, 0, 2, -1, 127, -128]
    assert quantize(np.array([[1.0, 2.0], [1.0, 2.0]]), np.array([1, 2]), 0, 8).tolist() == \
        [[2, 4], [4, 8]]


def test_quantize_float32_ties_and_per_row_scales_exact():
    """float32 inputs just below and at each half step, and per-element scales, against exact
    rational arithmetic."""
    from fractions import Fraction

    half = np.float32(0.5) / np.float32(8)  # half a step of exp2_inv = 3
    x = np.array([half, np.nextafter(half, np.float32(0)), -half, 3 * half, 1e-30, -7.3],
                 np.float32)

    def exact(v, e, zp):
        return min(max(int((Fraction(float(v)) * Fraction(2)**int(e) + Fraction(1, 2)).__floor__()) + zp, -128), 127)

    assert quantize(x, 3, 5, 8).tolist() == [exact(v, 3, 5) for v in x]
    e = np.array([3, -2, 0, 7, 40, 1])
    assert quantize(x, e, 0, 8).tolist() == [exact(v, k, 0) for v, k in zip(x, e)]
    with pytest.raises(ValueError):
        quantize(x, e[:3], 0, 8)
