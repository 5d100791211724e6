"""Keras GRUs from `.keras` archives (Keras 3) and legacy `.h5` model files, read with h5py alone:
kernel [C, 3H], recurrent_kernel [H, 3H], gates z | r | g; bias [2, 3H] (input, recurrent) with
reset_after=True, one bias [3H] with reset_after=False (Keras 2's default: bx, and br = 0).

The model config says which layers are GRUs and how they are configured (keras_config.py); each
layer's weights are taken from the group Keras itself assigns to it, never matched by name
guesses. A GRU-shaped weight group that no supported layer owns is refused.
"""

from __future__ import annotations

import json
import shutil
import tempfile
import zipfile
from dataclasses import replace
from functools import partial
from pathlib import Path

import h5py
import numpy as np

from qtool.core.model import GruCell
from qtool.errors import QtoolError
from qtool.importers.checks import (
    MAX_JSON_BYTES,
    as_float32,
    check_archive,
    check_size,
    expect_shape,
    reason,
    refuse_cut_zip,
)
from qtool.importers.keras.check import run_keras
from qtool.importers.keras.config import KerasGru, chain, find_grus, keras_major
from qtool.importers.keras.graph import Layer, input_from, layer_graph, left_out
from qtool.importers.stack import Stack

SPOOL_BYTES = 64 << 20  # weights archives up to this size are read in memory, larger ones via disk
LEGACY_ROLES = ("kernel", "recurrent_kernel", "bias")
HDF5_SIGNATURE = b"\x89HDF\r\n\x1a\n"


def _dataset(where: str, f: h5py.File, path: str) -> np.ndarray:
    ds = f.get(path)
    if not isinstance(ds, h5py.Dataset):
        raise QtoolError(f"{where}: weights '{path}' are missing")
    check_size(where, path, ds.shape)  # before h5py reads (and maybe decompresses) anything
    return as_float32(where, path, ds[()])


def _reset_after(where: str, g: KerasGru, d: int, bias: np.ndarray | None) -> bool:
    """The config's reset_after or, where an old config lacks it, what the bias's shape means:
    [2, 3H] reset_after=True, [3H] reset_after=False."""
    reset_after = g.dirs[d].reset_after
    if reset_after is not None:
        return reset_after
    if bias is None:
        raise QtoolError(f"{where}: GRU '{g.name}' has no bias and no reset_after in its config; "
                         "cannot tell which GRU formulation it uses")
    return bias.ndim == 2


def _cell(where: str, g: KerasGru, d: int, arrays: list, names: list) -> GruCell:
    """One direction's GruCell from its [kernel, recurrent_kernel(, bias)], shapes checked."""
    units, use_bias = g.dirs[d].units, g.dirs[d].use_bias
    if len(arrays) != 2 + use_bias:
        raise QtoolError(f"{where}: GRU '{g.name}' stores {len(arrays)} weight tensors, its config "
                         f"(use_bias={use_bias}) needs {2 + use_bias}")
    kernel, rkernel = arrays[0], expect_shape(where, names[1], arrays[1], (units, 3 * units))
    if kernel.ndim != 2 or kernel.shape[1] != 3 * units:
        raise QtoolError(f"{where}: tensor '{names[0]}' has shape {kernel.shape}, expected [C, {3 * units}]")
    reset_after = _reset_after(where, g, d, arrays[2] if use_bias else None)
    if not use_bias:
        bias = np.zeros((2, 3 * units), np.float32)
    elif reset_after:
        bias = expect_shape(where, names[2], arrays[2], (2, 3 * units))
    else:  # one bias, added once to each gate's sum: bx, and br = 0
        bias = np.stack([expect_shape(where, names[2], arrays[2], (3 * units,)), np.zeros(3 * units, np.float32)])
    form = replace(g.dirs[d].form, reset_after=reset_after)
    return GruCell(kernel.T, rkernel.T, bias[0], bias[1], form)


