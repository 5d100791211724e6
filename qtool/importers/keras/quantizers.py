"""QKeras quantizers as QKeras computes them: their configs, auto_po2 scales, quantized values, and
the float GRU a QGRU computes (its weights folded through their quantizers)."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from qtool.core.model import GruCell
from qtool.errors import QtoolError

EPSILON = np.float32(1e-7)  # keras.backend.epsilon()


LSQ_ROUNDS = 5              # QKeras' least-squares refinements of an auto_po2 scale


ROLES = {"kernel_quantizer": "W", "recurrent_quantizer": "R", "bias_quantizer": "b", "state_quantizer": "h"}


KEYS = ("bits", "integer", "symmetric", "keep_negative", "alpha", "qnoise_factor")


def quantizer_class(q) -> str | None:
    """A serialized QKeras quantizer's class (`.h5` files write 'qkeras>quantized_relu')."""
    name = q.get("class_name") if isinstance(q, dict) else None
    return name.removeprefix("qkeras>") if isinstance(name, str) else None


def quantizer_config(layer: str, role: str, q, owner: str | None = None) -> dict | None:
    """The settings of one `quantized_bits` from a QKeras layer's config (a QGRU's, or `owner`'s:
    how a refusal names the layer); anything else is refused."""
    if q is None:
        return None
    owner = owner or f"QGRU '{layer}'"
    cfg = q.get("config") if isinstance(q, dict) else None
    if quantizer_class(q) != "quantized_bits" or not isinstance(cfg, dict):
        what = q.get("class_name") if isinstance(q, dict) else q
        raise QtoolError(f"{owner}: {role} {what!r} is not supported (qtool reads quantized_bits)")
    c = {"bits": 8, "integer": 0, "symmetric": False, "keep_negative": True, "alpha": None,
         "qnoise_factor": 1.0, **{k: cfg[k] for k in KEYS if k in cfg}}
    if c["alpha"] is None and role in ("kernel_quantizer", "recurrent_quantizer"):
        c["alpha"] = "auto_po2"  # QGRUCell, QDense, QConv1D: alpha=None is a learned scale for kernels
    if c["alpha"] == "auto_po2" and role == "state_quantizer":
        raise QtoolError(f"{owner}: {role} has alpha='auto_po2', a scale found from each step's "
                         "own state; qtool's h grid is fixed")
    if c["alpha"] not in (None, "auto_po2") and not isinstance(c["alpha"], (int, float)):
        raise QtoolError(f"{owner}: {role} has alpha={c['alpha']!r}; qtool reads None, a number "
                         "or 'auto_po2' (alpha='auto' scales are not powers of two per channel)")
    for k in ("use_stochastic_rounding", "elements_per_scale", "min_po2_exponent", "max_po2_exponent",
              "post_training_scale", "scale_axis"):
        if cfg.get(k) not in (None, False):
            raise QtoolError(f"{owner}: {role} sets {k}={cfg[k]!r}, which qtool does not read")
    if not isinstance(c["bits"], int) or not 2 <= c["bits"] <= 16 or not isinstance(c["integer"], int):
        raise QtoolError(f"{owner}: {role} has bits={c['bits']!r}, integer={c['integer']!r}")
    if c["qnoise_factor"] != 1.0:
        raise QtoolError(f"{owner}: {role} has qnoise_factor={c['qnoise_factor']}; only 1.0 "
                         "(fully quantized) describes a quantized model")
    return c


ACTIVATION_QUANTIZERS = ("quantized_bits", "quantized_relu")


@dataclass
class ActivationGrid:
    """A QKeras quantizer on the data (a QActivation's, or a layer's `activation=`): the float
    function it stands for in qtool's float graph ("linear" or "relu") and the grid it rounds
    onto, levels qmin..qmax times `step`."""

    kind: str
    step: float
    qmin: int
    qmax: int
    bits: int
    label: str  # as QKeras prints it, e.g. quantized_relu(8,2)


