"""Keras GRUs (`reset_after=True`) from `.keras` archives and `.h5`/`.weights.h5` files, read with
h5py alone: kernel [C, 3H], recurrent_kernel [H, 3H], bias [2, 3H] (input, recurrent), gates z | r | g.

Layer order comes from the model config when the file has one, else from the layer names.
"""

from __future__ import annotations

import io
import json
import zipfile
from pathlib import Path

import h5py
import numpy as np

from qtool.errors import QtoolError
from qtool.importers import natural_key, stack_layers
from qtool.model import GruCell


def _find_cells(f: h5py.File) -> dict:
    """Map group path -> (kernel, recurrent_kernel, bias) for every GRU cell in a weights file."""
    found = {}

    def visit(name, obj):
        if not isinstance(obj, h5py.Group):
            return
        keys = set(obj.keys())
        if {"0", "1", "2"} <= keys and name.endswith("cell/vars"):  # Keras 3
            found[name[: -len("/cell/vars")]] = tuple(obj[k][()] for k in "012")
        plain = {k.split(":")[0]: k for k in keys}  # Keras 2 names end in ':0'
        if {"kernel", "recurrent_kernel", "bias"} <= plain.keys():
            found[name] = tuple(obj[plain[k]][()] for k in ("kernel", "recurrent_kernel", "bias"))

    f.visititems(visit)
    return found


def _config_layers(config: dict) -> list:
    cfg = config.get("config", config)
    return cfg.get("layers", []) if isinstance(cfg, dict) else []


def _check_layer_config(layer: dict, where: str) -> None:
    cls, cfg = layer.get("class_name"), layer.get("config", {})
    if cls == "Bidirectional":
        if cfg.get("merge_mode", "concat") != "concat":
            raise QtoolError(f"{where}: Bidirectional merge_mode '{cfg.get('merge_mode')}' is not "
                             "supported (only 'concat')")
        cfg = cfg.get("layer", {}).get("config", {})
    if cfg.get("reset_after", True) is False:
        raise QtoolError(f"{where}: GRU '{layer['config'].get('name')}' has reset_after=False; only "
                         "reset_after=True (the haste/PyTorch formulation) is supported")
    if cfg.get("go_backwards") and cls != "Bidirectional":
        raise QtoolError(f"{where}: GRU with go_backwards=True is not supported")
    for key, want in (("activation", "tanh"), ("recurrent_activation", "sigmoid")):
        if cfg.get(key, want) != want:
            raise QtoolError(f"{where}: GRU {key}='{cfg.get(key)}' is not supported (needs '{want}')")


def _cell(kernel, rkernel, bias, where: str) -> GruCell:
    bias = np.asarray(bias, np.float32)
    if bias.ndim == 1:
        raise QtoolError(f"{where}: bias of shape {bias.shape} means reset_after=False; only "
                         "reset_after=True (the haste/PyTorch formulation) is supported")
    return GruCell(np.asarray(kernel).T, np.asarray(rkernel).T, bias[0], bias[1])


def read_keras(path: Path) -> dict:
    config = None
    try:
        if zipfile.is_zipfile(path):
            with zipfile.ZipFile(path) as z:
                config = json.loads(z.read("config.json")) if "config.json" in z.namelist() else None
                f = h5py.File(io.BytesIO(z.read("model.weights.h5")), "r")
        else:
            f = h5py.File(path, "r")
            if "model_config" in f.attrs:
                config = json.loads(f.attrs["model_config"])
    except (OSError, KeyError, zipfile.BadZipFile, json.JSONDecodeError) as e:
        raise QtoolError(f"{path}: not a readable Keras file ({str(e).split(',')[0]})") from None
    with f:
        cells = _find_cells(f)
    # group paths by layer: a Bidirectional wrapper holds forward_layer and backward_layer
    layers: dict[str, dict] = {}
    for gpath, arrays in cells.items():
        parts = gpath.split("/")
        if parts[-1] in ("forward_layer", "backward_layer"):
            layers.setdefault(parts[-2], {})[parts[-1]] = arrays
        else:
            name = parts[-1] if parts[-1] != "gru_cell" else parts[-2]
            layers.setdefault(name, {})["forward_layer"] = arrays
    order = sorted(layers, key=natural_key)
    if config is not None:
        by_name = {layer.get("config", {}).get("name"): layer for layer in _config_layers(config)}
        for name in layers:
            if name in by_name:
                _check_layer_config(by_name[name], str(path))
        ranked = [n for n in by_name if n in layers]
        order = ranked + [n for n in order if n not in ranked]
    stacks: dict[str, list] = {}
    for name in order:
        dirs = layers[name]
        cells_ = [_cell(*dirs["forward_layer"], f"{path}: {name}")]
        if "backward_layer" in dirs:
            cells_.append(_cell(*dirs["backward_layer"], f"{path}: {name}"))
        stacks[name] = [cells_]
    if len(stacks) > 1:
        try:
            stacks[""] = stack_layers([stacks[n][0] for n in order], str(path))
        except QtoolError:
            pass  # not one chain: the user picks a layer by name
    return stacks
