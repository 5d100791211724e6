"""The candidates the searching methods (mse, kl) choose among: power-of-two grids only.

A grid is (exp2_inv e, zero point zp): step s = 2^-e, covering [(qmin - zp) s, (qmax - zp) s].
Coarser than the finest grid that clips nothing (e0, the min/max rule) only adds rounding error,
so the exponents tried are e0 .. e0 + OCTAVES. Symmetric tensors have zp = 0. Asymmetric ones
try every zp when the score is O(1) (mse) or a coarse-to-fine walk over zp when it is not (kl).
Ties keep the coarser grid, and for one exponent the centred zero point of the min/max rule.
"""

from __future__ import annotations

from qtool.calibrators.base import NO_BOUND
from qtool.calibrators.histogram import HistogramObserver

from qtool.numerics.qparams import E_MAX, choose_qparams, qrange

OCTAVES = 16


class SearchObserver(HistogramObserver):
    """A histogram method whose parameters minimise `score` over the power-of-two grids."""

    # KL compares distributions bin by bin: a grid finer than the histogram's bins would see one
    # bin per window and score zero, so (as TVM's smallest window of one bin per level) steps
    # stay at least one bin wide.
    step_at_least_bin = False
    search = None  # staticmethod(njit(counts, start, w, e_lo, e_hi, qmin, qmax, symmetric, zp0) -> (e, zp))

    def compute_params(self, bits: int, symmetric: bool, bound: tuple[float, float] = NO_BOUND
                       ) -> tuple[int, int]:
        if self.empty:
            return choose_qparams(0.0, 0.0, bits, symmetric)
        counts, start, lo, hi = self.clamped(bound)
        e0, zp0 = choose_qparams(lo, hi, bits, symmetric)
        if counts.sum() == 0 or max(-lo, hi) == 0.0:
            return e0, zp0
        qmin, qmax = qrange(bits)
        e_hi = min(E_MAX, e0 + OCTAVES)
        if self.step_at_least_bin:
            e_hi = max(e0, min(e_hi, -self.hist.w))
        e, zp = self.search(counts, start, self.hist.w, e0, e_hi,
                                  qmin, qmax, symmetric, zp0)
        return int(e), int(zp)