def is_quantizer(value) -> bool:
    """Whether a serialized activation is a QKeras quantizer (a class QKeras registers)."""
    if not isinstance(value, dict):
        return False
    name, module, registered = value.get("class_name"), value.get("module"), value.get("registered_name")
    return any(isinstance(v, str) and v.startswith(p) for v, p in
               ((name, "qkeras>"), (module, "qkeras"), (registered, "qkeras>"))) or name in ACTIVATION_QUANTIZERS


def activation_grid(owner: str, role: str, q) -> ActivationGrid:
    """The grid of a quantized_bits(bits, integer, ...) or quantized_relu(bits, integer) on the
    data, as QKeras' forward computes it (qnoise_factor 1):
    - quantized_bits: round(x 2^(bits - keep_negative) / 2^integer) clipped to
      [keep_negative (symmetric - 2^(bits - keep_negative)), 2^(bits - keep_negative) - 1], times
      alpha 2^integer / 2^(bits - keep_negative); without keep_negative it also clips at 0 (a relu);
    - quantized_relu: levels k 2^(integer - bits), k in 0 .. 2^bits - 1 (a relu clipped at the top).
    Options that change this (a scale found from each batch, sigmoid, leaky slopes, stochastic
    rounding) are refused, in one line naming `owner` and the quantizer."""
    cls, cfg = quantizer_class(q), q.get("config") if isinstance(q, dict) else None
    if cls not in ACTIVATION_QUANTIZERS or not isinstance(cfg, dict):
        what = cls or (q.get("class_name") if isinstance(q, dict) else q)
        raise QtoolError(f"{owner}: {role} {what!r} is not supported (qtool reads quantized_bits and "
                         "quantized_relu on the data)")
    bits, integer = cfg.get("bits", 8), cfg.get("integer", 0)
    if (not isinstance(bits, int) or not isinstance(integer, int) or isinstance(bits, bool)
            or not 2 <= bits <= 16 or not -32 <= integer <= 32):
        raise QtoolError(f"{owner}: {role} {cls} has bits={bits!r}, integer={integer!r}; qtool reads 2 to 16 "
                         "bits and an integer count of integer bits")
    if cfg.get("qnoise_factor", 1.0) != 1.0:
        raise QtoolError(f"{owner}: {role} {cls} has qnoise_factor={cfg['qnoise_factor']}; only 1.0 (fully "
                         "quantized) describes a quantized model")
    refused = ["use_stochastic_rounding"] + (
        ["post_training_scale", "elements_per_scale", "min_po2_exponent", "max_po2_exponent", "scale_axis"]
        if cls == "quantized_bits" else ["use_sigmoid", "negative_slope"])
    for k in refused:
        if cfg.get(k) not in (None, False, 0, 0.0):
            raise QtoolError(f"{owner}: {role} {cls} sets {k}={cfg[k]!r}, which qtool does not model")
    if cls == "quantized_relu":
        if cfg.get("is_quantized_clip", True) is False and cfg.get("relu_upper_bound") is not None:
            raise QtoolError(f"{owner}: {role} {cls} clips at relu_upper_bound={cfg['relu_upper_bound']!r} "
                             "(is_quantized_clip=False), which qtool does not model")
        return ActivationGrid("relu", 2.0 ** (integer - bits), 0, 2**bits - 1, bits,
                              f"quantized_relu({bits},{integer})")
    alpha, keep, sym = cfg.get("alpha"), bool(cfg.get("keep_negative", True)), bool(cfg.get("symmetric", False))
    if alpha is not None and (isinstance(alpha, bool) or not isinstance(alpha, (int, float)) or not alpha > 0):
        raise QtoolError(f"{owner}: {role} {cls} has alpha={alpha!r}; on the data qtool reads None or a positive "
                         "number (alpha='auto'/'auto_po2' finds its scale from each batch's own values)")
    m = 2 ** (bits - keep)
    opts = [f"alpha={alpha}"] if alpha is not None else []
    opts += ["symmetric=1"] * sym + ["keep_negative=False"] * (not keep)
    label = f"quantized_bits({','.join([str(bits), str(integer), *opts])})"
    step = (1.0 if alpha is None else float(alpha)) * 2.0**integer / m
    return ActivationGrid("linear" if keep else "relu", step, -m + sym if keep else 0, m - 1, bits, label)


