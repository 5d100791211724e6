"""`compare`: several calibration methods from one float pass, each scored on held-out data."""

from __future__ import annotations

import os
from collections.abc import Sequence
from dataclasses import dataclass

from qtool.api.calibration import graph_candidates, observe
from qtool.api.common import DataLike, Progress, as_data, count, held_out_notes
from qtool.api.models import is_whole
from qtool.api.simulation import simulate
from qtool.core.graph import Graph
from qtool.core.model import GruModel
from qtool.core.qgraph import QGraph
from qtool.core.qmodel import QuantModel
from qtool.errors import QtoolError
from qtool.importers.once import read_once


@dataclass
class Comparison:
    """Calibration methods scored on held-out data (`rows[k]`: method and output distance;
    `models[k]` a QuantModel for a GRU alone, a QGraph for a whole model)."""

    models: list[QuantModel | QGraph]
    rows: list[dict]
    best: int
    scored: int  # held-out sequences each method was scored on
    notes: list[str]  # what looks wrong with the calibration and the held-out data


def compare(model: GruModel | Graph | str | os.PathLike, data: DataLike, test: DataLike,
            methods: Sequence[str], *, bits: str | dict = "int8", method_weights: str = "minmax",
            percentile: float = 99.99, batch_size: int = 64, limit: int | None = None,
            dataset: str | None = None, time_first: bool = False, check: bool = True,
            progress: Progress | None = None) -> Comparison:
    """Calibrate with each method in one float pass and score each at the output on held-out
    `test` data (`simulate`'s `output`: a GRU's output, a whole model's integer core outputs,
    a classifier's logits, with its top-1 agreement); the best has the highest output SNR.
    `limit` bounds both: the first `limit` sequences of `data` calibrate, of `test` score.
    `methods` may hold auto (and for a whole model per-edge) beside single methods (`calibrate`)."""
    if data is None:
        raise QtoolError("missing DATA (calibration data file)")
    if isinstance(methods, str):
        raise QtoolError(f"`methods` is a list of method names, e.g. {methods.split(',')}, not the text {methods!r}")
    with read_once():
        whole = is_whole(model)
        if whole:
            cal_notes = []  # a whole model's are in its info (calibrate's, as for one method)
            models = graph_candidates(model, data, methods, bits=bits, method_weights=method_weights,
                                      percentile=percentile, batch_size=batch_size, limit=limit, dataset=dataset,
                                      time_first=time_first, check=check)
        else:  # the single methods from one float pass; auto runs its own (qtool.calibration.auto)
            options = dict(bits=bits, method_weights=method_weights, percentile=percentile, batch_size=batch_size,
                           limit=limit, dataset=dataset, time_first=time_first)
            singles = [m for m in methods if m != "auto"]
            by_method = {}
            if singles:
                cal = observe(model, data, methods=singles, **options)
                by_method = {m: cal.quant_model(k) for k, m in enumerate(singles)}
            if "auto" in methods:
                cal = observe(model, data, methods=("auto",), **options)
                by_method["auto"] = cal.quant_model(0)
            models = [by_method[m] for m in methods]
            cal_notes = cal.notes  # the same data each time
    inputs = models[0].graph.inputs if whole else ()
    data = as_data(data, dataset, time_first, inputs)
    test = as_data(test, dataset, time_first, inputs)
    scored = count(test, limit)
    test = test.first(scored)
    notes = cal_notes + held_out_notes(data, count(data, limit), test)
    rows = []
    total = len(models) * scored
    for k, qm in enumerate(models):
        def part(done: int, _n: int, k=k) -> None:
            if progress:
                progress(k * scored + done, total)
        sim = simulate(qm, test, batch_size=max(batch_size, 256), backend="cpu", progress=part, limit=limit,
                       **({} if whole else {"per_tensor": False}))
        rows.append({"method": qm.info["method"], **sim.output})
    best = max(range(len(rows)), key=lambda i: rows[i]["snr_db"] if rows[i]["snr_db"] is not None
               else float("inf") if rows[i]["exact"] else float("-inf"))
    return Comparison(models, rows, best, scored, notes)
