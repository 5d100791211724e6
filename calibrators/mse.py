"""MSE: the power-of-two grid that minimises the squared quantization error of the observed
distribution, rounding and clipping together.

The histogram's density is taken as uniform inside each bin. Bins and grids are both aligned at 0
with power-of-two widths, so a bin is either inside one rounding cell (width <= s/2) or a whole
number of cells (width >= s): the error of every bin is then exact, not sampled at its centre.
Prefix sums make each candidate O(1), so every zero point of every exponent is tried.
"""

from __future__ import annotations

import numba as nb
import numpy as np

from calibrators.search import SearchObserver


@nb.njit(cache=True)
def _piece(a: float, b: float, c: float) -> float:
    """Integral over [a, b] of (v - c)^2."""
    da, db = a - c, b - c
    return (b - a) * (da * da + da * db + db * db) / 3.0


@nb.njit(cache=True)
def bin_error(a: float, b: float, n: float, L: float, H: float, s: float, fine: bool) -> float:
    """Squared error of n values spread uniformly over [a, b] on the grid of step s clipped to
    [L, H] (values below L become L, above H become H)."""
    if n == 0.0:
        return 0.0
    err = 0.0
    if a < L:
        err += _piece(a, min(b, L), L)
    if b > H:
        err += _piece(max(a, H), b, H)
    lo, hi = max(a, L), min(b, H)
    if hi > lo:
        if fine:  # the bin lies inside one rounding cell
            err += _piece(lo, hi, np.floor(0.5 * (lo + hi) / s + 0.5) * s)
        else:     # whole cells: the classic s^2 / 12 per unit
            err += (hi - lo) * s * s / 12.0
    return err * n / (b - a)


@nb.njit(cache=True)
def grid_error(counts, start, w, e, zp, qmin, qmax) -> float:
    """Reference evaluation of one grid, bin by bin (the search below does the same in O(1))."""
    bw, s = 2.0**w, 2.0**-e
    L, H = (qmin - zp) * s, (qmax - zp) * s
    err = 0.0
    for i in range(counts.size):
        a = (start + i) * bw
        err += bin_error(a, a + bw, counts[i], L, H, s, bw <= 0.5 * s)
    return err


@nb.njit(cache=True)
def _mse_search(counts, start, w, e_lo, e_hi, qmin, qmax, symmetric, zp0):
    n = counts.size
    bw = 2.0**w
    P0, P1, P2 = np.zeros(n + 1), np.zeros(n + 1), np.zeros(n + 1)
    for i in range(n):  # moments of each bin's uniform mass: count, sum v, sum v^2
        a = (start + i) * bw
        b = a + bw
        P0[i + 1] = P0[i] + counts[i]
        P1[i + 1] = P1[i] + counts[i] * 0.5 * (a + b)
        P2[i + 1] = P2[i] + counts[i] * (a * a + a * b + b * b) / 3.0
    R = np.zeros(n + 1)
    best, best_e, best_zp = np.inf, e_lo, zp0
    for e in range(e_lo, e_hi + 1):
        s = 2.0**-e
        fine = bw <= 0.5 * s
        for i in range(n):  # rounding error of whole inside bins depends on e only
            a = (start + i) * bw
            R[i + 1] = R[i] + bin_error(a, a + bw, counts[i], -np.inf, np.inf, s, fine)
        for k in range(1 if symmetric else qmax - qmin + 2):  # zp0, then every zp of the range
            zp = zp0 if k == 0 else qmin + k - 1
            L, H = (qmin - zp) * s, (qmax - zp) * s
            iL = min(max(np.floor(L / bw) - start, -1.0), float(n))
            iH = min(max(np.floor(H / bw) - start, -1.0), float(n))
            jL, jH = int(iL), int(iH)
            below = min(max(jL, 0), n)
            err = P2[below] - 2.0 * L * P1[below] + L * L * P0[below]
            a0 = min(max(jH + 1, 0), n)
            err += (P2[n] - P2[a0]) - 2.0 * H * (P1[n] - P1[a0]) + H * H * (P0[n] - P0[a0])
            i0 = min(max(jL + 1, 0), n)
            if jH > i0:
                err += R[min(jH, n)] - R[i0]
            for j in (jL, jH):
                if 0 <= j < n and (j == jL or jH != jL):
                    a = (start + j) * bw
                    err += bin_error(a, a + bw, counts[j], L, H, s, fine)
            if err < best * (1.0 - 1e-12):
                best, best_e, best_zp = err, e, zp
    return best_e, best_zp


class MseObserver(SearchObserver):
    search = staticmethod(_mse_search)