def _cells_keras3(where: str, f: h5py.File, g: KerasGru) -> list[GruCell]:
    meta = f.get(f"{g.path}/vars")
    stored = meta.attrs.get("name") if isinstance(meta, h5py.Group) else None
    if stored is not None and stored != g.name.rsplit("/", 1)[-1]:  # Keras 3.x records the owner
        raise QtoolError(f"{where}: weights group '{g.path}' belongs to layer '{stored}', not to "
                         f"'{g.name}'; the file's config and weights disagree")
    subs = [""] if len(g.dirs) == 1 else ["/forward_layer", "/backward_layer"]
    cells = []
    for d, sub in enumerate(subs):
        group = f.get(f"{g.path}{sub}/cell/vars")
        if not isinstance(group, h5py.Group):
            raise QtoolError(f"{where}: weights of GRU '{g.name}' are missing ('{g.path}{sub}/cell/vars')")
        names = [f"{g.path}{sub}/cell/vars/{k}" for k in sorted(group.keys(), key=int)]
        cells.append(_cell(where, g, d, [_dataset(where, f, n) for n in names], names))
    return cells


def _cells_legacy(where: str, f: h5py.File, g: KerasGru) -> list[GruCell]:
    """Legacy h5: `model_weights/{name}` lists its weights in `weight_names`, forward then backward."""
    if g.nested:
        raise QtoolError(f"{where}: GRU '{g.name}' is inside a nested model, which legacy .h5 files do "
                         "not store per layer; save the model as .keras")
    group = f["model_weights"].get(g.name) if "model_weights" in f else None
    if not isinstance(group, h5py.Group):
        raise QtoolError(f"{where}: weights of GRU '{g.name}' are missing")
    names = [n.decode() if isinstance(n, bytes) else str(n) for n in group.attrs.get("weight_names", [])]
    per = len(names) // len(g.dirs)
    cells = []
    for d in range(len(g.dirs)):
        mine = sorted(names[d * per:(d + 1) * per], key=lambda n: _role(where, g, n))
        cells.append(_cell(where, g, d, [_dataset(where, group, n) for n in mine], mine))
    return cells


def _role(where: str, g: KerasGru, name: str) -> int:
    """A legacy weight's place in [kernel, recurrent_kernel, bias] from its name ('.../kernel:0')."""
    role = name.rsplit("/", 1)[-1].split(":")[0]
    if role not in LEGACY_ROLES:
        raise QtoolError(f"{where}: GRU '{g.name}' has an unexpected weight '{name}'")
    return LEGACY_ROLES.index(role)


def _gru_shaped(f: h5py.Group) -> list[str]:
    """Every Keras 3 `vars` group holding a kernel [C, 3H] and a recurrent kernel [H, 3H] (the
    optimizer's slots, shaped like the weights they train, are not the model's)."""
    found = []

    def visit(name, obj):
        if isinstance(obj, h5py.Group) and {"0", "1"} <= set(obj):
            k, r = obj["0"], obj["1"]
            if (isinstance(k, h5py.Dataset) and isinstance(r, h5py.Dataset) and len(k.shape) == 2
                    and len(r.shape) == 2 and r.shape[1] == 3 * r.shape[0] and k.shape[1] == r.shape[1]):
                found.append(name)

    for key in f:
        if key != "optimizer" and isinstance(f[key], h5py.Group):  # training state, not the model
            f[key].visititems(lambda name, obj, key=key: visit(f"{key}/{name}", obj))
    return found


def _refuse_unclaimed(where: str, f: h5py.File, grus: list[KerasGru], legacy: bool) -> None:
    """A GRU cell's weights that no supported layer owns (a custom GRU class, a subclassed model)."""
    if legacy:
        root = f["model_weights"]
        owned = {g.name for g in grus}
        for layer in root.attrs.get("layer_names", []):
            layer = layer.decode() if isinstance(layer, bytes) else str(layer)
            names = [str(n) for n in root[layer].attrs.get("weight_names", [])] if layer in root else []
            if layer not in owned and any("recurrent_kernel" in n for n in names):
                raise QtoolError(f"{where}: layer '{layer}' holds recurrent weights but is not a Keras GRU "
                                 "that qtool supports")
        return
    owned = {g.path for g in grus}
    for name in _gru_shaped(f):
        if not any(name == p or name.startswith(p + "/") for p in owned):
            raise QtoolError(f"{where}: weights group '{name}' holds a GRU-shaped cell that the model "
                             "config does not describe as a Keras GRU qtool supports")


