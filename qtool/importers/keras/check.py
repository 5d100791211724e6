"""The Keras side of the import check: the file loaded by Keras itself (safe_mode: no code from the
file runs, no compile: nothing of training is loaded), its GRU layers run on the check's inputs.
Keras is given an inference-only copy of the file in a private temporary folder (keras_copy.py).

Keras decides which weights belong to which layer and what the layer computes; each layer is
re-created from its own config with the full sequence returned (a `return_sequences=False` layer
computes the same steps) and float32 arithmetic, then given the loaded layer's weights.
"""

from __future__ import annotations

import importlib.util
import json
import os
import sys
import tempfile
from pathlib import Path

import numpy as np

from qtool.errors import QtoolError
from qtool.importers.checks import MAX_TENSOR_ELEMENTS, framework_run, one_torch_thread
from qtool.importers.keras.config import keras_major
from qtool.importers.keras.copy import inference_config, unloadable, write_copy

SIZE_KEYS = ("units", "filters", "input_dim", "output_dim", "num_heads", "key_dim", "value_dim",
             "num_tokens", "max_tokens")


def _import_keras():
    """Keras 3 uses TensorFlow unless configured otherwise; when the configured backend is not
    installed but PyTorch is, use PyTorch (only when Keras is not loaded yet)."""
    if "keras" not in sys.modules:
        config = Path(os.environ.get("KERAS_HOME", "~/.keras")).expanduser() / "keras.json"
        try:
            backend = json.loads(config.read_text()).get("backend", "tensorflow")
        except (OSError, ValueError, AttributeError):
            backend = "tensorflow"
        backend = os.environ.get("KERAS_BACKEND") or backend
        if importlib.util.find_spec(str(backend)) is None and importlib.util.find_spec("torch"):
            os.environ["KERAS_BACKEND"] = "torch"
    with framework_run():  # on PyTorch it makes a cache folder in the temporary folder
        import keras  # ImportError: Keras is not installed (or has no usable backend)

    return keras


def _full_sequence_config(cfg: dict) -> dict:
    """A GRU's (or a Bidirectional GRU's) config returning the whole sequence, in float32."""
    cfg = inference_config(cfg)  # a copy; the weights are replaced at once
    cfg["dtype"] = "float32"
    inner = [cfg[k]["config"] for k in ("layer", "backward_layer") if isinstance(cfg.get(k), dict)]
    for c in inner or [cfg]:
        c.update(return_sequences=True, return_state=False, stateful=False, dtype="float32")
        cell = c["cell"]["config"] if isinstance(c.get("cell"), dict) else c  # keras.layers.RNN(GRUCell)
        cell["dtype"] = "float32"
        if "state_quantizer" in cell:  # a QGRU: qtool's float GRU keeps h in float (h's grid is a range)
            cell["state_quantizer"] = None
    return cfg


def _oversized(config) -> str | None:
    """A layer whose config would make Keras allocate more than MAX_TENSOR_ELEMENTS for one weight
    when it builds the model (qtool validated only the GRU layers' sizes against their weights)."""
    if isinstance(config, list):
        return next((r for v in config if (r := _oversized(v))), None)
    if not isinstance(config, dict):
        return None
    cfg = config.get("config")
    if isinstance(cfg, dict):
        shape = (config.get("build_config") or {}).get("input_shape")
        fan_in = shape[-1] if isinstance(shape, list) and shape and isinstance(shape[-1], int) else 1
        sizes = {k: v for k in SIZE_KEYS if isinstance(v := cfg.get(k), int)}
        if sizes and max(max(sizes.values()) * fan_in, int(np.prod(list(sizes.values())))) > MAX_TENSOR_ELEMENTS:
            return f"layer '{cfg.get('name')}' ({', '.join(f'{k}={v}' for k, v in sizes.items())})"
    return next((r for v in config.values() if (r := _oversized(v))), None)


