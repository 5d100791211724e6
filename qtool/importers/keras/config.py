"""Keras model configs: which layers are GRUs, whether qtool computes what they compute, where
their weights are stored and which layer feeds which.

Keras 3 does not store a layer's weights under its name: `saving_lib` walks `model.layers` in
order and names each group after the layer's class, counting per class (`layers/gru`,
`layers/gru_1`, `layers/bidirectional`, ...). The config lists the layers in that same order, so
the n-th GRU of the config owns `layers/gru_{n}`, whatever it is called. Legacy `.h5` files
store each layer under its name (`model_weights/{name}`).
"""

from __future__ import annotations

import json
import re
import zipfile
from dataclasses import dataclass, field
from pathlib import Path

from qtool.core.model import (
    CANDIDATE_ACTIVATIONS,
    GATE_ACTIVATIONS,
    HASTE,
    KERAS2_HARD_SIGMOID,
    KERAS3_HARD_SIGMOID,
    CellForm,
)
from qtool.errors import QtoolError

MODELS = ("Sequential", "Functional", "Model")
# identity at inference: a GRU behind one of these still takes the GRU before it as its input
IDENTITY = ("Dropout", "SpatialDropout1D", "GaussianDropout", "GaussianNoise", "AlphaDropout",
            "ActivityRegularization", "Identity")
FLOAT_POLICIES = ("float32", "float64", "float16", "bfloat16", "mixed_float16", "mixed_bfloat16")


@dataclass
class Direction:
    units: int
    use_bias: bool
    reset_after: bool | None  # None: not in the config (old Keras); the bias shape decides
    quantizers: dict | None = None  # a QKeras QGRU's quantized_bits settings by role (W, R, b, h)
    form: CellForm = HASTE  # gate and candidate activations; reset_after is `reset_after`'s, once known


@dataclass
class KerasGru:
    """A GRU layer (or a Bidirectional wrapper of one) as the config describes it."""

    name: str  # the layer's name; "outer/inner" inside a nested model
    path: str  # its weights group in a .keras archive
    nested: bool
    source: str | None  # the layer it reads its input from, when that is one layer
    container: str
    dirs: list[Direction] = field(default_factory=list)


def snake_case(name: str) -> str:
    """keras.src.utils.naming.to_snake_case: the base of a layer's weights group name."""
    name = re.sub(r"\W+", "", name)
    name = re.sub("(.)([A-Z][a-z]+)", r"\1_\2", name)
    return re.sub("([a-z])([A-Z])", r"\1_\2", name).lower()


def _unique(base: str, used: dict) -> str:
    """saving_lib._get_unique_name: `gru`, then `gru_1`, `gru_2`, ..."""
    if base in used:
        used[base] += 1
        return f"{base}_{used[base]}"
    used[base] = 0
    return base


def is_qgru(layer: dict) -> bool:
    """A QKeras QGRU: registered as 'qkeras>QGRU' (.keras), or so named (legacy .h5)."""
    return (layer.get("class_name"), layer.get("registered_name")) in (("QGRU", "qkeras>QGRU"), ("qkeras>QGRU", None))


def _gru_cell(layer: dict, where: str) -> dict | None:
    """The cell config of a keras GRU or of an RNN around one GRUCell; None for other layers."""
    if not isinstance(layer, dict):
        return None
    cls, cfg = layer.get("class_name"), layer.get("config") or {}
    if cls == "GRU":
        if layer.get("registered_name") not in (None, "GRU"):
            raise QtoolError(f"{where}: layer '{cfg.get('name')}' is a custom class "
                             f"'{layer['registered_name']}'; only keras' own GRU is supported")
        return cfg
    if is_qgru(layer):
        return cfg
    if cls == "RNN":
        cell = cfg.get("cell")
        if isinstance(cell, dict) and cell.get("class_name") == "GRUCell":
            return cell.get("config") or {}
        if "GRUCell" in str(cell):
            raise QtoolError(f"{where}: RNN '{cfg.get('name')}' stacks several cells in one layer; only "
                             "one GRUCell per RNN layer is supported")
    return None


