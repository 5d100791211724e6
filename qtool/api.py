"""The Python API: the pipeline as functions that take models and data and return objects. The
command line (qtool.cli) only turns arguments into these calls and results into tables or JSON;
notebooks, training scripts and distributed runs call the same functions.

    import qtool
    model = qtool.load_model("model.safetensors")          # or .pt, .keras, .onnx, haste .npz
    qm = qtool.calibrate(model, "calib.npy", bits="int8", method="mse")
    qtool.save(qm, "q.h5")
    res = qtool.simulate(qm, "test.npy")
    print(res.output.snr_db, res.output.cosine)
    qtool.export_c(qm, "out/c", name="digits")
    print(qtool.verify(qm, "out/c", "test.npy"))

Data arguments take a file path (.npy, .npz, .h5), a float array `[N, T, C]` or a SequenceData.
Every user error raises qtool.errors.QtoolError with a one-line message.
"""

from __future__ import annotations

import contextlib
import json
import math
import os
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from qtool.core import edges
from qtool.core.graph import Graph
from qtool.core.model import DIRECTIONS, GruModel, tensor_key  # noqa: F401 (DIRECTIONS: FRONT_END)
from qtool.core.qgraph import MODEL_OPS, QGraph
from qtool.core.qmodel import QuantModel
from qtool.core.tensors import cell_params, cell_tensors  # noqa: F401 (FRONT_END)
from qtool.errors import QtoolError
from qtool.importers.once import read_once
from qtool.io.files import SequenceData, claim_output, now_utc, open_sequences, sha256_file
from qtool.io.phases import phase
from qtool.parallel import world

# What a front end (the command line, a notebook's display, a GUI) reads besides the verbs
# (qtool.API) and their results, to show them as qtool does: docs/api.md, "For front ends". The
# command line uses nothing else of qtool's (tests/project/test_layers.py).
FRONT_END = ("DIRECTIONS", "PRESETS", "cell_params", "cell_tensors", "claim_output", "describe_check", "file_ranges",
             "import_lines", "import_note", "is_whole_model", "mode_explanation", "model_file_format",
             "needs_compile", "op_text", "qgraph_rows", "read_once", "steps_text")
TYPES = ("Graph", "GruModel", "QGraph", "QuantModel", "SequenceData", "Inspection", "Calibration", "Comparison",
         "SimulationResult", "ExportResult", "VerifyResult", "GraphVerifyResult", "ReportResult")
__all__ = ["advise", "as_data", "calibrate", "compare", "export_c", "export_tables", "html_report", "inspect", "load",
           "load_model", "observe", "precompile", "save", "simulate", "verify", *TYPES, *FRONT_END]

Progress = Callable[[int, int], None]  # progress(done, total)
DataLike = str | os.PathLike | np.ndarray | SequenceData


# What only one kind of model takes. Options: (who takes it, its default); a value other than the
# default given for the other kind is refused in one line. Verbs: what they take, and why.
ONLY_FOR = {"method_weights": ("a GRU alone", "minmax"), "per_tensor": ("a GRU alone", True),
            "labels": ("a whole model", None)}
GRU_ONLY_VERBS = {
    "compare": "its calibrate --method auto scores per-edge, minmax and mse at its output",
    "observe": "it is calibrated whole by calibrate",
    "export_tables": "a whole model's integers are in its C export (export c)",
}


def _only(whole: bool, verb: str, **given) -> None:
    """Refuse `verb` for a whole model where it takes a GRU alone, and any option `given` a value
    the model's kind does not take (ONLY_FOR)."""
    kind = "a whole model" if whole else "a GRU alone"
    if whole and verb in GRU_ONLY_VERBS:
        what = "export json/h5 (export_tables)" if verb == "export_tables" else verb  # as the command line says it
        raise QtoolError(f"a whole model: {what} takes a GRU alone; {GRU_ONLY_VERBS[verb]}")
    for option, value in given.items():
        who, default = ONLY_FOR[option]
        given_default = value is default or (not isinstance(value, np.ndarray) and value == default)
        if who != kind and not given_default:
            raise QtoolError(f"`{option}` applies to {who}; {verb} was given {kind}")


def _whole(model) -> bool:
    """Whether `model` (a model, a model file or a PyTorch module) is a whole model, not a GRU alone."""
    if isinstance(model, (Graph, QGraph)):
        return True
    if isinstance(model, (GruModel, QuantModel)):
        return False
    if not isinstance(model, (str, os.PathLike)):
        return True  # an nn.Module: load_model exports it whole
    if not Path(model).is_file():
        return False  # the GRU's path says what is missing, after the options it checks first
    return _h5_format(Path(model)) == "qtool-qgraph" or is_whole_model(model)


def as_data(data: DataLike, dataset: str | None = None, time_first: bool = False) -> SequenceData:
    """A file path, an array `[N, T, C]` (or `[T, N, C]` with time_first) or SequenceData."""
    if isinstance(data, SequenceData):
        return data
    if isinstance(data, np.ndarray):
        return SequenceData(data, time_first, "array")
    return open_sequences(Path(data), dataset, time_first)


def count(data: SequenceData, limit: int | None) -> int:
    """How many sequences to use: all, or `limit` (at least 1)."""
    if limit is None:
        return data.num_sequences
    if isinstance(limit, bool) or not isinstance(limit, (int, np.integer)) or limit < 1:
        raise QtoolError(f"`limit` must be a positive number of sequences, got {limit}")
    return min(int(limit), data.num_sequences)


def load_model(path, fmt: str | None = None, name: str | None = None, check: bool = True, *,
               whole: bool | None = None, example=None, for_data: bool = False) -> GruModel | Graph:
    """The float model of a file: a whole model (`Graph`, docs/graph.md) where a Keras or ONNX file
    holds layers besides its GRU(s), or is qtool's whole-model file; else its GRU (`GruModel`),
    from a qtool model file or any importable file (PyTorch, Keras, ONNX, haste). `name` takes
    one GRU of a file alone; `whole=True` the graph even of a file that holds only GRUs (a file
    of a GRU's weights alone, PyTorch, haste or qtool's: the graph of one gru node,
    qtool.layers.gru.alone), and `whole=False` its GRU. `path` may be a PyTorch `nn.Module`
    with an `example` input `[N, T, C]`: exported through ONNX and checked against the module. An imported model is
    checked against its framework where that is installed (`check`). `for_data`: the command
    feeds data to the file, so a GRU that reads another layer's output is refused."""
    if not isinstance(path, (str, os.PathLike)):
        return _load_graph(path, fmt, check, example)
    with read_once():  # deciding what the file is and importing it read it once
        if whole and _weights_only(Path(path), fmt):
            return _alone(_load_gru(path, fmt, name, check), path)
        if whole or (whole is None and name is None and fmt is None and is_whole_model(path)):
            return _load_graph(path, fmt, check)
        return _load_model_for_data(path, fmt, name, check) if for_data else _load_gru(path, fmt, name, check)


def _alone(model: GruModel, path) -> Graph:
    """A GRU alone as the graph of one gru node, with what its import checked and left out."""
    from qtool.layers import check as check_graph
    from qtool.layers.gru import alone

    graph = check_graph(alone(model), str(path))
    graph.check_result = model.extra.get("check")
    if graph.check_result is None and _h5_format(Path(path)) in ("qtool-gru", "qtool-qgru"):
        graph.check_result = {"checked": False, "reason": "qtool's own GRU file (its import ran the check)"}
    graph.notes = [n for n in [import_note(model)] if n]
    return graph


def _weights_only(path: Path, fmt: str | None) -> bool:
    """Whether the file holds a GRU's weights and no graph (PyTorch, safetensors, haste, qtool's
    GRU files)."""
    from qtool.importers import detect_format

    if _h5_format(path) in ("qtool-gru", "qtool-qgru"):
        return True
    try:
        return (fmt or detect_format(path)) in ("torch", "safetensors", "haste")
    except QtoolError:
        return False


def _load_gru(path: str | os.PathLike, fmt: str | None = None, name: str | None = None,
              check: bool = True) -> GruModel:
    """A float GRU from a qtool model file or any importable file (PyTorch, Keras, ONNX, haste)."""
    from qtool.core.model import load_model as load_h5_model
    from qtool.importers import import_model

    path = Path(path)
    model = None
    if path.suffix.lower() in (".h5", ".hdf5") and fmt is None:
        kind = _h5_format(path)
        if kind == "qtool-gru":
            model = load_h5_model(path)
        elif kind == "qtool-qgru":
            model = load(path).model
    if model is None:
        model = import_model(path, fmt, name, check=check)
    if path.is_file():
        model.extra["sha256"] = sha256_file(path)
    model.extra["path"] = str(path)  # an output must never replace it
    return model


def _load_model_for_data(path: str | os.PathLike, fmt: str | None = None, name: str | None = None,
                        check: bool = True) -> GruModel:
    """`load_model` for a command that feeds data to the file (calibrate, advise): the data are the
    model's input, so a GRU that reads another layer's output is refused, remedy included."""
    from qtool.importers import not_fed_by_input

    model = _load_gru(path, fmt, name, check)
    refusal = not_fed_by_input(model, Path(path))
    if refusal:
        raise QtoolError(refusal)
    return model