def _load(keras, path: Path, config: dict):
    """The model as Keras reads it: Keras' own loader on the inference-only copy of the file, in a
    folder of qtool's that is removed afterwards (the loaded model holds its weights in memory)."""
    why = unloadable(keras, inference_config(config))
    if why:
        raise QtoolError(f"{path}: {why}; Keras cannot build the model without that code, which qtool does "
                         "not run (`check=False` imports the GRU without the check)")
    with tempfile.TemporaryDirectory(prefix="qtool-keras-") as folder:
        copy = write_copy(path, config, Path(folder))
        return keras.saving.load_model(str(copy), compile=False, safe_mode=True)


def keras2_hard_sigmoid(keras, model, major: int | None) -> None:
    """A file written by Keras 2 was trained with Keras 2's hard_sigmoid, 0.2x + 0.5; Keras 3 loads
    the name as its own, x / 6 + 0.5. So that the check compares with what the model's author ran,
    every layer of such a file that Keras 3 gave its hard_sigmoid (a Dense or Activation's
    `activation`, a GRU cell's `recurrent_activation`) computes Keras 2's instead."""
    if major is None or major >= 3:
        return

    def hard_sigmoid(x):
        return keras.ops.clip(0.2 * x + 0.5, 0.0, 1.0)

    for layer in model._flatten_layers(include_self=True, recursive=True):
        for obj in (layer, getattr(layer, "cell", None)):
            for key in ("activation", "recurrent_activation"):
                if isinstance(getattr(type(obj), key, None), property):
                    continue  # a GRU layer's view of its cell's function: the cell is patched
                if getattr(obj, key, None) is keras.activations.hard_sigmoid:
                    setattr(obj, key, hard_sigmoid)


def float_activations(keras, model) -> int:
    """The model as qtool's float graph computes it (the import check): every QKeras quantizer on
    the data (a QActivation's, or a layer's `activation=`) replaced by its float function, the
    identity for quantized_bits (a relu without keep_negative), a relu for quantized_relu; in
    place. Returns how many were replaced. Weight quantizers stay: qtool folds them."""
    try:
        from qkeras.quantizers import quantized_bits, quantized_relu
    except ImportError:
        return 0
    count = 0
    for layer in model._flatten_layers(include_self=True, recursive=True):
        q = getattr(layer, "activation", None)
        if isinstance(getattr(type(layer), "activation", None), property) or type(q) not in (quantized_bits,
                                                                                           quantized_relu):
            continue
        relu = type(q) is quantized_relu or not q.keep_negative
        layer.activation = keras.activations.relu if relu else keras.activations.linear
        count += 1
    return count


def _layer(model, name: str):
    for part in name.split("/"):
        # QKeras' QGRU.from_config hands the layer's name to its cell (the layer gets a fresh one)
        named = [l for l in model.layers if l.name == part or getattr(getattr(l, "cell", None), "name", None) == part]
        model = named[0] if len(named) == 1 else model.get_layer(part)
    return model


def run_keras(path: Path, config: dict, names: list[str], x: np.ndarray) -> np.ndarray:
    """The named GRU layers of the Keras model at `path`, one after another, on `x [N, T, C]`."""
    big = _oversized(config)
    if big:
        raise QtoolError(f"{path}: {big} would make Keras allocate more than {MAX_TENSOR_ELEMENTS:,} values "
                         "for one weight; not loaded with Keras (`check=False` imports the GRU without it)")
    keras = _import_keras()
    if '"qkeras>' in json.dumps(config):
        import qkeras  # noqa: F401  (registers QKeras' layers and quantizers with Keras)
    major = keras_major(path)
    with one_torch_thread():  # a no-op unless Keras runs on PyTorch
        model = _load(keras, path, config)
        y = np.asarray(x, np.float32)
        for name in names:
            layer = _layer(model, name)
            clone = layer.__class__.from_config(_full_sequence_config(layer.get_config()))
            clone.build(y.shape)
            clone.set_weights([np.asarray(w, np.float32) for w in layer.get_weights()])
            keras2_hard_sigmoid(keras, clone, major)
            y = keras.ops.convert_to_numpy(clone(y))
    return y
