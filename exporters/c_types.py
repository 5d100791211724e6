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
    needed (a zero point is not 0: x's, h's, or a reset-before cell's rh's, the input of R's g
    rows). The runtime adds the offset as it reads each input."""
    return compensation == "offset" and any(spec[n].zp != 0 for n in ("x", "h", "rh") if n in spec)


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
    rh_t: str = ""  # a reset-before cell's rh = r * h_old (the input of R's g rows); "": no such cell
    z_t: str = ""   # where a reset-before cell holds z between its two passes, when z_out is wider
                    # than q_t in some cell (its own buffer); "": in h_new

    def acc(self, gemm: str) -> str:
        return f"int{self.bits[gemm]}_t"

    def dsp(self, gemm: str) -> bool:
        """The int8 SMLAD kernel applies: int8 weights and activations, int32 sums. `gemm`: Wx,
        Rh, or rh (a reset-before cell's R_g rh, whose sums are Rh's statement)."""
        w = self.w_t if gemm == "Wx" else self.r_t
        v = self.rh_t if gemm == "rh" else self.q_t
        return w == "int8_t" and v == "int8_t" and self.bits["Rh" if gemm == "rh" else gemm] == 32


def _comp_tables(qm: QuantModel, row: str, offsets) -> list[np.ndarray]:
    i = CHANNEL_ROWS.index(row)
    return [cq.CH[i] for l, cells in enumerate(qm.cells) for d, cq in enumerate(cells)
            if not offsets[l][d] and cq.CH[i].any()]


def act_type(qm: QuantModel) -> str:
    """The storage of every activation and state integer: int8_t when all of them fit."""
    bits = max(max(cq.spec["x"].bits, cq.spec["h"].bits) for cells in qm.cells for cq in cells)
    return "int8_t" if bits <= 8 else "int16_t"


def _storage(bits: list[int]) -> str:
    """int8_t where every width fits, else int16_t; "" for none."""
    return "" if not bits else "int8_t" if max(bits) <= 8 else "int16_t"


def model_types(qm: QuantModel, compensation: str) -> ModelTypes:
    cqs = [cq for cells in qm.cells for cq in cells]
    offsets = [[offset_inputs(cq.spec, compensation) for cq in cells] for cells in qm.cells]
    rows = [{r: cq.CH[i] for i, r in enumerate(CHANNEL_ROWS)} for cq in cqs]
    q_t = act_type(qm)
    rb = [cq for cq in cqs if not cq.form.reset_after]
    z_fits = all(cq.spec["z_out"].bits <= SIZES[q_t] * 8 for cq in rb)
    return ModelTypes(
        q_t=q_t,
        w_t="int8_t" if max(cq.spec["W"].bits for cq in cqs) <= 8 else "int16_t",
        r_t="int8_t" if max(cq.spec["R"].bits for cq in cqs) <= 8 else "int16_t",
        b_t=int_type([b for r, cq in zip(rows, cqs)  # a reset-before cell has b_pre only
                      for b in folded_biases(r, cq.form.reset_after)[:2 if cq.form.reset_after else 1]],
                     ("int8_t", "int16_t", "int32_t", "int64_t")),
        comp64={k: int_type(_comp_tables(qm, row, offsets), ("int32_t", "int64_t")) == "int64_t"
                for k, row in (("W", "W_sum_mul_x_zp"), ("R", "R_sum_mul_h_zp"))},
        lut_t=int_type([cq.luts[k] for cq in cqs for k in cq.luts], ("int8_t", "int16_t")),
        bits=model_bits(qm, offsets), offsets=offsets,
        rh_t=_storage([cq.spec["rh"].bits for cq in rb]),
        z_t="" if z_fits else _storage([cq.spec["z_out"].bits for cq in rb]))
