"""The P_zero prediction ("precision speculation", docs/advisor.md), exactly as specified there.

The quantization step follows the outliers, the bulk N(mu, sigma) decides the damage:

    Delta  = 2 M / (2^bits - 1)
    P_zero = erf(Delta / (2 sqrt(2) sigma))          share of the bulk that rounds to zero
    SNR    = -20 log10(P1 + P2 - P1 P2)              an inner product of two such vectors

A zeroed element contributes nothing, so P_zero is taken as the relative error of a vector; a
tensor that is no operand of a product gets the one-vector form `-20 log10(P_zero)` (P2 = 0).
As specified, P_zero centres the bulk at 0 (P(|x| < Delta / 2) for N(0, sigma)); so does this.
"""

from __future__ import annotations

import math

from qtool.calibrators.sampled import BulkStats
from qtool.core.model import HASTE, CellForm

# The products of the GRU cell: output tensor -> its two operands. "one_minus_z" is (1 - z),
# computed on z_out's grid.
PRODUCTS = {
    "Wx": ("W", "x"),
    "Rh": ("R", "h"),
    "rRh": ("r_out", "Rh_add_br"),
    "old_contrib": ("z_out", "h"),
    "new_contrib": ("one_minus_z", "g_out"),
}
OPERAND_BITS = {"one_minus_z": "z_out"}  # whose bits an operand takes
# A reset-before cell's products: rh = r * h_old, and R's g rows multiply rh (Rh is then both
# R h and R rh); no Rh_add_br or rRh.
PRODUCTS_RESET_BEFORE = (("Wx", ("W", "x")), ("Rh", ("R", "h")), ("Rh", ("R", "rh")), ("rh", ("r_out", "h")),
                         ("old_contrib", ("z_out", "h")), ("new_contrib", ("one_minus_z", "g_out")))


def products(form: CellForm = HASTE) -> tuple[tuple[str, tuple[str, str]], ...]:
    """The products of a cell of this form: (output tensor, its two operands), a tensor once per
    product it is the output of."""
    return tuple(PRODUCTS.items()) if form.reset_after else PRODUCTS_RESET_BEFORE


def delta(M: float, bits: int) -> float:
    return 2.0 * M / ((1 << bits) - 1)


def p_zero(s: BulkStats, bits: int) -> float:
    """The share of the bulk N(0, sigma) that rounds to zero on the step of `bits` bits."""
    d = delta(s.M, bits)
    if s.sigma == 0.0:
        return 0.0 if d == 0.0 else 1.0
    return math.erf(d / (2.0 * math.sqrt(2.0) * s.sigma))


def snr_db(p1: float, p2: float = 0.0) -> float:
    """-20 log10(P1 + P2 - P1 P2): an inner product of vectors with zeroing shares P1, P2."""
    p = p1 + p2 - p1 * p2
    return math.inf if p <= 0.0 else -20.0 * math.log10(p)


def one_minus(s: BulkStats) -> BulkStats:
    """The statistics of 1 - z from those of z (the same sigma, mirrored values)."""
    lo, hi = 1.0 - s.hi, 1.0 - s.lo
    return BulkStats(1.0 - s.mu, s.sigma, max(-lo, hi), lo, hi, 1.0 - s.mean,
                     1.0 - 2.0 * s.mean + s.mean_square, s.n_sample, s.n)


def operand_stats(stats: dict[str, BulkStats], name: str) -> BulkStats:
    return one_minus(stats["z_out"]) if name == "one_minus_z" else stats[name]


def product_snr_db(stats: dict[str, BulkStats], bits: dict[str, int], operands: tuple[str, str]) -> float:
    return snr_db(*(p_zero(operand_stats(stats, n), bits[OPERAND_BITS.get(n, n)]) for n in operands))


def tensor_snr_db(stats: dict[str, BulkStats], bits: dict[str, int], name: str, form: CellForm = HASTE) -> float:
    """The P_zero prediction's SNR of one tensor of a cell: the product formula for the outputs
    of products (the lowest, for a tensor of two), the one-vector formula for every other tensor."""
    if form.reset_after and name in PRODUCTS:
        a, b = PRODUCTS[name]
        return snr_db(*(p_zero(operand_stats(stats, n), bits[OPERAND_BITS.get(n, n)]) for n in (a, b)))
    pairs = [ops for t, ops in products(form) if t == name]
    if pairs:
        return min(product_snr_db(stats, bits, ops) for ops in pairs)
    return snr_db(p_zero(stats[name], bits[name]))
