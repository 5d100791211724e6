"""What Keras is given to load for the check: an inference-only copy of the model file, written to a
private temporary folder.

A trained model carries what only training needs: the `compile_config` (a custom loss or metric,
the optimizer), optimizer slots, regularizers and constraints. Keras cannot build a model whose
config names a function it does not know, and none of these change what the model computes, so
the copy holds the model's config without them, with every initializer 'zeros' (the weights are
loaded from the file; Keras skips the orthogonal initializer's QR decompositions), and the file's
weights. A `.keras` copy holds only config.json, metadata.json and model.weights.h5 of the
archive: Keras' own loader may extract an archive, and no other member is handed to it (an archive
with an entry like `../evil.txt` is refused before: importers.checks.check_archive).

What does change the forward computation and cannot be loaded without the user's code (a custom
layer class, a custom activation, a Python lambda) is named before Keras tries.
"""

from __future__ import annotations

import json
import shutil
import zipfile
from pathlib import Path

import h5py

from qtool.errors import QtoolError
from qtool.importers.checks import MAX_JSON_BYTES, check_archive
from qtool.importers.keras.config import MODELS

HDF5_SIGNATURE = b"\x89HDF\r\n\x1a\n"
MEMBERS = ("config.json", "metadata.json", "model.weights.h5")
TRAINING_ONLY = ("_regularizer", "_constraint")  # config keys that only training reads
LAYER_KEYS = ("layer", "backward_layer", "cell", "cells")  # where a layer config holds layers


def inference_config(config):
    """A copy of a model config without compile configs, regularizers and constraints, and with
    every initializer 'zeros'; without Keras 2's `time_major: false` (Keras 3's default, a key it
    refuses; true is refused by qtool's reader)."""
    if isinstance(config, dict):
        out = {}
        for k, v in config.items():
            if k == "compile_config" or (k == "time_major" and v is False):
                continue  # Keras 2 writes time_major=false in every RNN, which Keras 3 no longer takes
            if str(k).endswith(TRAINING_ONLY):
                out[k] = None
            elif str(k).endswith("_initializer") and v is not None:
                out[k] = "zeros"
            else:
                out[k] = inference_config(v)
        return out
    if isinstance(config, list):
        return [inference_config(v) for v in config]
    return config


def write_copy(path: Path, config: dict, folder: Path) -> Path:
    """The inference-only copy of the Keras file `path` (whose config qtool read is `config`) in `folder`."""
    if zipfile.is_zipfile(path):
        return _archive_copy(path, config, folder / "model.keras")
    return _legacy_copy(path, config, folder / "model.h5")


def _archive_copy(path: Path, config: dict, out: Path) -> Path:
    with zipfile.ZipFile(path) as z, zipfile.ZipFile(out, "w") as copy:
        names = set(z.namelist())
        check_archive(path, z, set(MEMBERS))  # declared sizes, before anything is inflated
        copy.writestr("config.json", json.dumps(inference_config(config)))
        if "metadata.json" in names and z.getinfo("metadata.json").file_size <= MAX_JSON_BYTES:
            copy.writestr("metadata.json", z.read("metadata.json"))
        with z.open("model.weights.h5") as src, copy.open("model.weights.h5", "w") as dst:
            if src.read(8) != HDF5_SIGNATURE:
                raise QtoolError(f"{path}: model.weights.h5 in the archive is not an HDF5 file")
            dst.write(HDF5_SIGNATURE)
            shutil.copyfileobj(src, dst, 1 << 20)
    return out


def _legacy_copy(path: Path, config: dict, out: Path) -> Path:
    """The layers' weights as saved, without the training config and the optimizer's weights."""
    with h5py.File(path, "r") as src, h5py.File(out, "w") as dst:
        if not isinstance(src.get("model_weights"), h5py.Group):
            raise QtoolError(f"{path}: no 'model_weights' group for Keras to load")
        src.copy(src["model_weights"], dst, "model_weights")
        for key in ("keras_version", "backend"):
            if key in src.attrs:
                dst.attrs[key] = src.attrs[key]
        dst.attrs["model_config"] = json.dumps(inference_config(config))
    return out


