"""KL: the entropy method of MXNet/TensorRT as TVM's `kl_divergence` calibration does it,
restricted to power-of-two grids.

For a candidate grid, P is the observed histogram inside the grid with the clipped mass added to
its end bins; Q spreads each quantization level's count evenly over that level's non-empty bins
(the information the integers keep); both get TVM's smoothing of empty bins (eps = 1e-4) and the
grid with the least KL(P || Q) wins. The candidates are the power-of-two grids themselves, so the
snap to a power of two is part of the search: both neighbours of the continuous optimum are
scored and the one that loses less is kept. As TVM's thresholds start at half the quantized
bins, a grid must put at least half its levels over the data (or hold all of it).
"""

from __future__ import annotations

import numba as nb
import numpy as np
from qtool.calibrators.search import SearchObserver

EPS = 1e-4
ZP_PROBES = 32  # asymmetric: zp on a coarse comb first, then halving steps around the best


@nb.njit(cache=True)
def _smoothed(x: float, zero: bool, eps1: float) -> float:
    return EPS if zero else x - eps1


@nb.njit(cache=True)
def _level(i: int, start: int, bw: float, s: float, fine: bool) -> float:
    """The group of bin i in Q: its quantization level (bins finer than a level), else itself."""
    return np.floor((start + i + 0.5) * bw / s + 0.5) if fine else float(i)


@nb.njit(cache=True)
def kl_divergence(counts, start, w, e, zp, qmin, qmax, p, q) -> float:
    """KL(P || Q) of one grid; `p` and `q` are scratch of counts.size."""
    bw, s = 2.0**w, 2.0**-e
    fine = bw <= 0.5 * s
    n = counts.size
    # inside bins: centre within [L, H] (exact: every quantity is a power of two times an integer)
    i0 = max(0, int(np.ceil((qmin - zp) * s / bw - 0.5)) - start)
    i1 = min(n - 1, int(np.floor((qmax - zp) * s / bw - 0.5)) - start)
    if i1 < i0:
        return np.inf
    # TVM scores thresholds of at least half the quantized bins: a grid whose data sits on a
    # handful of its levels (the rest clipped into them) has P ~ Q and a KL near 0 that means
    # nothing. So at least half the levels must lie over data, unless the grid holds all of it.
    if (i1 - i0 + 1) * bw < min(0.5 * (qmax - qmin + 1), n * bw / s) * s:
        return np.inf
    # P: the inside bins, with the clipped mass added to the end bins (a loop: a slice copy
    # compiles numba's shape-mismatch message, which took longer than the rest of the search)
    for k in range(i0, i1 + 1):
        p[k] = counts[k]
    p[i0] += counts[:i0].sum()
    p[i1] += counts[i1 + 1:].sum()
    # Q: each level's count (clipped mass excluded, as TVM) spread over its non-empty bins of P
    i = i0
    while i <= i1:
        key = _level(i, start, bw, s, fine)
        j, total, nnz = i, 0.0, 0
        while j <= i1 and _level(j, start, bw, s, fine) == key:
            total += counts[j]
            nnz += p[j] != 0.0
            j += 1
        for k in range(i, j):
            q[k] = total / nnz if p[k] != 0.0 else 0.0
        i = j
    p_zeros, q_zeros, p_sum, q_sum = 0, 0, 0.0, 0.0
    for k in range(i0, i1 + 1):
        p_zeros += p[k] == 0.0
        q_zeros += q[k] == 0.0
        p_sum += p[k]
        q_sum += q[k]
    m = i1 - i0 + 1
    if q_sum == 0.0:
        return np.inf
    p_eps1 = EPS * p_zeros / (m - p_zeros)
    q_eps1 = EPS * q_zeros / (m - q_zeros) if q_zeros < m else 0.0
    kl = 0.0
    for k in range(i0, i1 + 1):
        ps = _smoothed(p[k], p[k] == 0.0, p_eps1) / p_sum
        qs = _smoothed(q[k], q[k] == 0.0, q_eps1) / q_sum
        if qs <= 0.0:
            return np.inf
        kl += ps * np.log(ps / qs)
    return kl


@nb.njit(cache=True)
def _kl_search(counts, start, w, e_lo, e_hi, qmin, qmax, symmetric, zp0):
    p, q = np.zeros(counts.size), np.zeros(counts.size)
    best, best_e, best_zp = np.inf, e_lo, zp0
    for e in range(e_lo, e_hi + 1):
        e_best, e_zp = kl_divergence(counts, start, w, e, zp0, qmin, qmax, p, q), zp0
        if not symmetric:
            stride = max(1, (qmax - qmin + 1) // ZP_PROBES)
            for zp in range(qmin, qmax + 1, stride):
                d = kl_divergence(counts, start, w, e, zp, qmin, qmax, p, q)
                if d < e_best * (1.0 - 1e-12):
                    e_best, e_zp = d, zp
            while stride > 1:
                stride //= 2
                centre = e_zp
                for zp in (centre - stride, centre + stride):
                    if qmin <= zp <= qmax:
                        d = kl_divergence(counts, start, w, e, zp, qmin, qmax, p, q)
                        if d < e_best * (1.0 - 1e-12):
                            e_best, e_zp = d, zp
        if e_best < best * (1.0 - 1e-12):
            best, best_e, best_zp = e_best, e, e_zp
    return best_e, best_zp


class KlObserver(SearchObserver):
    step_at_least_bin = True
    search = staticmethod(_kl_search)
