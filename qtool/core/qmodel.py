"""The quantized GRU: the float model, every tensor's quantization, the integer weights, the
derived shifts and the tables; and the layout of its HDF5 file (format "qtool-qgru",
docs/file-formats.md).

    (float model as in qtool.core.model)
    /quant                       attrs: version, fingerprint, qtool_version, provenance (method,
                                 bits, bits_config, data_file, data_sha256, source_sha256, created...)
    /quant/layer{l}/{fwd,bwd}/
        spec/<tensor>            attrs: bits, symmetric, zp;
                                 datasets exp2_inv (scalar, or [3H] per channel), range_lo, range_hi
        qW [3H, C], qR [3H, H]   integer weights (int8 or int16, by their bits)
        qbx [3H], qbr [3H]       integer biases (int32)
        W_sum_mul_x_zp [3H], R_sum_mul_h_zp [3H]        zero-point compensation (int64)
        P [len(PARAMS)] (attr names), CH [rows, 3H] (attr rows)   derived rescale parameters
                                 (a reset-before cell: its own tensors and PARAMS_RESET_BEFORE)
        lut_z, lut_r, lut_g      tables (int16), attrs: shift, max_error_lsb

The file is written and read by qtool.io.qmodel_file, which proves the whole model consistent
(qtool.numerics.validate) before any engine or exporter sees it.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass, field

import numpy as np

from qtool.core.model import HASTE, CellForm, GruModel
from qtool.core.tensors import cell_names

QFORMAT = "qtool-qgru"
QFORMAT_VERSION = 2  # the newest this qtool reads; a model of haste cells only is written as 1
HASTE_QFORMAT_VERSION = 1
LUT_NAMES = ("lut_z", "lut_r", "lut_g")


@dataclass
class TensorQ:
    """One tensor's quantization: q = round(x * 2^exp2_inv) + zp on `bits` signed bits."""

    bits: int
    symmetric: bool
    exp2_inv: int | np.ndarray  # an array for per-channel tensors
    zp: int
    lo: float | np.ndarray
    hi: float | np.ndarray

    def scale(self):
        return np.ldexp(1.0, -np.asarray(self.exp2_inv, np.int64))


@dataclass
class CellQuant:
    """Everything the integer engines need for one layer direction."""

    spec: dict[str, TensorQ]
    qW: np.ndarray
    qR: np.ndarray
    qbx: np.ndarray
    qbr: np.ndarray
    P: np.ndarray
    CH: np.ndarray
    luts: dict[str, np.ndarray]
    lut_error: dict[str, float]
    form: CellForm = HASTE  # what the cell computes: its tensors, P's layout, its tables' functions

    @property
    def hidden_size(self) -> int:
        return self.qR.shape[1]


@dataclass
class QuantModel:
    model: GruModel
    cells: list[list[CellQuant]]
    info: dict = field(default_factory=dict)

    @property
    def haste(self) -> bool:
        return all(c.form.haste for cells in self.cells for c in cells)

    def fingerprint(self) -> str:
        """A hash of everything that decides the integers: the quantization, the integer weights,
        shifts and tables. Two models with the same fingerprint compute the same integers."""
        h = hashlib.sha256(f"{QFORMAT}/{HASTE_QFORMAT_VERSION}".encode())  # as before cell forms
        for l, cells in enumerate(self.cells):
            for d, c in enumerate(cells):
                h.update(f"|{l}.{d}".encode())
                if not c.form.haste:  # a haste cell hashes as it did before forms existed
                    h.update(f"|form:{sorted(c.form.attrs().items())}".encode())
                for name in cell_names(c.form):
                    t = c.spec[name]
                    h.update(f"|{name}:{t.bits}:{int(t.symmetric)}:{t.zp}:".encode())
                    h.update(np.asarray(t.exp2_inv, np.int64).tobytes())
                for a in (c.qW, c.qR, c.qbx, c.qbr, c.P, c.CH, *(c.luts[n] for n in LUT_NAMES)):
                    a = np.asarray(a, np.int64)
                    h.update(str(a.shape).encode() + a.tobytes())
        return h.hexdigest()[:16]


def is_qmodel(f) -> bool:
    fmt = f.attrs.get("format")
    return (fmt.decode(errors="replace") if isinstance(fmt, bytes) else fmt) == QFORMAT
