"""The quantized GRU: the float model, every tensor's quantization, the integer weights, the
derived shifts and the tables; and its HDF5 file (format "qtool-qgru", docs/file-formats.md).

    (float model as in qtool.model)
    /quant                       attrs: version, method, bits, data_file, samples, qtool_version
    /quant/layer{l}/{fwd,bwd}/
        spec/<tensor>            attrs: bits, symmetric, zp, range_lo, range_hi;
                                 dataset exp2_inv (scalar, or [3H] per channel)
        qW [3H, C], qR [3H, H], qbx [3H], qbr [3H]      integer weights and biases (int32)
        W_sum_mul_x_zp [3H], R_sum_mul_h_zp [3H]        zero-point compensation (int64)
        P [len(PARAMS)] (attr names), CH [rows, 3H] (attr rows)   derived rescale parameters
        lut_z, lut_r, lut_g      tables (int32), attrs: shift, max_error_lsb
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from qtool import __version__
from qtool.errors import QtoolError
from qtool.model import DIRECTIONS, GruModel, open_h5, read_model, write_model
from qtool.rescale import CHANNEL_ROWS, PARAMS
from qtool.tensors import NAMES

QFORMAT = "qtool-qgru"
QFORMAT_VERSION = 1
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

    @property
    def hidden_size(self) -> int:
        return self.qR.shape[1]


@dataclass
class QuantModel:
    model: GruModel
    cells: list[list[CellQuant]]
    info: dict = field(default_factory=dict)


def write_qmodel(f, qm: QuantModel) -> None:
    write_model(f, qm.model)
    f.attrs["format"] = QFORMAT
    q = f.create_group("quant")
    q.attrs.update(version=QFORMAT_VERSION, qtool_version=__version__,
                   **{k: v for k, v in qm.info.items() if v is not None})
    for l, cells in enumerate(qm.cells):
        for d, c in enumerate(cells):
            g = q.create_group(f"layer{l}/{DIRECTIONS[d]}")
            for name, t in c.spec.items():
                s = g.create_group(f"spec/{name}")
                s.attrs.update(bits=t.bits, symmetric=t.symmetric, zp=t.zp)
                s.create_dataset("exp2_inv", data=np.asarray(t.exp2_inv, np.int32))
                s.create_dataset("range_lo", data=np.asarray(t.lo, np.float64))
                s.create_dataset("range_hi", data=np.asarray(t.hi, np.float64))
            for name in ("qW", "qR", "qbx", "qbr"):
                g.create_dataset(name, data=getattr(c, name).astype(np.int32))
            g.create_dataset("W_sum_mul_x_zp", data=c.CH[CHANNEL_ROWS.index("W_sum_mul_x_zp")])
            g.create_dataset("R_sum_mul_h_zp", data=c.CH[CHANNEL_ROWS.index("R_sum_mul_h_zp")])
            g.create_dataset("P", data=c.P).attrs["names"] = list(PARAMS)
            g.create_dataset("CH", data=c.CH).attrs["rows"] = list(CHANNEL_ROWS)
            for name in LUT_NAMES:
                ds = g.create_dataset(name, data=c.luts[name].astype(np.int32))
                ds.attrs["max_error_lsb"] = c.lut_error[name]


def _read_cell(g) -> CellQuant:
    spec = {}
    for name in NAMES:
        s = g[f"spec/{name}"]
        e = s["exp2_inv"][()]
        spec[name] = TensorQ(int(s.attrs["bits"]), bool(s.attrs["symmetric"]),
                             int(e) if np.ndim(e) == 0 else e.astype(np.int64), int(s.attrs["zp"]),
                             s["range_lo"][()], s["range_hi"][()])
    if list(g["P"].attrs["names"]) != list(PARAMS) or list(g["CH"].attrs["rows"]) != list(CHANNEL_ROWS):
        raise QtoolError(f"{g.file.filename}: rescale parameters were written by an incompatible qtool")
    return CellQuant(spec, *(g[n][()].astype(np.int64) for n in ("qW", "qR", "qbx", "qbr")),
                     g["P"][()].astype(np.int64), g["CH"][()].astype(np.int64),
                     {n: g[n][()].astype(np.int64) for n in LUT_NAMES},
                     {n: float(g[n].attrs["max_error_lsb"]) for n in LUT_NAMES})


def is_qmodel(f) -> bool:
    return f.attrs.get("format") == QFORMAT


def load_qmodel(path) -> QuantModel:
    with open_h5(path) as f:
        if not is_qmodel(f):
            raise QtoolError(f"{path}: not a quantized model (run 'qtool calibrate' first)")
        if int(f["quant"].attrs["version"]) > QFORMAT_VERSION:
            raise QtoolError(f"{path}: quantized format is newer than this qtool")
        try:
            model = read_model(f, formats=(QFORMAT,))
            cells = [[_read_cell(f[f"quant/layer{l}/{DIRECTIONS[d]}"])
                      for d in range(model.num_directions)] for l in range(model.num_layers)]
        except KeyError as e:
            raise QtoolError(f"{path}: quantized model file is incomplete ({e})") from None
        info = {k: (v.item() if hasattr(v, "item") else v) for k, v in f["quant"].attrs.items()}
    return QuantModel(model, cells, info)

