"""The observer interface every calibration method implements (after PyTorch's observers)."""

from __future__ import annotations

import math
from abc import ABC, abstractmethod

import numpy as np

from qtool.numerics.qparams import choose_qparams

NO_BOUND = (-math.inf, math.inf)


class Observer(ABC):
    """Collects statistics of one tensor; values arrive time-major, `[T, ...]`."""

    @abstractmethod
    def observe(self, values: np.ndarray) -> None:
        """Add one batch of values (first axis: time step)."""

    @abstractmethod
    def merge(self, other: Observer) -> Observer:
        """Combine with another observer of the same method (other batches, files, processes)."""

    @abstractmethod
    def range(self) -> tuple[float, float]:
        """The calibrated range [lo, hi]."""

    def compute_params(self, bits: int, symmetric: bool, bound: tuple[float, float] = NO_BOUND
                       ) -> tuple[int, int]:
        """(exp2_inv, zp) for this tensor. Values beyond `bound` may be clipped for free (the
        LUTs saturate there). Methods that search over scales override this."""
        lo, hi = self.range()
        return choose_qparams(max(lo, bound[0]), min(hi, bound[1]), bits, symmetric)

    @property
    def empty(self) -> bool:
        return False
