"""Which lane type the CPU engine's integer cell may use for a model (qtool.numerics.lanes): int32 only
where every value the cell computes provably fits, so that the integers never change.

The proof is the exported C's (`qtool.numerics.interval`: interval arithmetic over every statement of
`intops.gru_cell`, shift counts included), plus the engine's own constants stored as int32: its
GEMM compensation, the tables, and the bias terms, which the engine rounds once per channel as
the C does (`fold_bias_shifts`; a 32-bit bias shifted right by 34 does not fit int32 lanes).
"""

from __future__ import annotations

import numpy as np

from qtool.numerics.interval import cell_statements
from qtool.numerics.intops import rshift_round_all
from qtool.numerics.rescale import CH_QBR, CH_QBX, CH_SH_BR, CH_SH_BX

I32_MAX = 2**31 - 1


def fold_bias_shifts(CH: np.ndarray) -> np.ndarray:
    """CH with each bias q_b replaced by rshift_round(q_b, sh_b) and its shift by 0: the cell's
    bias terms rshift_round(q_b', 0) = q_b' are then the same integers, computed once."""
    CH = CH.copy()
    for q_row, sh_row in ((CH_QBX, CH_SH_BX), (CH_QBR, CH_SH_BR)):
        CH[q_row] = rshift_round_all(CH[q_row].astype(np.int64), CH[sh_row].astype(np.int64))
        CH[sh_row] = 0
    return CH


def cell_lane_type(cq, CH: np.ndarray, luts: list[np.ndarray]) -> type:
    """np.int32 when every value `intops.gru_cell` (and the engine's Wx rescale) computes for
    this cell fits int32, else np.int64. `CH`: the engine's channel constants (its GEMM
    compensation, its folded biases), `luts`: the three tables; both must fit too."""
    consts = [cq.P, CH, *luts]
    if any(c.size and not -I32_MAX - 1 <= int(c.min()) <= int(c.max()) <= I32_MAX for c in consts):
        return np.int64
    if any(s.bits != 32 for s in cell_statements(cq, offset=False).values()):
        return np.int64
    return np.int32
