"""Percentile: clip the range to the given two-sided percentile of the observed values
(`--percentile 99.99` keeps [0.005%, 99.995%] of the mass), from a mergeable histogram.
Results are approximate to one histogram bin (at most span / 4096)."""

from __future__ import annotations

import numpy as np

from calibrators.base import Observer
from calibrators.histogram import Histogram

DEFAULT_PERCENTILE = 99.99


class PercentileObserver(Observer):
    def __init__(self, percentile: float = DEFAULT_PERCENTILE) -> None:
        self.percentile = percentile
        self.hist = Histogram()

    def observe(self, values: np.ndarray) -> None:
        self.hist.add(values)

    def merge(self, other: Observer) -> Observer:
        out = PercentileObserver(self.percentile)
        out.hist = self.hist.merge(other.hist)
        return out

    def range(self) -> tuple[float, float]:
        if self.empty:
            return 0.0, 0.0
        tail = (100.0 - self.percentile) / 200.0
        return self.hist.quantile(tail), self.hist.quantile(1.0 - tail)

    @property
    def empty(self) -> bool:
        return self.hist.counts.size == 0