def gru_names(path: str | os.PathLike) -> list[str]:
    """The GRUs a framework file offers to `load_model(path, name=...)`."""
    from qtool.importers import gru_names as names

    return names(path)


def import_lines(model: GruModel) -> list[str]:
    """What `import` says of a model it read: the check against the framework, and what the file
    holds besides the GRU (qtool.importers.import_note)."""
    note = import_note(model)
    return [describe_check(model.extra.get("check")), *([f"note: {note}"] if note else [])]


def import_note(model: GruModel) -> str | None:
    """One line on what an import of a framework file took, left out and assumed; None if nothing."""
    from qtool.importers import import_note as note

    return note(model)


def _load_graph(path, fmt: str | None = None, check: bool = True, example=None):
    """The whole model of a Keras or ONNX file as a graph of layers (docs/graph.md), checked
    against the framework where it is installed (`check`). `path` may also be a PyTorch
    `nn.Module` with an `example` input `[N, T, C]`: exported with `torch.onnx.export` (batch and
    steps left free) into a temporary file, read, and checked against the module itself."""
    from qtool.importers import import_graph

    if isinstance(path, (str, os.PathLike)):
        if _h5_format(Path(path)) in ("qtool-graph", "qtool-qgraph"):
            from qtool.graph.file import load as load_file

            g = load_file(path)
            return g if isinstance(g, Graph) else g.graph
        return import_graph(path, fmt, check)
    from qtool.importers.torch.module import graph_of_module

    return graph_of_module(path, example, check)


def whole_model(path: str | os.PathLike, fmt: str | None = None) -> tuple[Graph | None, str | None]:
    """(graph, None) when the file at `path` is a whole model: qtool's own whole-model file, or a
    Keras or ONNX file with layers besides its GRU(s) (read, not yet checked against the
    framework). (None, None) for a GRU alone or a file with no graph (a PyTorch state dict, haste
    weights, qtool's GRU files); (None, why) when its graph cannot be taken."""
    from qtool.importers import detect_format

    path = Path(path)
    h5 = _h5_format(path)
    if h5 in ("qtool-graph", "qtool-qgraph"):
        return _load_graph(path), None
    try:
        kind = fmt or detect_format(path)  # `fmt`: the format a file named otherwise holds
        if h5 not in (None, "keras") or kind not in ("keras", "onnx", "tflite"):
            return None, None
        g = _load_graph(path, kind, check=False)
    except QtoolError as e:
        return None, str(e)
    return (None, None) if all(n.op in MODEL_OPS for n in g.nodes) else (g, None)


def is_whole_model(path: str | os.PathLike, fmt: str | None = None) -> bool:
    """Whether the file at `path` is a whole model (`whole_model`). A file with more than a GRU
    whose graph cannot be taken is refused with the reason (taking its GRU alone is `name`'s
    choice): never part of a model without a word."""
    path = Path(path)
    graph, why = whole_model(path, fmt)
    if why:
        try:
            left_out = _load_gru(path, fmt, check=False).extra.get("import", {}).get("left_out")
        except QtoolError as e:  # neither the whole model nor a GRU alone: both reasons, the whole one first
            whole, alone = _unprefixed(why, path), _unprefixed(str(e), path)
            if _same_reason(whole, alone):  # a recurrent node qtool does not read, a state input: once
                raise
            raise QtoolError(f"{path}: the whole model cannot be taken: {whole}; nor one GRU alone: {alone}") from None
        if left_out:
            raise QtoolError(f"{path}: the whole model cannot be taken: {_unprefixed(why, path)} (`name` takes "
                             f"one GRU, or the stack of GRU layers it starts, alone: {', '.join(gru_names(path))})")
    return graph is not None


def _same_reason(a: str, b: str) -> bool:
    """Whether two refusals end alike (the same reason, each naming its node its own way)."""
    tail = len(os.path.commonprefix([a[::-1], b[::-1]]))
    return tail >= 0.6 * min(len(a), len(b))


def _unprefixed(reason: str, path: Path) -> str:
    prefix = f"{path}: "
    return reason[len(prefix):] if reason.startswith(prefix) else reason


def op_text(node) -> str | None:
    """How tables show a graph node's op where its layer says more than the op's name (a gru: its
    layers, direction and a cell other than the haste form); None for the others."""
    from qtool.layers import layer

    describe = getattr(layer(node.op, node.label), "describe", None)
    return describe(node) if describe else None


def qgraph_rows(qg: QGraph, sim=None) -> list[dict]:
    """A row per edge the integer core writes, in graph order: the layer, its op, the edge's shape
    and grid (an input with a grid per channel: `channel_shifts`, channel c's exp2_inv is
    exp2_inv + k_c), how the grid was set, and with a simulation its distances."""
    methods = qg.info.get("edge_methods", {})
    steps = steps_text(qg.graph)
    edges = [(e, "input", "input") for e in qg.graph.inputs]
    edges += [(e, n, qg.node(n)) for n in qg.core for e in qg.node(n).outputs]
    rows = []
    for e, name, node in edges:
        g = qg.grids[e]
        op = node if isinstance(node, str) else (node.attrs.get("kind") or node.op)
        row = {"layer": name, "op": op, "edge": e, "shape": list(qg.graph.shapes.get(e, ())), "steps": steps.get(e),
               "bits": g.bits, "exp2_inv": int(g.exp2_inv), "zp": int(g.zp), "method": methods.get(e, "")}
        if e in qg.graph.input_shifts:  # a grid per channel: channel c's is 2^-(exp2_inv + k_c)
            row["channel_shifts"] = list(qg.graph.input_shifts[e])
        if sim is not None:
            row.update(sim.edges[e].as_dict())
        rows.append(row)
    return rows


def steps_text(graph: Graph) -> dict[str, str]:
    """Each sequence edge's steps against the input's T: "T", "T/2", "T-2" (qtool.layers)."""
    from qtool.layers import steps_text as of_graph

    return of_graph(graph)


def _load_qgraph(path: str | os.PathLike) -> QGraph:
    """A quantized whole-model file (`save` of `calibrate`'s result for a whole model), proved well formed."""
    from qtool.graph.file import load as load_file

    path = Path(path)
    fmt = _h5_format(path)
    if fmt != "qtool-qgraph":
        kind = "a float whole-model file" if fmt == "qtool-graph" else _other_model(path)
        if kind is None:
            raise QtoolError(f"{path}: not a quantized whole-model file")
        raise QtoolError(f"{path}: {kind}; quantize it first: qtool calibrate {path} CALIB_DATA -o q.h5")
    return load_file(path)


def _save_graph(model: Graph | QGraph, path: str | os.PathLike, force: bool = False,
               confirm: Callable[[str], bool] | None = None, inputs: Sequence = ()) -> Path:
    """Write a whole model (format qtool-graph) or a quantized one (qtool-qgraph) atomically."""
    from qtool.graph.file import write_graph, write_qgraph
    from qtool.io.files import write_h5

    def write() -> None:
        write_h5(claim_output(path, force, inputs, confirm),
                 lambda f: (write_qgraph if isinstance(model, QGraph) else write_graph)(f, model))

    _write_once(write)
    return Path(path)


def _one_input_graph(model: Graph | str | os.PathLike, check: bool) -> tuple[Graph, Path | None]:
    """The graph of `model` (read from its file, checked against its framework with `check`) and
    that file; a model of more than one input is refused."""
    source = None
    if not isinstance(model, Graph):
        source = Path(model)
        model = _load_graph(source, check=check)
    if len(model.inputs) != 1:
        raise QtoolError(f"the model has {len(model.inputs)} inputs; qtool calibrates models of one input")
    return model, source


def _calibrate_graph(model: Graph | str | os.PathLike, data: DataLike, *, bits: str | dict = "int8",
                    method: str = "auto", percentile: float = 99.99, batch_size: int = 64,
                    limit: int | None = None, dataset: str | None = None, time_first: bool = False,
                    check: bool = True, snap: str = "up", progress: Progress | None = None) -> QGraph:
    """Quantize a whole model (a graph, a whole-model file or a Keras/ONNX file) on calibration
    data `[N, T, C]` of its input: every edge's grid, each GRU calibrated on its own input
    (docs/graph.md). `method`: auto (per-edge, minmax and mse scored at the output on the last
    20% of the data, the best calibrated on all), per-edge (per edge the method with the least
    error there; each GRU its own auto) or one of minmax, percentile, mse, kl, ema. A QDQ file's
    fake-quant pairs (`Graph.ranges`) give their edges' grids (`snap` as for a GRU's imported
    ranges); the calibration sets the rest."""
    from qtool.calibrators import METHODS
    from qtool.graph.calibrate import calibrate_graph as run_calibration

    if method not in ("auto", "per-edge", *METHODS):
        raise QtoolError(f"unknown `method` '{method}' (use auto, per-edge or one of {', '.join(METHODS)})")
    if batch_size < 1:
        raise QtoolError("`batch_size` must be at least 1")
    if snap not in ("up", "nearest"):
        raise QtoolError(f"`snap` must be up or nearest, got '{snap}'")
    label, config = _bits_config(bits)
    model, source = _one_input_graph(model, check)
    data = as_data(data, dataset, time_first)
    n = count(data, limit)
    tick = (lambda done: progress(done, n)) if progress else None
    path = Path(data.name)
    info = {"method": method, "bits": label, "samples": n, "time_steps": int(data.shape[1]), "data_file": path.name,
            "data_sha256": sha256_file(path) if path.is_file() else "", "created": now_utc(),
            "source": model.source, "source_file": source.name if source else "",
            "source_sha256": sha256_file(source) if source and source.is_file() else ""}
    info["notes"] = axes_notes(model.steps, data.shape, data.time_first, "declares")
    if method == "auto":
        from qtool.graph.calibrate import calibrate_auto_graph

        return calibrate_auto_graph(model, data, n, config, percentile, batch_size, tick, info, snap)
    return run_calibration(model, data, n, config, method, percentile, batch_size, tick, info, snap)


