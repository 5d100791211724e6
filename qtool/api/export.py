"""`export_c` and `export_tables`: a quantized model written for a target."""

from __future__ import annotations

import os
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from qtool.api.common import DataLike, as_data, saturation_notes
from qtool.api.models import load
from qtool.core.qgraph import QGraph
from qtool.core.qmodel import QuantModel
from qtool.errors import QtoolError
from qtool.io.files import claim_folder, claim_output


def export_tables(qm: QuantModel | QGraph | str | os.PathLike, output: str | os.PathLike, kind: str = "json", *,
                  force: bool = False, confirm: Callable[[str], bool] | None = None) -> Path:
    """Every integer parameter and table as JSON (`kind="json"`) or HDF5 (`"h5"`) for other
    toolchains (docs/file-formats.md): a GRU's cells; a whole model's edges' grids and its
    integer layers in order, each GRU node's cells as a GRU alone's. Written atomically."""
    from qtool.exporters.tables import json_bytes, write_h5
    from qtool.io.files import write_bytes

    if kind not in ("json", "h5"):
        raise QtoolError(f"`kind` must be json or h5, got '{kind}'")
    qm_path = None
    if not isinstance(qm, (QuantModel, QGraph)):
        qm_path = Path(qm)
        qm = load(qm_path)
    output = claim_output(output, force, [qm_path], confirm, kind="tables" if kind == "h5" else "JSON")
    if kind == "json":
        write_bytes(output, json_bytes(qm))
    else:
        write_h5(qm, output)
    return output


@dataclass
class ExportResult:
    directory: Path
    name: str
    files: list[str]
    replaced: list[str]
    footprint: object
    compensation: str
    fingerprint: str
    edited: list[str] = field(default_factory=list)  # replaced files edited since qtool wrote them
    removed: list[str] = field(default_factory=list)  # an earlier export's files not written now
    notes: list[str] = field(default_factory=list)  # what looks wrong with the test vectors


