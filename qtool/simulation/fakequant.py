"""The fake-quant side of `qtool simulate --mode fakequant|both`: distances of the fake-quant GRU
from the float GRU (output, per tensor, per time step), and, beside the integer engine, how many
integers the two share per tensor. The difference is what the integer arithmetic itself costs."""

from __future__ import annotations

import numpy as np

from qtool.core.model import tensor_key
from qtool.core.qmodel import QuantModel
from qtool.engine.metrics import Distance, count_clipped, finite_or_none
from qtool.numerics.fakequant import run_fakequant, to_int
from qtool.numerics.qparams import dequantize

MODES = ("integer", "fakequant", "both")
EXPLANATION = (
    "fakequant rounds every tensor once onto its grid (TVM's simulated quantization); the integer "
    "GRU also rounds each term of a sum on its own when shifting it onto the sum's grid, and "
    "interpolates wide tables. Products and GEMMs are rounded once in both, so they differ only "
    "through their inputs; the gap between the columns is what the integer arithmetic itself costs "
    "(docs/qat.md).")


class Agreement:
    """Integers of the fake-quant GRU against the engine's: share identical, largest difference."""

    def __init__(self) -> None:
        self.count = self.same = self.max_lsb = 0

    def add(self, q_fq: np.ndarray, q_int: np.ndarray) -> None:
        d = np.abs(np.asarray(q_fq, np.int64) - np.asarray(q_int, np.int64))
        self.count += d.size
        self.same += int(np.count_nonzero(d == 0))
        self.max_lsb = max(self.max_lsb, int(d.max(initial=0)))

    def merge(self, other: Agreement) -> Agreement:
        out = Agreement()
        out.count, out.same = self.count + other.count, self.same + other.same
        out.max_lsb = max(self.max_lsb, other.max_lsb)
        return out

    def as_dict(self) -> dict:
        return {"identical": self.same / self.count if self.count else 1.0, "max_lsb": self.max_lsb}


class FakeQuantSide:
    """Accumulates the fake-quant GRU's distances from float, and its agreement with the integers
    (every cell form: each cell's tensors are its form's, in the float traces, the fake-quant
    traces and the engine's alike)."""

    def __init__(self, qm: QuantModel, per_tensor: bool, static: dict[str, Distance]):
        self.qm = qm
        self.per_tensor = per_tensor
        self.output = Distance()
        self.output_agreement = Agreement()
        self.steps: list[Distance] = []
        self.tensors: dict[str, Distance] = dict(static)  # W, R, bx, br: the same integers
        self.agreement: dict[str, Agreement] = {}

    def run_chunk(self, x: np.ndarray, y_float: np.ndarray, ftr: list | None,
                  y_int: np.ndarray | None, int_tensors: list | None) -> tuple[np.ndarray, np.ndarray]:
        """Run the fake-quant GRU on one batch; returns (its output values, their integers)."""

        traces: list | None = [] if self.per_tensor else None
        y_fq = run_fakequant(self.qm, x, traces)
        s = self.qm.cells[-1][0].spec["h"]
        q = to_int(y_fq, s)
        self.output.add(y_fq, y_float, count_clipped(y_float, s.exp2_inv, s.zp, s.bits))
        while len(self.steps) < x.shape[1]:
            self.steps.append(Distance())
        for t in range(x.shape[1]):
            self.steps[t].add(y_fq[:, t], y_float[:, t])
        if y_int is not None:
            self.output_agreement.add(q, y_int)
        for l, row in enumerate(traces or []):
            for d, tr in enumerate(row):
                cq = self.qm.cells[l][d]
                for name, v in tr.items():
                    spec, key = cq.spec[name], tensor_key(l, d, name)
                    qv = to_int(v, spec)
                    ref = ftr[l][d][name]
                    self.tensors.setdefault(key, Distance()).add(
                        dequantize(qv, spec.exp2_inv, spec.zp), ref,
                        count_clipped(ref, spec.exp2_inv, spec.zp, spec.bits))
                    if int_tensors is not None:
                        self.agreement.setdefault(key, Agreement()).add(qv, int_tensors[l][d][name])
        return y_fq.astype(np.float32), q.astype(np.int32)

    def results(self, keys: list[str]) -> dict:
        out = {"output": self.output.as_dict(),
               "tensors": {k: self.tensors[k].as_dict() for k in keys if k in self.tensors},
               "per_step_snr_db": [finite_or_none(d.snr_db) for d in self.steps]}
        if self.output_agreement.count:
            out["agreement"] = {"output": self.output_agreement.as_dict(),
                                **{k: self.agreement[k].as_dict() for k in keys if k in self.agreement}}
        return out