def load_labels(labels, n: int, classes: int, used: int | None = None) -> np.ndarray:
    """Class indexes in 0..classes-1 from an array or a .npy file: one per sequence of the data
    (`n`), or one per sequence used (`used`, the first ones with a limit)."""
    if isinstance(labels, (str, os.PathLike)):
        path = Path(labels)
        if not path.is_file():
            raise QtoolError(f"labels: file not found: {path}")
        if path.suffix != ".npy":
            raise QtoolError(f"labels {path}: give a .npy file of class indexes")
        try:
            labels = np.load(path, allow_pickle=False)
        except (OSError, ValueError):
            raise QtoolError(f"labels {path}: not a readable .npy file of numbers") from None
    labels = np.asarray(labels)
    if labels.ndim != 1 or labels.dtype.kind not in "iu" or len(labels) not in (n, used):
        counts = (f"{n}" if used in (None, n) else
                  f"{n} (one per sequence of the data) or {used} (one per sequence used)")
        raise QtoolError(f"labels must be one integer class index per sequence, [{counts}]; got shape "
                         f"{list(labels.shape)} of {labels.dtype}")
    bad = (labels < 0) | (labels >= classes)
    if bad.any():
        raise QtoolError(f"label {labels[bad][0]} (sequence {int(np.argmax(bad))}) is not a class of the model's "
                         f"{classes} outputs (0..{classes - 1})")
    return labels


def _simulate_graph(qg: QGraph | str | os.PathLike, data: DataLike, *, labels=None, batch_size: int = 256,
                   limit: int | None = None, dataset: str | None = None, time_first: bool = False,
                   outputs: bool = False, save: str | os.PathLike | None = None, force: bool = False,
                   confirm: Callable[[str], bool] | None = None, backend: str = "auto",
                   mode: str = "integer", progress: Progress | None = None):
    """Run a quantized whole model in integers beside its float graph on `data`: every edge's and
    the outputs' SNR, cosine and saturation; for a classifier top-1 agreement, and with `labels`
    both accuracies (qtool.graph.simulate.GraphSimulation). `outputs=True` keeps the first
    output's float/y, quant/y and quant/y_int (`kept`, in the output's own shape, e.g.
    `[N, classes]`); `save` writes them to an HDF5 file. `backend`: the GRUs' engine, as for
    `simulate` (the other layers run on the CPU). `mode`: "integer", "fakequant" (the float graph
    with every weight and edge rounded onto its grid, qtool.graph.fakequant) or "both"."""
    from qtool.engine.backend import select_backend
    from qtool.graph.simulate import simulate_graph as run_simulation
    from qtool.io.files import write_h5

    _check_mode(mode)
    runner, label, reason = select_backend(backend)
    qg_path = None
    if not isinstance(qg, QGraph):
        qg_path = Path(qg)
        qg = _load_qgraph(qg_path)
    if save is not None:
        files = [qg_path, data, labels]
        save = claim_output(save, force, [f for f in files if isinstance(f, (str, os.PathLike))], confirm)
    if batch_size < 1:
        raise QtoolError("`batch_size` must be at least 1")
    data = as_data(data, dataset, time_first)
    n = count(data, limit)
    shape_notes = axes_notes(int(qg.info.get("time_steps", 0)), data.shape, data.time_first)
    lab = None
    if labels is not None:
        from qtool.graph.simulate import classes

        if classes(qg) is None:
            shape = qg.graph.shapes.get(qg.graph.outputs[0], ())
            raise QtoolError(f"`labels` go with a classifier; the model's output {qg.graph.outputs[0]} is "
                             f"{'a sequence' if edges.is_sequence(shape) else 'one value'}, not a vector of classes")
        try:
            lab = load_labels(labels, data.num_sequences, classes(qg), n)[:n]
        except QtoolError as e:  # a count of labels that does not fit data with swapped axes: say that
            raise QtoolError(f"{shape_notes[0]} ({e})" if shape_notes else str(e)) from None
    tick = (lambda done: progress(done, n)) if progress else None
    keep = outputs or save is not None
    comm = world()
    if comm is None:
        sim = run_simulation(qg, data, n, batch_size, lab, keep, tick, runner, mode)
    else:  # under mpiexec: each rank its chunks, the root folds them in order and writes `save`
        from qtool.parallel.graph import simulate_graph as simulate_ranks

        sim = simulate_ranks(comm, qg, data, n, batch_size, lab, keep, tick, runner, mode)
    sim.backend, sim.backend_reason = label, reason
    saturated = {e: sim.edges[e].as_dict()["saturated"] for e in qg.graph.inputs if e in sim.edges}
    worst = {e: _worst_channel(qg, e, data, n, batch_size) for e, share in saturated.items()
             if share > SATURATED_NOTE and e in qg.graph.input_shifts}
    sim.notes = shape_notes + saturation_notes(saturated, worst)
    if save is not None:
        def write(f) -> None:
            from qtool.graph.file import fingerprint
            from qtool.io.results import RESULTS_FORMAT
            from qtool.version import __version__

            # the GRU-only results file's attributes, with the same meaning (docs/file-formats.md)
            f.attrs.update(format=RESULTS_FORMAT, version=1, qtool_version=__version__, samples=n, mode=mode,
                           qmodel_fingerprint=fingerprint(qg), model=str(qg_path or qg.graph.name),
                           data_file=Path(data.name).name, created=now_utc(),
                           data_sha256=sha256_file(Path(data.name)) if Path(data.name).is_file() else "")
            for k, v in sim.kept.items():
                f.create_dataset(k, data=v)

        _write_once(lambda: write_h5(save, write))
    return sim


SATURATED_NOTE = 0.02  # more than this share of an input's values outside its grid is said


def axes_notes(steps: int | None, shape: tuple, time_first: bool, source: str = "was calibrated on") -> list[str]:
    """Data `[N, T, C]` (as read, after `time_first`) whose first axis is the number of steps the
    model expects (`steps`: what it `source`, calibrated on or declared by its file) and whose
    second is not: batch and steps look swapped (the command says it, and runs on)."""
    n, t = shape[0], shape[1]
    if steps and t != steps and n != steps and source == "declares":
        return [f"the model declares sequences of {steps} steps; the data [{n}, {t}, {shape[2]}] have {t} per "
                "sequence (qtool runs any length: are these the data the model was made for?)"]
    if not steps or n != steps or t == steps:
        return []
    if time_first:
        return [f"the data read time-first are [{n}, {t}, {shape[2]}] sequences x steps: the model {source} "
                f"sequences of {steps} steps, their first axis, not their second; if they are [N, T, C], "
                "drop `time_first`"]
    return [f"the data [{n}, {t}, {shape[2]}] look time-first: the model {source} sequences of {steps} steps, "
            "which is their first axis, not their second; if they are [T, N, C], pass `time_first`"]


def saturation_notes(saturated: dict[str, float], worst: dict[str, str] | None = None) -> list[str]:
    """Inputs with more than 2% of their values outside their grid (input -> share): data scaled
    unlike the calibration data (`simulate` says it, and runs on); `worst`: an input with a grid
    per channel -> the channel most outside its own."""
    worst = worst or {}
    return [f"{share:.1%} of the values of input '{name}' lie outside its grid (saturated"
            + (f"; most on {worst[name]}" if name in worst else "") + "): are the data scaled as the calibration "
            "data were?" for name, share in saturated.items() if share > SATURATED_NOTE]


def _worst_channel(qg: QGraph, edge: str, data: SequenceData, n: int, chunk: int) -> str:
    """The channel of a per-channel input grid with the largest share of values outside its own
    grid: `channel 3 (its grid 2^-15 finer): 95.0%`."""
    g, shifts = qg.grids[edge], qg.graph.input_shifts[edge]
    out, total = np.zeros(len(shifts)), 0
    for _, x in data.chunks(chunk, n):
        v = qg.graph.scale_inputs({edge: x})[edge].reshape(-1, len(shifts))
        out += ((v < g.lo) | (v > g.hi)).sum(0)
        total += v.shape[0]
    c = int(np.argmax(out))
    return f"channel {c} (its grid 2^-{shifts[c]} finer): {out[c] / max(total, 1):.1%}"


