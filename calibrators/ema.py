"""The EMA dynamic range (docs/calibration.md): per time step,
`min = 0.9 * min_old + 0.1 * min_cur` (same for max).

The EMA runs over the time steps of each batch in order and carries on into the next batch.
Merging two observers averages their states weighted by the steps each saw: exact for the
min/max union it is not, and the docs say so; it is order-independent.
"""

from __future__ import annotations

import numpy as np
from qtool.calibrators.base import Observer

MOMENTUM = 0.9


class EmaObserver(Observer):
    def __init__(self) -> None:
        self.lo = 0.0
        self.hi = 0.0
        self.steps = 0

    def observe(self, values: np.ndarray) -> None:
        if values.size == 0:
            return
        flat = values.reshape(values.shape[0], -1)
        lo_cur, hi_cur = flat.min(axis=1), flat.max(axis=1)
        for t in range(flat.shape[0]):
            if self.steps == 0:
                self.lo, self.hi = float(lo_cur[t]), float(hi_cur[t])
            else:
                self.lo = MOMENTUM * self.lo + (1 - MOMENTUM) * float(lo_cur[t])
                self.hi = MOMENTUM * self.hi + (1 - MOMENTUM) * float(hi_cur[t])
            self.steps += 1

    def merge(self, other: Observer) -> Observer:
        out = EmaObserver()
        total = self.steps + other.steps
        if total:
            out.lo = (self.lo * self.steps + other.lo * other.steps) / total
            out.hi = (self.hi * self.steps + other.hi * other.steps) / total
        out.steps = total
        return out

    def range(self) -> tuple[float, float]:
        return self.lo, self.hi

    @property
    def empty(self) -> bool:
        return self.steps == 0
