"""`qtool simulate`: the integer GRU and the float GRU side by side on held-out data, streamed in
chunks, with distances at the output, per tensor and per time step."""

from __future__ import annotations

from collections.abc import Callable

import numpy as np

from qtool.core.model import DIRECTIONS, HASTE, CellForm, tensor_key
from qtool.core.qmodel import QuantModel
from qtool.core.tensors import ALL_NAMES, trace_tensor
from qtool.engine.cpu import plan_model, run_model, time_first_traces
from qtool.engine.layout import EVERY_TENSOR, INTS, OUTPUT, cell_layout
from qtool.engine.metrics import Distance, count_clipped, finite_or_none
from qtool.errors import QtoolError
from qtool.io.files import SequenceData
from qtool.numerics.float_gru import run_float
from qtool.numerics.qparams import dequantize
from qtool.simulation.fakequant import MODES, FakeQuantSide
from qtool.simulation.fold import merge_stat


def int_tensors(trace: dict, form: CellForm = HASTE) -> dict[str, np.ndarray]:
    """Integer tensors of one direction of a cell of this form, `[T, N, width]`, named as in
    the tensor table (docs/numerics.md)."""
    cell = trace["cell"]  # row k: cell_trace(form)[k] (Rh as its three gate blocks)
    out = {"x": trace["x"], "Wx": trace["Wx"]}
    tensors = trace_tensor(form)
    for name in dict.fromkeys(tensors):
        rows = [cell[:, :, k] for k, t in enumerate(tensors) if t == name]
        out[name] = rows[0] if len(rows) == 1 else np.concatenate(rows, axis=2)
    return out