def range_notes(data: SequenceData, n: int, test: SequenceData) -> list[str]:
    """Held-out data with more than 2% of their values outside the range of the first `n`
    calibration sequences: data scaled unlike the calibration data (advise says it)."""
    lo, hi = math.inf, -math.inf
    for _, x in data.chunks(256, n):
        lo, hi = min(lo, float(np.nanmin(x))), max(hi, float(np.nanmax(x)))
    outside = total = 0
    for _, x in test.chunks(256):
        outside += int(np.count_nonzero((x < lo) | (x > hi)))
        total += x.size
    share = outside / max(total, 1)
    if share <= SATURATED_NOTE:
        return []
    return [f"{share:.1%} of the held-out values lie outside the calibration data's range [{lo:.4g}, {hi:.4g}]: "
            "are they scaled as the calibration data are?"]


def _check_mode(mode: str) -> None:
    from qtool.simulation.fakequant import MODES

    if mode not in MODES:
        raise QtoolError(f"unknown `mode` '{mode}' (use one of {', '.join(MODES)})")


def model_file_format(path: str | os.PathLike) -> str | None:
    """The format of a qtool HDF5 file ("qtool-gru", "qtool-qgru", "qtool-graph", "qtool-qgraph"),
    "keras" for a Keras HDF5 file, "" for another HDF5 file, None for no HDF5 file."""
    return _h5_format(Path(path))


def describe_check(check: dict | None) -> str:
    """One line on what an import was checked against and how closely."""
    from qtool.importers.crosscheck import describe

    return describe(check)


def needs_compile() -> bool:
    """Whether the CPU engine's kernels are not in numba's cache yet (the first run compiles them)."""
    from qtool.engine.cpu import needs_compile as missing

    return missing()


@dataclass
class Inspection:
    """What a file holds: its float model, and its quantization when it is a quantized model."""

    model: GruModel | Graph
    qm: QuantModel | QGraph | None

    @property
    def quantized(self) -> bool:
        return self.qm is not None


def inspect(path: str | os.PathLike, *, name: str | None = None, check: bool = True) -> Inspection:
    """A quantized or float qtool model file, or any importable file (imported as `load_model`
    imports it, checked)."""
    import h5py

    from qtool.core.model import open_h5
    from qtool.core.qmodel import is_qmodel

    path = Path(path)
    quantized = False
    if path.is_file() and h5py.is_hdf5(path):  # else an importable file, or load_model's error
        with open_h5(path) as f:
            quantized = is_qmodel(f)
    if quantized or _h5_format(path) == "qtool-qgraph":
        qm = load(path)
        return Inspection(qm.model if isinstance(qm, QuantModel) else qm.graph, qm)
    return Inspection(load_model(path, name=name, check=check), None)


def export_tables(qm: QuantModel | str | os.PathLike, output: str | os.PathLike, kind: str = "json", *,
                  force: bool = False, confirm: Callable[[str], bool] | None = None) -> Path:
    """Every integer parameter and table as JSON (`kind="json"`) or HDF5 (`"h5"`) for other
    toolchains (docs/file-formats.md); written atomically."""
    from qtool.exporters.tables import json_bytes, write_h5
    from qtool.io.files import write_bytes

    if kind not in ("json", "h5"):
        raise QtoolError(f"`kind` must be json or h5, got '{kind}'")
    _only(_whole(qm), "export_tables")
    qm_path = None
    if not isinstance(qm, QuantModel):
        qm_path = Path(qm)
        qm = load(qm_path)
    output = claim_output(output, force, [qm_path], confirm)
    if kind == "json":
        write_bytes(output, json_bytes(qm))
    else:
        write_h5(qm, output)
    return output


def mode_explanation(mode: str) -> str | None:
    """What a fake-quant simulation measures, for `mode` "fakequant" or "both"; None for "integer"."""
    if mode == "integer":
        return None
    from qtool.simulation.fakequant import EXPLANATION

    return EXPLANATION


def load(path: str | os.PathLike) -> QuantModel | QGraph:
    """A quantized model file: a GRU's (`QuantModel`, validated by qtool.numerics.validate) or a
    whole model's (`QGraph`, proved well formed); safe for every engine and exporter."""
    from qtool.io.qmodel_file import load_qmodel

    path = Path(path)
    if _h5_format(path) == "qtool-qgraph":
        return _load_qgraph(path)
    try:
        return load_qmodel(path)
    except QtoolError:
        kind = _other_model(path)  # a float model or a framework file: say what it is and what to run
        if kind is None:
            raise
        if kind.startswith("an empty file"):
            raise QtoolError(f"{path} is empty (0 bytes), not a quantized model") from None
        raise QtoolError(f"{path}: {kind}, not a quantized model; quantize it first: qtool calibrate "
                         f"{path} CALIB_DATA -o q.h5") from None


def _h5_format(path: Path) -> str | None:
    """The `format` attribute of an HDF5 file ("qtool-gru", "qtool-qgru", "" for others such as
    Keras'), or None when `path` is no HDF5 file."""
    import h5py

    from qtool.core.model import open_h5

    if not (path.is_file() and h5py.is_hdf5(path)):
        return None
    with open_h5(path) as f:
        fmt = f.attrs.get("format", "")
        keras = "keras_version" in f.attrs or "model_config" in f.attrs
    fmt = fmt.decode(errors="replace") if isinstance(fmt, bytes) else str(fmt)
    return "keras" if keras and not fmt else fmt


def _other_model(path: Path) -> str | None:
    """What a file that is no quantized model is, when it is a model of another kind."""
    from qtool.importers import detect_format

    if not path.is_file():
        return None
    if path.stat().st_size == 0:
        return "an empty file (0 bytes)"
    fmt = _h5_format(path)
    if fmt is None:
        with contextlib.suppress(QtoolError):
            fmt = detect_format(path)
    return {"qtool-gru": "a float qtool model", "qtool-graph": "a float whole model",
            "keras": "a Keras model", "torch": "a PyTorch file",
            "safetensors": "a safetensors file", "onnx": "an ONNX model", "tflite": "a TFLite model",
            "haste": "haste weights"}.get(fmt)


def _write_once(write: Callable[[], None]) -> None:
    """Write an output file; under mpiexec rank 0 writes it and every rank learns the outcome."""
    comm = world()
    if comm is None:
        write()
    else:
        from qtool.parallel.agree import on_root

        on_root(comm, write)


def save(model: QuantModel | QGraph | GruModel | Graph, path: str | os.PathLike, force: bool = False,
         confirm: Callable[[str], bool] | None = None, inputs: Sequence = ()) -> Path:
    """Write a model file atomically, in the format of what `model` is (docs/file-formats.md): a
    quantized GRU (validated first), a quantized whole model, a float GRU or a float whole model.
    An existing file is replaced only as qtool.io.files.claim_output allows, never one of `inputs`."""
    from qtool.io.files import write_h5
    from qtool.io.qmodel_file import write_qmodel

    if isinstance(model, (Graph, QGraph)):
        return _save_graph(model, path, force, confirm, inputs)
    if isinstance(model, GruModel):
        return _save_model(model, path, force, confirm, inputs)

    def write() -> None:
        write_h5(claim_output(path, force, inputs, confirm), lambda f: write_qmodel(f, model))

    _write_once(write)
    return Path(path)


def _save_model(model: GruModel, path: str | os.PathLike, force: bool = False,
               confirm: Callable[[str], bool] | None = None, inputs: Sequence = ()) -> Path:
    """Write a float model file (format qtool-gru) atomically."""
    from qtool.core.model import write_model
    from qtool.io.files import write_h5

    def write() -> None:
        write_h5(claim_output(path, force, inputs, confirm), lambda f: write_model(f, model))

    _write_once(write)
    return Path(path)


def _bits_config(bits: str | dict) -> tuple[str, dict]:
    from qtool.core.tensors import TensorConfig, load_bits

    if isinstance(bits, dict):
        if not all(isinstance(v, TensorConfig) for v in bits.values()):
            raise QtoolError("bits must be a preset name, a bits file or a {tensor: TensorConfig} dict")
        return "custom", bits
    return load_bits(bits)


def _provenance(model: GruModel, data: SequenceData | None, n: int, label: str, config: dict,
                method: str) -> dict:
    config_text = json.dumps({k: {"bits": c.bits, "symmetric": c.symmetric, "method": c.method}
                              for k, c in config.items()}, sort_keys=True)
    path = Path(data.name) if data is not None else None
    return {
        "method": method, "bits": label, "bits_config": config_text,
        "data_file": path.name if path else "", "data_sha256": sha256_file(path) if path and path.is_file() else "",
        "samples": n, "time_steps": data.shape[1] if data is not None else 0, "source": model.source,
        "source_sha256": model.extra.get("sha256", ""), "created": now_utc(),
    }


def file_ranges(path: str | os.PathLike, model: GruModel):
    """The ranges a quantized or QAT-trained model file holds (ONNX QDQ, torch.ao fake-quant, a
    QuantGRU checkpoint) for `model`, imported from it; None for a float model file."""
    from qtool.importers import read_imported

    return read_imported(Path(path), model)


