"""`verify`: the exported C compiled and run, every integer compared with the simulator's."""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from qtool.api.common import DataLike, as_data, count
from qtool.api.export import find_export, gru_of, simulated
from qtool.api.models import load
from qtool.core.qgraph import QGraph
from qtool.core.qmodel import QuantModel
from qtool.errors import QtoolError
from qtool.io.phases import phase


@dataclass
class VerifyResult:
    """What `verify` compared of the export `name` on `target`, each part as how many integers
    and how many of them differ from the simulator's. A GRU alone: its output integers and final
    states (`output_*`, `state_*`). A whole model: every edge's integers run whole (`edge_*`,
    `edges` per edge) and, where the model streams, the frames NAME_step gave one input frame at
    a time (`stream_*`). Both: the dequantized outputs. The parts a model has not are None."""

    target: str
    sequences: int
    time_steps: int
    output_values: int | None = None
    output_mismatches: int | None = None
    state_values: int | None = None
    state_mismatches: int | None = None
    edge_values: int | None = None
    edge_mismatches: int | None = None
    edges: dict | None = None
    stream_values: int | None = None
    stream_mismatches: int | None = None
    streaming: bool | None = None
    dequantized_mismatches: int = 0
    name: str = ""

    @property
    def mismatches(self) -> int:
        """Every mismatch: 0 when the C computes exactly what the simulator computes."""
        return sum(v for k, v in vars(self).items() if k.endswith("_mismatches") and v is not None)

    def to_dict(self) -> dict:
        """The model's parts as a dict, in order, then the verdict (`qtool verify --json`)."""
        return {**{k: v for k, v in vars(self).items() if v is not None}, "mismatches": self.mismatches,
                "passed": self.mismatches == 0}


def verify(qm: QuantModel | QGraph | str | os.PathLike, export_dir: str | os.PathLike, data: DataLike, *,
           name: str | None = None, limit: int | None = None, dataset: str | None = None,
           time_first: bool = False, target: str = "host") -> VerifyResult:
    """Compile the exported C for `target` (the host compiler, or "cortex-m4", "cortex-m33",
    "cortex-m55" on an emulated board), run it on `data` and count the output integers, final
    states and dequantized outputs that differ from the simulator's."""
    from qtool.exporters.c_target import HOST
    from qtool.exporters.c_target import target as target_named
    from qtool.exporters.c_verify import check_export, compare, export_fingerprint, run_c

    if target != HOST:
        target_named(target)  # an unknown target: said before any work
    if not isinstance(qm, (QuantModel, QGraph)):
        qm = load(Path(qm))
    qm = gru_of(qm)  # a whole model that is a GRU alone was exported as its GRU
    if isinstance(qm, QGraph):
        return _verify_graph(qm, export_dir, data, name=name, limit=limit, dataset=dataset, time_first=time_first,
                             target=target)
    export_dir = Path(export_dir)
    prefix = find_export(export_dir, name, qm)
    check_export(export_dir, prefix)  # before any phase says it compiles
    stamp = export_fingerprint(export_dir, prefix)
    if stamp is not None and stamp != qm.fingerprint():
        raise QtoolError(f"the export in {export_dir} was made from another model (fingerprint "
                         f"{stamp}, this model is {qm.fingerprint()}); run 'qtool export c' again")
    data = as_data(data, dataset, time_first)
    data.check_features(qm.model.input_size)
    n = count(data, limit)
    x = data.chunk(0, n)
    phase(f"verify: compiling {prefix}'s C for {target} and running it on {len(x)} sequences")
    c = run_c(qm, export_dir, prefix, x, target)  # the C first: a missing compiler says so at once
    phase(f"verify: simulating the {len(x)} sequences and comparing every integer")
    return VerifyResult(**compare(qm, c, *simulated(qm, x)), name=prefix)


def _verify_graph(qg: QGraph, export_dir: str | os.PathLike, data: DataLike, *, name: str | None = None,
                  limit: int | None = None, dataset: str | None = None, time_first: bool = False,
                  target: str = "host") -> VerifyResult:
    """`verify` of a whole model: compile its export for `target`, run `data` through it whole
    and frame by frame, and count the integers that differ from the simulator's."""
    from qtool.exporters.c_graph import input_arrays, render_graph_c
    from qtool.exporters.c_graph_verify import compare_graph, run_graph_c
    from qtool.exporters.c_verify import export_fingerprint
    from qtool.graph.simulate import run_int
    from qtool.numerics.qparams import dequantize

    export_dir = Path(export_dir)
    prefix = find_export(export_dir, name, qg)
    stamp, mine = export_fingerprint(export_dir, prefix), qg.fingerprint()
    if stamp is None:
        raise QtoolError(f"{export_dir}: not a whole-model C export for '{prefix}' (no {prefix}.h with its "
                         "fingerprint); run 'qtool export c' or pass --name")
    if stamp != mine:
        raise QtoolError(f"the export in {export_dir} was made from another model (fingerprint {stamp}, this "
                         f"model is {mine}); run 'qtool export c' again")
    layout = render_graph_c(qg, prefix).layout
    missing = [f for f in layout[3] if not (export_dir / f).is_file()]
    if missing:
        raise QtoolError(f"{export_dir}: the export '{prefix}' lacks {', '.join(missing)}; run 'qtool export c' again")
    data = as_data(data, dataset, time_first, qg.graph.inputs)
    from qtool.layers import check_data

    check_data(qg.graph, data)
    n = count(data, limit)
    x = data.chunk(0, n)
    phase(f"verify: compiling {prefix}'s C for {target} and running it on {n} sequences")
    c = run_graph_c(layout, export_dir, prefix, input_arrays(qg, x), target)  # the C first: a missing compiler says so
    phase(f"verify: simulating the {n} sequences and comparing every edge's integers")
    q = run_int(qg, x)
    out = qg.core_outputs[0]
    y = dequantize(q[out], int(qg.grids[out].exp2_inv), qg.grids[out].zp).astype(np.float32)
    return VerifyResult(**compare_graph(c, q, out, y), name=prefix)
