"""The C types of one exported model: the storage of activations, weights, biases and tables,
and the integer width of every statement of the cell (the bounds of qtool/numerics/interval.py)."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from qtool.core.qmodel import QuantModel
from qtool.errors import QtoolError
from qtool.numerics.interval import model_bits
from qtool.numerics.passes import folded_biases
from qtool.numerics.rescale import CHANNEL_ROWS

INT_TYPES = (("int8_t", 8), ("int16_t", 16), ("int32_t", 32), ("int64_t", 64))
SIZES = {t: bits // 8 for t, bits in INT_TYPES}


def int_type(values, choices=tuple(SIZES)) -> str:
    """The narrowest of `choices` that holds every value (int32_t for no values)."""
    vals = [int(v) for a in values for v in np.ravel(a)]
    lo, hi = min(vals, default=0), max(vals, default=0)
    for t, bits in INT_TYPES:
        if t in choices and -(1 << (bits - 1)) <= lo and hi < (1 << (bits - 1)):
            return t
    raise QtoolError(f"values [{lo}, {hi}] fit none of {choices}")


COMPENSATION = ("table", "offset")


def offset_inputs(spec: dict, compensation: str) -> bool:
    """Whether a cell compensates zero points by offsetting its GEMM inputs: asked for, and
    needed (a zero point is not 0). The runtime adds the offset as it reads each input."""
    return compensation == "offset" and (spec["x"].zp != 0 or spec["h"].zp != 0)


@dataclass
class ModelTypes:
    """The C types of one model's storage and arithmetic (its cells share them: the widest any
    cell needs)."""

    q_t: str       # every activation and state integer
    w_t: str       # qW
    r_t: str       # qR
    b_t: str       # the folded biases
    comp64: dict   # "W", "R" -> some compensation table of that GEMM needs int64 (each table
                   # is stored in the narrower of int32/int64 that holds it)
    lut_t: str     # activation tables
    bits: dict     # statement -> 32 or 64 (c_bounds.STATEMENTS)
    offsets: list  # [layer][direction] -> offset inputs

    def acc(self, gemm: str) -> str:
        return f"int{self.bits[gemm]}_t"

    def dsp(self, gemm: str) -> bool:
        """The int8 SMLAD kernel applies: int8 weights and activations, int32 sums."""
        w = self.w_t if gemm == "Wx" else self.r_t
        return w == "int8_t" and self.q_t == "int8_t" and self.bits[gemm] == 32


def _comp_tables(qm: QuantModel, row: str, offsets) -> list[np.ndarray]:
    i = CHANNEL_ROWS.index(row)
    return [cq.CH[i] for l, cells in enumerate(qm.cells) for d, cq in enumerate(cells)
            if not offsets[l][d] and cq.CH[i].any()]


def act_type(qm: QuantModel) -> str:
    """The storage of every activation and state integer: int8_t when all of them fit."""
    bits = max(max(cq.spec["x"].bits, cq.spec["h"].bits) for cells in qm.cells for cq in cells)
    return "int8_t" if bits <= 8 else "int16_t"


def model_types(qm: QuantModel, compensation: str) -> ModelTypes:
    cqs = [cq for cells in qm.cells for cq in cells]
    offsets = [[offset_inputs(cq.spec, compensation) for cq in cells] for cells in qm.cells]
    rows = [{r: cq.CH[i] for i, r in enumerate(CHANNEL_ROWS)} for cq in cqs]
    return ModelTypes(
        q_t=act_type(qm),
        w_t="int8_t" if max(cq.spec["W"].bits for cq in cqs) <= 8 else "int16_t",
        r_t="int8_t" if max(cq.spec["R"].bits for cq in cqs) <= 8 else "int16_t",
        b_t=int_type([b for r in rows for b in folded_biases(r)], ("int8_t", "int16_t", "int32_t", "int64_t")),
        comp64={k: int_type(_comp_tables(qm, row, offsets), ("int32_t", "int64_t")) == "int64_t"
                for k, row in (("W", "W_sum_mul_x_zp"), ("R", "R_sum_mul_h_zp"))},
        lut_t=int_type([cq.luts[k] for cq in cqs for k in cq.luts], ("int8_t", "int16_t")),
        bits=model_bits(qm, offsets), offsets=offsets)
