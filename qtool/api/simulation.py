"""`simulate`: the integer model beside the float model on the same data, and how far apart."""

from __future__ import annotations

import os
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from qtool.api.common import (
    SATURATED_NOTE,
    DataLike,
    Progress,
    as_data,
    axes_notes,
    check_mode,
    count,
    only_for,
    output_notes,
    saturation_notes,
    write_once,
)
from qtool.api.models import is_whole, load, load_qgraph
from qtool.core import edges
from qtool.core.model import tensor_key
from qtool.core.qgraph import QGraph
from qtool.core.qmodel import QuantModel
from qtool.errors import QtoolError
from qtool.io.files import SequenceData, claim_output, now_utc, sha256_file
from qtool.parallel import world


def load_labels(labels, n: int, classes: int, used: int | None = None, per_frame: bool = False) -> np.ndarray:
    """Class indexes in 0..classes-1 from an array or a .npy file: one per sequence of the data
    (`n`), or one per sequence used (`used`, the first ones with a limit); a tagger's (`per_frame`)
    one per output frame of each, `[N, T]`."""
    if isinstance(labels, (str, os.PathLike)):
        path = Path(labels)
        if path.is_dir():
            raise QtoolError(f"labels: {path} is a directory, not a .npy file of class indexes")
        if not path.is_file():
            raise QtoolError(f"labels: file not found: {path}")
        if path.suffix != ".npy":
            raise QtoolError(f"labels {path}: give a .npy file of class indexes")
        if path.stat().st_size == 0:
            raise QtoolError(f"labels {path}: the file is empty")
        try:
            labels = np.load(path, allow_pickle=False)
        except (OSError, ValueError, EOFError):  # a cut file: numpy's EOFError would read as Ctrl-D
            raise QtoolError(f"labels {path}: not a readable .npy file of numbers") from None
    labels = np.asarray(labels)
    if labels.ndim != (2 if per_frame else 1) or labels.dtype.kind not in "iu" or len(labels) not in (n, used):
        counts = (f"{n}" if used in (None, n) else
                  f"{n} (one per sequence of the data) or {used} (one per sequence used)")
        raise QtoolError(f"labels must be one integer class index per {'frame, [N, T]' if per_frame else 'sequence'}, "
                         f"[{counts}{', T' * per_frame}]; got shape {list(labels.shape)} of {labels.dtype}")
    bad = (labels < 0) | (labels >= classes)
    if bad.any():
        first = int(np.argwhere(bad)[0][0])
        raise QtoolError(f"label {labels[bad][0]} (sequence {first}) is not a class of the model's "
                         f"{classes} outputs (0..{classes - 1})")
    return labels


