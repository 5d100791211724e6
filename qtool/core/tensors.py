"""The tensor table (docs/numerics.md, "Tensor table"): every tensor of the quantized GRU, its
class, and its defaults.

This is the one list of tensors; calibration, simulation, reports and export iterate over it.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

from qtool.errors import QtoolError

# the calibration methods a bits file may name (qtool.calibrators.METHODS holds one observer for each)
METHOD_NAMES = ("minmax", "ema", "percentile", "mse", "kl")

# The integer cell's derived parameters (qtool.numerics.rescale.derive computes them): scalars in
# one int64 vector P in this order, per-channel values in the rows CH of CHANNEL_ROWS.
PARAMS = (
    # zero points
    "zp_x", "zp_h", "zp_Wx", "zp_Rh", "zp_z_pre", "zp_r_pre", "zp_g_pre", "zp_z_out", "zp_r_out",
    "zp_g_out", "zp_Rh_add_br", "zp_rRh", "zp_old_contrib", "zp_new_contrib",
    # shifts: sh_<from>_<to>
    "sh_Wx_z_pre", "sh_Rh_z_pre", "sh_Wx_r_pre", "sh_Rh_r_pre", "sh_Rh_Rh_add_br", "sh_rRh",
    "sh_Wx_g_pre", "sh_rRh_g_pre", "sh_old_contrib", "sh_new_contrib", "sh_old_contrib_h",
    "sh_new_contrib_h",
    # the constant 1 in z_out's quantization, for (1 - z)
    "q_1_in_z_scale",
    # saturation bounds of every computed tensor
    "lo_Wx", "hi_Wx", "lo_Rh", "hi_Rh", "lo_z_pre", "hi_z_pre", "lo_r_pre", "hi_r_pre",
    "lo_g_pre", "hi_g_pre", "lo_z_out", "hi_z_out", "lo_r_out", "hi_r_out", "lo_g_out", "hi_g_out",
    "lo_Rh_add_br", "hi_Rh_add_br", "lo_rRh", "hi_rRh", "lo_old_contrib", "hi_old_contrib",
    "lo_new_contrib", "hi_new_contrib", "lo_h", "hi_h",
    # LUT interpolation shifts (0: directly indexed table)
    "lut_shift_z", "lut_shift_r", "lut_shift_g",
)
CHANNEL_ROWS = ("sh_W", "W_sum_mul_x_zp", "sh_R", "R_sum_mul_h_zp", "qbx", "qbr", "sh_bx", "sh_br")


@dataclass(frozen=True)
class TensorDef:
    name: str
    kind: str  # "activation", "weight" or "bias"
    symmetric: bool
    per_channel: bool
    note: str


TENSORS = (
    TensorDef("x", "activation", False, False, "input, EMA range over time steps"),
    TensorDef("h", "activation", False, False, "hidden state, EMA range over time steps"),
    TensorDef("W", "weight", True, True, "input weights [3H, C]"),
    TensorDef("R", "weight", True, True, "recurrent weights [3H, H]"),
    TensorDef("bx", "bias", True, True, "input bias [3H]"),
    TensorDef("br", "bias", True, True, "recurrent bias [3H]"),
    TensorDef("Wx", "activation", False, False, "GEMM output W x"),
    TensorDef("Rh", "activation", False, False, "GEMM output R h"),
    TensorDef("z_pre", "activation", False, False, "update gate pre-activation"),
    TensorDef("r_pre", "activation", False, False, "reset gate pre-activation"),
    TensorDef("g_pre", "activation", False, False, "candidate gate pre-activation"),
    TensorDef("z_out", "activation", False, False, "sigmoid output; (1 - z) reuses its params"),
    TensorDef("r_out", "activation", False, False, "sigmoid output"),
    TensorDef("g_out", "activation", True, False, "tanh output"),
    TensorDef("Rh_add_br", "activation", False, False, "Rh_g + br_g"),
    TensorDef("rRh", "activation", False, False, "r * Rh_add_br"),
    TensorDef("old_contrib", "activation", False, False, "z * h_old"),
    TensorDef("new_contrib", "activation", False, False, "(1 - z) * g"),
)
# A reset-before cell (qtool.core.model.CellForm, reset_after False) has no Rh_add_br or rRh: the
# reset gate multiplies h, `rh = r * h_old`, and R's g rows run on rh (Rh's g block is R_g rh,
# on Rh's grid; docs/numerics.md, "Integer cell, reset before").
RH = TensorDef("rh", "activation", False, False, "r * h_old, the R_g GEMM's input (reset before)")
TENSORS_RESET_BEFORE = tuple(t for t in TENSORS if t.name not in ("Rh_add_br", "rRh")) + (RH,)
PARAMS_RESET_BEFORE = (
    # zero points
    "zp_x", "zp_h", "zp_Wx", "zp_Rh", "zp_z_pre", "zp_r_pre", "zp_g_pre", "zp_z_out", "zp_r_out",
    "zp_g_out", "zp_rh", "zp_old_contrib", "zp_new_contrib",
    # shifts: sh_<from>_<to>; sh_rh = e_r_out + e_h - e_rh, the product r * h_old onto rh's grid
    "sh_Wx_z_pre", "sh_Rh_z_pre", "sh_Wx_r_pre", "sh_Rh_r_pre", "sh_rh", "sh_Wx_g_pre", "sh_Rh_g_pre",
    "sh_old_contrib", "sh_new_contrib", "sh_old_contrib_h", "sh_new_contrib_h",
    "q_1_in_z_scale",
    "lo_Wx", "hi_Wx", "lo_Rh", "hi_Rh", "lo_z_pre", "hi_z_pre", "lo_r_pre", "hi_r_pre",
    "lo_g_pre", "hi_g_pre", "lo_z_out", "hi_z_out", "lo_r_out", "hi_r_out", "lo_g_out", "hi_g_out",
    "lo_rh", "hi_rh", "lo_old_contrib", "hi_old_contrib", "lo_new_contrib", "hi_new_contrib", "lo_h", "hi_h",
    "lut_shift_z", "lut_shift_r", "lut_shift_g",
)
# every tensor any cell has: what bits files and configs may name
ALL_TENSORS = TENSORS + (RH,)
BY_NAME = {t.name: t for t in ALL_TENSORS}
NAMES = tuple(t.name for t in TENSORS)  # the haste cell's
ALL_NAMES = tuple(t.name for t in ALL_TENSORS)
# The activations in table order: what the float GRU records per time step (float_gru.TRACED).
ACTIVATIONS = tuple(t.name for t in TENSORS if t.kind == "activation")
# The one written order of the cell's tensors: the integer cell's outputs in the order
# qtool.numerics.intops.gru_cell returns them, Rh as its three gate blocks. Pinned by
# tests/qat/test_fakequant.py (the engines' traces, named by this order, equal the fake-quant cell's
# tensors, which it names itself) and checked against TENSORS by tests/engine/test_tensor_order.py.
CELL_TRACE = ("Rh_z", "Rh_r", "Rh_g", "z_pre", "r_pre", "g_pre", "z_out", "r_out", "g_out",
              "Rh_add_br", "rRh", "old_contrib", "new_contrib", "h")
# the tensor of each CELL_TRACE output (Rh_z, Rh_r, Rh_g: Rh's gate blocks)
TRACE_TENSOR = tuple(n if n in BY_NAME else n.rsplit("_", 1)[0] for n in CELL_TRACE)
# Tensors the integer cell computes at every step (recorded for per-tensor reports).
CELL_OUTPUTS = tuple(dict.fromkeys(TRACE_TENSOR))
# Every tensor the integer GRU computes (and saturates): Wx, the W x GEMM's epilogue, then the cell's.
COMPUTED = ("Wx", *CELL_OUTPUTS)
# The reset-before cell's outputs (intops.gru_gates_reset_before, then gru_candidate_reset_before,
# in the haste cell's order where they share a tensor)
CELL_TRACE_RESET_BEFORE = ("Rh_z", "Rh_r", "Rh_g", "z_pre", "r_pre", "g_pre", "z_out", "r_out", "g_out",
                           "rh", "old_contrib", "new_contrib", "h")
TRACE_TENSOR_RESET_BEFORE = tuple(n if n in BY_NAME else n.rsplit("_", 1)[0] for n in CELL_TRACE_RESET_BEFORE)
COMPUTED_RESET_BEFORE = ("Wx", *dict.fromkeys(TRACE_TENSOR_RESET_BEFORE))


def cell_tensors(form) -> tuple[TensorDef, ...]:
    """The tensor table of a cell of this form (qtool.core.model.CellForm): the haste table, or
    the reset-before one (rh for Rh_add_br and rRh). The activations do not change the table."""
    return TENSORS if form.reset_after else TENSORS_RESET_BEFORE


def cell_names(form) -> tuple[str, ...]:
    return tuple(t.name for t in cell_tensors(form))


def cell_params(form) -> tuple[str, ...]:
    """The names of P's entries for a cell of this form (rescale.derive's or derive_reset_before's)."""
    return PARAMS if form.reset_after else PARAMS_RESET_BEFORE