def _po2(scale: np.ndarray) -> np.ndarray:
    """2^round(log2(scale)), as QKeras writes it (round half to even, like torch.round)."""
    return np.power(np.float32(2), np.round(np.log(scale + EPSILON) / np.log(np.float32(2)))).astype(np.float32)


def _axes(x: np.ndarray) -> tuple:
    """QKeras' scaling axes (channels_last): all but the last; a vector is one channel."""
    return tuple(range(x.ndim - 1)) if x.ndim > 1 else (0,)


def _levels_of(xs: np.ndarray, scale: np.ndarray, half: np.float32) -> np.ndarray:
    v = np.floor(np.abs(xs) / scale + np.float32(0.5))
    return np.sign(xs) * np.where(v < half, v, half)


def auto_po2(x: np.ndarray, bits: int, integer: int) -> tuple[np.ndarray, np.ndarray]:
    """(levels z, scale) of quantized_bits(alpha='auto_po2'): x ~ 2^integer * scale * z."""
    xs = (x / np.float32(2.0**integer)).astype(np.float32)
    half = np.float32((2 ** (bits - 1) - 1) * 2 / 2)
    scale = _po2((np.max(np.abs(xs), axis=_axes(xs), keepdims=True) * 2 / (2 * half)).astype(np.float32))
    for _ in range(LSQ_ROUNDS):
        z = _levels_of(xs, scale, half)
        if xs.ndim > 1:
            qx = np.mean(xs * z, axis=_axes(xs), keepdims=True, dtype=np.float32)
            qq = np.mean(z * z, axis=_axes(xs), keepdims=True, dtype=np.float32)
        else:  # QKeras scales a vector element by element here
            qx, qq = xs * z, z * z
        scale = _po2((qx / (qq + EPSILON)).astype(np.float32))
    return _levels_of(xs, scale, half), scale


def grid(c: dict, x: np.ndarray | None = None) -> tuple[np.ndarray, int, int]:
    """(step, qmin, qmax) of a quantizer: per column of `x` for auto_po2, else one step."""
    m, m_i = 2.0 ** (c["bits"] - c["keep_negative"]), 2.0 ** c["integer"]
    if c["alpha"] == "auto_po2":
        half = 2 ** (c["bits"] - 1) - 1
        _, scale = auto_po2(x, c["bits"], c["integer"])
        return np.asarray(scale, np.float64).reshape(-1) * m_i, -half, half
    a = 1.0 if c["alpha"] is None else float(c["alpha"])
    return a * m_i / m, int(c["keep_negative"] * (-m + c["symmetric"])), int(m - 1)


def quantize(c: dict | None, x: np.ndarray) -> np.ndarray:
    """quantized_bits(x) as QKeras' forward computes it, float32: x + (xq - x), the STE form."""
    if c is None:
        return x
    x = np.asarray(x, np.float32)
    m, m_i = np.float32(2.0 ** (c["bits"] - c["keep_negative"])), np.float32(2.0 ** c["integer"])
    if c["alpha"] == "auto_po2":
        z, scale = auto_po2(x, c["bits"], c["integer"])
        xq = (scale * m) * (m_i * z / m)
    else:
        _, qmin, qmax = grid(c)
        a = np.float32(1.0 if c["alpha"] is None else c["alpha"])
        xq = a * (m_i * np.clip(np.round(x * m / m_i), qmin, qmax) / m)
    return (x + (-x + xq.astype(np.float32))).astype(np.float32)


def fold(cell: GruCell, dr) -> GruCell:
    """The GRU a QGRU runs: its weights through their quantizers (as stored: kernel [C, 3H],
    recurrent kernel [H, 3H], bias [2, 3H]); a Keras GRU's cell unchanged."""
    q = dr.quantizers
    if not q:
        return cell
    b = np.stack([cell.bx, cell.br])
    b = quantize(q["b"], b) if dr.use_bias else b
    return GruCell(quantize(q["W"], cell.W.T).T, quantize(q["R"], cell.R.T).T, b[0], b[1], cell.form)