def _simulate_graph(qg: QGraph | str | os.PathLike, data: DataLike, *, labels=None, batch_size: int = 256,
                   limit: int | None = None, dataset: str | None = None, time_first: bool = False,
                   outputs: bool = False, save: str | os.PathLike | None = None, force: bool = False,
                   confirm: Callable[[str], bool] | None = None, backend: str = "auto",
                   mode: str = "integer", progress: Progress | None = None):
    """Run a quantized whole model in integers beside its float graph on `data`: every edge's and
    the outputs' SNR, cosine and saturation; for a classifier top-1 agreement, and with `labels`
    both accuracies (a SimulationResult). `outputs=True` keeps the first output's float/y,
    quant/y and quant/y_int (`y_float`, `y_quant`, `y_int`, in the output's own shape, e.g.
    `[N, classes]`); `save` writes them to an HDF5 file. `backend`: the GRUs' engine, as for
    `simulate` (the other layers run on the CPU). `mode`: "integer", "fakequant" (the float graph
    with every weight and edge rounded onto its grid, qtool.graph.fakequant) or "both"."""
    import time

    from qtool.engine.backend import select_backend
    from qtool.graph.simulate import simulate_graph as run_simulation
    from qtool.io.files import write_h5

    check_mode(mode)
    runner, label, reason = select_backend(backend)
    qg_path = None
    if not isinstance(qg, QGraph):
        qg_path = Path(qg)
        qg = load_qgraph(qg_path)
    if save is not None:
        files = [qg_path, data, labels]
        save = claim_output(save, force, [f for f in files if isinstance(f, (str, os.PathLike))], confirm,
                            kind="results")
    if batch_size < 1:
        raise QtoolError("`batch_size` must be at least 1")
    data = as_data(data, dataset, time_first, qg.graph.inputs)
    n = count(data, limit)
    shape_notes = (axes_notes(int(qg.info.get("time_steps", 0)), data.shape, data.time_first)
                   or axes_notes(qg.graph.steps, data.shape, data.time_first, "declares"))
    lab = None
    if labels is not None:
        from qtool.graph.simulate import classes

        shape = qg.graph.shapes.get(qg.graph.outputs[0], ())
        if classes(qg) is None:
            raise QtoolError(f"`labels` go with a classifier; the model's output {qg.graph.outputs[0]} is "
                             + ("a sequence that no softmax makes, not classes per frame" if edges.is_sequence(shape)
                                else "one value, not a vector of classes"))
        try:
            lab = load_labels(labels, data.num_sequences, classes(qg), n, edges.is_sequence(shape))[:n]
        except QtoolError as e:  # a count of labels that does not fit data with swapped axes: say that
            raise QtoolError(f"{shape_notes[0]} ({e})" if shape_notes else str(e)) from None
    tick = (lambda done: progress(done, n)) if progress else None
    keep = outputs or save is not None
    comm = world()
    t0 = time.perf_counter()
    if comm is None:
        sim = run_simulation(qg, data, n, batch_size, lab, keep, tick, runner, mode)
    else:  # under mpiexec: each rank its chunks, the root folds them in order and writes `save`
        from qtool.parallel.graph import simulate_graph as simulate_ranks

        sim = simulate_ranks(comm, qg, data, n, batch_size, lab, keep, tick, runner, mode)
    notes = shape_notes + graph_saturation_notes(qg, sim, data, n, batch_size)
    notes = notes or output_notes(sim.output)  # what is wrong with the data explains a low SNR first
    if save is not None:
        def write(f) -> None:
            from qtool.io.results import RESULTS_FORMAT
            from qtool.version import __version__

            # the GRU-only results file's attributes, with the same meaning (docs/file-formats.md)
            f.attrs.update(format=RESULTS_FORMAT, version=1, qtool_version=__version__, samples=n, mode=mode,
                           qmodel_fingerprint=qg.fingerprint(), model=str(qg_path or qg.graph.name),
                           data_file=Path(data.name).name, created=now_utc(),
                           data_sha256=sha256_file(Path(data.name)) if Path(data.name).is_file() else "")
            if len(qg.graph.outputs) > 1:  # several: which dataset holds which
                f.attrs["outputs"] = list(qg.graph.outputs)
            for k, v in sim.kept.items():
                f.create_dataset(k, data=v)

        write_once(lambda: write_h5(save, write))
    measured = sim.to_dict()
    extra = {k: v for k, v in measured.items()
             if k not in ("mode", "samples", "backend", "backend_reason", "outputs", "edges", "notes")}
    arrays = {"y_float": sim.kept["float/y"], "y_quant": sim.kept["quant/y"], "y_int": sim.kept["quant/y_int"]} \
        if outputs else {}
    return SimulationResult(sim.output, n, time.perf_counter() - t0, label, reason, mode, edges=sim.edges,
                            outputs=sim.outputs, extra=extra, notes=notes, **arrays)


def graph_saturation_notes(qg: QGraph, sim, data: SequenceData, n: int, batch_size: int) -> list[str]:
    """The model's inputs scaled unlike the calibration data (`sim`: a GraphSimulation), with the
    channel most outside its own grid where an input has a grid per channel."""
    saturated = {e: sim.edges[e].as_dict()["saturated"] for e in qg.graph.inputs if e in sim.edges}
    worst = {e: _worst_channel(qg, e, data, n, batch_size) for e, share in saturated.items()
             if share > SATURATED_NOTE and e in qg.graph.input_shifts}
    return saturation_notes(saturated, worst)