def cell_trace(form) -> tuple[str, ...]:
    """The integer cell's outputs in the order the engines trace them."""
    return CELL_TRACE if form.reset_after else CELL_TRACE_RESET_BEFORE


def trace_tensor(form) -> tuple[str, ...]:
    return TRACE_TENSOR if form.reset_after else TRACE_TENSOR_RESET_BEFORE


def computed(form) -> tuple[str, ...]:
    """Every tensor the integer cell computes and saturates, Wx first."""
    return COMPUTED if form.reset_after else COMPUTED_RESET_BEFORE

# bits per tensor class: (weight, bias, activation)
PRESETS = {"int8": (8, 32, 8), "w8a16": (8, 32, 16), "int16": (16, 32, 16)}
BITS_LIMITS = {"weight": (2, 16), "activation": (2, 16), "bias": (8, 32)}


@dataclass(frozen=True)
class TensorConfig:
    bits: int
    symmetric: bool
    method: str | None = None  # calibration method for this tensor; None: the command's choice


def preset_config(preset: str) -> dict[str, TensorConfig]:
    if preset not in PRESETS:
        raise QtoolError(f"unknown bits preset '{preset}' (use one of {', '.join(PRESETS)})")
    w, b, a = PRESETS[preset]
    bits = {"weight": w, "bias": b, "activation": a}
    return {t.name: TensorConfig(bits[t.kind], t.symmetric) for t in ALL_TENSORS}


