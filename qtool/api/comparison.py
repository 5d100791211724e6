"""`compare`: several calibration methods from one float pass, each scored on held-out data."""

from __future__ import annotations

import os
from collections.abc import Sequence
from dataclasses import dataclass

from qtool.api.calibration import observe
from qtool.api.common import DataLike, Progress, as_data, only_for
from qtool.api.models import is_whole
from qtool.api.simulation import simulate
from qtool.core.model import GruModel
from qtool.core.qmodel import QuantModel
from qtool.errors import QtoolError


@dataclass
class Comparison:
    """Calibration methods scored on held-out data (`rows[k]`: method and output distance)."""

    models: list[QuantModel]
    rows: list[dict]
    best: int


def compare(model: GruModel | str | os.PathLike, data: DataLike, test: DataLike,
            methods: Sequence[str], *, bits: str | dict = "int8", method_weights: str = "minmax",
            percentile: float = 99.99, batch_size: int = 64, limit: int | None = None,
            dataset: str | None = None, time_first: bool = False,
            progress: Progress | None = None) -> Comparison:
    """Calibrate with each method in one float pass and score each on held-out `test` data."""
    only_for(is_whole(model), "compare")
    if data is None:
        raise QtoolError("missing DATA (calibration data file)")
    cal = observe(model, data, bits=bits, methods=methods, method_weights=method_weights,
                  percentile=percentile, batch_size=batch_size, limit=limit, dataset=dataset,
                  time_first=time_first)
    test = as_data(test, dataset, time_first)
    test.check_features(cal.model.input_size)
    models = [cal.quant_model(k) for k in range(len(methods))]
    rows = []
    total = len(models) * test.num_sequences
    for k, qm in enumerate(models):
        def part(done: int, _n: int, k=k) -> None:
            if progress:
                progress(k * test.num_sequences + done, total)
        sim = simulate(qm, test, per_tensor=False, batch_size=max(batch_size, 256), backend="cpu",
                       progress=part)
        rows.append({"method": qm.info["method"], **sim.output})
    best = max(range(len(rows)), key=lambda i: rows[i]["snr_db"] if rows[i]["snr_db"] is not None
               else float("inf") if rows[i]["exact"] else float("-inf"))
    return Comparison(models, rows, best)
