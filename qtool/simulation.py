"""`qtool simulate`: the integer GRU and the float GRU side by side on held-out data, streamed in
chunks, with distances at the output, per tensor and per time step."""

from __future__ import annotations

from collections.abc import Callable

import numpy as np

from qtool.engine_cpu import MEASURED, OUTPUT, TENSORS, plan_model, run_model
from qtool.fileio import SequenceData
from qtool.metrics import Distance, count_clipped, finite_or_none
from qtool.model import DIRECTIONS
from qtool.qmodel import QuantModel
from qtool.qparams import dequantize
from qtool.tensors import NAMES


def tensor_key(l: int, d: int, name: str) -> str:
    return f"layer{l}.{DIRECTIONS[d]}.{name}"


class Simulation:
    """Accumulates distances over chunks; `results()` gives the report.

    `runner(qm, x, level, plans)` is an engine's `run_model` (engine_cpu's by default, or
    engine_cuda's): it runs the integer GRU and the float reference on one chunk and returns
    the outputs and the distance statistics of every tensor (`engine_cpu.ModelRun`).
    """

    def __init__(self, qm: QuantModel, per_tensor: bool = True, runner=run_model):
        self.qm = qm
        self.runner = runner
        self.plans = plan_model(qm) if runner is run_model else None
        self.per_tensor = per_tensor
        self.output = Distance()
        self.steps: list[Distance] = []
        self.tensors: dict[str, Distance] = {}
        if per_tensor:
            self._static_tensors()

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

    def run_chunk(self, x: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """Simulate one batch; returns (float y, dequantized y, integer y), all `[N, T, H*D]`."""
        run = self.runner(self.qm, x, TENSORS if self.per_tensor else OUTPUT, plans=self.plans)
        s = self.qm.cells[-1][0].spec["h"]
        y_q = dequantize(run.y_int, s.exp2_inv, s.zp).astype(np.float32)
        for st in run.stats[-1]:  # the output is every direction's h of the last layer
            self.output.add_stats(st[-1])
        while len(self.steps) < len(run.step_stats):
            self.steps.append(Distance())
        for d, row in zip(self.steps, run.step_stats):
            d.add_stats(row)
        if self.per_tensor:
            for l, row in enumerate(run.stats):
                for d, st in enumerate(row):
                    for k, name in enumerate(MEASURED):
                        self.tensors.setdefault(tensor_key(l, d, name), Distance()).add_stats(st[k])
        return run.y_float, y_q, run.y_int

    def results(self) -> dict:
        order = {name: i for i, name in enumerate(NAMES)}

        def rank(key: str) -> tuple:
            layer, direction, name = key.split(".")
            return int(layer[5:]), DIRECTIONS.index(direction), order[name]

        return {
            "output": self.output.as_dict(),
            "tensors": {k: self.tensors[k].as_dict() for k in sorted(self.tensors, key=rank)},
            "per_step_snr_db": [finite_or_none(d.snr_db) for d in self.steps],
        }


def simulate(qm: QuantModel, data: SequenceData, chunk: int = 256, per_tensor: bool = True,
             limit: int | None = None, on_chunk: Callable | None = None,
             runner=run_model) -> Simulation:
    """Run the whole data set in chunks; `on_chunk(start, y_float, y_q, y_int)` sees each."""
    data.check_features(qm.model.input_size)
    sim = Simulation(qm, per_tensor, runner)
    for start, x in data.chunks(chunk, limit):
        outs = sim.run_chunk(x)
        if on_chunk:
            on_chunk(start, *outs)
    return sim