def _read_config_file(path: Path) -> dict:
    try:
        text = path.read_text()
    except OSError as e:
        raise QtoolError(f"cannot read bits config {path}: {e.strerror}") from None
    if path.suffix.lower() not in (".toml", ".json"):
        raise QtoolError(f"{path}: a bits file is .json or .toml (a preset: int8, w8a16, int16)")
    try:
        if path.suffix.lower() == ".toml":
            import tomllib

            return tomllib.loads(text)
        return json.loads(text)
    except ValueError as e:
        raise QtoolError(f"{path}: not valid {path.suffix[1:].upper()} ({e})") from None


class BitsConfig(dict):
    """name -> TensorConfig for every layer, and per-layer overrides `layers[l][name]` (a bits
    file's `[layers.L.NAME]` tables). A plain dict is a config without overrides."""

    def __init__(self, base: dict[str, TensorConfig], layers: dict[int, dict[str, TensorConfig]] | None = None,
                 graph: dict[str, dict] | None = None, named: tuple[str, set] | None = None):
        super().__init__(base)
        self.layers = layers or {}
        self.graph = graph or {}  # a whole model's layer (or input) name -> {weight, bias, activation, method}
        # (file name, {(layer or None, tensor)}): what a bits file names, checked against the model's cells
        self.named = named


GRAPH_KEYS = {"weight": "weight", "bias": "bias", "activation": "activation"}


def _graph_entries(path: Path, raw) -> dict[str, dict]:
    """A bits file's `graph` tables: per layer of a whole model (or per model input) the bits of
    its weights, bias and output, and the method of its output's range."""
    if not isinstance(raw, dict):
        raise QtoolError(f"{path}: 'graph' must be a table/object")
    out = {}
    for name, entry in raw.items():
        if not isinstance(entry, dict) or not entry or set(entry) - {*GRAPH_KEYS, "method"}:
            raise QtoolError(f"{path}: graph '{name}' needs a table of weight, bias, activation (bits) and/or method")
        for key, kind in GRAPH_KEYS.items():
            lo, hi = BITS_LIMITS[kind]
            v = entry.get(key)
            if v is not None and (not isinstance(v, int) or isinstance(v, bool) or not lo <= v <= hi):
                raise QtoolError(f"{path}: graph '{name}' {key} bits must be an integer in {lo}..{hi}, got {v!r:.20}")
        if entry.get("method") not in (None, *METHOD_NAMES):
            raise QtoolError(f"{path}: graph '{name}' method must be one of {', '.join(METHOD_NAMES)}")
        out[str(name)] = dict(entry)
    return out


