"""`qtool export json|h5`: every tensor's bits, exp2_inv and zero point, and the shifts derived
from them, for other toolchains."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np

from qtool.core.model import DIRECTIONS
from qtool.core.qmodel import QuantModel
from qtool.core.tensors import cell_params, cell_tensors
from qtool.numerics.rescale import CHANNEL_ROWS
from qtool.version import __version__


def parameter_tables(qm: QuantModel) -> dict:
    cells = []
    for l, row in enumerate(qm.cells):
        for d, cq in enumerate(row):
            tensors = {}
            for td in cell_tensors(cq.form):  # a reset-before cell: rh for Rh_add_br and rRh
                s = cq.spec[td.name]
                tensors[td.name] = {
                    "bits": s.bits, "symmetric": s.symmetric, "per_channel": td.per_channel,
                    "exp2_inv": np.asarray(s.exp2_inv).tolist(), "zp": s.zp,
                    "range": [np.asarray(s.lo).tolist(), np.asarray(s.hi).tolist()],
                }
            cell = {
                "layer": l, "direction": DIRECTIONS[d], "tensors": tensors,
                "shifts": {n: int(v) for n, v in zip(cell_params(cq.form), cq.P)},
                "per_channel": {n: cq.CH[i].tolist() for i, n in enumerate(CHANNEL_ROWS)},
                "lut_max_error_lsb": cq.lut_error,
            }
            if not cq.form.haste:  # the settings that differ from the haste cell (CellForm.attrs)
                cell["form"] = cq.form.attrs()
            cells.append(cell)
    return {"format": "qtool-params", "version": 1, "qtool_version": __version__,
            "model": qm.model.name, "fingerprint": qm.fingerprint(), "calibration": qm.info,
            "cells": cells}


def json_bytes(qm: QuantModel) -> bytes:
    return json.dumps(parameter_tables(qm), indent=1, default=str).encode()


def write_h5(qm: QuantModel, path: Path) -> None:
    """The tables as HDF5, written atomically."""
    from qtool.io.files import write_h5 as write_h5_file

    tables = parameter_tables(qm)

    def fill(f) -> None:
        f.attrs.update(format="qtool-params", version=1, qtool_version=__version__,
                       model=qm.model.name, fingerprint=qm.fingerprint())
        for cell in tables["cells"]:
            g = f.create_group(f"layer{cell['layer']}/{cell['direction']}")
            for name, t in cell["tensors"].items():
                tg = g.create_group(f"tensors/{name}")
                tg.attrs.update(bits=t["bits"], symmetric=t["symmetric"], zp=t["zp"])
                tg.create_dataset("exp2_inv", data=np.asarray(t["exp2_inv"], np.int32))
            g.attrs.update(cell.get("form", {}))
            sg = g.create_group("shifts")
            sg.attrs.update(cell["shifts"])
            for name, values in cell["per_channel"].items():
                g.create_dataset(f"per_channel/{name}", data=np.asarray(values, np.int64))

    write_h5_file(path, fill)
