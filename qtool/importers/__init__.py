"""Model import: PyTorch, Keras, ONNX and haste weights into the canonical GruModel.

Each format module returns the GRU stacks it finds as `{stack_name: Stack}`; `import_model`
picks one (by `--name` or because it is the only one), builds the model and, where the source
framework is installed, checks the model against it (`qtool.importers.crosscheck`).
"""

from __future__ import annotations

import re
from pathlib import Path

from qtool.core.model import NOT_HDF5, GruModel, check_model_file
from qtool.errors import QtoolError
from qtool.importers.stack import Stack, chained, natural_key
from qtool.io.files import READ_AS

__all__ = ["FORMATS", "Stack", "chained", "detect_format", "gru_names", "import_graph", "import_model", "import_note",
           "natural_key", "not_fed_by_input", "read_imported", "read_stacks"]

FORMATS = ("torch", "safetensors", "keras", "onnx", "tflite", "haste")
GRAPH_FORMATS = ("onnx", "tflite")  # read by the ONNX importer (a TFLite file as the ONNX graph it computes)


def detect_format(path: Path) -> str:
    if path.is_dir():
        raise QtoolError(f"{path} is a directory, not a model file")
    name = path.name.lower()
    if name.endswith((".pt", ".pth")):
        return "torch"
    if name.endswith(".safetensors"):
        return "safetensors"
    if name.endswith((".h5", ".hdf5")) and path.is_file() and path.stat().st_size and not _is_hdf5(path):
        raise QtoolError(f"{path}: {NOT_HDF5}")
    if name.endswith((".keras", ".h5", ".hdf5")):
        return "keras"
    if name.endswith(".onnx"):
        return "onnx"
    if name.endswith(".npz"):
        return "haste"
    if name.endswith(".tflite"):
        return "tflite"
    if name.endswith(".pb"):
        raise QtoolError(f"{path}: a TensorFlow frozen graph, which qtool does not read; convert it to ONNX "
                         "with tf2onnx (python -m tf2onnx.convert --graphdef FILE.pb --inputs ... --outputs ... "
                         "--output model.onnx) and import the .onnx")
    if READ_AS.get(Path(name).suffix) == "data":  # a data file where the model goes: arguments swapped?
        raise QtoolError(f"{path}: qtool reads {Path(name).suffix} files as data, not as a model; the model "
                         "file comes first, then the data")
    raise QtoolError(f"{path}: cannot tell the model format from the name; name it by its format (.pt, "
                     ".safetensors, .keras, .h5, .onnx, .tflite, .npz) or use `fmt` with `qtool import` "
                     f"({', '.join(FORMATS)})")


QTOOL_FILES = {"qtool-results": "a results file (qtool simulate --save): model outputs, not a model",
               "qtool-qgraph": "qtool's quantized whole model, which holds no GRU to pick by `name` (`name` "
                               "picks one GRU of a framework file; without it the model is taken whole)",
               "qtool-graph": "qtool's whole model, which holds no GRU to pick by `name` (`name` picks one GRU "
                              "of a framework file; without it the model is taken whole)"}


def _not_qtool_output(path: Path) -> None:
    """An HDF5 file qtool wrote that holds no GRU to import is named as what it is (not taken
    for a Keras file without a config)."""
    import h5py

    try:
        with h5py.File(path, "r") as f:
            fmt = f.attrs.get("format", "")
    except OSError:
        return  # the Keras reader says what is wrong with it
    fmt = fmt.decode(errors="replace") if isinstance(fmt, bytes) else str(fmt)
    if fmt in QTOOL_FILES:
        raise QtoolError(f"{path}: {QTOOL_FILES[fmt]}")


def read_stacks(path: Path, fmt: str) -> dict[str, Stack]:
    if fmt in ("torch", "safetensors"):
        from qtool.importers.torch.state_dict import read_torch
        return read_torch(path, fmt)
    if fmt == "keras":
        from qtool.importers.keras.reader import read_keras
        return read_keras(path)
    if fmt in GRAPH_FORMATS:
        from qtool.importers.onnx.gru import read_onnx
        return read_onnx(path)
    if fmt == "haste":
        from qtool.importers.haste import read_haste
        return read_haste(path)
    raise QtoolError(f"unknown format '{fmt}' (use one of {', '.join(FORMATS)})")


def gru_names(path: str | Path, fmt: str | None = None) -> list[str]:
    """The names `import_model` takes as `name` in the file at `path` (each GRU, or for an ONNX GRU
    node the stack it starts)."""
    path = Path(path)
    return [k for k in read_stacks(path, fmt or detect_format(path)) if k]