@dataclass
class Calibration:
    """The observations of one float pass and how to turn them into quantized models. With
    `ranges` (a quantized or QAT-trained file's own ranges), those are kept and the observations
    fill in the rest; `ranges_used` then lists where each kept range came from."""

    model: GruModel
    data: SequenceData | None
    samples: int
    label: str
    config: dict
    plans: list
    observers: list
    ranges: object = None
    snap: str = "up"
    ranges_used: list = field(default_factory=list)
    auto: object = None  # method auto: (its quantized model, qtool.calibration.auto.AutoChoice)

    def quant_model(self, k: int = 0) -> QuantModel:
        from qtool.calibration.observe import build_quant_model

        if self.auto is not None:
            return self.auto[0]
        method = self.plans[k].label()
        if self.ranges is not None:
            method = f"ranges from the {self.ranges.kind} file (snap {self.snap})" + (
                f", the rest {method}" if self.data is not None else "")
        info = _provenance(self.model, self.data, self.samples, self.label, self.config, method)
        if self.ranges is None:
            return build_quant_model(self.model, self.observers[k], self.config, info, self.plans[k])
        from qtool.calibration.from_file import build_from_file

        qm, self.ranges_used = build_from_file(self.ranges, self.model, self.config, info, self.snap,
                                               self.observers[k], self.plans[k])
        return qm


def observe(model: GruModel | str | os.PathLike, data: DataLike | None, *, bits: str | dict = "int8",
            methods: Sequence[str] = ("minmax",), method_weights: str = "minmax",
            percentile: float = 99.99, batch_size: int = 64, limit: int | None = None,
            dataset: str | None = None, time_first: bool = False, ranges=None, snap: str = "up",
            progress: Progress | None = None) -> Calibration:
    """One float pass over the calibration data feeding the observers of every method asked for.
    A model file that holds ranges (`file_ranges`; looked up when `model` is a path) keeps them,
    and `data` may then be None when the file holds every range. `methods=("auto",)`: per tensor
    the method with the least held-out error (qtool.calibration.auto); beside a file's own ranges,
    minmax fills in the rest."""
    from qtool.calibration.observe import MethodPlan, collect_many
    from qtool.calibrators import METHODS

    _only(_whole(model), "observe")
    if "auto" in methods and len(methods) > 1:
        raise QtoolError("`methods` takes single methods (auto chooses among them itself)")
    for m in [*(m for m in methods if m != "auto"), method_weights]:
        if m not in METHODS:
            raise QtoolError(f"unknown method '{m}' (use auto or one of {', '.join(METHODS)})")
    if not methods or len(set(methods)) != len(methods):
        raise QtoolError("`methods` needs distinct methods, e.g. minmax,percentile,mse,kl")
    if batch_size < 1:
        raise QtoolError("`batch_size` must be at least 1")
    if not 50.0 < percentile <= 100.0:
        raise QtoolError("`percentile` must be in (50, 100]")
    if snap not in ("up", "nearest"):
        raise QtoolError(f"`snap` must be up or nearest, got '{snap}'")
    label, config = _bits_config(bits)
    if not isinstance(model, GruModel):
        path = Path(model)
        model = _load_model_for_data(path)
        ranges = file_ranges(path, model) if ranges is None else ranges
    auto = list(methods) == ["auto"] and ranges is None
    methods = ["minmax" if m == "auto" else m for m in methods]
    plans = [MethodPlan.from_config(config, m, method_weights, percentile) for m in methods]
    if data is None:
        if ranges is None:
            raise QtoolError("missing DATA (calibration data file)")
        return Calibration(model, None, 0, label, config, plans, [None] * len(plans), ranges, snap)
    data = as_data(data, dataset, time_first)
    data.check_features(model.input_size)
    n = count(data, limit)
    tick = (lambda done: progress(done, n)) if progress else None
    comm = world()
    if auto:  # not distributed: under mpiexec every rank runs it over all the data, rank 0 writes
        from qtool.calibration.auto import calibrate_auto

        info = _provenance(model, data, n, label, config, "auto")
        qm, choice = calibrate_auto(model, data, n, config, method_weights, percentile, batch_size, tick, info)
        return Calibration(model, data, n, label, config, [choice.plan], [None], auto=(qm, choice))
    if comm is None:
        obs = collect_many(model, data, plans, batch_size, n, progress=tick)
    else:  # under mpiexec: each rank observes its chunks; every rank gets the merged observers
        from qtool.parallel.calibrate import collect_many as collect_ranks

        obs = collect_ranks(comm, model, data, plans, batch_size, n, progress=tick)
    return Calibration(model, data, n, label, config, plans, obs, ranges, snap)


def calibrate(model: GruModel | Graph | str | os.PathLike, data: DataLike | None, *, bits: str | dict = "int8",
              method: str = "auto", method_weights: str = "minmax", percentile: float = 99.99,
              batch_size: int = 64, limit: int | None = None, dataset: str | None = None,
              time_first: bool = False, snap: str = "up", check: bool = True,
              progress: Progress | None = None) -> QuantModel | QGraph:
    """Observe every tensor of the float model on calibration data; return the quantized model:
    a `QuantModel` for a GRU alone, a `QGraph` for a whole model (every edge's grid, each GRU
    calibrated on its own input; docs/graph.md). `method`: "auto" (a GRU: per tensor the method
    with the least error on held-out folds of the data, checked at the output against every
    single method, docs/calibration.md; a whole model: per-edge, minmax and mse scored at the
    output on the last 20% of the data, the best calibrated on all), "per-edge" (a whole model:
    per edge its least-error method) or one method. A quantized, QAT-trained or QDQ file keeps
    its own ranges (`snap`: how a scale that is not a power of two becomes one, "up" without
    clipping or "nearest"); `data` fills in the rest. `check`: a file read here is checked
    against its framework."""
    with read_once():
        whole = _whole(model)
        _only(whole, "calibrate", method_weights=method_weights)
        if whole:
            return _calibrate_graph(model, data, bits=bits, method=method, percentile=percentile,
                                    batch_size=batch_size, limit=limit, dataset=dataset, time_first=time_first,
                                    check=check, snap=snap, progress=progress)
        ranges = None
        if not isinstance(model, GruModel):
            path = Path(model)
            model = _load_model_for_data(path, check=check)
            ranges = file_ranges(path, model)
    return observe(model, data, bits=bits, methods=(method,), method_weights=method_weights,
                   percentile=percentile, batch_size=batch_size, limit=limit, dataset=dataset,
                   time_first=time_first, ranges=ranges, snap=snap, progress=progress).quant_model(0)


def advise(model: GruModel | str | os.PathLike, data: DataLike, test: DataLike | None = None, *,
           target_snr: float | None = None, max_flash: int | None = None, threshold: float | None = None,
           seed: int = 0, gamma: float = 0.01, repeats: int = 5, batch_size: int = 64,
           limit: int | None = None, dataset: str | None = None, time_first: bool = False,
           output: str | os.PathLike | None = None, force: bool = False, check: bool = True,
           confirm: Callable[[str], bool] | None = None,
           progress: Callable[[str, int, int | None], None] | None = None):
    """The precision advisor (docs/advisor.md): every tensor's predicted SNR at 8 and 16 bits and
    the int8/int16 threshold rule (docs/advisor.md) at `threshold` dB; with held-out `test` data, the least flash whose
    measured output SNR reaches `target_snr`, or the best SNR within `max_flash` bytes. Returns
    a qtool.advisor.advise.Advice; `output` gets its bits file (TOML, for `calibrate(bits=...)`).
    `progress(stage, done, total or None)`. A whole model: int8 or int16 for each layer's weights
    and output and each GRU tensor, a qtool.advisor.graph.GraphAdvice (docs/advisor.md, "Whole
    models"). `check`: a file read here is checked against its framework."""
    from qtool.advisor.advise import THRESHOLD_DB
    from qtool.advisor.advise import advise as run_advise

    if target_snr is not None and not math.isfinite(target_snr):
        raise QtoolError(f"`target_snr` must be a finite number of dB, got {target_snr}")
    if max_flash is not None and (isinstance(max_flash, bool) or max_flash < 1):
        raise QtoolError(f"`max_flash` must be a positive number of bytes, got {max_flash}")
    if threshold is not None and not math.isfinite(threshold):
        raise QtoolError(f"`threshold` must be a finite number of dB, got {threshold}")
    if batch_size < 1:
        raise QtoolError("`batch_size` must be at least 1")
    with read_once():
        if _whole(model):
            return _advise_graph(model, data, test, target_snr=target_snr, max_flash=max_flash,
                                 threshold=threshold, seed=seed, gamma=gamma, repeats=repeats, batch_size=batch_size,
                                 limit=limit, dataset=dataset, time_first=time_first, output=output, force=force,
                                 check=check, confirm=confirm, progress=progress)
        if not isinstance(model, GruModel):
            model = _load_model_for_data(Path(model), check=check)
    model_path = model.extra.get("path")
    data_in, test_in = data, test
    data = as_data(data, dataset, time_first)
    data.check_features(model.input_size)
    test = as_data(test, dataset, time_first) if test is not None else None
    if test is not None:
        test.check_features(model.input_size)
    if output is not None:  # refuse before the work, not after it
        names = [None if isinstance(d, np.ndarray) or d is None else s.name
                 for d, s in ((data_in, data), (test_in, test))]
        output = claim_output(output, force, [model_path, *names], confirm)
    n = count(data, limit)
    return _advised(lambda: run_advise(model, data, test, target_snr, max_flash,
                                       THRESHOLD_DB if threshold is None else threshold, seed, gamma, repeats,
                                       batch_size, n, progress, {"data_file": Path(data.name).name}),
                    data, test, n, time_first, output)


