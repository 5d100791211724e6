"""Reading and writing models: `load_model` (a framework file, qtool's own, a PyTorch module),
`load` (a quantized model), `save`, `inspect`; a GRU alone or a whole model, told apart once."""

from __future__ import annotations

import os
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

from qtool.api.common import describe_check, h5_format, other_model, write_once
from qtool.core.graph import Graph
from qtool.core.model import GruModel, check_model_file
from qtool.core.qgraph import MODEL_OPS, QGraph
from qtool.core.qmodel import QuantModel
from qtool.errors import QtoolError
from qtool.importers.once import read_once
from qtool.io.files import claim_output, sha256_file


def is_whole(model) -> bool:
    """Whether `model` (a model, a model file or a PyTorch module) is a whole model, not a GRU alone."""
    if isinstance(model, (Graph, QGraph)):
        return True
    if isinstance(model, (GruModel, QuantModel)):
        return False
    if not isinstance(model, (str, os.PathLike)):
        return True  # an nn.Module: load_model exports it whole
    if not Path(model).is_file():
        return False  # the GRU's path says what is missing, after the options it checks first
    return h5_format(Path(model)) == "qtool-qgraph" or is_whole_model(model)


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
        return load_model_for_data(path, fmt, name, check) if for_data else _load_gru(path, fmt, name, check)


def _alone(model: GruModel, path) -> Graph:
    """A GRU alone as the graph of one gru node, with what its import checked and left out."""
    from qtool.layers import check as check_graph
    from qtool.layers.gru import alone

    graph = check_graph(alone(model), str(path))
    graph.check_result = model.extra.get("check")
    if graph.check_result is None and h5_format(Path(path)) in ("qtool-gru", "qtool-qgru"):
        graph.check_result = {"checked": False, "reason": "qtool's own GRU file (its import ran the check)"}
    graph.notes = [n for n in [import_note(model)] if n]
    return graph


def _weights_only(path: Path, fmt: str | None) -> bool:
    """Whether the file holds a GRU's weights and no graph (PyTorch, safetensors, haste, qtool's
    GRU files)."""
    from qtool.importers import detect_format

    if h5_format(path) in ("qtool-gru", "qtool-qgru"):
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
        kind = h5_format(path)
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


def load_model_for_data(path: str | os.PathLike, fmt: str | None = None, name: str | None = None,
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
        if h5_format(Path(path)) in ("qtool-graph", "qtool-qgraph"):
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
    h5 = h5_format(path)
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


def load_qgraph(path: str | os.PathLike) -> QGraph:
    """A quantized whole-model file (`save` of `calibrate`'s result for a whole model), proved well formed."""
    from qtool.graph.file import load as load_file

    path = Path(path)
    check_model_file(path)
    fmt = h5_format(path)
    if fmt != "qtool-qgraph":
        kind = "a float whole-model file" if fmt == "qtool-graph" else other_model(path)
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

    write_once(write)
    return Path(path)


def read_graph(model: Graph | str | os.PathLike, check: bool) -> tuple[Graph, Path | None]:
    """The graph of `model` (read from its file, checked against its framework with `check`) and
    that file."""
    source = None
    if not isinstance(model, Graph):
        source = Path(model)
        model = _load_graph(source, check=check)
    return model, source


@dataclass
class Inspection:
    """What a file holds: its float model, and its quantization when it is a quantized model."""

    model: GruModel | Graph
    qm: QuantModel | QGraph | None

    @property
    def quantized(self) -> bool:
        return self.qm is not None


def inspect(path: str | os.PathLike, *, name: str | None = None, check: bool = True,
            whole: bool | None = None) -> Inspection:
    """A quantized or float qtool model file, or any importable file (imported as `load_model`
    imports it, checked; `name` and `whole` as there)."""
    import h5py

    from qtool.core.model import open_h5
    from qtool.core.qmodel import is_qmodel

    path = Path(path)
    quantized = False
    if path.is_file() and h5py.is_hdf5(path):  # else an importable file, or load_model's error
        with open_h5(path) as f:
            quantized = is_qmodel(f)
    if quantized or h5_format(path) == "qtool-qgraph":
        qm = load(path)
        return Inspection(qm.model if isinstance(qm, QuantModel) else qm.graph, qm)
    return Inspection(load_model(path, name=name, check=check, whole=whole), None)


def load(path: str | os.PathLike) -> QuantModel | QGraph:
    """A quantized model file: a GRU's (`QuantModel`, validated by qtool.numerics.validate) or a
    whole model's (`QGraph`, proved well formed); safe for every engine and exporter."""
    from qtool.io.qmodel_file import load_qmodel

    path = Path(path)
    check_model_file(path)
    if h5_format(path) == "qtool-qgraph":
        return load_qgraph(path)
    try:
        return load_qmodel(path)
    except QtoolError:
        kind = other_model(path)  # a float model or a framework file: say what it is and what to run
        if kind is None:
            raise
        raise QtoolError(f"{path}: {kind}, not a quantized model; quantize it first: qtool calibrate "
                         f"{path} CALIB_DATA -o q.h5") from None


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

    write_once(write)
    return Path(path)


def _save_model(model: GruModel, path: str | os.PathLike, force: bool = False,
               confirm: Callable[[str], bool] | None = None, inputs: Sequence = ()) -> Path:
    """Write a float model file (format qtool-gru) atomically."""
    from qtool.core.model import write_model
    from qtool.io.files import write_h5

    def write() -> None:
        write_h5(claim_output(path, force, inputs, confirm), lambda f: write_model(f, model))

    write_once(write)
    return Path(path)