def import_model(path: str | Path, fmt: str | None = None, name: str | None = None,
                 check: bool = True) -> GruModel:
    """Read a GRU from `path` (format detected from the name unless `fmt` is given).

    With `check`, the model is run against the source framework when it is installed and refused
    if they disagree; `model.extra["check"]` says what was checked and the largest difference.
    """
    path = Path(path)
    check_model_file(path)
    fmt = fmt or detect_format(path)
    if fmt == "keras":
        _not_qtool_output(path)
    stacks = read_stacks(path, fmt)
    if not stacks:
        if fmt == "haste":
            from qtool.importers.haste import refuse_data

            refuse_data(path)
        raise QtoolError(f"{path}: no GRU found in this {fmt} file")
    named = [k for k in stacks if k]
    if name is not None:
        if name not in stacks:
            raise QtoolError(f"{path}: no GRU named '{name}' (found: {', '.join(named)})")
        key = name
    elif "" in stacks or len(stacks) == 1:  # "" is the whole chained stack when there is one
        key = "" if "" in stacks else next(iter(stacks))
    else:
        weights_only = (" and, as a state dict, weights only (how its layers connect is not in it): choose one "
                        "with `name`, or export the whole model to ONNX (torch.onnx.export) to take it whole"
                        if fmt in ("torch", "safetensors") else "; choose one with `name`")
        raise QtoolError(f"{path}: holds several GRUs ({', '.join(named)}){weights_only}")
    model_name = key.replace("/", "_") or path.stem
    model = GruModel(stacks[key].layers, name=re.sub(r"\W+", "_", model_name).strip("_") or "gru",
                     source=f"{fmt}:{path.name}" + (f":{key}" if key else ""))
    stack = stacks[key]
    model.extra["import"] = {"took": list(stack.took), "left_out": list(stack.left_out),
                             "input_from": stack.input_from, "notes": list(stack.notes)}
    if check:
        from qtool.importers.crosscheck import cross_check
        model.extra["check"] = cross_check(model, stacks[key], str(path))
    return model


def import_note(model: GruModel) -> str | None:
    """One line on what an import took from a framework file, what it left out and what it
    assumed; None when the file holds nothing but the GRU and nothing was assumed."""
    info = model.extra.get("import")
    if not info or not (info["left_out"] or info["notes"]):
        return None
    took = ", ".join(info["took"]) or model.name
    left = (f"took the GRU ({took}); left out, not quantized: {', '.join(info['left_out'])} "
            "(qtool quantizes the GRU alone)") if info["left_out"] else ""
    return "; ".join([left, *info["notes"]] if left else info["notes"])


def not_fed_by_input(model: GruModel, path: Path) -> str | None:
    """Why data for the file at `path` are not data for its GRU (it reads another layer's output),
    with the remedy; None when the GRU reads the model's own input."""
    info = model.extra.get("import")
    if not info or info["input_from"] is None:
        return None
    took = ", ".join(info["took"]) or model.name
    key = model.source.split(":", 2)[2] if model.source.count(":") >= 2 else ""  # the GRU asked for by name
    named = f" `name` {key}" if key else ""
    return (f"{path}: the GRU ({took}) is fed by {info['input_from']}, not by the model's input, "
            "so the model's input data are not what the GRU sees; qtool quantizes the GRU alone: run "
            f"the layers before it on your data and calibrate the GRU on their outputs (qtool import "
            f"{path}{named} -o gru.h5, then qtool calibrate gru.h5 GRU_INPUTS.npy)" + (
                "; or take the whole model: export it with torch.onnx.export, or give the module to "
                "qtool.load_model(module, example=x)" if model.source.startswith(("torch:", "safetensors:")) else ""))


def read_imported(path, model: GruModel, fmt: str | None = None):
    """The quantizers a model file holds for the GRU `model` was imported from (None: a float
    file). ONNX QDQ, PyTorch fake-quant state, qtool QAT checkpoints and QKeras QGRUs; a
    qtool.importers.ranges.Imported."""
    path = Path(path)
    if path.suffix.lower() in (".h5", ".hdf5"):
        import h5py

        try:
            with h5py.File(path, "r") as f:
                if str(f.attrs.get("format", "")).startswith("qtool-"):
                    return None  # qtool's own float model file holds no quantizers
        except OSError:
            pass
    fmt = fmt or detect_format(path)
    if fmt == "onnx":
        from qtool.importers.onnx.qdq import read_qdq

        return read_qdq(path, model)
    if fmt in ("torch", "safetensors"):
        from qtool.importers.torch.fakequant import read_fake_quant

        return read_fake_quant(path, fmt, model)
    if fmt == "keras":
        from qtool.importers.keras.qkeras import read_qkeras

        return read_qkeras(path, model)
    return None


def import_graph(path: str | Path, fmt: str | None = None, check: bool = True):
    """The whole model in a Keras or ONNX file as a qtool.core.graph.Graph (docs/graph.md), proven
    well formed and, with `check`, equal to the framework's own run (1e-4) where it is installed;
    `graph.check` says what was checked."""
    from qtool.layers import check as check_graph

    path = Path(path)
    check_model_file(path)
    fmt = fmt or detect_format(path)
    if fmt in GRAPH_FORMATS:
        from qtool.importers.onnx.model_graph import import_onnx_graph

        return import_onnx_graph(path, check)
    if fmt != "keras":
        raise QtoolError(f"{path}: whole models are read from Keras (.keras, .h5), ONNX and TFLite files; "
                         f"a {fmt} file holds weights only")
    from qtool.importers.keras.model_check import check_keras_graph
    from qtool.importers.keras.model_graph import read_keras_graph
    from qtool.importers.once import once

    if _qtool_file(path):
        raise QtoolError(f"{path}: a qtool model file holds a GRU, not a whole model; whole models are read "
                         "from the Keras or ONNX file it was imported from")
    graph, = once("keras", path, lambda: (check_graph(read_keras_graph(path), str(path)),))
    graph.check_result = check_keras_graph(path, graph) if check else None
    return graph


def _is_hdf5(path: Path) -> bool:
    import h5py

    return h5py.is_hdf5(path)


def _qtool_file(path: Path) -> bool:
    import h5py

    if not h5py.is_hdf5(path):
        return False
    with h5py.File(path, "r") as f:
        return str(f.attrs.get("format", "")).startswith(("qtool-", "b'qtool-"))
