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
from qtool.calibrators.search import SearchObserver


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
def _bin_of(v: float, bw: float, start: int, n: int) -> int:
    """The bin holding v, -1 below the histogram, n above it."""
    return int(min(max(np.floor(v / bw) - start, -1.0), float(n)))


@nb.njit(cache=True)
def _below(P0, P1, P2, jL: int, L: float) -> float:
    """Clipping error of the whole bins below bin jL (which holds L): all clipped to L."""
    k = min(max(jL, 0), P0.size - 1)
    return P2[k] - 2.0 * L * P1[k] + L * L * P0[k]


@nb.njit(cache=True)
def _above(P0, P1, P2, jH: int, H: float) -> float:
    """Clipping error of the whole bins above bin jH (which holds H): all clipped to H."""
    n = P0.size - 1
    k = min(max(jH + 1, 0), n)
    return (P2[n] - P2[k]) - 2.0 * H * (P1[n] - P1[k]) + H * H * (P0[n] - P0[k])


@nb.njit(cache=True)
def _zp_error(counts, P0, P1, P2, R, start, bw, L, H, s, fine) -> float:
    """The grid's error in O(1): clipped whole bins, whole bins inside, the two bins at L, H."""
    n = counts.size
    jL, jH = _bin_of(L, bw, start, n), _bin_of(H, bw, start, n)
    err = _below(P0, P1, P2, jL, L) + _above(P0, P1, P2, jH, H)
    i0 = min(max(jL + 1, 0), n)
    if jH > i0:
        err += R[min(jH, n)] - R[i0]
    for j in (jL, jH):
        if 0 <= j < n and (j == jL or jH != jL):
            a = (start + j) * bw
            err += bin_error(a, a + bw, counts[j], L, H, s, fine)
    return err


ZP_BLOCK = 256  # zero points bounded together: a block that cannot win is skipped


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
        err = _zp_error(counts, P0, P1, P2, R, start, bw, (qmin - zp0) * s, (qmax - zp0) * s, s, fine)
        if err < best * (1.0 - 1e-12):
            best, best_e, best_zp = err, e, zp0
        for z1 in range(qmin, (qmin - 1) if symmetric else (qmax + 1), ZP_BLOCK):
            z2 = min(z1 + ZP_BLOCK - 1, qmax)
            # every term of a grid's error is >= 0; as zp grows, L and H move down: the clipping
            # below L only shrinks, the clipping above H only grows. No zp of [z1, z2] has less
            # than the one at z2 plus the other at z1 (less a margin for rounding)
            L, H = (qmin - z2) * s, (qmax - z1) * s
            bound = _below(P0, P1, P2, _bin_of(L, bw, start, n), L) + _above(P0, P1, P2, _bin_of(H, bw, start, n), H)
            if bound - 1e-9 * (P2[n] + (L * L + H * H) * P0[n]) >= best:
                continue
            for zp in range(z1, z2 + 1):
                err = _zp_error(counts, P0, P1, P2, R, start, bw, (qmin - zp) * s, (qmax - zp) * s, s, fine)
                if err < best * (1.0 - 1e-12):
                    best, best_e, best_zp = err, e, zp
    return best_e, best_zp


class MseObserver(SearchObserver):
    search = staticmethod(_mse_search)
