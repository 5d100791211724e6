"""`qtool simulate`: the integer GRU and the float GRU side by side on held-out data, streamed in
chunks, with distances at the output, per tensor and per time step."""

from __future__ import annotations

from collections.abc import Callable

import numpy as np

from qtool.engine_cpu import run_cell, run_int
from qtool.errors import QtoolError
from qtool.fakequant_sim import MODES, FakeQuantSide
from qtool.fileio import SequenceData
from qtool.float_gru import run_float
from qtool.metrics import Distance, count_clipped, finite_or_none
from qtool.model import DIRECTIONS
from qtool.qmodel import QuantModel
from qtool.qparams import dequantize
from qtool.tensors import NAMES

# row k of the engine's cell trace holds this tensor (Rh comes as three gate blocks)
CELL_TRACE = ("Rh_z", "Rh_r", "Rh_g", "z_pre", "r_pre", "g_pre", "z_out", "r_out", "g_out",
              "Rh_add_br", "rRh", "old_contrib", "new_contrib", "h")


def int_tensors(trace: dict) -> dict[str, np.ndarray]:
    """Integer tensors of one direction, `[T, N, width]`, named as in the seed's table."""
    cell = trace["cell"]
    out = {"x": trace["x"], "Wx": trace["Wx"],
           "Rh": np.concatenate([cell[:, :, k] for k in range(3)], axis=2)}
    for k, name in enumerate(CELL_TRACE[3:], start=3):
        out[name] = cell[:, :, k]
    return out


def tensor_key(l: int, d: int, name: str) -> str:
    return f"layer{l}.{DIRECTIONS[d]}.{name}"


class Simulation:
    """Accumulates distances over chunks; `results()` gives the report."""

    def __init__(self, qm: QuantModel, per_tensor: bool = True, runner=run_cell, mode: str = "integer",
                 per_step: bool = True):
        if mode not in MODES:
            raise QtoolError(f"unknown mode '{mode}' (use one of {', '.join(MODES)})")
        self.qm = qm
        self.runner = runner
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

    def run_chunk(self, x: np.ndarray, y_float: np.ndarray | None = None
                  ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """Simulate one batch; returns (float y, dequantized y, integer y), all `[N, T, H*D]`.
        Without per-tensor reports, the float output may be given (several quantized models of
        one float model, scored on the same batch, share it)."""
        ftr: list | None = [] if self.per_tensor else None
        itr: list | None = [] if self.per_tensor else None
        if y_float is None or self.per_tensor:
            y_float = run_float(self.qm.model, x, ftr)
        if self.mode == "fakequant":
            return (y_float, *self.fakequant.run_chunk(x, y_float, ftr, None, None))
        y_int = run_int(self.qm, x, itr, runner=self.runner)
        s = self.qm.cells[-1][0].spec["h"]
        y_q = dequantize(y_int, s.exp2_inv, s.zp).astype(np.float32)
        self.output.add(y_q, y_float, count_clipped(y_float, s.exp2_inv, s.zp, s.bits))
        T = x.shape[1] if self.per_step else 0
        while len(self.steps) < T:
            self.steps.append(Distance())
        for t in range(T):
            self.steps[t].add(y_q[:, t], y_float[:, t])
        if self.per_tensor:
            self._add_tensors(ftr, itr)
        if self.fakequant is not None:
            ints = [[int_tensors(tr) for tr in row] for row in itr] if itr else None
            self.fakequant.run_chunk(x, y_float, ftr, y_int, ints)
        return y_float, y_q, y_int

    def _add_tensors(self, ftr: list, itr: list) -> None:
        for l, cells in enumerate(self.qm.cells):
            for d, cq in enumerate(cells):
                ints = int_tensors(itr[l][d])
                for name, q in ints.items():
                    s = cq.spec[name]
                    key = tensor_key(l, d, name)
                    ref = ftr[l][d][name]
                    self.tensors.setdefault(key, Distance()).add(
                        dequantize(q, s.exp2_inv, s.zp), ref, count_clipped(ref, s.exp2_inv, s.zp, s.bits))

    def results(self) -> dict:
        order = {name: i for i, name in enumerate(NAMES)}

        def rank(key: str) -> tuple:
            layer, direction, name = key.split(".")
            return int(layer[5:]), DIRECTIONS.index(direction), order[name]

        keys = sorted(self.tensors, key=rank)
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


def simulate(qm: QuantModel, data: SequenceData, chunk: int = 256, per_tensor: bool = True,
             limit: int | None = None, on_chunk: Callable | None = None,
             runner=run_cell, mode: str = "integer") -> Simulation:
    """Run the whole data set in chunks; `on_chunk(start, y_float, y_q, y_int)` sees each. `mode`:
    the integer GRU, the fake-quant GRU (qtool.fakequant), or both side by side."""
    data.check_features(qm.model.input_size)
    sim = Simulation(qm, per_tensor, runner, mode)
    for start, x in data.chunks(chunk, limit):
        outs = sim.run_chunk(x)
        if on_chunk:
            on_chunk(start, *outs)
    return sim
