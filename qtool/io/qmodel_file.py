"""Quantized model files (format "qtool-qgru", laid out as qtool.core.qmodel describes): written
only after validation, read back dataset by dataset (presence, shape, dtype checked first) and
validated whole (qtool.numerics.validate) before any engine or exporter sees them."""

from __future__ import annotations

import numpy as np

from qtool.core.model import DIRECTIONS, h5_attr, h5_dataset, open_h5, read_model, write_model
from qtool.core.qmodel import (
    HASTE_QFORMAT_VERSION,
    LUT_NAMES,
    QFORMAT,
    QFORMAT_VERSION,
    CellQuant,
    QuantModel,
    TensorQ,
    is_qmodel,
)
from qtool.core.tensors import BY_NAME, CHANNEL_ROWS, cell_names, cell_params
from qtool.errors import QtoolError
from qtool.numerics.validate import validate
from qtool.version import __version__


def _int_storage(bits: int):
    return np.int8 if bits <= 8 else np.int16 if bits <= 16 else np.int32


def write_qmodel(f, qm: QuantModel) -> None:
    """Write a quantized model into an open HDF5 file; the model is validated first, so a
    model qtool writes is always one it reads back."""
    validate(qm)
    write_model(f, qm.model)
    f.attrs["format"] = QFORMAT
    q = f.create_group("quant")
    # a model read from a file carries that file's version attributes in info: these replace them
    version = HASTE_QFORMAT_VERSION if qm.haste else QFORMAT_VERSION  # haste files as before cell forms
    q.attrs.update({**{k: v for k, v in qm.info.items() if v is not None}, "version": version,
                    "qtool_version": __version__, "fingerprint": qm.fingerprint()})
    for l, cells in enumerate(qm.cells):
        for d, c in enumerate(cells):
            g = q.create_group(f"layer{l}/{DIRECTIONS[d]}")
            for name, t in c.spec.items():
                s = g.create_group(f"spec/{name}")
                s.attrs.update(bits=t.bits, symmetric=t.symmetric, zp=t.zp)
                s.create_dataset("exp2_inv", data=np.asarray(t.exp2_inv, np.int32))
                s.create_dataset("range_lo", data=np.asarray(t.lo, np.float64))
                s.create_dataset("range_hi", data=np.asarray(t.hi, np.float64))
            for name, tensor in (("qW", "W"), ("qR", "R"), ("qbx", "bx"), ("qbr", "br")):
                g.create_dataset(name, data=getattr(c, name).astype(_int_storage(c.spec[tensor].bits)))
            g.create_dataset("W_sum_mul_x_zp", data=c.CH[CHANNEL_ROWS.index("W_sum_mul_x_zp")])
            g.create_dataset("R_sum_mul_h_zp", data=c.CH[CHANNEL_ROWS.index("R_sum_mul_h_zp")])
            g.create_dataset("P", data=c.P).attrs["names"] = list(cell_params(c.form))
            g.create_dataset("CH", data=c.CH).attrs["rows"] = list(CHANNEL_ROWS)
            for name in LUT_NAMES:
                ds = g.create_dataset(name, data=c.luts[name].astype(np.int16))
                ds.attrs["max_error_lsb"] = c.lut_error[name]


def _read_spec(g, name: str, H: int, where: str) -> TensorQ:
    w = f"{where}/spec/{name}"
    if f"spec/{name}" not in g:
        raise QtoolError(f"{w} is missing")
    s = g[f"spec/{name}"]
    shape = (3 * H,) if BY_NAME[name].per_channel else ()
    e = h5_dataset(s, "exp2_inv", shape, "i", w)
    lo, hi = (h5_dataset(s, k, shape, "fi", w) for k in ("range_lo", "range_hi"))
    return TensorQ(h5_attr(s, "bits", int, w), h5_attr(s, "symmetric", bool, w),
                   int(e) if e.ndim == 0 else e.astype(np.int64), h5_attr(s, "zp", int, w),
                   lo.astype(np.float64) if lo.ndim else float(lo),
                   hi.astype(np.float64) if hi.ndim else float(hi))


def _name_list(g, dataset: str, attr: str) -> list[str] | None:
    """A dataset's attribute that lists names (P's parameter names, CH's row names)."""
    v = getattr(g.get(dataset), "attrs", {}).get(attr)
    if v is None or np.ndim(v) != 1:
        return None
    return [x.decode(errors="replace") if isinstance(x, bytes) else str(x) for x in v]


def _read_cell(g, cell, where: str) -> CellQuant:
    """Read one cell of the float cell's form, checking each dataset's presence, shape and dtype
    before reading it."""
    C, H = cell.W.shape[1], cell.R.shape[1]
    params = cell_params(cell.form)
    spec = {name: _read_spec(g, name, H, where) for name in cell_names(cell.form)}
    if _name_list(g, "P", "names") != list(params) or _name_list(g, "CH", "rows") != list(CHANNEL_ROWS):
        raise QtoolError(f"{where}: rescale parameters P/CH are missing or were written by an "
                         "incompatible qtool")
    ints = {n: h5_dataset(g, n, shp, "i", where).astype(np.int64) for n, shp in (
        ("qW", (3 * H, C)), ("qR", (3 * H, H)), ("qbx", (3 * H,)), ("qbr", (3 * H,)),
        ("P", (len(params),)), ("CH", (len(CHANNEL_ROWS), 3 * H)))}
    luts = {n: h5_dataset(g, n, None, "i", where).astype(np.int64) for n in LUT_NAMES}
    for n, t in luts.items():
        if t.ndim != 1:
            raise QtoolError(f"{where}/{n} must be one-dimensional, got shape {t.shape}")
    return CellQuant(spec, ints["qW"], ints["qR"], ints["qbx"], ints["qbr"], ints["P"], ints["CH"],
                     luts, {n: 0.0 for n in LUT_NAMES}, cell.form)


def _plain(v):
    if isinstance(v, bytes):
        return v.decode(errors="replace")
    if isinstance(v, np.ndarray):
        return v.tolist()
    return v.item() if hasattr(v, "item") else v


def load_qmodel(path) -> QuantModel:
    """Read and validate a quantized model file: a file that loads is safe for every engine."""
    with open_h5(path) as f:
        return read_qmodel(f, str(path))


def read_qmodel(f, where: str) -> QuantModel:
    """Read and validate the quantized model of an open HDF5 file or group."""
    path = where
    if not is_qmodel(f):
        raise QtoolError(f"{path}: not a quantized model (run 'qtool calibrate' first)")
    q = f.get("quant")
    if q is None:
        raise QtoolError(f"{path}: the group /quant is missing")
    version = h5_attr(q, "version", int, f"{path}: /quant")
    if not 1 <= version <= QFORMAT_VERSION:
        raise QtoolError(f"{path}: quantized format version {version} is not one this qtool "
                         f"reads (1..{QFORMAT_VERSION})")
    model = read_model(f, formats=(QFORMAT,))
    cells = []
    for l, layer in enumerate(model.layers):
        row = []
        for d, cell in enumerate(layer):
            where = f"{path}: quant/layer{l}/{DIRECTIONS[d]}"
            if f"quant/layer{l}/{DIRECTIONS[d]}" not in f:
                raise QtoolError(f"{where} is missing")
            row.append(_read_cell(f[f"quant/layer{l}/{DIRECTIONS[d]}"], cell, where))
        cells.append(row)
    info = {k: _plain(v) for k, v in q.attrs.items()}
    qm = QuantModel(model, cells, info)
    validate(qm, str(path))
    return qm
