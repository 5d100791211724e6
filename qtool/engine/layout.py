"""What every engine shares: the rows of the per-step buffers and the tensors they measure, the
levels of work, the exact arithmetic of a GEMM from its bound, the input's quantization and the
result of one batch."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from qtool.core.qmodel import CellQuant, QuantModel
from qtool.core.tensors import CELL_TRACE, COMPUTED, TRACE_TENSOR, cell_trace, computed, trace_tensor
from qtool.engine.metrics import STATS, grid_row
from qtool.numerics.qparams import quantize

N_TRACE = len(CELL_TRACE)  # gru_cell's outputs


# rows of the per-step buffers: Wx (3 gate rows), then gru_cell's outputs
ROWS = 3 + N_TRACE


# the tensors of one layer direction whose distances the engine measures, in order; row r of
# the buffers belongs to tensor ROW_TENSOR[r]
MEASURED = ("x", *COMPUTED)


ROW_TENSOR = np.array([MEASURED.index(n) for n in ("Wx",) * 3 + TRACE_TENSOR], np.int64)


X_TENSOR, WX_TENSOR, H_TENSOR = (MEASURED.index(n) for n in ("x", "Wx", "h"))


@dataclass(frozen=True)
class CellLayout:
    """The rows of one cell form's per-step buffers: Wx's three gate rows, then its integer
    cell's outputs `trace` (the haste cell's CELL_TRACE, or the reset-before cell's; `tensors`
    names each one's tensor), and the tensors measured, x first and h last (the constants above
    are the haste cell's)."""

    trace: tuple[str, ...]
    tensors: tuple[str, ...]
    measured: tuple[str, ...]

    @property
    def rows(self) -> int:
        return 3 + len(self.trace)

    @property
    def row_tensor(self) -> np.ndarray:
        return np.array([self.measured.index(n) for n in ("Wx",) * 3 + self.tensors], np.int64)


def cell_layout(form) -> CellLayout:
    """The buffers' rows for a cell of this form (qtool.core.model.CellForm)."""
    return CellLayout(cell_trace(form), trace_tensor(form), ("x", *computed(form)))


N_STATS = len(STATS)


# levels of work: the integers only; plus the float reference and the output's distances;
# plus the distance of every tensor
INTS, OUTPUT, EVERY_TENSOR = 0, 1, 2


def gemm_bound(q_w: np.ndarray, bits_in: int) -> int:
    """Largest |sum_k q_w[c, k] * q_in[k]| for any input on `bits_in` signed bits."""
    return int(np.abs(np.asarray(q_w, np.int64)).sum(axis=1).max(initial=0)) * (1 << (bits_in - 1))


def gemm_dtype(q_w: np.ndarray, bits_in: int):
    """The narrowest float type in which this GEMM is exact for every input, else int64."""
    bound = gemm_bound(q_w, bits_in)
    if bound < 2**24:
        return np.float32
    if bound < 2**53:
        return np.float64
    return np.int64


def measured_grids(cq: CellQuant) -> np.ndarray:
    """The GRID rows (qtool.engine.metrics) of one layer direction's measured tensors, in order."""
    return np.stack([grid_row(cq.spec[t].exp2_inv, cq.spec[t].zp, cq.spec[t].bits)
                     for t in cell_layout(cq.form).measured])


def quantize_input(qm: QuantModel, x: np.ndarray) -> np.ndarray:
    s = qm.cells[0][0].spec["x"]
    return quantize(x, s.exp2_inv, s.zp, s.bits).astype(np.int32)


@dataclass
class ModelRun:
    """One batch through the model: the last layer's integer (and float) output `[N, T, H*D]`,
    and with the float reference the distance statistics: `stats[l][d]` one row (STATS) per
    MEASURED tensor, `step_stats` one row per time step of the model's output."""

    y_int: np.ndarray
    y_float: np.ndarray | None
    stats: list | None
    step_stats: np.ndarray | None
    outputs: list  # every layer's integer output [N, T, H*D]
