"""Distance between the integer GRU (dequantized) and the float GRU, accumulated over batches."""

from __future__ import annotations

import math

import numpy as np
from numba import njit
from numba.extending import register_jitable

from qtool.engine.simd import f64_bits, f64_from_bits

LOW_SNR_DB = 10.0  # below this output SNR the bits are too few for the model (calibrate and simulate say so)


def coarse_bits_note(snr_db: float, held: str, bits: str | None) -> str | None:
    """What calibrate says when the best calibration it found is below LOW_SNR_DB on held-out
    data: the grids are not what is wrong, the bits are; None otherwise."""
    if snr_db >= LOW_SNR_DB:
        return None
    coarse = f"{bits} is" if bits else "these bits are"
    return (f"the integer model's output SNR on {held} is {snr_db:.1f} dB at best: {coarse} too coarse for this "
            "model; try --bits w8a16, or `qtool advise` to choose the bits per tensor")

# the columns of a statistics row, as the engines accumulate them (named as Distance's fields;
# STAT_MAX_ABS is a maximum, the others sums), and their indexes STAT_<NAME>
STATS = ("ref2", "err2", "dot", "q2", "max_abs", "count", "saturated")
STAT_REF2, STAT_ERR2, STAT_DOT, STAT_Q2, STAT_MAX_ABS, STAT_COUNT, STAT_SATURATED = range(len(STATS))
# a tensor's grid as the engines read it: zero point, scale 2^-exp2_inv, and the reference
# values below LO_CLIP or from HI_CLIP up that the grid clips (see count_clipped)
GRID = ("zp", "scale", "lo_clip", "hi_clip")
GRID_ZP, GRID_SCALE, GRID_LO_CLIP, GRID_HI_CLIP = range(len(GRID))


class Distance:
    """SNR, cosine, max abs error and share of saturated values; `add` batches, `merge` partials."""

    def __init__(self) -> None:
        self.ref2 = self.err2 = self.dot = self.q2 = 0.0
        self.max_abs = 0.0
        self.count = 0
        self.saturated = 0

    def add(self, quant: np.ndarray, ref: np.ndarray, saturated: int = 0) -> None:
        q = np.asarray(quant, np.float64).ravel()
        r = np.asarray(ref, np.float64).ravel()
        e = q - r
        self.ref2 += float(r @ r)
        self.err2 += float(e @ e)
        self.dot += float(q @ r)
        self.q2 += float(q @ q)
        self.max_abs = max(self.max_abs, float(np.abs(e).max(initial=0.0)))
        self.count += r.size
        self.saturated += int(saturated)

    @classmethod
    def of_stats(cls, rows) -> Distance:
        """The distance of rows of engine statistics (columns STATS), added in order."""
        out = cls()
        for row in rows:
            out.ref2 += float(row[STAT_REF2])
            out.err2 += float(row[STAT_ERR2])
            out.dot += float(row[STAT_DOT])
            out.q2 += float(row[STAT_Q2])
            out.max_abs = max(out.max_abs, float(row[STAT_MAX_ABS]))
            out.count += int(row[STAT_COUNT])
            out.saturated += int(row[STAT_SATURATED])
        return out

    def merge(self, other: Distance) -> Distance:
        out = Distance()
        for k in (c for c in STATS if c != "max_abs"):  # the sums
            setattr(out, k, getattr(self, k) + getattr(other, k))
        out.max_abs = max(self.max_abs, other.max_abs)
        return out

    @property
    def snr_db(self) -> float:
        if self.err2 == 0.0:
            return math.inf
        if self.ref2 == 0.0:
            return -math.inf
        return 10.0 * math.log10(self.ref2 / self.err2)

    @property
    def cosine(self) -> float:
        denom = math.sqrt(self.ref2 * self.q2)
        if denom == 0.0:
            return 1.0 if self.ref2 == self.q2 else 0.0
        return self.dot / denom

    def as_dict(self) -> dict:
        """JSON-ready: an exact result (no error at all) has snr_db None and exact True."""
        return {
            "snr_db": finite_or_none(self.snr_db), "exact": self.err2 == 0.0 and self.count > 0,
            "cosine": self.cosine, "max_abs_error": self.max_abs,
            "saturated": self.saturated / self.count if self.count else 0.0, "count": self.count,
        }


def finite_or_none(v: float) -> float | None:
    return v if math.isfinite(v) else None


def grid_row(exp2_inv: int, zp: int, bits: int) -> np.ndarray:
    """The GRID row of a per-tensor quantization (the thresholds of count_clipped)."""
    qmin, qmax = -(1 << (bits - 1)), (1 << (bits - 1)) - 1
    s = np.ldexp(1.0, -int(exp2_inv))
    return np.array([zp, s, (qmin - zp - 0.5) * s, (qmax - zp + 0.5) * s], np.float64)


@register_jitable
def dequantized(q, offset, scale):
    """(q - offset) * scale in float64, offset = zero point (+ the GEMM view's shift): exact for
    every integer of up to 16 bits."""
    return (np.float64(q) - offset) * scale


@register_jitable
def clipped(r, lo, hi):
    """Whether the grid clips the reference value r: r < lo or r >= hi (GRID's lo_clip and
    hi_clip, as count_clipped)."""
    return (r < lo) | (r >= hi)


@njit(nogil=True, cache=True, fastmath=True, noalias=True)
def add_row(q, shift, f, grid, st):
    """Accumulate the distance between integers `q - shift` (dequantized on `grid`) and the
    float reference `f` into the statistics row `st`, in float64 as Distance.add does.

    fastmath lets the compiler keep several partial sums (a different order of float64
    additions, nothing else); the values themselves are exact float64 products.
    """
    offset, scale, lo, hi = shift + grid[GRID_ZP], grid[GRID_SCALE], grid[GRID_LO_CLIP], grid[GRID_HI_CLIP]
    ref2 = err2 = dot = q2 = 0.0
    mx = f64_bits(st[STAT_MAX_ABS])  # |errors| >= 0: their maximum as an integer maximum of bit patterns
    n_clipped = 0
    for k in range(f.shape[0]):
        qd = dequantized(q[k], offset, scale)
        r = np.float64(f[k])
        e = qd - r
        ref2 += r * r
        err2 += e * e
        dot += qd * r
        q2 += qd * qd
        mx = max(mx, f64_bits(abs(e)))
        n_clipped += clipped(r, lo, hi)
    st[STAT_REF2] += ref2
    st[STAT_ERR2] += err2
    st[STAT_DOT] += dot
    st[STAT_Q2] += q2
    st[STAT_MAX_ABS] = f64_from_bits(mx)
    st[STAT_COUNT] += f.shape[0]
    st[STAT_SATURATED] += n_clipped


def count_clipped(ref: np.ndarray, exp2_inv, zp: int, bits: int) -> int:
    """Reference values the grid clips: rounding half up gives q < qmin or q > qmax exactly for
    x < (qmin - zp - 1/2) s or x >= (qmax - zp + 1/2) s. (Values at the grid's ends, such as the
    exact zeros of a ReLU-fed input whose grid starts at 0, are not clipped.) `exp2_inv` may be
    per row of `ref`."""
    qmin, qmax = -(1 << (bits - 1)), (1 << (bits - 1)) - 1
    s = np.ldexp(1.0, -np.asarray(exp2_inv, np.int64))
    if s.ndim:
        s = s.reshape(-1, *([1] * (np.ndim(ref) - 1)))
    ref = np.asarray(ref)
    return int(np.count_nonzero((ref < (qmin - zp - 0.5) * s) | (ref >= (qmax - zp + 0.5) * s)))