def simulated(qm: QuantModel, x: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """The simulator's output integers `[N, T, output_size]` for float `x [N, T, C]` and its final
    states `[N, state size]` (every layer's and direction's, in order): what an export must equal."""
    from qtool.engine.cpu import run_int

    finals: list = []
    y = run_int(qm, x, finals=finals)
    return y, np.concatenate(finals, axis=1)


def export_c(qm: QuantModel | QGraph | str | os.PathLike, out_dir: str | os.PathLike, *, name: str | None = None,
             compensation: str = "table", test_vectors: DataLike | bool | None = None, vectors: int | None = None,
             dataset: str | None = None, time_first: bool = False, force: bool = False,
             confirm: Callable[[str], bool] | None = None, fully_integral: bool = True) -> ExportResult:
    """Write the C sources (runtime, parameter tables, model) into `out_dir`, replacing only
    files of the same names that qtool wrote; other files in the directory are left alone.
    `test_vectors` for a self-checking test main: float inputs `[V, T, C]` (an array, a data file
    or SequenceData; the first `vectors` of them, default all), or True for `vectors` (default 4)
    random sequences of 16 steps in the calibrated input range; the result's notes say when there
    are fewer than asked, or when they saturate the input's grid. `fully_integral`: refuse an
    export whose integer core would hold a floating-point operation. The footprint carries what
    the compiler passes (qtool.numerics.passes) removed.
    A whole model (docs/embedded.md, "Whole models"): every layer of its integer core in C, run
    whole (NAME_run_sequence) and, where every layer is causal, frame by frame (NAME_step); its
    footprint per layer (qtool.exporters.c_graph.GraphFootprint). A whole model that is a GRU
    alone (one gru node from its input to its output) is exported as the GRU it is."""
    from qtool.exporters.c_export import RUNTIME, c_name
    from qtool.exporters.c_types import COMPENSATION
    from qtool.io.files import write_files

    if compensation not in COMPENSATION:
        raise QtoolError(f"unknown compensation {compensation!r}: use one of {', '.join(COMPENSATION)}")
    if vectors is not None and (isinstance(vectors, bool) or not isinstance(vectors, (int, np.integer)) or vectors < 1):
        raise QtoolError(f"`vectors` must be a positive integer, got {vectors!r:.20}")
    claim_folder(out_dir)  # before the model is read and rendered
    path = None
    if not isinstance(qm, (QuantModel, QGraph)):
        path = Path(qm)
        qm = load(path)
    if isinstance(qm, QGraph):  # before the test vectors are read
        from qtool.exporters.c_graph import check_exportable

        check_exportable(qm)
    test_vectors, notes = _test_inputs(qm, test_vectors, vectors, dataset, time_first)
    qm = gru_of(qm)
    prefix = c_name(name or (qm.graph.name if isinstance(qm, QGraph) else qm.model.name))
    if prefix in {p.stem for p in RUNTIME.iterdir()}:
        raise QtoolError(f"`name` {prefix} would overwrite the runtime's own {prefix}.c/{prefix}.h; choose "
                         "another name")
    render = _render_graph if isinstance(qm, QGraph) else _render_gru
    rendered, stamp = render(qm, prefix, compensation, fully_integral, test_vectors)
    files = rendered.encoded()
    stale = [f"{prefix}_test_vectors.h", f"{prefix}_test_main.c",  # an export with test vectors wrote them
             *_earlier_parts(Path(out_dir), prefix)]
    replaced = write_files(out_dir, files, force, confirm, inputs=[path], stale=stale,
                           fixed=[f.name for f in RUNTIME.iterdir()])
    return ExportResult(Path(out_dir), prefix, list(files), replaced.names, rendered.footprint, compensation,
                        stamp, replaced.edited, replaced.removed, notes)


def _earlier_parts(out_dir: Path, prefix: str) -> list[str]:
    """The files of the GRUs an earlier export of `prefix` in `out_dir` included (its NAME.h's
    #include lines): a GRU renamed since would leave them behind."""
    import re

    from qtool.exporters.c_export import RUNTIME
    from qtool.io.files import written_by_qtool

    header = out_dir / f"{prefix}.h"
    if not header.is_file() or not written_by_qtool(header):
        return []
    try:
        stems = re.findall(r'^#include "([A-Za-z_][A-Za-z0-9_]*)\.h"', header.read_text(errors="replace"), re.M)
    except OSError:
        return []
    fixed = {p.stem for p in RUNTIME.iterdir()} | {f"{prefix}_params"}
    return [f"{s}{part}" for s in stems if s not in fixed and s.startswith(f"{prefix}_")
            for part in (".h", ".c", "_params.h", "_params.c")]


LARGE_VECTORS = 1 << 20  # input values of test vectors beyond which export_c's notes say how many


def _test_inputs(qm: QuantModel | QGraph, given: DataLike | bool | None, vectors: int | None,
                 dataset: str | None, time_first: bool) -> tuple[np.ndarray | dict | None, list[str]]:
    """The test vectors' float inputs `[V, T, C]` (export_c's `test_vectors`; a model of several
    inputs: a dict of one per input), and notes on them: fewer sequences than asked; inputs
    outside the input's grid, which still agree bit for bit but test little of the model."""
    if given is None or given is False:
        if vectors is not None or dataset is not None or time_first:
            raise QtoolError("`vectors`, `dataset` and `time_first` go with `test_vectors`")
        return None, []
    from qtool.layers import check_data

    whole = isinstance(qm, QGraph)
    inputs = qm.graph.inputs if whole else {"x": (None, qm.model.input_size)}
    grids = {e: qm.grids[e] if whole else qm.cells[0][0].spec["x"] for e in inputs}
    if given is True:
        if dataset is not None or time_first:
            raise QtoolError("`dataset` and `time_first` go with test vectors read from data")
        rng = np.random.default_rng(0)
        V = 4 if vectors is None else vectors
        xs = {e: rng.uniform(g.lo, g.hi, (V, 16, inputs[e][-1])).astype(np.float32) for e, g in grids.items()}
        x = xs if len(xs) > 1 else next(iter(xs.values()))
        return x, _size_notes(xs)
    data = as_data(given, dataset, time_first, list(inputs) if whole else ())
    if whole:
        check_data(qm.graph, data)
    else:
        data.check_features(qm.model.input_size)
    n = data.num_sequences if vectors is None else min(vectors, data.num_sequences)
    notes = [f"{vectors} test vectors asked for: {Path(data.name).name} holds {n} sequence{'s' * (n != 1)}; the test "
             f"vectors are all {n}"] if n < (vectors or 0) else []
    x = data.chunk(0, n)
    xs = x if isinstance(x, dict) else {next(iter(inputs)): x}
    seen = qm.graph.scale_inputs(xs) if whole else xs  # as the grids see them
    share = {e: float(np.mean((seen[e] < g.lo) | (seen[e] > g.hi))) for e, g in grids.items()}
    return x, notes + _size_notes(xs) + saturation_notes(share, of="the test vectors' ")


def _size_notes(xs: dict[str, np.ndarray]) -> list[str]:
    """Test vectors of more than LARGE_VECTORS input values: how many, as the header will hold them."""
    size = sum(x.size for x in xs.values())
    if size <= LARGE_VECTORS:
        return []
    x = next(iter(xs.values()))
    shape = (f"{x.shape[2]} channels" if len(xs) == 1 else
             f"{' + '.join(str(a.shape[2]) for a in xs.values())} channels of {len(xs)} inputs")
    return [f"the test vectors are {size:,} input values ({len(x)} sequences x {x.shape[1]} steps x "
            f"{shape}), written with their outputs into the test header; `vectors` takes fewer"]


def gru_of(qm: QuantModel | QGraph) -> QuantModel | QGraph:
    """A quantized whole model that is a GRU alone (qtool.layers.gru.as_alone) as its GRU; any
    other model as it is."""
    from qtool.layers.gru import as_alone

    node = as_alone(qm.graph) if isinstance(qm, QGraph) and not qm.tail else None
    return qm if node is None else qm.qparams[node.name]["qm"]


def _render_gru(qm: QuantModel, prefix: str, compensation: str, fully_integral: bool, test_vectors):
    from qtool.exporters.c_export import render_c
    from qtool.exporters.c_vectors import render_test_vectors

    rendered = render_c(qm, prefix, compensation, fully_integral)
    if test_vectors is not None:
        y, _ = simulated(qm, test_vectors)
        rendered.files.update(render_test_vectors(qm, prefix, test_vectors, y))
    return rendered, qm.fingerprint()


def _render_graph(qg: QGraph, prefix: str, compensation: str, fully_integral: bool, test_vectors):
    from qtool.exporters.c_graph import input_arrays, render_graph_c
    from qtool.exporters.c_graph_vectors import render_graph_test_vectors
    from qtool.graph.simulate import run_int

    rendered = render_graph_c(qg, prefix, fully_integral, compensation)

    def work_bytes(q: dict) -> int:  # NAME_sequence_work of the sequences run_int gave `q` for
        return rendered.work_bytes({e: (q[e].shape[1] if q[e].ndim == 3 else 1) for e in rendered.edges})

    if test_vectors is not None:
        q = run_int(qg, test_vectors)
        edges, out, _, _, others = rendered.layout
        outs = [(edges[e][1], q[edges[e][0]]) for e in [out, *others]]
        rendered.files.update(render_graph_test_vectors(prefix, outs, input_arrays(qg, test_vectors), work_bytes(q)))
    steps_at = int(qg.info.get("time_steps", 0))  # the work NAME_run_sequence needs at the calibration's length
    if steps_at:
        zeros = {e: np.zeros((1, steps_at, shape[-1]), np.float32) for e, shape in qg.graph.inputs.items()}
        rendered.footprint.work_at = (steps_at, work_bytes(run_int(qg, zeros)))
    return rendered, qg.fingerprint()


def find_export(export_dir: Path, name: str | None, qm: QuantModel | QGraph) -> str:
    """The prefix of `qm`'s export in `export_dir`: `name`; else the only export there; else the
    one made from `qm` (its fingerprint); else the one named after the model."""
    from qtool.exporters.c_export import c_name
    from qtool.exporters.c_verify import export_fingerprint

    if export_dir.exists() and not export_dir.is_dir():
        raise QtoolError(f"{export_dir} is a file, not an export directory (the folder that qtool export c wrote)")
    if not export_dir.is_dir():
        raise QtoolError(f"export directory not found: {export_dir}")
    if name is not None:
        return c_name(name)
    whole = isinstance(qm, QGraph)
    # a whole model's header says how many edges it has; its GRUs' tables are NAME_<node>_params.h
    wholes = sorted(p.stem for p in export_dir.glob("*.h") if "_NUM_EDGES (" in p.read_text(errors="replace"))
    if whole:
        prefixes = wholes
    else:
        prefixes = sorted(p.name[:-len("_params.h")] for p in export_dir.glob("*_params.h"))
        prefixes = [p for p in prefixes if not any(p == w or p.startswith(f"{w}_") for w in wholes)]
    if len(prefixes) == 1:
        return prefixes[0]
    if not prefixes and not whole and wholes:
        raise QtoolError(f"{export_dir} holds a whole model's export ({', '.join(wholes)}), not a GRU alone's; "
                         "verify it with that whole model's quantized file")
    if not prefixes:
        raise QtoolError(f"{export_dir}: no " + ("whole-model C export here; run 'qtool export c' on the quantized "
                                                 "whole model" if whole else
                                                 "qtool C export here (no NAME_params.h); run 'qtool export c'"))
    default = c_name(qm.graph.name if whole else qm.model.name)
    mine = qm.fingerprint()
    made = [p for p in prefixes if export_fingerprint(export_dir, p) == mine]
    if made:
        return default if default in made else made[0]
    if default in prefixes:
        return default  # verify then says it was made from another model
    raise QtoolError(f"{export_dir} holds several exports ({', '.join(prefixes)}), none made from this model "
                     f"(fingerprint {mine}); run 'qtool export c', or choose one with `name`")
