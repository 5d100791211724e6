"""From a calibrated range to a power-of-two scale `2^-exp2_inv` and an integer zero point.

The rule (docs/numerics.md):
- the range is first widened to contain 0, so 0 is always exactly representable (q = zp);
- exp2_inv is the largest integer for which the whole range, rounded onto the grid, fits the
  integer type: no calibrated value is clipped because of rounding the scale;
- asymmetric: zp places the range inside [qmin, qmax], the unused levels split evenly around it;
- symmetric: zp = 0;
- a degenerate range (all zeros, or below half a step of the finest scale 2^-E_MAX) gets the
  grid of [-1, 1): exp2_inv = bits - 1, zp = 0, so the shifts derived from it stay ordinary.

Quantize: q = clamp(floor(x * 2^exp2_inv + 0.5) + zp), saturated before any conversion to an
integer type so that no input, however large, wraps; dequantize: x = (q - zp) * 2^-exp2_inv.
"""

from __future__ import annotations

import math

import numpy as np
from numba import njit

E_MIN, E_MAX = -24, 40  # scales from 2^24 down to 2^-40 cover every real tensor


def qrange(bits: int) -> tuple[int, int]:
    """The signed storage range of a `bits`-wide integer."""
    return -(1 << (bits - 1)), (1 << (bits - 1)) - 1


def round_half_up(v):
    """The one float-to-int rounding rule of qtool: floor(v + 0.5), in float64."""
    return np.floor(np.asarray(v, np.float64) + 0.5)


def _fits(lo: float, hi: float, e: int, bits: int, symmetric: bool) -> bool:
    qmin, qmax = qrange(bits)
    a, b = round_half_up(math.ldexp(lo, e)), round_half_up(math.ldexp(hi, e))
    if symmetric:
        return a >= qmin and b <= qmax
    return b - a <= qmax - qmin


def choose_qparams(lo: float, hi: float, bits: int, symmetric: bool) -> tuple[int, int]:
    """Return (exp2_inv, zp) for one range [lo, hi]."""
    lo, hi = min(float(lo), 0.0), max(float(hi), 0.0)
    amax = max(-lo, hi)
    if not math.isfinite(amax):
        raise ValueError("range is not finite")
    if math.ldexp(amax, E_MAX) < 0.5:  # rounds to zero even on the finest grid
        return bits - 1, 0
    width = amax if symmetric else hi - lo
    levels = (1 << (bits - 1)) - 1 if symmetric else (1 << bits) - 1
    e = min(E_MAX, max(E_MIN, math.floor(math.log2(levels / width)) + 2))
    while e > E_MIN and not _fits(lo, hi, e, bits, symmetric):
        e -= 1
    if not _fits(lo, hi, e, bits, symmetric):
        from qtool.errors import QtoolError

        top = math.ldexp((1 << (bits - 1)) - 1, -E_MIN)
        raise QtoolError(f"range [{lo:.3g}, {hi:.3g}] is wider than any {bits}-bit power-of-two grid "
                         f"holds (|x| up to {top:.3g}); check the data's scale")
    if symmetric:
        return e, 0
    qmin, qmax = qrange(bits)
    a, b = int(round_half_up(math.ldexp(lo, e))), int(round_half_up(math.ldexp(hi, e)))
    slack = (qmax - qmin) - (b - a)
    zp = qmin - a + slack // 2
    return e, int(min(max(zp, qmin), qmax))


def grid_range(exp2_inv: int, zp: int, bits: int) -> tuple[float, float]:
    """The real interval a grid represents: [(qmin - zp), (qmax - zp)] * 2^-exp2_inv."""
    qmin, qmax = qrange(bits)
    return math.ldexp(qmin - zp, -exp2_inv), math.ldexp(qmax - zp, -exp2_inv)


def quantize(x, exp2_inv, zp, bits: int) -> np.ndarray:
    """q = clamp(floor(x * 2^exp2_inv + 0.5) + zp); `exp2_inv` may be per row (a [rows] array
    for [rows] or [rows, cols] values)."""
    x = np.asarray(x)
    if x.dtype not in (np.float32, np.float64):
        x = x.astype(np.float64)
    e = np.asarray(exp2_inv, np.int64)
    if e.ndim and not (x.ndim in (1, 2) and x.shape[0] == e.size):
        raise ValueError(f"per-row exp2_inv {e.shape} does not match values {x.shape}")
    rows = x.reshape(e.size, -1)
    qmin, qmax = qrange(bits)
    # x * 2^e is exact in float64 (x is float32 or float64 far from its exponent limits)
    q = _quantize_rows(np.ascontiguousarray(rows), np.ldexp(1.0, e.reshape(-1)), zp, qmin, qmax)
    return q.reshape(x.shape)


@njit(cache=True)
def _quantize_rows(x, scale, zp, qmin, qmax):
    # saturate in float64, before the conversion to int64: a value beyond +-2^63 would wrap
    lo, hi = np.float64(qmin - zp), np.float64(qmax - zp)
    out = np.empty(x.shape, np.int64)
    for r in range(x.shape[0]):
        for c in range(x.shape[1]):
            v = np.floor(np.float64(x[r, c]) * scale[r] + 0.5)
            out[r, c] = np.int64(min(max(v, lo), hi)) + zp
    return out


def dequantize(q, exp2_inv, zp) -> np.ndarray:
    q = np.asarray(q, np.float64)
    e = np.asarray(exp2_inv, np.int64)
    if e.ndim == 1 and q.ndim == 2:
        e = e[:, None]
    return np.ldexp(q - zp, -e)
