"""What the Keras builders share: config values read the same way and refused in the same words
(`ints`, `channels_last`, `last_axis`, `policy_ok`), Keras' activations by name, and a map's
values per channel."""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np

from qtool.importers.checks import MAX_TENSOR_ELEMENTS
from qtool.importers.keras.config import FLOAT_POLICIES, _policy, hard_sigmoid_params

if TYPE_CHECKING:
    from qtool.importers.keras.model_graph import Entry, Reader

# keras.activations by name -> (op, attrs); "linear" is no node. Keras 3's hard_sigmoid is relu6(x + 3) / 6
# (Keras 2's 0.2x + 0.5: `activation_of` takes the file's), its leaky_relu's default slope 0.2, its gelu the
# exact (erf) one
ACTIVATIONS = {"relu": ("activation", {"kind": "relu"}), "relu6": ("activation", {"kind": "relu6"}),
               "leaky_relu": ("activation", {"kind": "leaky_relu", "alpha": 0.2}),
               "sigmoid": ("activation", {"kind": "sigmoid"}), "tanh": ("activation", {"kind": "tanh"}),
               "hard_sigmoid": ("activation", {"kind": "hard_sigmoid", "alpha": 1 / 6, "beta": 0.5}),
               "softplus": ("activation", {"kind": "softplus"}), "gelu": ("activation", {"kind": "gelu"}),
               "softmax": ("softmax", {}), "linear": None}



def ints(r: Reader, e: Entry, key: str, default=None, n: int = 1) -> tuple[int, ...]:
    """A config value given as an int or a list of `n` ints (`kernel_size: [3]`), as a tuple."""
    v = e.cfg.get(key, default)
    v = [v] * n if isinstance(v, int) else v
    if (not isinstance(v, (list, tuple)) or len(v) != n
            or not all(isinstance(i, int) and not isinstance(i, bool) and 0 <= i <= MAX_TENSOR_ELEMENTS for i in v)):
        raise r.fail(e, f"has {key}={e.cfg.get(key)!r}; expected {n} non-negative integer(s)")
    return tuple(v)


def channels_last(r: Reader, e: Entry) -> None:
    if e.cfg.get("data_format") not in (None, "channels_last"):
        raise r.fail(e, f"has data_format={e.cfg.get('data_format')!r}; only 'channels_last' (Keras' default, "
                     "[N, T, C]) is supported")


def last_axis(r: Reader, e: Entry, key: str, shape: tuple) -> None:
    """`axis` (an int or a list of one) must name the channel axis: -1, or 2 of [N, T, C], 1 of [N, C]."""
    v = e.cfg.get(key, -1)
    v = v[0] if isinstance(v, list) and len(v) == 1 else v
    if v not in (-1, len(shape)):
        raise r.fail(e, f"has {key}={e.cfg.get(key)!r}; only the channel axis (-1) is supported")


def activation_of(r: Reader, e: Entry, value) -> tuple[str, dict] | None:
    """(op, attrs) of a Keras activation given by name; None for linear; refused otherwise."""
    if isinstance(value, dict) and value.get("class_name") == "function" and isinstance(value.get("config"), str):
        value = value["config"]  # a serialized keras.activations function
    if value == "hard_sigmoid":  # what it meant in the Keras that wrote the file
        alpha, beta = hard_sigmoid_params(r.major, f"{r.where}: layer {e.label}")
        return "activation", {"kind": "hard_sigmoid", "alpha": alpha, "beta": beta}
    if value is None or value in ACTIVATIONS:
        return ACTIVATIONS.get(value)
    what = value.get("class_name", value) if isinstance(value, dict) else value
    raise r.fail(e, f"has activation {what!r}; supported: {', '.join(ACTIVATIONS)}")


def policy_ok(r: Reader, e: Entry) -> None:
    if _policy(e.cfg) not in (None, *FLOAT_POLICIES):
        raise r.fail(e, f"has dtype policy {_policy(e.cfg)!r}; only float policies are supported")


def per_channel(r: Reader, v, width: int) -> np.ndarray:
    """Values per channel (or per frequency and channel) as one per edge channel: repeated at
    each frequency of a map ("fc" frames) where they are one per channel of it; otherwise as
    they are (the op's own check says what does not fit)."""
    v = np.asarray(v, np.float32)
    if r.on_map and v.size != width and v.size == v.shape[-1] and v.size * r.on_map == width:
        return np.tile(v.reshape(-1), r.on_map)
    return v.reshape(-1)
