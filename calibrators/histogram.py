"""A histogram on a shared, growable grid: bins of width 2^w aligned at 0, so any two histograms
can be brought to a common grid (the coarser width) and added exactly. Merging is exact and does
not depend on batch order; only the bin width (the resolution) adapts to the data's span.

Exact zeros are also counted on their own (they stay in the bin [0, 2^w) too): every grid holds
0 exactly, so the searching methods take them out (`clamped`) rather than reading a spike of
zero-padded steps or silent frames as mass spread over the whole bin."""

from __future__ import annotations

import copy

import numba as nb
import numpy as np
from qtool.calibrators.base import Observer

MAX_BINS = 8192  # the resolution of TVM's 8001-bin KL histogram


@nb.njit(cache=True)
def _min_max_zeros(v: np.ndarray) -> tuple[float, float, int]:
    lo, hi, zeros = np.inf, -np.inf, 0
    for x in v:
        lo = min(lo, x)
        hi = max(hi, x)
        zeros += x == 0.0
    return lo, hi, zeros


@nb.njit(cache=True)
def _bin_counts(v: np.ndarray, inv_width: float, start: int, counts: np.ndarray) -> None:
    """counts[floor(x / 2^w) - start] += 1; inv_width = 2^-w makes the division exact."""
    for x in v:
        counts[int(np.floor(x * inv_width)) - start] += 1


class Histogram:
    def __init__(self, width_exp: int | None = None) -> None:
        self.w = width_exp  # bin width 2^w; None until the first value
        self.start = 0      # index of counts[0] on the grid: bin i covers [i, i+1) * 2^w
        self.counts = np.zeros(0, np.int64)
        self.lo, self.hi = np.inf, -np.inf  # exact extremes, kept beside the bins
        self.zeros = 0  # values exactly 0 (also inside counts)

    @property
    def total(self) -> int:
        return int(self.counts.sum())

    def _coarsen(self, w: int) -> None:
        """Re-bin onto width 2^w (w >= self.w): adjacent aligned bins add up exactly."""
        if self.w is None or w <= self.w or self.counts.size == 0:
            self.w = w if self.w is None or self.counts.size == 0 else max(self.w, w)
            return
        # floor(i / 2^s) as an arithmetic shift: s may exceed 63 (bins of 2^-40 merged with bins
        # of 2^90 when data reach 1e30), where 2^s is no int64 and every index becomes 0 or -1
        idx = np.right_shift(np.arange(self.start, self.start + self.counts.size, dtype=np.int64),
                             min(w - self.w, 63))
        new_start = int(idx[0])
        self.counts = np.bincount(idx - new_start, weights=self.counts,
                                  minlength=int(idx[-1]) - new_start + 1).astype(np.int64)
        self.start, self.w = new_start, w

    def _span_exp(self, lo: float, hi: float) -> int:
        """Smallest width exponent for which [lo, hi] needs at most MAX_BINS bins. A constant
        (or nearly constant) span counts as 2^-40 of its magnitude, at least 2^-1000: 2^-w stays
        a finite double and every bin index stays far inside int64."""
        span = max(hi - lo, max(abs(lo), abs(hi)) * 2.0**-40, 2.0**-1000)
        w = int(np.ceil(np.log2(span / (MAX_BINS - 2))))
        while np.floor(hi / 2.0**w) - np.floor(lo / 2.0**w) + 1 > MAX_BINS:
            w += 1
        return w

    def add(self, values: np.ndarray) -> None:
        v = np.ascontiguousarray(values).ravel()
        if v.size == 0:
            return
        vlo, vhi, zeros = _min_max_zeros(v)
        vlo, vhi = float(vlo), float(vhi)
        self.zeros += int(zeros)
        self.lo, self.hi = min(self.lo, vlo), max(self.hi, vhi)
        lo, hi = vlo, vhi
        if self.counts.size:
            lo = min(lo, self.start * 2.0**self.w)
            hi = max(hi, (self.start + self.counts.size) * 2.0**self.w)
        self._coarsen(self._span_exp(lo, hi) if self.w is None else max(self.w, self._span_exp(lo, hi)))
        inv = 2.0**-self.w
        start = int(np.floor(vlo * inv))
        counts = np.zeros(int(np.floor(vhi * inv)) - start + 1, np.int64)
        _bin_counts(v, inv, start, counts)
        self._add_counts(start, counts)

    def _add_counts(self, start: int, counts: np.ndarray) -> None:
        if self.counts.size == 0:
            self.start, self.counts = start, counts.astype(np.int64)
            return
        new_start = min(self.start, start)
        end = max(self.start + self.counts.size, start + counts.size)
        out = np.zeros(end - new_start, np.int64)
        out[self.start - new_start:self.start - new_start + self.counts.size] += self.counts
        out[start - new_start:start - new_start + counts.size] += counts
        self.start, self.counts = new_start, out

    def merge(self, other: Histogram) -> Histogram:
        out = Histogram()
        if self.w is None and other.w is None:
            return out
        parts = [h for h in (self, other) if h.counts.size]
        w = max(h.w for h in parts)
        lo = min(h.start * 2.0**h.w for h in parts)
        hi = max((h.start + h.counts.size) * 2.0**h.w for h in parts)
        w = max(w, out._span_exp(lo, hi))
        for h in parts:
            c = Histogram(h.w)
            c.start, c.counts = h.start, h.counts.copy()
            c._coarsen(w)
            out.w = w
            out._add_counts(c.start, c.counts)
        out.lo, out.hi = min(self.lo, other.lo), max(self.hi, other.hi)
        out.zeros = self.zeros + other.zeros
        return out

    def edges(self) -> np.ndarray:
        return (self.start + np.arange(self.counts.size + 1)) * 2.0**self.w

    def quantile(self, q: float) -> float:
        """The value below which a share q of the counts lies (linear inside the bin)."""
        cum = np.cumsum(self.counts)
        target = q * cum[-1]
        i = int(np.searchsorted(cum, target, side="left"))
        i = min(i, self.counts.size - 1)
        before = cum[i - 1] if i > 0 else 0
        frac = (target - before) / self.counts[i] if self.counts[i] else 0.0
        e = self.edges()
        return float(e[i] + frac * (e[i + 1] - e[i]))