def _advise_graph(model: Graph | str | os.PathLike, data: DataLike, test: DataLike | None = None, *,
                 target_snr: float | None = None, max_flash: int | None = None, threshold: float | None = None,
                 seed: int = 0, gamma: float = 0.01, repeats: int = 5, batch_size: int = 64,
                 limit: int | None = None, dataset: str | None = None, time_first: bool = False,
                 output: str | os.PathLike | None = None, force: bool = False, check: bool = True,
                 confirm: Callable[[str], bool] | None = None,
                 progress: Callable[[str, int, int | None], None] | None = None):
    """The precision advisor for a whole model (docs/advisor.md, "Whole models"): int8 or int16
    for each layer's weights and output and each GRU tensor, by the threshold rule or, with
    `test`, the searches `advise` runs. Returns a qtool.advisor.graph.GraphAdvice; `output` gets
    its bits file (TOML, for `calibrate(bits=...)`)."""
    from qtool.advisor.advise import THRESHOLD_DB
    from qtool.advisor.graph import advise_graph as run_advise

    model, source = _one_input_graph(model, check)
    data_in, test_in = data, test
    data = as_data(data, dataset, time_first)
    test = as_data(test, dataset, time_first) if test is not None else None
    if output is not None:  # refuse before the work, not after it
        names = [None if isinstance(d, np.ndarray) or d is None else s.name
                 for d, s in ((data_in, data), (test_in, test))]
        output = claim_output(output, force, [source, *names], confirm)
    n = count(data, limit)
    return _advised(lambda: run_advise(model, data, n, test, target_snr, max_flash,
                                       THRESHOLD_DB if threshold is None else threshold, seed, gamma, repeats,
                                       batch_size, progress, {"data_file": Path(data.name).name}),
                    data, test, n, time_first, output)


def _advised(run: Callable, data: SequenceData, test: SequenceData | None, n: int, time_first: bool,
             output: Path | None):
    """`run()`'s advice, its bits file written to `output`, with what looks wrong in the held-out
    data (`.extra["notes"]`; in the error when the run fails)."""
    from qtool.io.files import write_bytes

    notes = [] if test is None else (axes_notes(int(data.shape[1]), test.shape, test.time_first,
                                                "is calibrated here on") + range_notes(data, n, test))
    try:
        adv = run()
    except QtoolError as e:
        if not notes:
            raise
        raise QtoolError(f"{e} (note: {'; '.join(notes)})") from None
    adv.extra["notes"] = notes
    if output is not None:
        write_bytes(output, adv.bits_toml.encode())
        adv.extra["bits_file"] = str(output)
    return adv


@dataclass
class Comparison:
    """Calibration methods scored on held-out data (`rows[k]`: method and output distance)."""

    models: list[QuantModel]
    rows: list[dict]
    best: int


def compare(model: GruModel | str | os.PathLike, data: DataLike, test: DataLike,
            methods: Sequence[str], *, bits: str | dict = "int8", method_weights: str = "minmax",
            percentile: float = 99.99, batch_size: int = 64, limit: int | None = None,
            dataset: str | None = None, time_first: bool = False,
            progress: Progress | None = None) -> Comparison:
    """Calibrate with each method in one float pass and score each on held-out `test` data."""
    _only(_whole(model), "compare")
    if data is None:
        raise QtoolError("missing DATA (calibration data file)")
    cal = observe(model, data, bits=bits, methods=methods, method_weights=method_weights,
                  percentile=percentile, batch_size=batch_size, limit=limit, dataset=dataset,
                  time_first=time_first)
    test = as_data(test, dataset, time_first)
    test.check_features(cal.model.input_size)
    models = [cal.quant_model(k) for k in range(len(methods))]
    rows = []
    total = len(models) * test.num_sequences
    for k, qm in enumerate(models):
        def part(done: int, _n: int, k=k) -> None:
            if progress:
                progress(k * test.num_sequences + done, total)
        sim = simulate(qm, test, per_tensor=False, batch_size=max(batch_size, 256), backend="cpu",
                       progress=part)
        rows.append({"method": qm.info["method"], **sim.output})
    best = max(range(len(rows)), key=lambda i: rows[i]["snr_db"] if rows[i]["snr_db"] is not None
               else float("inf") if rows[i]["exact"] else float("-inf"))
    return Comparison(models, rows, best)


@dataclass
class SimulationResult:
    """Distances between the integer GRU (dequantized) and the float GRU: at the output, per
    tensor (`tensors`, keyed layer{l}.{fwd,bwd}.{tensor}) and per time step."""

    output: dict
    tensors: dict
    per_step_snr_db: list
    samples: int
    seconds: float
    backend: str
    backend_reason: str = ""
    mode: str = "integer"
    extra: dict = field(default_factory=dict)  # mode both: "fakequant" (its distances, agreement)
    # with outputs=True, [N, T, output_size]: the float GRU's output, the integer GRU's dequantized
    # (the fake-quant GRU's under mode "fakequant") and its raw output integers (int32)
    y_float: np.ndarray | None = None
    y_quant: np.ndarray | None = None
    y_int: np.ndarray | None = None

    def to_dict(self) -> dict:
        return {"mode": self.mode, "output": self.output, "tensors": self.tensors,
                "per_step_snr_db": self.per_step_snr_db, "samples": self.samples, "seconds": self.seconds,
                "backend": self.backend, "backend_reason": self.backend_reason, **self.extra}


def simulate(qm: QuantModel | QGraph | str | os.PathLike, data: DataLike, *, per_tensor: bool = True,
             backend: str = "auto", batch_size: int = 256, limit: int | None = None,
             save: str | os.PathLike | None = None, force: bool = False,
             confirm: Callable[[str], bool] | None = None, dataset: str | None = None,
             time_first: bool = False, mode: str = "integer", outputs: bool = False, labels=None,
             progress: Progress | None = None):
    """Run the integer model and the float model side by side on `data` and measure how far apart
    they are. `mode`: "integer", "fakequant" (the float model with every tensor rounded onto its
    grid) or "both". `save` writes both outputs and the raw output integers to an HDF5 file;
    `outputs=True` returns them in the result. A GRU alone gives a `SimulationResult`
    (`y_float`, `y_quant`, `y_int`, `[N, T, out]`); a whole model a `GraphSimulation` (every
    edge; a classifier's top-1 agreement, and with `labels` both accuracies)."""
    whole = _whole(qm)
    _only(whole, "simulate", per_tensor=per_tensor, labels=labels)
    if whole:
        return _simulate_graph(qm, data, labels=labels, batch_size=batch_size, limit=limit, dataset=dataset,
                               time_first=time_first, outputs=outputs, save=save, force=force, confirm=confirm,
                               backend=backend, mode=mode, progress=progress)
    _check_mode(mode)
    import time

    from qtool.engine.backend import select_backend
    from qtool.simulation.run import simulate as run_simulation

    runner, label, reason = select_backend(backend)
    qm_path = None
    if not isinstance(qm, QuantModel):
        qm_path = Path(qm)
        qm = load(qm_path)
    if batch_size < 1:
        raise QtoolError("`batch_size` must be at least 1")
    data_in = data
    data = as_data(data, dataset, time_first)
    data.check_features(qm.model.input_size)
    n = count(data, limit)
    if save is not None:
        save = claim_output(save, force, [qm_path, data.name if not isinstance(data_in, np.ndarray) else None],
                            confirm)
    t0 = time.perf_counter()
    comm = world()
    kept = _Outputs(n, data.shape[1], qm.model.output_size) if outputs else None
    if comm is not None:  # under mpiexec: each rank simulates its chunks, rank 0 writes `save`
        from qtool.parallel.simulate import simulate as simulate_ranks

        if outputs:
            raise QtoolError("outputs=True is not available under mpiexec (each rank holds its own "
                             "chunks); use save= to get the outputs in a file")
        sim = simulate_ranks(comm, qm, data, batch_size, per_tensor, n, runner, progress, save, mode)
    elif save is None:
        report = (lambda start, *o: progress(start + len(o[0]), n)) if progress else None
        sim = run_simulation(qm, data, batch_size, per_tensor, n, _keeping(kept, report), runner, mode)
    else:
        from qtool.io.results import write_results

        sim = write_results(save, qm, data, n, lambda on_chunk: run_simulation(
            qm, data, batch_size, per_tensor, n, _keeping(kept, on_chunk), runner, mode), progress, mode)
    res = sim.results()
    x_tensor = res["tensors"].get(tensor_key(0, 0, "x"), {})
    res["notes"] = axes_notes(int(qm.info.get("time_steps", 0)), data.shape, data.time_first) + saturation_notes(
        {"x": x_tensor["saturated"]} if "saturated" in x_tensor else {})
    extra = {k: v for k, v in res.items() if k not in ("mode", "output", "tensors", "per_step_snr_db")}
    arrays = (kept.y_float, kept.y_quant, kept.y_int) if kept else (None, None, None)
    return SimulationResult(res["output"], res["tensors"], res["per_step_snr_db"], n,
                            time.perf_counter() - t0, label, reason, mode, extra, *arrays)


