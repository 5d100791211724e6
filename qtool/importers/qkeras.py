"""QKeras `QGRU` layers (qkeras-v3, Keras 3): the quantizers in the layer's config.

A QGRU runs a Keras GRU (reset_after=True, z | r | g) on `kernel_quantizer(kernel)`,
`recurrent_quantizer(recurrent_kernel)` and `bias_quantizer(bias)`, and quantizes the state it
reads each step with `state_quantizer`. The file stores the float weights; the quantizers are
recomputed here (seed 002: the fake-quant on a constant folds into it), so qtool's float model is
the GRU QKeras runs. `quantized_bits` is the only quantizer qtool reads:
- alpha None or a number a: levels of step a 2^integer / 2^(bits - keep_negative);
- alpha "auto_po2": a power-of-two scale per output column, found from the weights themselves by
  QKeras' least-squares iteration (ported below, in float32 as QKeras computes it), on the
  symmetric levels -(2^(bits-1) - 1) .. 2^(bits-1) - 1. The file holds no scale: it is a
  function of the weights, so the port must give QKeras' own numbers (the golden test checks).
W and R get their learned ranges per channel (columns of kernel [C, 3H] are qtool's rows), h
the state quantizer's range. Biases are folded only (qtool keeps them on its 32-bit grid).
"""

from __future__ import annotations

import numpy as np

from qtool.errors import QtoolError
from qtool.importers.ranges import Imported, ImportedRange, source_key
from qtool.model import GruCell

EPSILON = np.float32(1e-7)  # keras.backend.epsilon()
LSQ_ROUNDS = 5              # QKeras' least-squares refinements of an auto_po2 scale
ROLES = {"kernel_quantizer": "W", "recurrent_quantizer": "R", "bias_quantizer": "b", "state_quantizer": "h"}
KEYS = ("bits", "integer", "symmetric", "keep_negative", "alpha", "qnoise_factor")


def quantizer_config(layer: str, role: str, q) -> dict | None:
    """The settings of one `quantized_bits` from a QGRU's config; anything else is refused."""
    if q is None:
        return None
    cfg = q.get("config") if isinstance(q, dict) else None
    if not isinstance(q, dict) or q.get("class_name") != "quantized_bits" or not isinstance(cfg, dict):
        what = q.get("class_name") if isinstance(q, dict) else q
        raise QtoolError(f"QGRU '{layer}': {role} {what!r} is not supported (qtool reads quantized_bits)")
    c = {"bits": 8, "integer": 0, "symmetric": False, "keep_negative": True, "alpha": None,
         "qnoise_factor": 1.0, **{k: cfg[k] for k in KEYS if k in cfg}}
    if c["alpha"] is None and role in ("kernel_quantizer", "recurrent_quantizer"):
        c["alpha"] = "auto_po2"  # QGRUCell turns alpha=None into a learned scale for its kernels
    if c["alpha"] == "auto_po2" and role == "state_quantizer":
        raise QtoolError(f"QGRU '{layer}': {role} has alpha='auto_po2', a scale found from each step's "
                         "own state; qtool's h grid is fixed")
    if c["alpha"] not in (None, "auto_po2") and not isinstance(c["alpha"], (int, float)):
        raise QtoolError(f"QGRU '{layer}': {role} has alpha={c['alpha']!r}; qtool reads None, a number "
                         "or 'auto_po2' (alpha='auto' scales are not powers of two per channel)")
    for k in ("use_stochastic_rounding", "elements_per_scale", "min_po2_exponent", "max_po2_exponent",
              "post_training_scale", "scale_axis"):
        if cfg.get(k) not in (None, False):
            raise QtoolError(f"QGRU '{layer}': {role} sets {k}={cfg[k]!r}, which qtool does not read")
    if not isinstance(c["bits"], int) or not 2 <= c["bits"] <= 16 or not isinstance(c["integer"], int):
        raise QtoolError(f"QGRU '{layer}': {role} has bits={c['bits']!r}, integer={c['integer']!r}")
    if c["qnoise_factor"] != 1.0:
        raise QtoolError(f"QGRU '{layer}': {role} has qnoise_factor={c['qnoise_factor']}; only 1.0 "
                         "(fully quantized) describes a quantized model")
    return c


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
    return GruCell(quantize(q["W"], cell.W.T).T, quantize(q["R"], cell.R.T).T, b[0], b[1])


def read_qkeras(path, model) -> Imported | None:
    """The QGRU quantizers of a `.keras`/`.h5` file for the GRU stack `model` was imported from
    (the GRUs `importers.import_model` chose, by `model.source`); None without QGRUs."""
    import tempfile

    from qtool.importers.keras import SPOOL_BYTES, _read

    with tempfile.SpooledTemporaryFile(SPOOL_BYTES) as tmp:
        _, grus, raw = _read(path, tmp)
    if not any(dr.quantizers for g in grus for dr in g.dirs):
        return None
    key = source_key(model)  # a GRU's name, or "": the file's GRUs in order (one, or the chained stack)
    chosen = [g for g in grus if g.name == key] if key else grus
    if len(chosen) != model.num_layers:
        raise QtoolError(f"{model.source}: {len(chosen)} Keras GRUs for {model.num_layers} layers")
    out = Imported("QKeras")
    for l, g in enumerate(chosen):
        if not any(dr.quantizers for dr in g.dirs):
            out.notes.append(f"layer {l} is not a QGRU: its ranges come from calibration")
            continue
        for d, (dr, cell) in enumerate(zip(g.dirs, raw[g.name])):
            for name in ("W", "R", "h"):
                c = dr.quantizers[name]
                if c is None:
                    continue
                # auto_po2: the grid QKeras found on the stored (float) weights, per column
                step, qmin, qmax = grid(c, getattr(cell, name).T if name != "h" else None)
                out.add(l, d, name, ImportedRange(qmin * step, qmax * step, f"QGRU '{g.name}' {name}",
                                                  step, c["bits"]))
    return out