def layer_config(config: dict[str, TensorConfig], layer: int) -> dict[str, TensorConfig]:
    """The config of one layer: the per-layer overrides over the all-layer entries."""
    out = dict(config)
    out.update(getattr(config, "layers", {}).get(layer, {}))
    return out


def _entry(path: Path, where: str, name: str, entry, base: TensorConfig) -> TensorConfig:
    """One tensor's table of a bits file over `base`, validated."""
    if not isinstance(entry, dict) or set(entry) - {"bits", "symmetric", "method"}:
        raise QtoolError(f"{path}: {where} '{name}' needs a table with 'bits', 'symmetric' and/or 'method'")
    t = BY_NAME[name]
    bits = entry.get("bits", base.bits)
    lo, hi = BITS_LIMITS[t.kind]
    if not isinstance(bits, int) or not lo <= bits <= hi:
        raise QtoolError(f"{path}: bits of '{name}' must be an integer in [{lo}, {hi}]")
    sym = entry.get("symmetric", base.symmetric)
    if t.kind != "activation" and not sym:
        raise QtoolError(f"{path}: '{name}' must stay symmetric (zero-point compensation "
                         "assumes symmetric weights and biases)")
    method = entry.get("method", base.method)
    if method is not None and method not in METHOD_NAMES:
        raise QtoolError(f"{path}: method of '{name}' must be one of {', '.join(METHOD_NAMES)}")
    if method is not None and t.kind == "bias":
        raise QtoolError(f"{path}: '{name}' is a 32-bit bias; it keeps its min/max range")
    return TensorConfig(bits, bool(sym), method)


def _tables(path: Path, raw, where: str) -> dict:
    if not isinstance(raw, dict):
        raise QtoolError(f"{path}: '{where}' must be a table/object")
    for name in raw:
        if name not in BY_NAME:
            raise QtoolError(f"{path}: unknown tensor '{name}' in {where} (known: {', '.join(ALL_NAMES)})")
    return raw


def _layer_overrides(path: Path, raw, config: dict[str, TensorConfig]) -> dict[int, dict[str, TensorConfig]]:
    layers = {}
    if not isinstance(raw, dict):
        raise QtoolError(f"{path}: 'layers' must be a table of layer numbers")
    for key, tensors in raw.items():
        if not str(key).isdigit():
            raise QtoolError(f"{path}: layers.{key}: layer numbers are integers from 0")
        l = int(key)
        if l > 0 and "x" in (tensors or {}):
            raise QtoolError(f"{path}: layers.{l}.x: the input of layer {l} is the h of layer {l - 1} "
                             f"(set layers.{l - 1}.h)")
        layers[l] = {name: _entry(path, f"layers.{l}", name, entry, config[name])
                     for name, entry in _tables(path, tensors or {}, f"layers.{l}").items()}
    return layers


def load_bits(spec: str) -> tuple[str, BitsConfig]:
    """`spec` is a preset name or a JSON/TOML file: {"preset": "int8", "tensors": {"g_pre":
    {"bits": 16}, "h": {"bits": 16, "symmetric": false, "method": "mse"}}, "layers": {"1": {"R":
    {"bits": 16}}}}. `layers` overrides single layers (TOML: `[layers.1.R]`); for a whole model,
    `graph` sets a layer's (or the input's) bits, `{"graph": {"head": {"weight": 16, "activation":
    16, "method": "mse"}}}` (TOML: `[graph.head]`). Returns (label, config)."""
    if spec in PRESETS:
        return spec, BitsConfig(preset_config(spec))
    path = Path(spec)
    if not path.is_file():
        raise QtoolError(f"`bits` '{spec}' is neither a preset ({', '.join(PRESETS)}) nor a file")
    return path.name, bits_from_table(_read_config_file(path), path)


