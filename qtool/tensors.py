"""The seed's tensor table: every tensor of the quantized GRU, its class, and its defaults.

This is the one list of tensors; calibration, simulation, reports and export iterate over it.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

from qtool.errors import QtoolError


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
BY_NAME = {t.name: t for t in TENSORS}
NAMES = tuple(t.name for t in TENSORS)
# Tensors the integer cell computes at every step (recorded for per-tensor reports).
CELL_OUTPUTS = ("Rh", "z_pre", "r_pre", "g_pre", "z_out", "r_out", "g_out", "Rh_add_br", "rRh",
                "old_contrib", "new_contrib", "h")

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
    return {t.name: TensorConfig(bits[t.kind], t.symmetric) for t in TENSORS}


def _read_config_file(path: Path) -> dict:
    try:
        text = path.read_text()
    except OSError as e:
        raise QtoolError(f"cannot read bits config {path}: {e.strerror}") from None
    try:
        if path.suffix.lower() == ".toml":
            import tomllib

            return tomllib.loads(text)
        return json.loads(text)
    except ValueError as e:
        raise QtoolError(f"{path}: not valid {path.suffix[1:].upper() or 'JSON'} ({e})") from None


def load_bits(spec: str) -> tuple[str, dict[str, TensorConfig]]:
    """`spec` is a preset name or a JSON/TOML file: {"preset": "int8", "tensors": {"g_pre":
    {"bits": 16}, "h": {"bits": 16, "symmetric": false, "method": "mse"}}}. Returns (label, config)."""
    from calibrators import METHODS

    if spec in PRESETS:
        return spec, preset_config(spec)
    path = Path(spec)
    if not path.is_file():
        raise QtoolError(f"--bits '{spec}' is neither a preset ({', '.join(PRESETS)}) nor a file")
    raw = _read_config_file(path)
    if not isinstance(raw, dict):
        raise QtoolError(f"{path}: the config must be a table/object")
    unknown = set(raw) - {"preset", "tensors"}
    if unknown:
        raise QtoolError(f"{path}: unknown keys {sorted(unknown)} (allowed: preset, tensors)")
    config = preset_config(raw.get("preset", "int8"))
    for name, entry in (raw.get("tensors") or {}).items():
        if name not in BY_NAME:
            raise QtoolError(f"{path}: unknown tensor '{name}' (known: {', '.join(NAMES)})")
        if not isinstance(entry, dict) or set(entry) - {"bits", "symmetric", "method"}:
            raise QtoolError(f"{path}: tensor '{name}' needs a table with 'bits', 'symmetric' and/or 'method'")
        t = BY_NAME[name]
        bits = entry.get("bits", config[name].bits)
        lo, hi = BITS_LIMITS[t.kind]
        if not isinstance(bits, int) or not lo <= bits <= hi:
            raise QtoolError(f"{path}: bits of '{name}' must be an integer in [{lo}, {hi}]")
        sym = entry.get("symmetric", config[name].symmetric)
        if t.kind != "activation" and not sym:
            raise QtoolError(f"{path}: '{name}' must stay symmetric (zero-point compensation "
                             "assumes symmetric weights and biases)")
        method = entry.get("method")
        if method is not None and method not in METHODS:
            raise QtoolError(f"{path}: method of '{name}' must be one of {', '.join(METHODS)}")
        if method is not None and t.kind == "bias":
            raise QtoolError(f"{path}: '{name}' is a 32-bit bias; it keeps its min/max range")
        config[name] = TensorConfig(bits, bool(sym), method)
    return path.name, config