def gru_notes(qm: QuantModel, data: SequenceData, tensors: dict) -> list[str]:
    """What looks wrong with the data of a GRU alone's run (`tensors`: its per-tensor results):
    time-first data read batch-first, inputs scaled unlike the calibration data."""
    x = tensors.get(tensor_key(0, 0, "x"), {})
    return axes_notes(int(qm.info.get("time_steps", 0)), data.shape, data.time_first) + saturation_notes(
        {"x": x["saturated"]} if "saturated" in x else {})


def _worst_channel(qg: QGraph, edge: str, data: SequenceData, n: int, chunk: int) -> str:
    """The channel of a per-channel input grid with the largest share of values outside its own
    grid: `channel 3 (a grid 2^15 times finer than the coarsest): 95.0%`."""
    g, shifts = qg.grids[edge], qg.graph.input_shifts[edge]
    out, total = np.zeros(len(shifts)), 0
    for _, x in data.chunks(chunk, n):
        v = qg.graph.scale_inputs({edge: x[edge] if isinstance(x, dict) else x})[edge].reshape(-1, len(shifts))
        out += ((v < g.lo) | (v > g.hi)).sum(0)
        total += v.shape[0]
    c = int(np.argmax(out))
    grid = "the coarsest grid" if shifts[c] == 0 else f"a grid 2^{shifts[c]} times finer than the coarsest"
    return f"channel {c} ({grid}): {out[c] / max(total, 1):.1%}"


@dataclass
class SimulationResult:
    """How far the integer model (dequantized) lands from the float model on the same data, for
    either kind. `output`: at the output, as SNR, cosine, largest error and saturation (a GRU's
    output; a whole model's integer core outputs together, a classifier's logits, with its top-1
    agreement). A GRU alone adds `tensors` (keyed layer{l}.{fwd,bwd}.{tensor}) and
    `per_step_snr_db`; a whole model `edges` (every core edge) and `outputs` (the model's outputs,
    after the float tail), each a qtool.engine.metrics.Distance. `extra`: mode "both"'s
    "fakequant" (its distances and agreement), a classifier's accuracies with labels. With
    outputs=True: the float output, the integer one dequantized (the fake-quant model's under
    mode "fakequant") and its raw integers; a GRU's `[N, T, output_size]`, a whole model's first
    output in its own shape. The parts a model has not are None."""

    output: dict
    samples: int
    seconds: float
    backend: str
    backend_reason: str = ""
    mode: str = "integer"
    tensors: dict | None = None
    per_step_snr_db: list | None = None
    edges: dict | None = None
    outputs: dict | None = None
    extra: dict = field(default_factory=dict)
    notes: list = field(default_factory=list)  # what looks wrong with the data
    y_float: np.ndarray | None = None
    y_quant: np.ndarray | None = None
    y_int: np.ndarray | None = None

    def to_dict(self) -> dict:
        """The measurements (`qtool simulate --json`): a GRU's per tensor, a whole model's per edge."""
        head = {"mode": self.mode, "output": self.output}
        if self.edges is None:
            head |= {"tensors": self.tensors, "per_step_snr_db": self.per_step_snr_db}
        tail = {"samples": self.samples, "seconds": self.seconds, "backend": self.backend,
                "backend_reason": self.backend_reason}
        if self.edges is not None:
            tail |= {"outputs": {e: d.as_dict() for e, d in self.outputs.items()},
                     "edges": {e: d.as_dict() for e, d in self.edges.items()}}
        return {**head, **tail, **self.extra, "notes": list(self.notes)}


