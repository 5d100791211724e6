"""Distance between the integer GRU (dequantized) and the float GRU, accumulated over batches."""

from __future__ import annotations

import math

import numpy as np


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

    def merge(self, other: Distance) -> Distance:
        out = Distance()
        for k in ("ref2", "err2", "dot", "q2", "count", "saturated"):
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
