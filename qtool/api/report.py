"""`html_report`: one HTML page of a quantized model's errors, layer by layer and over time."""

from __future__ import annotations

import os
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from qtool.api.common import DataLike, Progress, as_data, axes_notes, count
from qtool.api.models import is_whole, load
from qtool.api.rows import qgraph_rows
from qtool.api.simulation import graph_saturation_notes, gru_notes
from qtool.core.qgraph import QGraph
from qtool.core.qmodel import QuantModel
from qtool.errors import QtoolError
from qtool.io.files import SequenceData, claim_output


@dataclass
class ReportResult:
    """The page `html_report` wrote and the output metrics it shows (simulate's)."""

    path: Path
    output: dict
    per_step_snr_db: list
    samples: int
    size: int
    backend: str
    notes: list  # what looks wrong with the data, as `simulate` says it


def html_report(qm: QuantModel | QGraph | str | os.PathLike, data: DataLike, out: str | os.PathLike, *,
                limit: int | None = None, sequences: int | None = None, units: int | None = None,
                backend: str = "auto",
                batch_size: int = 256, force: bool = False, confirm: Callable[[str], bool] | None = None,
                dataset: str | None = None, time_first: bool = False,
                progress: Progress | None = None) -> ReportResult:
    """Simulate as `simulate` does and write one self-contained HTML page. A GRU alone (needs
    the `report` extra, plotly): per tensor its float histogram against its grid, the output
    error by time step, float vs integer output traces of the first `sequences` (3) sequences,
    `units` (4) output units each. A whole model: the graph with each edge's error, and each
    GRU's tensors measured on its own input (their histograms where plotly is installed); it
    draws no traces, so `sequences` and `units` are refused."""
    from qtool.engine.backend import select_backend
    from qtool.io.files import write_bytes
    from qtool.report.html import plotly_modules

    for value, option in ((batch_size, "`batch_size`"), (sequences, "`sequences`"), (units, "`units`")):
        if value is not None and (isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value < 1):
            raise QtoolError(f"{option} must be at least 1, got {value}")
    whole = is_whole(qm)
    if whole and (sequences is not None or units is not None):
        raise QtoolError(f"{'`sequences`' if sequences is not None else '`units`'} sets the output traces of a GRU "
                         "alone's page; a whole model's page draws none")
    sequences, units = sequences or 3, units or 4
    if not whole:
        plotly_modules()  # refuse before the work, not after it
    runner, label, reason = select_backend(backend)
    qm_path = None
    if not isinstance(qm, (QuantModel, QGraph)):
        qm_path = Path(qm)
        qm = load(qm_path)
    data_in = data
    data = as_data(data, dataset, time_first, qm.graph.inputs if whole else ())
    if not whole:
        data.check_features(qm.model.input_size)
    n = count(data, limit)
    out = claim_output(out, force, [qm_path, None if isinstance(data_in, np.ndarray) else data.name], confirm,
                       kind="HTML")
    page = _graph_page if whole else _gru_page
    html, output, per_step, notes = page(qm, data, n, runner, label, reason, sequences=sequences, units=units,
                                         batch_size=batch_size, progress=progress)
    write_bytes(out, html)
    return ReportResult(out, output, per_step, n, len(html), label, notes)


def _gru_page(qm: QuantModel, data: SequenceData, n: int, runner, label: str, reason: str, *, sequences: int,
              units: int, batch_size: int, progress: Progress | None) -> tuple[bytes, dict, list, list]:
    """A GRU alone's page (qtool.report.html): its tensors, the output's error by time step."""
    from qtool.report.data import collect
    from qtool.report.html import render

    rd = collect(qm, data, n, keep=sequences, batch_size=batch_size, runner=runner, progress=progress)
    drawn = [f"`{option}` {asked}: drew {has}, {what}" for option, asked, has, what in (
        ("sequences", sequences, min(sequences, n), "every sequence simulated"),
        ("units", units, min(units, qm.model.output_size), "every unit of the output")) if asked > has]
    return (render(qm, rd, Path(data.name).name, units).encode(), rd.results["output"],
            rd.results["per_step_snr_db"], gru_notes(qm, data, rd.results["tensors"]) + drawn)


def _graph_page(qg: QGraph, data: SequenceData, n: int, runner, label: str, reason: str, *, sequences: int,
                units: int, batch_size: int, progress: Progress | None) -> tuple[bytes, dict, list, list]:
    """A whole model's page (qtool.report.graph_page): the graph with each edge's error, and each
    GRU's tensors measured on its own input (qtool.report.data.collect_graph)."""
    from qtool.report.data import collect_graph
    from qtool.report.graph_page import render

    sim, grus = collect_graph(qg, data, n, batch_size=batch_size, runner=runner,
                              progress=(lambda done: progress(done, n)) if progress else None)
    sim.backend, sim.backend_reason = label, reason
    res = sim.to_dict()
    html = render(qg, qgraph_rows(qg, sim), res, Path(data.name).name, grus).encode()
    notes = axes_notes(int(qg.info.get("time_steps", 0)), data.shape, data.time_first)
    # several outputs: all together, as simulate's `output`, auto and advise measure them
    output = sim.output if len(qg.core_outputs) > 1 else next(iter(res["outputs"].values()))
    return html, output, [], notes + graph_saturation_notes(qg, sim, data, n, batch_size)