class HistogramObserver(Observer):
    """Base of the histogram methods: observing and merging are the histogram's (exact, order
    free); subclasses only choose parameters from the counts."""

    def __init__(self) -> None:
        self.hist = Histogram()

    def observe(self, values: np.ndarray) -> None:
        self.hist.add(values)

    def merge(self, other: Observer) -> Observer:
        out = copy.copy(self)
        out.hist = self.hist.merge(other.hist)
        return out

    def range(self) -> tuple[float, float]:
        return (0.0, 0.0) if self.empty else (self.hist.lo, self.hist.hi)

    @property
    def empty(self) -> bool:
        return self.hist.counts.size == 0

    def clamped(self, bound: tuple[float, float]) -> tuple[np.ndarray, int, float, float]:
        """(counts as float64, start, lo, hi) with the mass beyond `bound` moved into the bins at
        the bound: values the LUTs saturate anyway cost nothing wherever they are clipped.
        Exact zeros inside the bound are left out: every grid represents them without error, so
        they are no evidence for any grid (kept in, a spike of them drives kl to a grid so fine
        that 0's level holds one bin, clipping the rest)."""
        h = self.hist
        counts = h.counts.astype(np.float64)
        if h.zeros and bound[0] <= 0.0 <= bound[1]:
            counts[-h.start] -= h.zeros
        lo, hi = max(h.lo, bound[0]), min(h.hi, bound[1])
        i0, i1 = np.clip(np.floor(np.array([lo, hi]) / 2.0**h.w).astype(np.int64) - h.start, 0, counts.size - 1)
        counts[i0] += counts[:i0].sum()
        counts[i1] += counts[i1 + 1:].sum()
        return counts[i0:i1 + 1], h.start + int(i0), lo, hi