def keras_major(path: Path) -> int | None:
    """The major version of the Keras that wrote the file (metadata.json of a .keras archive, the
    `keras_version` attribute of a legacy .h5), or None where it is not recorded. It decides
    what 'hard_sigmoid' meant when the model was trained (KERAS2_HARD_SIGMOID, KERAS3_HARD_SIGMOID)."""
    import h5py

    try:
        if zipfile.is_zipfile(path):
            with zipfile.ZipFile(path) as z:
                if "metadata.json" not in z.namelist() or z.getinfo("metadata.json").file_size > 1 << 20:
                    return None
                version = json.loads(z.read("metadata.json")).get("keras_version")
        else:
            with h5py.File(path, "r") as f:
                version = f.attrs.get("keras_version")
    except (OSError, ValueError, AttributeError, zipfile.BadZipFile):
        return None
    version = version.decode(errors="replace") if isinstance(version, bytes) else version
    major = re.match(r"(\d+)\.", version) if isinstance(version, str) else None
    return int(major.group(1)) if major else None


def hard_sigmoid_params(major: int | None, what: str) -> tuple[float, float]:
    """(alpha, beta) of 'hard_sigmoid' in the Keras that wrote the file: 0.2x + 0.5 before Keras 3,
    x / 6 + 0.5 from Keras 3 on."""
    if major is None:
        raise QtoolError(f"{what} has a 'hard_sigmoid' activation, which Keras 2 computes as 0.2x + 0.5 and "
                         "Keras 3 as x / 6 + 0.5, and the file does not record which Keras wrote it")
    return KERAS2_HARD_SIGMOID if major < 3 else KERAS3_HARD_SIGMOID


def activation_name(value) -> str | None:
    """A Keras activation as its name: a string, None (linear), or a serialized function; None
    for anything else (a quantizer object, a custom callable)."""
    if value is None:
        return "linear"
    if isinstance(value, dict) and value.get("class_name") == "function" and isinstance(value.get("config"), str):
        value = value["config"]
    return value if isinstance(value, str) else None


def _shown(value) -> str:
    """A config value as a refusal names it: a serialized object (QKeras' quantized_tanh) by its class."""
    return repr(value.get("class_name", value) if isinstance(value, dict) else value)


def _cell_form(cell: dict, what: str, major: int | None) -> CellForm:
    """The gate and candidate activations of a Keras GRU cell (reset_after is decided with the
    bias: keras/reader.py)."""
    gate = activation_name(cell.get("recurrent_activation", "sigmoid"))
    candidate = activation_name(cell.get("activation", "tanh"))
    if gate not in GATE_ACTIVATIONS:
        raise QtoolError(f"{what} has recurrent_activation={_shown(cell.get('recurrent_activation'))}; qtool's GRU "
                         f"computes {' or '.join(map(repr, GATE_ACTIVATIONS))} gates")
    if candidate not in CANDIDATE_ACTIVATIONS:
        raise QtoolError(f"{what} has activation={_shown(cell.get('activation'))}; qtool's GRU computes "
                         f"{', '.join(map(repr, CANDIDATE_ACTIVATIONS))} candidates")
    alpha, beta = hard_sigmoid_params(major, what) if gate == "hard_sigmoid" else (None, None)
    return CellForm(gate=gate, gate_alpha=alpha, gate_beta=beta, candidate=candidate)


def _policy(cfg: dict) -> str | None:
    dtype = cfg.get("dtype")
    if isinstance(dtype, dict):
        dtype = (dtype.get("config") or {}).get("name")
    return dtype


