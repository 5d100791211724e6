"""`html_report`: one HTML page of a quantized model's errors, layer by layer and over time."""

from __future__ import annotations

import os
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from qtool.api.common import DataLike, Progress, as_data, count
from qtool.api.models import is_whole, load, load_qgraph
from qtool.api.rows import qgraph_rows
from qtool.core.qgraph import QGraph
from qtool.core.qmodel import QuantModel
from qtool.errors import QtoolError
from qtool.io.files import claim_output


@dataclass
class ReportResult:
    """The page `html_report` wrote and the output metrics it shows (simulate's)."""

    path: Path
    output: dict
    per_step_snr_db: list
    samples: int
    size: int
    backend: str


def html_report(qm: QuantModel | QGraph | str | os.PathLike, data: DataLike, out: str | os.PathLike, *,
                limit: int | None = None, sequences: int = 3, units: int = 4, backend: str = "auto",
                batch_size: int = 256, force: bool = False, confirm: Callable[[str], bool] | None = None,
                dataset: str | None = None, time_first: bool = False,
                progress: Progress | None = None) -> ReportResult:
    """Simulate as `simulate` does and write one self-contained HTML page of plots (needs the
    `report` extra, plotly): per tensor its float histogram against its grid, the output error
    by time step, float vs integer output traces of the first `sequences` sequences."""
    from qtool.engine.backend import select_backend
    from qtool.io.files import write_bytes
    from qtool.report.data import collect
    from qtool.report.html import plotly_modules, render

    if is_whole(qm):
        return _graph_report(qm, data, out, limit=limit, backend=backend, batch_size=batch_size, force=force,
                             confirm=confirm, dataset=dataset, time_first=time_first, progress=progress)
    plotly_modules()  # refuse before the work, not after it
    runner, label, _ = select_backend(backend)
    qm_path = None
    if not isinstance(qm, QuantModel):
        qm_path = Path(qm)
        qm = load(qm_path)
    for value, option in ((batch_size, "`batch_size`"), (sequences, "`sequences`"), (units, "`units`")):
        if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value < 1:
            raise QtoolError(f"{option} must be at least 1, got {value}")
    data_in = data
    data = as_data(data, dataset, time_first)
    data.check_features(qm.model.input_size)
    n = count(data, limit)
    out = claim_output(out, force, [qm_path, None if isinstance(data_in, np.ndarray) else data.name], confirm)
    rd = collect(qm, data, n, keep=sequences, batch_size=batch_size, runner=runner, progress=progress)
    page = render(qm, rd, Path(data.name).name, units).encode()
    write_bytes(out, page)
    return ReportResult(out, rd.results["output"], rd.results["per_step_snr_db"], n, len(page), label)


def _graph_report(qg: QGraph | str | os.PathLike, data: DataLike, out: str | os.PathLike, *, limit, backend,
                  batch_size, force, confirm, dataset, time_first, progress) -> ReportResult:
    """A whole model's page (qtool.report.graph_page): the graph with each edge's error, and each
    GRU's tensors measured on its own input (qtool.report.data.collect_graph)."""
    from qtool.engine.backend import select_backend
    from qtool.io.files import write_bytes
    from qtool.report.data import collect_graph
    from qtool.report.graph_page import render

    inputs = [p for p in (qg, data) if isinstance(p, (str, os.PathLike))]
    out = claim_output(out, force, inputs, confirm)
    runner, label, reason = select_backend(backend)
    if not isinstance(qg, QGraph):
        qg = load_qgraph(qg)
    if batch_size < 1:
        raise QtoolError("`batch_size` must be at least 1")
    name = Path(data).name if isinstance(data, (str, os.PathLike)) else "the data"
    data = as_data(data, dataset, time_first)
    n = count(data, limit)
    sim, grus = collect_graph(qg, data, n, batch_size=batch_size, runner=runner,
                              progress=(lambda done: progress(done, n)) if progress else None)
    sim.backend, sim.backend_reason = label, reason
    res = sim.to_dict()
    page = render(qg, qgraph_rows(qg, sim), res, name, grus).encode()
    write_bytes(out, page)
    first = next(iter(res["outputs"].values()))
    return ReportResult(out, first, [], sim.samples, len(page), sim.backend)
