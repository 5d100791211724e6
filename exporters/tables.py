"""`qtool export json|h5`: every tensor's bits, exp2_inv and zero point, and the shifts derived
from them, for other toolchains. A whole model: every edge's grid, every integer layer's op,
attributes and integers, each GRU's cells as a GRU alone's, in the core's order."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np

from qtool.core.model import DIRECTIONS
from qtool.core.qgraph import MODEL_OPS, QGraph
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


def graph_tables(qg: QGraph) -> dict:
    """A whole model's integers: each core edge's grid, each core node's integers in order."""

    g = qg.graph
    order = {e: k for k, e in enumerate([*g.inputs, *(e for name in qg.core for e in qg.node(name).outputs)])}
    grids = {e: {"bits": t.bits, "exp2_inv": int(t.exp2_inv), "zp": int(t.zp), "range": [float(t.lo), float(t.hi)]}
             for e, t in sorted(qg.grids.items(), key=lambda et: order.get(et[0], len(order)))}  # the graph's order
    nodes = []
    for name in qg.core:
        n, qp = qg.node(name), qg.qparams.get(name, {})
        node = {"name": name, "op": n.op, "inputs": n.inputs, "outputs": n.outputs, "attrs": _plain(n.attrs)}
        if n.op in MODEL_OPS:
            node["cells"] = parameter_tables(qp["qm"])["cells"]
        else:
            node["integers"] = _plain(qp)
        nodes.append(node)
    return {"format": "qtool-graph-params", "version": 1, "qtool_version": __version__, "model": g.name,
            "fingerprint": qg.fingerprint(), "calibration": _plain(qg.info), "inputs": list(g.inputs),
            "input_shifts": {e: list(k) for e, k in g.input_shifts.items()}, "outputs": qg.core_outputs,
            "float_tail": qg.tail, "edges": grids, "nodes": nodes}


def _plain(v):
    """JSON's kinds of a node's attributes and integers: arrays as (nested) lists."""
    if isinstance(v, dict):
        return {str(k): _plain(x) for k, x in v.items()}
    if isinstance(v, (list, tuple)):
        return [_plain(x) for x in v]
    if isinstance(v, (np.ndarray, np.generic)):
        return v.tolist()
    return v


def json_bytes(qm: QuantModel | QGraph) -> bytes:
    tables = graph_tables(qm) if isinstance(qm, QGraph) else parameter_tables(qm)
    return json.dumps(tables, indent=1, default=str).encode()


def write_h5(qm: QuantModel | QGraph, path: Path) -> None:
    """The tables as HDF5, written atomically: a GRU's cells at `layer{l}/{direction}`; a whole
    model's edges at `edges/{k}` and nodes at `nodes/{k}` (names in attributes: they hold '/'),
    a GRU node's cells below its node's group."""
    from qtool.io.files import write_h5 as write_h5_file

    tables = graph_tables(qm) if isinstance(qm, QGraph) else parameter_tables(qm)

    def fill(f) -> None:
        f.attrs.update(format=tables["format"], version=1, qtool_version=__version__, model=tables["model"],
                       fingerprint=tables["fingerprint"])
        if "cells" in tables:
            _write_cells(f, tables["cells"])
            return
        f.attrs.update(inputs=json.dumps(tables["inputs"]), outputs=json.dumps(tables["outputs"]),
                       input_shifts=json.dumps(tables["input_shifts"]), float_tail=json.dumps(tables["float_tail"]),
                       calibration=json.dumps(tables["calibration"], default=str))
        for k, (edge, t) in enumerate(tables["edges"].items()):
            f.create_group(f"edges/{k}").attrs.update(name=edge, bits=t["bits"], exp2_inv=t["exp2_inv"], zp=t["zp"],
                                                      lo=t["range"][0], hi=t["range"][1])
        for k, node in enumerate(tables["nodes"]):
            g = f.create_group(f"nodes/{k}")
            g.attrs.update(name=node["name"], op=node["op"], inputs=json.dumps(node["inputs"]),
                           outputs=json.dumps(node["outputs"]), attrs=json.dumps(node["attrs"], default=str))
            if "cells" in node:
                _write_cells(g, node["cells"])
            for name, v in node.get("integers", {}).items():
                a = None if isinstance(v, dict) else np.asarray(v)
                if a is not None and a.dtype.kind in "iub":
                    g.create_dataset(f"integers/{name}", data=a.astype(np.int64))
                else:  # a table of its own or a setting
                    g.attrs[f"integers.{name}"] = json.dumps(v, default=str)

    write_h5_file(path, fill)


def _write_cells(f, cells: list[dict]) -> None:
    for cell in cells:
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