def simulate(qm: QuantModel | QGraph | str | os.PathLike, data: DataLike, *, per_tensor: bool = True,
             backend: str = "auto", batch_size: int = 256, limit: int | None = None,
             save: str | os.PathLike | None = None, force: bool = False,
             confirm: Callable[[str], bool] | None = None, dataset: str | None = None,
             time_first: bool = False, mode: str = "integer", outputs: bool = False, labels=None,
             progress: Progress | None = None):
    """Run the integer model and the float model side by side on `data` and measure how far apart
    they are. `mode`: "integer", "fakequant" (the float model with every tensor rounded onto its
    grid) or "both". `save` writes both outputs and the raw output integers to an HDF5 file;
    `outputs=True` returns them in the result. A `SimulationResult` for either kind: a GRU
    alone's per tensor and per step, a whole model's per edge (a classifier's top-1 agreement,
    and with `labels` both accuracies)."""
    whole = is_whole(qm)
    only_for(whole, "simulate", per_tensor=per_tensor, labels=labels)
    if whole:
        return _simulate_graph(qm, data, labels=labels, batch_size=batch_size, limit=limit, dataset=dataset,
                               time_first=time_first, outputs=outputs, save=save, force=force, confirm=confirm,
                               backend=backend, mode=mode, progress=progress)
    check_mode(mode)
    import time

    from qtool.engine.backend import select_backend
    from qtool.simulation.run import simulate as run_simulation

    runner, label, reason = select_backend(backend)
    qm_path = None
    if not isinstance(qm, QuantModel):
        qm_path = Path(qm)
        qm = load(qm_path)
    if batch_size < 1:
        raise QtoolError("`batch_size` must be at least 1")
    data_in = data
    data = as_data(data, dataset, time_first)
    data.check_features(qm.model.input_size)
    n = count(data, limit)
    if save is not None:
        save = claim_output(save, force, [qm_path, data.name if not isinstance(data_in, np.ndarray) else None],
                            confirm, kind="results")
    t0 = time.perf_counter()
    comm = world()
    kept = _Outputs(n, data.shape[1], qm.model.output_size) if outputs else None
    if comm is not None:  # under mpiexec: each rank simulates its chunks, rank 0 writes `save`
        from qtool.parallel.simulate import simulate as simulate_ranks

        if outputs:
            raise QtoolError("outputs=True is not available under mpiexec (each rank holds its own "
                             "chunks); use save= to get the outputs in a file")
        sim = simulate_ranks(comm, qm, data, batch_size, per_tensor, n, runner, progress, save, mode)
    elif save is None:
        report = (lambda start, *o: progress(start + len(o[0]), n)) if progress else None
        sim = run_simulation(qm, data, batch_size, per_tensor, n, _keeping(kept, report), runner, mode)
    else:
        from qtool.io.results import write_results

        sim = write_results(save, qm, data, n, lambda on_chunk: run_simulation(
            qm, data, batch_size, per_tensor, n, _keeping(kept, on_chunk), runner, mode), progress, mode)
    res = sim.results()
    notes = gru_notes(qm, data, res["tensors"]) or output_notes(res["output"])
    extra = {k: v for k, v in res.items() if k not in ("mode", "output", "tensors", "per_step_snr_db", "samples")}
    arrays = {"y_float": kept.y_float, "y_quant": kept.y_quant, "y_int": kept.y_int} if kept else {}
    return SimulationResult(res["output"], n, time.perf_counter() - t0, label, reason, mode, tensors=res["tensors"],
                            per_step_snr_db=res["per_step_snr_db"], extra=extra, notes=notes, **arrays)


class _Outputs:
    """The outputs of every chunk of a simulation, gathered for SimulationResult."""

    def __init__(self, n: int, steps: int, width: int) -> None:
        self.y_float = np.empty((n, steps, width), np.float32)
        self.y_quant = np.empty((n, steps, width), np.float32)
        self.y_int = np.empty((n, steps, width), np.int32)

    def put(self, start: int, y_float: np.ndarray, y_quant: np.ndarray, y_int: np.ndarray) -> None:
        stop = start + len(y_float)
        self.y_float[start:stop], self.y_quant[start:stop], self.y_int[start:stop] = y_float, y_quant, y_int


def _keeping(kept: _Outputs | None, on_chunk: Callable | None) -> Callable | None:
    """`on_chunk`, first storing each chunk's outputs in `kept` (when asked for)."""
    if kept is None:
        return on_chunk

    def both(start: int, *outs) -> None:
        kept.put(start, *outs)
        if on_chunk:
            on_chunk(start, *outs)
    return both
