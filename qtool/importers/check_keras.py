"""The Keras side of the import check: the file loaded by Keras itself (safe_mode: no code from the
file runs), its GRU layers run on the check's inputs.

Keras decides which weights belong to which layer and what the layer computes; each layer is
re-created from its own config with the full sequence returned (a `return_sequences=False` layer
computes the same steps) and float32 arithmetic, then given the loaded layer's weights.
"""

from __future__ import annotations

import copy
import importlib.util
import json
import os
import sys
from pathlib import Path

import numpy as np


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
    import keras  # ImportError: Keras is not installed (or has no usable backend)

    return keras


def _full_sequence_config(cfg: dict) -> dict:
    """A GRU's (or a Bidirectional GRU's) config returning the whole sequence, in float32."""
    cfg = copy.deepcopy(cfg)
    cfg["dtype"] = "float32"
    inner = [cfg[k]["config"] for k in ("layer", "backward_layer") if isinstance(cfg.get(k), dict)]
    for c in inner or [cfg]:
        c.update(return_sequences=True, return_state=False, stateful=False, dtype="float32")
        if isinstance(c.get("cell"), dict):  # keras.layers.RNN(GRUCell)
            c["cell"]["config"]["dtype"] = "float32"
    return cfg


def _layer(model, name: str):
    for part in name.split("/"):
        model = model.get_layer(part)
    return model


def run_keras(path: Path, names: list[str], x: np.ndarray) -> np.ndarray:
    """The named GRU layers of the Keras model at `path`, one after another, on `x [N, T, C]`."""
    keras = _import_keras()
    model = keras.saving.load_model(str(path), compile=False, safe_mode=True)
    y = np.asarray(x, np.float32)
    for name in names:
        layer = _layer(model, name)
        clone = layer.__class__.from_config(_full_sequence_config(layer.get_config()))
        clone.build(y.shape)
        clone.set_weights([np.asarray(w, np.float32) for w in layer.get_weights()])
        y = keras.ops.convert_to_numpy(clone(y))
    return y