def bits_from_table(raw, path: Path) -> BitsConfig:
    """A bits file's contents, read (its TOML or JSON as a dict), as `load_bits` returns them;
    `path` names the file in errors."""
    if not isinstance(raw, dict):
        raise QtoolError(f"{path}: the config must be a table/object")
    unknown = set(raw) - {"preset", "tensors", "layers", "graph"}
    if unknown:
        raise QtoolError(f"{path}: unknown keys {sorted(unknown)} (allowed: preset, tensors, layers, graph)")
    config = preset_config(raw.get("preset", "int8"))
    for name, entry in _tables(path, raw.get("tensors") or {}, "tensors").items():
        config[name] = _entry(path, "tensor", name, entry, config[name])
    layers = _layer_overrides(path, raw.get("layers") or {}, config)
    named = {(None, n) for n in raw.get("tensors") or {}} | {(l, n) for l, t in layers.items() for n in t}
    return BitsConfig(config, layers, _graph_entries(path, raw.get("graph") or {}), (path.name, named))


def bits_table(preset: str, per_layer: list[dict[str, TensorConfig]], methods_apart: bool = False) -> dict:
    """The contents of a bits file (what `bits_from_table` reads, `bits_toml` writes) for per-layer
    configs `per_layer[l]`: entries that all layers share under tensors, the others under
    layers[l]; only what differs from the preset. The x of layers l > 0 is the h of layer l - 1
    and is left out. With `methods_apart`, a tensor's bits and its method are shared or not each
    on its own (bits under tensors, methods under layers where only the methods differ), so that
    the methods never move the tensors table's bits (a whole model's layers default to its W and
    h)."""
    base = preset_config(preset)
    parts = (("bits", "symmetric"), ("method",)) if methods_apart else (("bits", "symmetric", "method"),)

    def entry(name: str, c: TensorConfig) -> dict:
        e: dict = {"bits": c.bits}
        if c.symmetric != BY_NAME[name].symmetric:
            e["symmetric"] = c.symmetric
        if c.method:
            e["method"] = c.method
        return e

    tensors: dict[str, dict] = {}
    by_layer: dict[int, dict[str, dict]] = {}
    for name in ALL_NAMES:
        layers = [l for l in range(len(per_layer)) if (name != "x" or l == 0) and name in per_layer[l]]
        for part in parts if layers else ():
            values = [{k: v for k, v in entry(name, per_layer[l][name]).items() if k in part} for l in layers]
            default = {k: v for k, v in entry(name, base[name]).items() if k in part}
            if all(v == values[0] for v in values):
                if values[0] != default:
                    tensors.setdefault(name, {}).update(values[0])
                continue
            for l, v in zip(layers, values):
                if v != default:
                    by_layer.setdefault(l, {}).setdefault(name, {}).update(v)
    return {"preset": preset, "tensors": tensors, "layers": {l: by_layer[l] for l in sorted(by_layer)}}


def table_toml(table: dict, comment: str = "") -> str:
    """A bits file's contents (`bits_table`, and a whole model's `graph`) as TOML, read by
    `load_bits`: [tensors.NAME], [layers.L.NAME], [graph."NAME"], in the dict's order."""
    def one(header: str, entry: dict) -> str:
        return "\n".join([f"[{header}]", *(f"{k} = {json.dumps(v)}" for k, v in entry.items())])

    out = [f"# {line}" for line in comment.splitlines()] + [f'preset = "{table["preset"]}"']
    out += [one(f"tensors.{name}", e) for name, e in table.get("tensors", {}).items()]
    out += [one(f"layers.{l}.{name}", e) for l, t in table.get("layers", {}).items() for name, e in t.items()]
    out += [one(f"graph.{json.dumps(name)}", e) for name, e in table.get("graph", {}).items()]
    return "\n\n".join(out) + "\n"


def bits_toml(preset: str, per_layer: list[dict[str, TensorConfig]], comment: str = "") -> str:
    """A bits file (TOML, read by `load_bits`) for per-layer configs `per_layer[l]` (`bits_table`)."""
    return table_toml(bits_table(preset, per_layer), comment)
