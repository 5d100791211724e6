"""A histogram on a shared, growable grid: bins of width 2^w aligned at 0, so any two histograms
can be brought to a common grid (the coarser width) and added exactly. Merging is exact and does
not depend on batch order; only the bin width (the resolution) adapts to the data's span."""

from __future__ import annotations

import numpy as np

MAX_BINS = 4096


class Histogram:
    def __init__(self, width_exp: int | None = None) -> None:
        self.w = width_exp  # bin width 2^w; None until the first value
        self.start = 0      # index of counts[0] on the grid: bin i covers [i, i+1) * 2^w
        self.counts = np.zeros(0, np.int64)

    @property
    def total(self) -> int:
        return int(self.counts.sum())

    def _coarsen(self, w: int) -> None:
        """Re-bin onto width 2^w (w >= self.w): adjacent aligned bins add up exactly."""
        if self.w is None or w <= self.w or self.counts.size == 0:
            self.w = w if self.w is None or self.counts.size == 0 else max(self.w, w)
            return
        f = 1 << (w - self.w)
        idx = np.floor_divide(np.arange(self.start, self.start + self.counts.size), f)
        new_start = int(idx[0])
        self.counts = np.bincount(idx - new_start, weights=self.counts,
                                  minlength=int(idx[-1]) - new_start + 1).astype(np.int64)
        self.start, self.w = new_start, w

    def _span_exp(self, lo: float, hi: float) -> int:
        """Smallest width exponent for which [lo, hi] needs at most MAX_BINS bins."""
        span = max(hi - lo, np.finfo(np.float64).tiny)
        w = int(np.ceil(np.log2(span / (MAX_BINS - 2))))
        while np.floor(hi / 2.0**w) - np.floor(lo / 2.0**w) + 1 > MAX_BINS:
            w += 1
        return w

    def add(self, values: np.ndarray) -> None:
        v = np.asarray(values, np.float64).ravel()
        if v.size == 0:
            return
        lo, hi = float(v.min()), float(v.max())
        if self.counts.size:
            lo = min(lo, self.start * 2.0**self.w)
            hi = max(hi, (self.start + self.counts.size) * 2.0**self.w)
        self._coarsen(self._span_exp(lo, hi) if self.w is None else max(self.w, self._span_exp(lo, hi)))
        idx = np.floor(v / 2.0**self.w).astype(np.int64)
        self._add_counts(int(idx.min()), np.bincount(idx - idx.min()))

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