class Simulation:
    """Accumulates distances over chunks; `results()` gives the report.

    `runner(qm, x, level, plans, traces)` is an engine's `run_model` (engine_cpu's by default, or
    engine_cuda's): it runs the integer GRU and the float reference on one chunk and returns
    the outputs and the distance statistics of every tensor (`engine_cpu.ModelRun`), keeping
    no traces. Only what needs every tensor's values at every step asks for them: the
    fake-quant side (`mode`) and `float_traces` (the report's histograms).
    """

    def __init__(self, qm: QuantModel, per_tensor: bool = True, runner=run_model, mode: str = "integer",
                 per_step: bool = True):
        if mode not in MODES:
            raise QtoolError(f"unknown mode '{mode}' (use one of {', '.join(MODES)})")
        self.qm = qm
        self.runner = runner
        self.plans = plan_model(qm) if runner is run_model else None
        self.per_tensor = per_tensor
        self.mode = mode
        self.per_step = per_step
        self.output = Distance()
        self.steps: list[Distance] = []
        self.tensors: dict[str, Distance] = {}
        if per_tensor:
            self._static_tensors()
        self.fakequant = FakeQuantSide(qm, per_tensor, self.tensors) if mode != "integer" else None

    def _static_tensors(self) -> None:
        for l, cells in enumerate(self.qm.cells):
            for d, cq in enumerate(cells):
                cell = self.qm.model.layers[l][d]
                for name, q in (("W", cq.qW), ("R", cq.qR), ("bx", cq.qbx), ("br", cq.qbr)):
                    s = cq.spec[name]
                    dist = Distance()
                    ref = getattr(cell, name)
                    dist.add(dequantize(q, s.exp2_inv, 0), ref, count_clipped(ref, s.exp2_inv, 0, s.bits))
                    self.tensors[tensor_key(l, d, name)] = dist

    def wants_float_traces(self) -> bool:
        """Whether run_chunk needs every tensor's float values at every step (numpy's float GRU,
        traced): for the fake-quant side's per-tensor distances (and subclasses' pictures)."""
        return self.fakequant is not None and self.per_tensor

    def float_traces(self, ftr: list) -> None:
        """Sees each chunk's float traces (`float_gru.run_float`) when `wants_float_traces`."""

    def run_chunk(self, x: np.ndarray, y_float: np.ndarray | None = None
                  ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """Simulate one batch; returns (float y, dequantized y, integer y), all `[N, T, H*D]`.
        Without per-tensor reports, the float output may be given (several quantized models of
        one float model, scored on the same batch, share it): the engine then runs the integers
        alone and the output is measured against `y_float`."""
        ftr: list | None = [] if self.wants_float_traces() else None
        if self.mode == "fakequant":
            y_float = run_float(self.qm.model, x, ftr)
            return (y_float, *self.fakequant.run_chunk(x, y_float, ftr, None, None))
        if y_float is not None and not self.per_tensor and self.fakequant is None:
            return self._against(x, y_float)
        raw: list | None = [] if self.fakequant is not None and self.per_tensor else None
        run = self.runner(self.qm, x, EVERY_TENSOR if self.per_tensor else OUTPUT, plans=self.plans, traces=raw)
        self._add_stats(run)
        if ftr is not None:
            run_float(self.qm.model, x, ftr)
            self.float_traces(ftr)
        if self.fakequant is not None:
            ints = None if raw is None else \
                [[int_tensors(tr, self.qm.cells[l][d].form) for d, tr in enumerate(row)]
                 for l, row in enumerate(time_first_traces(self.qm, x, run, raw))]
            self.fakequant.run_chunk(x, run.y_float, ftr, run.y_int, ints)
        s = self.qm.cells[-1][0].spec["h"]
        return run.y_float, dequantize(run.y_int, s.exp2_inv, s.zp).astype(np.float32), run.y_int

    def _add_stats(self, run) -> None:
        """Folds one chunk's statistics (computed inside the engine's loops) into the
        accumulators with qtool.simulation.fold's merge, as a distributed run folds its chunks."""
        self._fold(chunk_partial(run, self.per_tensor, self.per_step, self.qm))

    def _fold(self, partial: dict) -> None:
        for field, part in partial.items():
            setattr(self, field, merge_stat(getattr(self, field), part))

    def _against(self, x: np.ndarray, y_float: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """The integers alone, their output measured against a given float output."""
        y_int = self.runner(self.qm, x, INTS, plans=self.plans).y_int
        s = self.qm.cells[-1][0].spec["h"]
        y_q = dequantize(y_int, s.exp2_inv, s.zp).astype(np.float32)
        output, steps = Distance(), [Distance() for _ in range(x.shape[1] if self.per_step else 0)]
        output.add(y_q, y_float, count_clipped(y_float, s.exp2_inv, s.zp, s.bits))
        for t, d in enumerate(steps):
            d.add(y_q[:, t], y_float[:, t])
        self._fold({"output": output, "steps": steps})
        return y_float, y_q, y_int

    def results(self) -> dict:
        order = {name: i for i, name in enumerate(ALL_NAMES)}

        def rank(key: str) -> tuple:
            layer, direction, name = key.split(".")
            return int(layer[5:]), DIRECTIONS.index(direction), order[name]

        # fakequant alone measures the activations on its side only
        keys = sorted(set(self.tensors) | set(self.fakequant.tensors if self.fakequant else ()), key=rank)
        if self.mode == "fakequant":
            return {"mode": self.mode, **self.fakequant.results(keys)}
        extra = {"fakequant": self.fakequant.results(keys)} if self.fakequant else {}
        return {
            "mode": self.mode,
            "output": self.output.as_dict(),
            "tensors": {k: self.tensors[k].as_dict() for k in keys},
            "per_step_snr_db": [finite_or_none(d.snr_db) for d in self.steps],
            **extra,
        }


def float_output(qm: QuantModel, x: np.ndarray, runner=run_model) -> np.ndarray:
    """The float GRU's output `[N, T, H*D]` as `simulate`'s engine computes it (its float32
    reference): for scoring several quantized models of one float model against one float run
    (`Simulation.run_chunk(x, y_float)`) with the numbers `simulate` reports."""
    return runner(qm, x, OUTPUT).y_float


def chunk_partial(run, per_tensor: bool, per_step: bool, qm: QuantModel) -> dict:
    """One chunk's distances from an engine's statistics `run` (engine_cpu.ModelRun), as the
    partial of the Simulation's fields (qtool.simulation.fold.STATS); each cell's measured
    tensors are its form's (qtool.engine.layout.cell_layout)."""

    def measured(l: int, d: int) -> tuple[str, ...]:
        return cell_layout(qm.cells[l][d].form).measured

    return {"output": Distance.of_stats(st[-1] for st in run.stats[-1]),  # every direction's h (last), last layer
            "steps": [Distance.of_stats([row]) for row in run.step_stats] if per_step else [],
            "tensors": {tensor_key(l, d, name): Distance.of_stats([st[k]])
                        for l, row in enumerate(run.stats) for d, st in enumerate(row)
                        for k, name in enumerate(measured(l, d))} if per_tensor else {}}


def simulate(qm: QuantModel, data: SequenceData, chunk: int = 256, per_tensor: bool = True,
             limit: int | None = None, on_chunk: Callable | None = None,
             runner=run_model, mode: str = "integer") -> Simulation:
    """Run the whole data set in chunks; `on_chunk(start, y_float, y_q, y_int)` sees each. `mode`:
    the integer GRU, the fake-quant GRU (qtool.numerics.fakequant), or both side by side."""
    data.check_features(qm.model.input_size)
    sim = Simulation(qm, per_tensor, runner, mode)
    for start, x in data.chunks(chunk, limit):
        outs = sim.run_chunk(x)
        if on_chunk:
            on_chunk(start, *outs)
    return sim
