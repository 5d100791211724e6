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
        return {
            "snr_db": self.snr_db, "cosine": self.cosine, "max_abs_error": self.max_abs,
            "saturated": self.saturated / self.count if self.count else 0.0, "count": self.count,
        }


def count_saturated(q: np.ndarray, bits: int) -> int:
    lo, hi = -(1 << (bits - 1)), (1 << (bits - 1)) - 1
    return int(np.count_nonzero((q == lo) | (q == hi)))
