"""Model import: PyTorch, Keras, ONNX and haste weights into the canonical GruModel.

Each format module returns the GRU stacks it finds as `{stack_name: [[GruCell, ...], ...]}`;
`import_model` picks one (by `--name` or because it is the only one) and builds the model.
"""

from __future__ import annotations

import re
from pathlib import Path

from qtool.errors import QtoolError
from qtool.model import GruModel

FORMATS = ("torch", "safetensors", "keras", "onnx", "haste")


def detect_format(path: Path) -> str:
    name = path.name.lower()
    if name.endswith((".pt", ".pth")):
        return "torch"
    if name.endswith(".safetensors"):
        return "safetensors"
    if name.endswith((".keras", ".h5", ".hdf5")):
        return "keras"
    if name.endswith(".onnx"):
        return "onnx"
    if name.endswith(".npz"):
        return "haste"
    raise QtoolError(f"{path}: cannot tell the model format from the name; use --format "
                     f"({', '.join(FORMATS)})")


def natural_key(s: str) -> list:
    return [int(t) if t.isdigit() else t for t in re.split(r"(\d+)", s)]


def import_model(path: str | Path, fmt: str | None = None, name: str | None = None) -> GruModel:
    """Read a GRU from `path` (format detected from the name unless `fmt` is given)."""
    path = Path(path)
    if not path.is_file():
        raise QtoolError(f"model file not found: {path}")
    fmt = fmt or detect_format(path)
    if fmt in ("torch", "safetensors"):
        from qtool.importers.torch_sd import read_torch
        stacks = read_torch(path, fmt)
    elif fmt == "keras":
        from qtool.importers.keras import read_keras
        stacks = read_keras(path)
    elif fmt == "onnx":
        from qtool.importers.onnx_gru import read_onnx
        stacks = read_onnx(path)
    elif fmt == "haste":
        from qtool.importers.haste import read_haste
        stacks = read_haste(path)
    else:
        raise QtoolError(f"unknown format '{fmt}' (use one of {', '.join(FORMATS)})")
    if not stacks:
        raise QtoolError(f"{path}: no GRU found in this {fmt} file")
    named = [k for k in stacks if k]
    if name is not None:
        if name not in stacks:
            raise QtoolError(f"{path}: no GRU named '{name}' (found: {', '.join(named)})")
        key = name
    elif "" in stacks or len(stacks) == 1:  # "" is the whole chained stack when there is one
        key = "" if "" in stacks else next(iter(stacks))
    else:
        raise QtoolError(f"{path}: holds several GRUs ({', '.join(named)}); choose one with --name")
    model_name = key.replace("/", "_") or path.stem
    return GruModel(stacks[key], name=re.sub(r"\W+", "_", model_name).strip("_") or "gru",
                    source=f"{fmt}:{path.name}" + (f":{key}" if key else ""))


def stack_layers(cells: list, where: str) -> list:
    """Chain single layers `[[fwd(, bwd)], ...]` checking that each input matches the one before."""
    for l in range(1, len(cells)):
        want = cells[l - 1][0].R.shape[1] * len(cells[l - 1])
        got = cells[l][0].W.shape[1]
        if got != want:
            raise QtoolError(f"{where}: GRU layer {l} takes {got} inputs but the layer before gives "
                             f"{want}; they are not one stack, choose one with --name")
    return cells