def _open_keras3(path: Path, tmp) -> tuple[dict, h5py.File]:
    """config.json and model.weights.h5 of a .keras archive, sizes checked before reading."""
    with zipfile.ZipFile(path) as z:
        names = z.namelist()
        if "model.weights.h5" not in names or "config.json" not in names:
            raise QtoolError(f"{path}: a .keras archive needs config.json and model.weights.h5 (found: "
                             f"{', '.join(names[:5])})")
        check_archive(path, z, {"config.json", "model.weights.h5"})
        if z.getinfo("config.json").file_size > MAX_JSON_BYTES:
            raise QtoolError(f"{path}: config.json is larger than {MAX_JSON_BYTES:,} bytes")
        config = json.loads(z.read("config.json"))
        with z.open("model.weights.h5") as src:  # never more than the declared (checked) size
            head = src.read(8)
            if head != HDF5_SIGNATURE:  # before anything large is inflated
                raise QtoolError(f"{path}: model.weights.h5 in the archive is not an HDF5 file")
            tmp.write(head)
            shutil.copyfileobj(src, tmp, 1 << 20)
    tmp.seek(0)
    return config, h5py.File(tmp, "r")


def _open(path: Path, tmp) -> tuple[dict | None, h5py.File, bool]:
    if zipfile.is_zipfile(path):
        config, f = _open_keras3(path, tmp)
        return config, f, False
    refuse_cut_zip(path, ".keras archive")
    f = h5py.File(path, "r")
    config = json.loads(f.attrs["model_config"]) if "model_config" in f.attrs else None
    return config, f, "model_weights" in f


def _read(path: Path, tmp) -> tuple[dict, list[KerasGru], dict]:
    config, f, legacy = _open(path, tmp)
    where = str(path)
    with f:
        if not isinstance(config, dict):
            raise QtoolError(f"{path}: no model config (a weights-only file): qtool cannot tell the "
                             "GRUs' order and settings; save the whole model (model.save('m.keras'))")
        grus = find_grus(config, where, keras_major(path))
        read = _cells_legacy if legacy else _cells_keras3
        layers = {g.name: read(where, f, g) for g in grus}
        _refuse_unclaimed(where, f, grus, legacy)
    return config, grus, layers


def _stack(path: Path, config: dict, grus: list[KerasGru], layers: dict, graph: dict[str, Layer]) -> Stack:
    """The GRUs `grus` as one Stack, with the model's other computing layers and what feeds the first."""
    took = [g.name for g in grus]
    return Stack([layers[n] for n in took], "Keras", partial(run_keras, path, config, took), took=took,
                 left_out=left_out(graph, took), input_from=input_from(graph, took[0]))


def read_keras(path: Path) -> dict[str, Stack]:
    with tempfile.SpooledTemporaryFile(SPOOL_BYTES) as tmp:
        try:
            config, grus, layers = _read(path, tmp)
            graph = layer_graph(config)
        except QtoolError:
            raise
        except (OSError, RuntimeError, KeyError, ValueError, TypeError, AttributeError, IndexError,
                UnicodeError, RecursionError, zipfile.BadZipFile) as e:  # h5py, zipfile, json, a malformed config
            raise QtoolError(f"{path}: not a readable Keras file ({reason(e)})") from None
    from qtool.importers.keras.quantizers import fold

    layers = {g.name: [fold(c, dr) for c, dr in zip(layers[g.name], g.dirs)] for g in grus}
    stacks = {g.name: _stack(path, config, [g], layers, graph) for g in grus}
    if chain(grus):
        stacks[""] = _stack(path, config, grus, layers, graph)
    return stacks