def unloadable(keras, config: dict) -> str | None:
    """The first layer Keras cannot build without code qtool does not run: `"layer 'x' (Class) ..."`."""
    for layer in _layers(config, ""):
        why = _custom(keras, layer)
        if why:
            return f"layer '{_name(layer)}' ({layer.get('class_name')}) {why}"
    return None


def _name(layer: dict) -> str:
    cfg = layer.get("config")
    return str((cfg if isinstance(cfg, dict) else {}).get("name", layer.get("name")))


def _layers(model: dict, prefix: str):
    """Every layer of the model (nested models' layers as 'outer/inner')."""
    cfg = model.get("config")
    layers = cfg if isinstance(cfg, list) else cfg.get("layers") if isinstance(cfg, dict) else None
    for layer in layers if isinstance(layers, list) else []:
        if isinstance(layer, dict) and layer.get("class_name") in MODELS:
            yield from _layers(layer, f"{prefix}{_name(layer)}/")
        elif isinstance(layer, dict):
            cfg = layer.get("config")
            yield {**layer, "config": {**(cfg if isinstance(cfg, dict) else {}), "name": prefix + _name(layer)}}


def _custom(keras, layer: dict) -> str | None:
    """Why Keras cannot build `layer` from its config alone, or None: a class or function that is
    neither part of Keras nor registered in this process, or a Python lambda (Keras' safe mode)."""
    cfg = layer.get("config") or {}
    fn = cfg.get("function")
    if cfg.get("function_type") == "lambda" or isinstance(fn, dict) and fn.get("class_name") == "__lambda__":
        return "holds a Python lambda"
    for key, obj in _objects(layer):
        if not _known(keras, obj, key):
            kind = "function" if obj.get("class_name") == "function" else "class"
            name = obj.get("config") if kind == "function" else obj.get("registered_name") or obj.get("class_name")
            what = "is the custom class" if obj is layer else f"uses the {kind}"
            return f"{what} '{name}', which is not part of Keras"
    for key, value in _values(layer.get("config")):
        if key.endswith("activation") and isinstance(value, str) and not _activation(keras, value):
            return f"uses the activation '{value}', which is not part of Keras"
    return None


def _objects(v, key: str = "layer"):
    """(key, object) of every serialized Keras object (class_name and config) in a layer config, the
    layer first."""
    if isinstance(v, dict):
        if isinstance(v.get("class_name"), str) and "config" in v:
            yield key, v
        for k, w in v.items():
            yield from _objects(w, str(k))
    elif isinstance(v, list):
        for w in v:
            yield from _objects(w, key)


def _values(v, key: str = ""):
    if isinstance(v, dict):
        for k, w in v.items():
            yield from _values(w, str(k))
    elif isinstance(v, list):
        for w in v:
            yield from _values(w, key)
    else:
        yield key, v


def _known(keras, obj: dict, key: str) -> bool:
    """Whether Keras resolves the object without code from outside Keras (as serialization_lib does:
    registered objects, then Keras' own modules). Keras 2 configs do not say where a class lives:
    layers are looked up among Keras' layers, anything else is left to Keras."""
    cls, module, registered = obj.get("class_name"), obj.get("module"), obj.get("registered_name")
    if cls in MODELS or cls.startswith("__") and cls.endswith("__"):  # Keras' own tensors, tuples, arrays, ...
        return True
    if cls == "function":
        name = obj.get("config")
        return isinstance(name, str) and (keras.saving.get_registered_object(name) is not None
                                          or (module == "builtins" and _activation(keras, name))
                                          or isinstance(module, str) and module.split(".")[0] == "keras")
    if isinstance(registered or cls, str) and keras.saving.get_registered_object(registered or cls) is not None:
        return True
    if "module" in obj:  # Keras 3 configs say where the class lives
        return isinstance(module, str) and module.split(".")[0] == "keras"
    return key not in LAYER_KEYS or hasattr(keras.layers, str(cls))


def _activation(keras, name: str) -> bool:
    try:
        keras.activations.get(name)
        return True
    except (ValueError, TypeError):
        return False
