"""Min/max: the running union of every value seen. Merging is exact."""

from __future__ import annotations

import numpy as np
from qtool.calibrators.base import Observer


class MinMaxObserver(Observer):
    def __init__(self) -> None:
        self.lo = np.inf
        self.hi = -np.inf

    def observe(self, values: np.ndarray) -> None:
        if values.size:
            self.lo = min(self.lo, float(values.min()))
            self.hi = max(self.hi, float(values.max()))

    def merge(self, other: Observer) -> Observer:
        out = MinMaxObserver()
        out.lo, out.hi = min(self.lo, other.lo), max(self.hi, other.hi)
        return out

    def range(self) -> tuple[float, float]:
        if self.empty:
            return 0.0, 0.0
        return self.lo, self.hi

    @property
    def empty(self) -> bool:
        return self.lo > self.hi