def _direction(layer: dict, backwards: bool, where: str, major: int | None) -> Direction:
    """Check one GRU's config against what qtool computes; refuse anything that changes the math."""
    cfg, cell = layer.get("config") or {}, _gru_cell(layer, where)
    what = f"{where}: GRU '{cfg.get('name')}'"
    if is_qgru(layer):  # QKeras' quantizers are read for the haste form only
        for key, want in (("activation", "tanh"), ("recurrent_activation", "sigmoid")):
            if cell.get(key, want) != want:
                raise QtoolError(f"{what} has {key}={_shown(cell.get(key))}; qtool's GRU needs {want!r}")
    form = _cell_form(cell, what, major)
    if cell.get("reset_after") not in (None, True, False):
        raise QtoolError(f"{what} has reset_after={cell.get('reset_after')!r:.40}; expected true or false")
    if bool(cfg.get("go_backwards", False)) != backwards:
        raise QtoolError(f"{what} has go_backwards={cfg.get('go_backwards')} (it reads and returns "
                         "the sequence reversed); only forward GRUs and Bidirectional wrappers are supported")
    for c in (cfg, cell):
        if _policy(c) not in (None, *FLOAT_POLICIES):
            raise QtoolError(f"{what} has dtype policy {_policy(c)!r}; only float policies are supported")
    units = cell.get("units")
    if not isinstance(units, int) or units <= 0:
        raise QtoolError(f"{what} has units={units!r}")
    quantizers = None
    if is_qgru(layer):
        from qtool.importers.keras.quantizers import ROLES, quantizer_config

        try:
            quantizers = {r: quantizer_config(str(cfg.get("name")), k, cell.get(k)) for k, r in ROLES.items()}
        except QtoolError as e:
            raise QtoolError(f"{where}: {e}") from None  # which file, as for every other refusal
        if cell.get("reset_after", False) is not True:  # QGRU's own default is reset_after=False
            raise QtoolError(f"{what} has reset_after={cell.get('reset_after', False)}; only "
                             "reset_after=True (the haste/PyTorch formulation) is supported")
    return Direction(units, bool(cell.get("use_bias", True)), cell.get("reset_after"), quantizers, form)


def _gru_dirs(layer: dict, where: str, major: int | None) -> list[Direction] | None:
    """The directions of a GRU layer or a Bidirectional GRU; None for any other layer."""
    cls, cfg = layer.get("class_name"), layer.get("config") or {}
    if _gru_cell(layer, where) is not None:
        return [_direction(layer, False, where, major)]
    if cls != "Bidirectional" or _gru_cell(cfg.get("layer"), where) is None:
        return None
    if cfg.get("merge_mode", "concat") != "concat":
        raise QtoolError(f"{where}: Bidirectional '{cfg.get('name')}' has merge_mode "
                         f"{cfg.get('merge_mode')!r}; only 'concat' is supported")
    back = cfg.get("backward_layer")
    if back is not None and _gru_cell(back, where) is None:
        raise QtoolError(f"{where}: Bidirectional '{cfg.get('name')}' has a backward layer that is not a GRU")
    fwd = _direction(cfg["layer"], False, where, major)
    return [fwd, _direction(back, True, where, major) if back is not None else fwd]


def tensor_refs(value) -> list[tuple[str, int]]:
    """(layer, output index) of `input_layers`/`output_layers`: ["x", 0, 0] or [["x", 0, 0], ...]."""
    if not isinstance(value, list):
        return []
    entries = [value] if value and isinstance(value[0], str) else value
    return [(e[0], e[2] if len(e) > 2 and isinstance(e[2], int) else 0)
            for e in entries if isinstance(e, list) and e and isinstance(e[0], str)]


def call_refs(node) -> list[tuple[str, int]]:
    """(layer, output index) of the tensors one call of a layer reads, positional ones first."""
    if isinstance(node, list):  # Keras 2: [[layer_name, node_index, tensor_index, kwargs], ...]
        return tensor_refs([e[:3] for e in node if isinstance(e, list)])
    found: list[tuple[str, int]] = []

    def visit(v) -> None:
        if isinstance(v, dict):
            cfg = v.get("config") if v.get("class_name") == "__keras_tensor__" else None
            history = cfg.get("keras_history") if isinstance(cfg, dict) else None
            if isinstance(history, list) and history and isinstance(history[0], str):
                found.extend(tensor_refs(history))
            else:
                for w in v.values():
                    visit(w)
        elif isinstance(v, list):
            for w in v:
                visit(w)

    if isinstance(node, dict):
        visit(node.get("args"))
        visit(node.get("kwargs"))
    return found


