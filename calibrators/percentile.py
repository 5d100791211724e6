"""Percentile: clip the range to the given two-sided percentile of the observed values
(`--percentile 99.99` keeps [0.005%, 99.995%] of the mass), from a mergeable histogram.
Results are approximate to one histogram bin (at most twice span / MAX_BINS)."""

from __future__ import annotations

from qtool.calibrators.histogram import HistogramObserver

DEFAULT_PERCENTILE = 99.99


class PercentileObserver(HistogramObserver):
    def __init__(self, percentile: float = DEFAULT_PERCENTILE) -> None:
        super().__init__()
        self.percentile = percentile

    def range(self) -> tuple[float, float]:
        if self.empty:
            return 0.0, 0.0
        tail = (100.0 - self.percentile) / 200.0
        return self.hist.quantile(tail), self.hist.quantile(1.0 - tail)