class _Outputs:
    """The outputs of every chunk of a simulation, gathered for SimulationResult."""

    def __init__(self, n: int, steps: int, width: int) -> None:
        self.y_float = np.empty((n, steps, width), np.float32)
        self.y_quant = np.empty((n, steps, width), np.float32)
        self.y_int = np.empty((n, steps, width), np.int32)

    def put(self, start: int, y_float: np.ndarray, y_quant: np.ndarray, y_int: np.ndarray) -> None:
        stop = start + len(y_float)
        self.y_float[start:stop], self.y_quant[start:stop], self.y_int[start:stop] = y_float, y_quant, y_int


def _keeping(kept: _Outputs | None, on_chunk: Callable | None) -> Callable | None:
    """`on_chunk`, first storing each chunk's outputs in `kept` (when asked for)."""
    if kept is None:
        return on_chunk

    def both(start: int, *outs) -> None:
        kept.put(start, *outs)
        if on_chunk:
            on_chunk(start, *outs)
    return both


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


def _simulated(qm: QuantModel, x: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """The simulator's output integers `[N, T, output_size]` for float `x [N, T, C]` and its final
    states `[N, state size]` (every layer's and direction's, in order): what an export must equal."""
    from qtool.engine.cpu import run_int

    finals: list = []
    y = run_int(qm, x, finals=finals)
    return y, np.concatenate(finals, axis=1)


def export_c(qm: QuantModel | QGraph | str | os.PathLike, out_dir: str | os.PathLike, *, name: str | None = None,
             compensation: str = "table", test_vectors: DataLike | None = None, force: bool = False,
             confirm: Callable[[str], bool] | None = None, fully_integral: bool = True) -> ExportResult:
    """Write the C sources (runtime, parameter tables, model) into `out_dir`, replacing only
    files of the same names that qtool wrote; other files in the directory are left alone.
    `test_vectors`: float inputs `[V, T, C]` (an array or a data file) for a self-checking test
    main. `fully_integral`: refuse an export whose integer core would hold a floating-point
    operation. The footprint carries what the compiler passes (qtool.numerics.passes) removed."""
    from qtool.exporters.c_export import RUNTIME, c_name, render_c
    from qtool.exporters.c_types import COMPENSATION
    from qtool.exporters.c_vectors import render_test_vectors
    from qtool.io.files import write_files

    if compensation not in COMPENSATION:
        raise QtoolError(f"unknown compensation {compensation!r}: use one of {', '.join(COMPENSATION)}")
    if test_vectors is not None and not isinstance(test_vectors, np.ndarray):
        vectors = as_data(test_vectors)
        test_vectors = vectors.chunk(0, vectors.num_sequences)
    if _whole(qm):
        return _export_graph_c(qm, out_dir, name=name, test_vectors=test_vectors, force=force, confirm=confirm,
                               fully_integral=fully_integral, compensation=compensation)
    qm_path = None
    if not isinstance(qm, QuantModel):
        qm_path = Path(qm)
        qm = load(qm_path)
    prefix = c_name(name or qm.model.name)
    runtime = {p.stem for p in RUNTIME.iterdir()}
    if prefix in runtime:
        raise QtoolError(f"`name` {prefix} would overwrite the runtime's own {prefix}.c/{prefix}.h; "
                         "choose another name")
    rendered = render_c(qm, prefix, compensation, fully_integral)
    if test_vectors is not None:
        y, _ = _simulated(qm, test_vectors)
        rendered.files.update(render_test_vectors(qm, prefix, test_vectors, y))
    files = rendered.encoded()
    replaced = write_files(out_dir, files, force, confirm, inputs=[qm_path])
    return ExportResult(Path(out_dir), prefix, list(files), replaced.names, rendered.footprint, compensation,
                        qm.fingerprint(), replaced.edited)


def _export_graph_c(qg: QGraph | str | os.PathLike, out_dir: str | os.PathLike, *, name: str | None = None,
                   test_vectors: np.ndarray | None = None, force: bool = False,
                   confirm: Callable[[str], bool] | None = None, fully_integral: bool = True,
                   compensation: str = "table") -> ExportResult:
    """`export_c` of a whole model (docs/embedded.md, "Whole models"): every layer of its integer
    core in C, run whole (NAME_run_sequence) and, where every layer is causal, frame by frame
    (NAME_step); its GRUs compensate zero points by `compensation`. The footprint is per layer
    (qtool.exporters.c_graph.GraphFootprint)."""
    from qtool.exporters.c_export import RUNTIME, c_name
    from qtool.exporters.c_graph import render_graph_c
    from qtool.exporters.c_graph_vectors import render_graph_test_vectors
    from qtool.graph.file import fingerprint
    from qtool.graph.simulate import run_int
    from qtool.io.files import write_files

    qg_path = None
    if not isinstance(qg, QGraph):
        qg_path = Path(qg)
        qg = _load_qgraph(qg_path)
    prefix = c_name(name or qg.graph.name)
    if prefix in {p.stem for p in RUNTIME.iterdir()}:
        raise QtoolError(f"`name` {prefix} would overwrite the runtime's own {prefix}.h; choose another name")
    rendered = render_graph_c(qg, prefix, fully_integral, compensation)

    def work_bytes(q: dict) -> int:  # NAME_sequence_work of the sequences run_int gave `q` for
        return rendered.work_bytes({e: (q[e].shape[1] if q[e].ndim == 3 else 1) for e in rendered.edges})

    if test_vectors is not None:
        q = run_int(qg, test_vectors)
        rendered.files.update(render_graph_test_vectors(prefix, rendered.layout[0][rendered.layout[1]][1],
                                                        test_vectors, q[qg.core_outputs[0]], work_bytes(q)))
    steps_at = int(qg.info.get("time_steps", 0))  # the work NAME_run_sequence needs at the calibration's length
    if steps_at and len(qg.graph.inputs) == 1:
        width = next(iter(qg.graph.inputs.values()))[-1]
        rendered.footprint.work_at = (steps_at, work_bytes(run_int(qg, np.zeros((1, steps_at, width), np.float32))))
    files = rendered.encoded()
    replaced = write_files(out_dir, files, force, confirm, inputs=[qg_path])
    return ExportResult(Path(out_dir), prefix, list(files), replaced.names, rendered.footprint, compensation,
                        fingerprint(qg), replaced.edited)


def find_export(export_dir: Path, name: str | None, qm: QuantModel) -> str:
    """The prefix of the export in `export_dir`: `name`, else the only one there, else the model's."""
    from qtool.exporters.c_export import c_name

    if not export_dir.is_dir():
        raise QtoolError(f"export directory not found: {export_dir}")
    if name is not None:
        return c_name(name)
    prefixes = sorted(p.name[:-len("_params.h")] for p in export_dir.glob("*_params.h"))
    if len(prefixes) == 1:
        return prefixes[0]
    if not prefixes:
        raise QtoolError(f"{export_dir}: no qtool C export here (no NAME_params.h); run 'qtool export c'")
    default = c_name(qm.model.name)
    if default in prefixes:
        return default
    raise QtoolError(f"{export_dir} holds several exports ({', '.join(prefixes)}); choose one with `name`")


@dataclass
class VerifyResult:
    """What `verify` compared on `target`: how many output integers, final-state integers and
    dequantized outputs of the export `name` differ from the simulator's."""

    target: str
    sequences: int
    time_steps: int
    output_values: int
    output_mismatches: int
    state_values: int
    state_mismatches: int
    dequantized_mismatches: int
    name: str

    @property
    def mismatches(self) -> int:
        """Every mismatch: 0 when the C computes exactly what the simulator computes."""
        return self.output_mismatches + self.state_mismatches + self.dequantized_mismatches

    def to_dict(self) -> dict:
        """The fields as a dict, in order (`qtool verify --json`)."""
        return dict(vars(self))


def verify(qm: QuantModel | QGraph | str | os.PathLike, export_dir: str | os.PathLike, data: DataLike, *,
           name: str | None = None, limit: int | None = None, dataset: str | None = None,
           time_first: bool = False, target: str = "host") -> VerifyResult:
    """Compile the exported C for `target` (the host compiler, or "cortex-m4", "cortex-m33",
    "cortex-m55" on an emulated board), run it on `data` and count the output integers, final
    states and dequantized outputs that differ from the simulator's."""
    from qtool.exporters.c_target import HOST
    from qtool.exporters.c_target import target as target_named
    from qtool.exporters.c_verify import compare, export_fingerprint, run_c

    if target != HOST:
        target_named(target)  # an unknown target: said before any work
    if _whole(qm):
        return _verify_graph(qm, export_dir, data, name=name, limit=limit, dataset=dataset, time_first=time_first,
                            target=target)
    if not isinstance(qm, QuantModel):
        qm = load(Path(qm))
    export_dir = Path(export_dir)
    prefix = find_export(export_dir, name, qm)
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
    return VerifyResult(**compare(qm, c, *_simulated(qm, x)), name=prefix)


@dataclass
class GraphVerifyResult:
    """What `verify` compared of a whole model's export `name` on `target`: every edge's integers
    (run whole), the frames NAME_step gave one input frame at a time (where the model streams),
    and the dequantized outputs, each against the simulator's."""

    target: str
    sequences: int
    time_steps: int
    edge_values: int
    edge_mismatches: int
    edges: dict
    stream_values: int
    stream_mismatches: int
    streaming: bool
    dequantized_mismatches: int
    name: str

    @property
    def mismatches(self) -> int:
        return self.edge_mismatches + self.stream_mismatches + self.dequantized_mismatches

    def to_dict(self) -> dict:
        return dict(vars(self))


def _graph_export_prefix(export_dir: Path, name: str | None, qg: QGraph) -> str:
    """The prefix of the whole-model export in `export_dir`: `name`, else the only one there."""
    from qtool.exporters.c_export import c_name

    if not export_dir.is_dir():
        raise QtoolError(f"export directory not found: {export_dir}")
    if name is not None:
        return c_name(name)
    found = sorted(p.stem for p in export_dir.glob("*.h") if "_NUM_EDGES (" in p.read_text(errors="replace"))
    if len(found) == 1:
        return found[0]
    if not found:
        raise QtoolError(f"{export_dir}: no whole-model C export here; run 'qtool export c' on the quantized "
                         "whole model")
    if c_name(qg.graph.name) in found:
        return c_name(qg.graph.name)
    raise QtoolError(f"{export_dir} holds several exports ({', '.join(found)}); choose one with `name`")


def _verify_graph(qg: QGraph | str | os.PathLike, export_dir: str | os.PathLike, data: DataLike, *,
                 name: str | None = None, limit: int | None = None, dataset: str | None = None,
                 time_first: bool = False, target: str = "host") -> GraphVerifyResult:
    """`verify` of a whole model: compile its export for `target`, run `data` through it whole
    and frame by frame, and count the integers that differ from the simulator's."""
    from qtool.exporters.c_graph import render_graph_c
    from qtool.exporters.c_graph_verify import compare_graph, run_graph_c
    from qtool.exporters.c_verify import export_fingerprint
    from qtool.graph.file import fingerprint
    from qtool.graph.simulate import run_int
    from qtool.numerics.qparams import dequantize

    if not isinstance(qg, QGraph):
        qg = _load_qgraph(Path(qg))
    export_dir = Path(export_dir)
    prefix = _graph_export_prefix(export_dir, name, qg)
    stamp, mine = export_fingerprint(export_dir, prefix), fingerprint(qg)
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
    data = as_data(data, dataset, time_first)
    from qtool.layers import input_map

    data.check_features(next(iter(qg.graph.inputs.values()))[-1], input_map(qg.graph))
    x = data.chunk(0, count(data, limit))
    phase(f"verify: compiling {prefix}'s C for {target} and running it on {len(x)} sequences")
    c = run_graph_c(layout, export_dir, prefix, x, target)  # the C first: a missing compiler says so at once
    phase(f"verify: simulating the {len(x)} sequences and comparing every edge's integers")
    q = run_int(qg, x)
    out = qg.core_outputs[0]
    y = dequantize(q[out], int(qg.grids[out].exp2_inv), qg.grids[out].zp).astype(np.float32)
    return GraphVerifyResult(**compare_graph(c, q, out, y), name=prefix)


@dataclass
class ReportResult:
    """The page `html_report` wrote and the output metrics it shows (simulate's)."""

    path: Path
    output: dict
    per_step_snr_db: list
    samples: int
    size: int
    backend: str


def html_report(qm: QuantModel | QGraph | str | os.PathLike, data: DataLike, out: str | os.PathLike, *,
                limit: int | None = None, sequences: int = 3, units: int = 4, backend: str = "auto",
                batch_size: int = 256, force: bool = False, confirm: Callable[[str], bool] | None = None,
                dataset: str | None = None, time_first: bool = False,
                progress: Progress | None = None) -> ReportResult:
    """Simulate as `simulate` does and write one self-contained HTML page of plots (needs the
    `report` extra, plotly): per tensor its float histogram against its grid, the output error
    by time step, float vs integer output traces of the first `sequences` sequences."""
    from qtool.engine.backend import select_backend
    from qtool.io.files import write_bytes
    from qtool.report.data import collect
    from qtool.report.html import plotly_modules, render

    if _whole(qm):
        return _graph_report(qm, data, out, limit=limit, backend=backend, batch_size=batch_size, force=force,
                             confirm=confirm, dataset=dataset, time_first=time_first, progress=progress)
    plotly_modules()  # refuse before the work, not after it
    runner, label, _ = select_backend(backend)
    qm_path = None
    if not isinstance(qm, QuantModel):
        qm_path = Path(qm)
        qm = load(qm_path)
    for value, option in ((batch_size, "`batch_size`"), (sequences, "`sequences`"), (units, "`units`")):
        if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value < 1:
            raise QtoolError(f"{option} must be at least 1, got {value}")
    data_in = data
    data = as_data(data, dataset, time_first)
    data.check_features(qm.model.input_size)
    n = count(data, limit)
    out = claim_output(out, force, [qm_path, None if isinstance(data_in, np.ndarray) else data.name], confirm)
    rd = collect(qm, data, n, keep=sequences, batch_size=batch_size, runner=runner, progress=progress)
    page = render(qm, rd, Path(data.name).name, units).encode()
    write_bytes(out, page)
    return ReportResult(out, rd.results["output"], rd.results["per_step_snr_db"], n, len(page), label)


def _graph_report(qg: QGraph | str | os.PathLike, data: DataLike, out: str | os.PathLike, *, limit, backend,
                  batch_size, force, confirm, dataset, time_first, progress) -> ReportResult:
    """A whole model's page (qtool.report.graph_page): the graph with each edge's error, and each
    GRU's tensors measured on its own input (qtool.report.data.collect_graph)."""
    from qtool.engine.backend import select_backend
    from qtool.io.files import write_bytes
    from qtool.report.data import collect_graph
    from qtool.report.graph_page import render

    inputs = [p for p in (qg, data) if isinstance(p, (str, os.PathLike))]
    out = claim_output(out, force, inputs, confirm)
    runner, label, reason = select_backend(backend)
    if not isinstance(qg, QGraph):
        qg = _load_qgraph(qg)
    if batch_size < 1:
        raise QtoolError("`batch_size` must be at least 1")
    name = Path(data).name if isinstance(data, (str, os.PathLike)) else "the data"
    data = as_data(data, dataset, time_first)
    n = count(data, limit)
    sim, grus = collect_graph(qg, data, n, batch_size=batch_size, runner=runner,
                              progress=(lambda done: progress(done, n)) if progress else None)
    sim.backend, sim.backend_reason = label, reason
    res = sim.to_dict()
    page = render(qg, qgraph_rows(qg, sim), res, name, grus).encode()
    write_bytes(out, page)
    first = next(iter(res["outputs"].values()))
    return ReportResult(out, first, [], sim.samples, len(page), sim.backend)


PRESETS = ("int8", "w8a16", "int16")  # what precompile compiles for (qtool/install/precompile.py)


def _precompile_model(layers: int, dirs: int, seed: int):
    from qtool.core.model import GruCell, GruModel

    rng = np.random.default_rng(seed)
    C, H = 4, 8
    cells = [[GruCell(rng.normal(0, 0.5, (3 * H, C if l == 0 else H * dirs)), rng.normal(0, 0.5, (3 * H, H)),
                      rng.normal(0, 0.3, 3 * H), rng.normal(0, 0.3, 3 * H)) for _ in range(dirs)]
             for l in range(layers)]
    return GruModel(cells, name=f"precompile-{layers}x{dirs}")


def precompile(presets: tuple[str, ...] = PRESETS, say: Callable[[str], None] = lambda s: None) -> float:
    """Compile the CPU kernels into numba's cache (qtool/install/precompile.py says why): run
    calibrate (auto, every method) and simulate (integer and fake-quant) once per preset on a
    stacked and a bidirectional random GRU, and with every preset the advisor's table; returns
    the seconds it took."""
    import time

    presets = tuple(dict.fromkeys(presets))  # `--preset int8 --preset int8`: once
    t0 = time.perf_counter()
    x = np.random.default_rng(0).normal(0, 1, (16, 6, 4)).astype(np.float32)
    for preset in presets:
        t = time.perf_counter()
        for layers, dirs in ((2, 1), (1, 2)):
            qm = calibrate(_precompile_model(layers, dirs, seed=layers), x, bits=preset, method="auto")
            simulate(qm, x, backend="cpu", mode="both")
        say(f"{preset}: {time.perf_counter() - t:.1f} s")
    if set(presets) == set(PRESETS):  # the advisor's noise model and observers; a search's mixed
        t = time.perf_counter()      # 8/16-bit candidates (W int8 with R int16, ...) compile when met
        advise(_precompile_model(2, 1, seed=2), x, x)
        say(f"advise: {time.perf_counter() - t:.1f} s")
    return time.perf_counter() - t0