def _node_inputs(node) -> list[str]:
    """Names of the layers whose outputs one call of a layer takes (Keras 3 and Keras 2 configs)."""
    return [name for name, _ in call_refs(node)]


def _masking(config) -> str | None:
    """The name of a layer that produces a mask (Masking, Embedding(mask_zero=True)), if any."""
    if isinstance(config, dict):
        cfg = config.get("config")
        if isinstance(cfg, dict) and (config.get("class_name") == "Masking" or cfg.get("mask_zero") is True):
            return str(cfg.get("name"))
        return next((m for v in config.values() if (m := _masking(v))), None)
    if isinstance(config, list):
        return next((m for v in config if (m := _masking(v))), None)
    return None


def model_layers(model: dict, where: str) -> tuple[str, list]:
    cls, cfg = model.get("class_name"), model.get("config")
    layers = cfg if isinstance(cfg, list) else (cfg or {}).get("layers") if isinstance(cfg, dict) else None
    if cls not in MODELS or not isinstance(layers, list):
        raise QtoolError(f"{where}: a subclassed Keras model ('{cls}'): its file does not say which layers "
                         "are GRUs or how they are configured; put the GRU layers in a Sequential or "
                         "functional model")
    return cls, layers


def find_grus(config: dict, where: str, major: int | None = None) -> list[KerasGru]:
    """Every GRU of the model, in Keras' own layer order, checked against what qtool supports
    (`major`: the version of the Keras that wrote the file, keras_major)."""
    found: list[KerasGru] = []
    _walk(config, "", "", where, found, major)
    masking = _masking(config)
    if found and masking:
        raise QtoolError(f"{where}: layer '{masking}' masks time steps, which changes what a GRU computes; "
                         "qtool's GRU runs every step (remove the mask to import)")
    return found


def _walk(model: dict, path: str, prefix: str, where: str, found: list, major: int | None) -> None:
    cls, layers = model_layers(model, where)
    by_name = {(l.get("config") or {}).get("name", l.get("name")): l for l in layers if isinstance(l, dict)}
    used: dict[str, int] = {}
    prev = None
    for layer in layers:
        lcls, lcfg = layer.get("class_name"), layer.get("config") or {}
        name = lcfg.get("name", layer.get("name"))
        group = f"{path}layers/{_unique(snake_case(str(lcls)), used)}"
        if lcls in MODELS:
            _walk(layer, group + "/", f"{prefix}{name}/", where, found, major)
        dirs = _gru_dirs(layer, where, major)
        if dirs is not None:
            source = prev if cls == "Sequential" else _source(layer, by_name, where)
            found.append(KerasGru(prefix + name, group, bool(prefix), source and prefix + source, prefix, dirs))
        if lcls not in ("InputLayer", *IDENTITY):
            prev = name


def _source(layer: dict, by_name: dict, where: str) -> str | None:
    """In a functional model: the one layer a GRU reads from (through identity layers), or None."""
    nodes = layer.get("inbound_nodes") or []
    inputs = [_node_inputs(n) for n in nodes]
    if any(len(i) > 1 for i in inputs):
        raise QtoolError(f"{where}: GRU '{layer['config'].get('name')}' is called with an initial state or "
                         "a mask; qtool's GRU starts every sequence from zero and runs every step")
    if len(inputs) != 1 or not inputs[0]:
        return None
    name = inputs[0][0]
    while by_name.get(name, {}).get("class_name") in IDENTITY:
        up = [_node_inputs(n) for n in by_name[name].get("inbound_nodes") or []]
        if len(up) != 1 or len(up[0]) != 1:
            return None
        name = up[0][0]
    return name


def chain(grus: list[KerasGru]) -> bool:
    """Whether the GRUs form one stack: each reads the output of the one before, in one model."""
    return len(grus) > 1 and all(g.source == p.name and g.container == p.container
                                 for p, g in zip(grus, grus[1:]))
