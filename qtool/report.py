"""Rich tables for results and file contents; the same data goes to `--json`."""

from __future__ import annotations

import math

import numpy as np
from rich.table import Table

from qtool.model import DIRECTIONS
from qtool.qmodel import QuantModel
from qtool.rescale import PARAMS
from qtool.tensors import TENSORS


def _num(v: float, fmt: str = "{:.2f}") -> str:
    if isinstance(v, float) and math.isinf(v):
        return "inf" if v > 0 else "-inf"
    return fmt.format(v)


def _span(v) -> str:
    a = np.asarray(v)
    if a.ndim == 0:
        return f"{float(a):.4g}"
    return f"{float(a.min()):.4g}..{float(a.max()):.4g}"


def _distance_cells(m: dict) -> tuple[str, ...]:
    return (_num(m["snr_db"]), _num(m["cosine"], "{:.6f}"), _num(m["max_abs_error"], "{:.3g}"),
            f"{100 * m['saturated']:.2f}%")


def _metric_table(title: str, first: str) -> Table:
    t = Table(title=title)
    for col in (first, "SNR dB", "cosine", "max |err|", "saturated"):
        t.add_column(col, justify="left" if col == first else "right")
    return t


def compare_table(rows: list[dict], best: int, title: str) -> Table:
    """One row per calibration method, scored at the output on held-out data."""
    t = _metric_table(title, "method")
    for i, m in enumerate(rows):
        t.add_row(m["method"] + (" (best)" if i == best else ""), *_distance_cells(m),
                  style="bold" if i == best else None)
    return t


def distance_table(results: dict, title: str) -> Table:
    t = _metric_table(title, "tensor")
    rows = [("output", results["output"])] + list(results["tensors"].items())
    for name, m in rows:
        t.add_row(name, *_distance_cells(m), style="bold" if name == "output" else None)
    return t


def spec_rows(qm: QuantModel) -> list[dict]:
    rows = []
    for l, cells in enumerate(qm.cells):
        for d, cq in enumerate(cells):
            for td in TENSORS:
                s = cq.spec[td.name]
                rows.append({
                    "layer": l, "direction": DIRECTIONS[d], "tensor": td.name, "bits": s.bits,
                    "symmetric": s.symmetric, "per_channel": td.per_channel,
                    "exp2_inv": np.asarray(s.exp2_inv).tolist(), "zp": s.zp,
                    "range": [np.asarray(s.lo).min().item(), np.asarray(s.hi).max().item()],
                })
    return rows


def spec_table(qm: QuantModel, title: str) -> Table:
    t = Table(title=title)
    for col in ("layer", "tensor", "bits", "sym", "exp2_inv", "zp", "range"):
        t.add_column(col, justify="left" if col in ("layer", "tensor") else "right")
    for l, cells in enumerate(qm.cells):
        for d, cq in enumerate(cells):
            for td in TENSORS:
                s = cq.spec[td.name]
                lo, hi = np.asarray(s.lo), np.asarray(s.hi)
                rng = (f"[{float(lo.min()):.4g}, {float(hi.max()):.4g}]")
                t.add_row(f"{l}.{DIRECTIONS[d]}", td.name, str(s.bits), "y" if s.symmetric else "n",
                          _span(s.exp2_inv), str(s.zp), rng)
    return t


def lut_table(qm: QuantModel) -> Table:
    t = Table(title="activation tables")
    for col in ("layer", "table", "entries", "interpolation shift", "max error (LSB)"):
        t.add_column(col, justify="left" if col in ("layer", "table") else "right")
    for l, cells in enumerate(qm.cells):
        for d, cq in enumerate(cells):
            for name, shift_idx in (("lut_z", "z"), ("lut_r", "r"), ("lut_g", "g")):
                shift = int(cq.P[PARAMS.index(f"lut_shift_{shift_idx}")])
                t.add_row(f"{l}.{DIRECTIONS[d]}", name, str(len(cq.luts[name])), str(shift),
                          f"{cq.lut_error[name]:g}")
    return t


def auto_lines(auto: dict) -> list[str]:
    """What `--method auto` chose: the winner on the held-out sequences, then per layer each
    tensor's method."""
    snr = ", ".join(f"{k} {_num(v)} dB" for k, v in auto["held_out_snr_db"].items())
    lines = [f"method auto: {auto['winner']}" + (f" (held-out output SNR: {snr})" if snr else "")]
    if auto.get("note"):
        lines.append(f"  {auto['note']}")
    by_layer: dict[int, list[str]] = {}
    for r in auto["tensors"]:
        by_layer.setdefault(r["layer"], []).append(f"{r['tensor']} {r['method']}")
    lines += [f"  layer {l}: " + ", ".join(v) for l, v in sorted(by_layer.items())]
    return lines
