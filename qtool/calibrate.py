"""Calibration: run the float GRU over data, observe every tensor of the seed's table, and turn
the ranges into a QuantModel (scales, zero points, integer weights, tables, shifts).

Ties that keep the integer program free of extra requantization:
- h is shared by both directions of a layer (one range over both);
- the input x of layer l > 0 is the h of layer l - 1, so its integers pass through unchanged;
- z_out's range is widened to also hold 1 - z, because (1 - z) reuses z_out's parameters.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np

from calibrators import Observer, make_observer
from qtool.fileio import SequenceData
from qtool.float_gru import TRACED, run_float
from qtool.lut import build_lut
from qtool.model import GruCell, GruModel
from qtool.qmodel import CellQuant, QuantModel, TensorQ
from qtool.qparams import choose_qparams, choose_qparams_per_channel, quantize
from qtool.rescale import derive
from qtool.tensors import TensorConfig

Observers = list[list[dict[str, Observer]]]


def new_observers(model: GruModel, method: str, **options) -> Observers:
    return [[{n: make_observer(method, n, **options) for n in TRACED} for _ in cells]
            for cells in model.layers]


def observe_batch(model: GruModel, x: np.ndarray, obs: Observers) -> None:
    """Run the float GRU on one batch `[N, T, C]` and feed every traced tensor to its observer."""
    traces: list = []
    run_float(model, x, traces)
    for l, cells in enumerate(traces):
        for d, trace in enumerate(cells):
            for name, values in trace.items():
                if name == "x" and d == 1:
                    continue  # the backward direction sees the same inputs, reversed
                obs[l][d][name].observe(values)


def collect(model: GruModel, data: SequenceData, method: str, chunk: int = 64,
            limit: int | None = None, progress: Callable[[int], None] | None = None,
            **options) -> Observers:
    """Observe the float GRU over the data, streamed in chunks of `chunk` sequences;
    `progress(done)` sees the number of sequences observed so far."""
    data.check_features(model.input_size)
    obs = new_observers(model, method, **options)
    for start, x in data.chunks(chunk, limit):
        observe_batch(model, x, obs)
        if progress:
            progress(start + len(x))
    return obs


def _activation_range(obs: Observers, l: int, d: int, name: str) -> tuple[float, float]:
    dirs = obs[l]
    if name == "x" and l > 0:
        return _activation_range(obs, l - 1, 0, "h")
    if name == "h":  # one range for both directions
        merged = dirs[0]["h"]
        for other in dirs[1:]:
            merged = merged.merge(other["h"])
        return merged.range()
    if name == "x":
        return dirs[0]["x"].range()
    lo, hi = dirs[d][name].range()
    if name == "z_out":  # 1 - z must fit the same grid
        lo, hi = min(lo, 1.0 - hi), max(hi, 1.0 - lo)
    return lo, hi


def _per_channel(values: np.ndarray, cfg: TensorConfig) -> tuple[TensorQ, np.ndarray]:
    rows = values.reshape(values.shape[0], -1)
    lo, hi = rows.min(axis=1), rows.max(axis=1)
    e = choose_qparams_per_channel(lo, hi, cfg.bits)
    q = quantize(values, e, 0, cfg.bits)
    return TensorQ(cfg.bits, True, e, 0, lo, hi), q


def quantize_cell(cell: GruCell, ranges: dict, config: dict[str, TensorConfig]) -> CellQuant:
    spec: dict[str, TensorQ] = {}
    qW, qR, qbx, qbr = None, None, None, None
    for name, cfg in config.items():
        if name in ("W", "R", "bx", "br"):
            spec[name], q = _per_channel(getattr(cell, name), cfg)
            if name == "W":
                qW = q
            elif name == "R":
                qR = q
            elif name == "bx":
                qbx = q
            else:
                qbr = q
        else:
            lo, hi = ranges[name]
            e, zp = choose_qparams(lo, hi, cfg.bits, cfg.symmetric)
            spec[name] = TensorQ(cfg.bits, cfg.symmetric, e, zp, lo, hi)
    luts, shifts, errors = {}, [], {}
    for lut, func, src, dst in (("lut_z", "sigmoid", "z_pre", "z_out"),
                                ("lut_r", "sigmoid", "r_pre", "r_out"),
                                ("lut_g", "tanh", "g_pre", "g_out")):
        a, b = spec[src], spec[dst]
        luts[lut], shift, errors[lut] = build_lut(func, a.bits, a.exp2_inv, a.zp,
                                                  b.bits, b.exp2_inv, b.zp)
        shifts.append(shift)
    P, CH = derive(spec, qW, qR, qbx, qbr, tuple(shifts))
    return CellQuant(spec, qW, qR, qbx, qbr, P, CH, luts, errors)


def build_quant_model(model: GruModel, obs: Observers, config: dict[str, TensorConfig],
                      info: dict) -> QuantModel:
    """Turn observed ranges into a QuantModel. Layers l > 0 take their x bits from h."""
    cells = []
    for l, layer in enumerate(model.layers):
        cfg = dict(config)
        if l > 0:
            cfg["x"] = config["h"]
        row = []
        for d, cell in enumerate(layer):
            ranges = {n: _activation_range(obs, l, d, n) for n in TRACED}
            row.append(quantize_cell(cell, ranges, cfg))
        cells.append(row)
    return QuantModel(model, cells, info)
