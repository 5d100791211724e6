"""A quantized or QAT-trained model file's quantizers (qtool.importers.ranges), turned into qtool's
spec: the compiler steps "recognise the fake-quant nodes" and "extract their parameters"
(docs/qat.md) end here, in the same TensorQ the calibration produces.

A file's quantizer gives a learned range, the interval its grid covers, `[(qmin - zp) s, (qmax -
zp) s]`. qtool's grid for it (docs/qat.md, "Importing"):
- `snap="up"` (the default): the finest power-of-two grid that does not clip the learned range,
  by the same rule calibration uses (`qparams.choose_qparams`); a power-of-two scale at the
  file's bits comes back unchanged;
- `snap="nearest"`: the power of two nearest the file's step (in log2), centred on the range.
How far each moved is reported as the change of expected noise, 20 log10(s_qtool / s_file) dB
(uniform rounding noise has power s^2 / 12).
"""

from __future__ import annotations

import math

import numpy as np

from qtool.core.model import DIRECTIONS, GruModel
from qtool.core.qmodel import QuantModel, TensorQ
from qtool.core.tensors import TensorConfig, cell_tensors
from qtool.errors import QtoolError
from qtool.importers.ranges import Imported, ImportedRange
from qtool.numerics.qparams import choose_qparams, grid_range, qrange, round_half_up

SNAPS = ("up", "nearest")


def _snap_one(lo: float, hi: float, bits: int, symmetric: bool, step: float | None, file_bits: int | None,
              snap: str) -> tuple[int, int]:
    if snap == "up" or step is None:
        return choose_qparams(lo, hi, bits, symmetric)
    levels = ((1 << file_bits) - 1) / ((1 << bits) - 1)
    e = int(round_half_up(-math.log2(step * levels)))
    if symmetric:
        return e, 0
    qmin, qmax = qrange(bits)
    zp = int(round_half_up((qmin + qmax) / 2 - (lo + hi) / 2 * 2.0 ** e))
    return e, min(max(zp, qmin), qmax)


def snap_range(r: ImportedRange, cfg: TensorConfig, snap: str) -> tuple[TensorQ, dict]:
    """qtool's grid for an imported range, and a report row: how far the step moved (dB of
    expected noise) and whether the grid clips the learned range."""
    if r.exact is not None:
        return r.exact, {"source": r.source, "moved_db": 0.0, "clips": False}
    lo, hi = np.atleast_1d(r.lo).astype(np.float64), np.atleast_1d(r.hi).astype(np.float64)
    step = None if r.step is None else np.broadcast_to(np.asarray(r.step, np.float64), lo.shape)
    es, zps, moved, clips = [], [], [], False
    for k in range(lo.size):
        e, zp = _snap_one(lo[k], hi[k], cfg.bits, cfg.symmetric, None if step is None else step[k], r.bits, snap)
        es.append(e)
        zps.append(zp)
        g_lo, g_hi = grid_range(e, zp, cfg.bits)
        clips |= bool(g_lo > lo[k] + 1e-12 * abs(lo[k]) or g_hi < hi[k] - 1e-12 * abs(hi[k]))
        if step is not None:
            levels = ((1 << r.bits) - 1) / ((1 << cfg.bits) - 1)
            moved.append(20 * math.log10(2.0 ** -e / (step[k] * levels)))
    if len(set(zps)) > 1:
        raise QtoolError(f"{r.source}: per-channel zero points are not supported")
    per_channel = np.ndim(r.lo) > 0
    t = TensorQ(cfg.bits, cfg.symmetric, np.array(es, np.int64) if per_channel else es[0], zps[0],
                lo if per_channel else float(lo[0]), hi if per_channel else float(hi[0]))
    row = {"source": r.source, "moved_db": max(moved, key=abs) if moved else None, "clips": clips}
    return t, row


def fixed_spec(imported: Imported, model: GruModel, config: dict[str, TensorConfig], snap: str = "up"
               ) -> tuple[list[list[dict[str, TensorQ]]], list[dict]]:
    """The imported tensors as qtool's spec per cell (ties applied: x of layer l > 0 and the
    backward h come from the same range), and one report row per imported range."""
    if snap not in SNAPS:
        raise QtoolError(f"unknown `snap` '{snap}' (use one of {', '.join(SNAPS)})")
    fixed: list[list[dict[str, TensorQ]]] = [[{} for _ in layer] for layer in model.layers]
    rows = []
    for (l, d, name), r in sorted(imported.ranges.items()):
        if l >= model.num_layers or d >= model.num_directions:
            raise QtoolError(f"{r.source}: the model has no layer {l} {DIRECTIONS[d]}")
        t, row = snap_range(r, config[name] if not (name == "x" and l) else config["h"], snap)
        rows.append({"layer": l, "direction": DIRECTIONS[d], "tensor": name, "bits": t.bits,
                     "exp2_inv": np.asarray(t.exp2_inv).tolist(), "zp": t.zp, **row})
        targets = [(l, dd) for dd in range(model.num_directions)] if name in ("h", "x") else [(l, d)]
        for ll, dd in targets:
            fixed[ll][dd][name] = t
            if name == "h" and ll + 1 < model.num_layers:
                for d2 in range(model.num_directions):
                    fixed[ll + 1][d2]["x"] = t
    return fixed, rows


def missing(fixed: list[list[dict[str, TensorQ]]], model: GruModel) -> list[str]:
    """The tensors whose quantization neither the file nor the weights give."""
    out = []
    for l, row in enumerate(fixed):
        for d, spec in enumerate(row):
            names = [t.name for t in cell_tensors(model.layers[l][d].form) if t.kind == "activation"]
            out += [f"layer{l}.{DIRECTIONS[d]}.{n}" for n in names if n not in spec]
    return out


def build_from_file(imported: Imported, model: GruModel, config: dict[str, TensorConfig], info: dict,
                    snap: str = "up", obs=None, plan=None) -> tuple[QuantModel, list[dict]]:
    """The quantized model: the file's ranges where it has them, the calibration observers `obs`
    (DATA) for the rest; without observers every activation's range must be in the file."""
    from qtool.calibration.observe import build_quant_model

    fixed, rows = fixed_spec(imported, model, config, snap)
    if obs is None:
        gaps = missing(fixed, model)
        if gaps:
            raise QtoolError(f"the {imported.kind} file holds no range for {len(gaps)} tensors "
                             f"({_summarise(gaps)}); give calibration data (qtool calibrate MODEL DATA) "
                             "to fill them in")
    return build_quant_model(model, obs, config, info, plan, fixed), rows


def _summarise(keys: list[str]) -> str:
    """'in every cell: Wx, Rh; in layer1.fwd: h': the missing names, grouped by where."""
    cells = sorted({k.rsplit(".", 1)[0] for k in keys})
    where: dict[str, list[str]] = {}
    for k in keys:
        cell, name = k.rsplit(".", 1)
        where.setdefault(name, []).append(cell)
    groups: dict[str, list[str]] = {}
    for name, c in where.items():
        groups.setdefault("every cell" if len(c) == len(cells) else ", ".join(c), []).append(name)
    return "; ".join(f"in {w}: {', '.join(names)}" for w, names in groups.items())
