"""Both predictions for a whole quantized model: the P_zero one per tensor, and the grid-aware one
per tensor and at the output."""

from __future__ import annotations

import math
from dataclasses import dataclass

from qtool.advisor import pzero
from qtool.advisor.noise import WeightTerms, clip_above_of, grid_error_of, predict_cell, snr_db
from qtool.advisor.stats import Stats
from qtool.calibration.observe import Observers
from qtool.core.model import HASTE, CellForm, GruModel
from qtool.core.qmodel import CellQuant
from qtool.core.tensors import cell_names


@dataclass
class Prediction:
    """Predicted SNR (dB) per tensor key (l, d, name): the P_zero one (`pzero_db`) and the
    grid-aware one; and the grid-aware prediction of the model's output."""

    pzero_db: dict[tuple[int, int, str], float]
    grid_db: dict[tuple[int, int, str], float]
    output_db: float


def pzero_cell(stats: dict, spec: dict, form: CellForm = HASTE) -> dict[str, float]:
    """The P_zero prediction's SNR of every tensor of one cell (of this form) at the cell's bits."""
    bits = {n: t.bits for n, t in spec.items()}
    return {n: pzero.tensor_snr_db(stats, bits, n, form) for n in cell_names(form) if n in stats}


class Predictor:
    """Predictions for quantized models of one float model, from the estimator's statistics
    over `steps`-step sequences and (optionally) the calibration histograms `hists[l][d][name]`
    for the tensors' own errors. Results per grid are computed once."""

    def __init__(self, model: GruModel, stats: Stats, steps: int, hists: Observers | None = None) -> None:
        self.model, self.stats, self.steps, self.hists = model, stats, steps, hists
        self._terms: dict = {}
        self._own: dict = {}

    def _own_error(self, l: int, d: int):
        """A cell's tensors' own errors on their grids (calibration histograms where given)."""
        def own(name: str, t, above: bool = False):
            key = (l, d, name, t.bits, int(t.exp2_inv), int(t.zp)) + (("above",) if above else ())
            if key not in self._own:
                o = None
                if self.hists is not None:
                    o = self.hists[l][0 if name == "x" else d][name]
                error = clip_above_of if above else grid_error_of
                self._own[key] = error(t, self.stats[l][d][name], o)
            return self._own[key]
        return own

    def _weights(self, l: int, d: int, cq: CellQuant) -> tuple[WeightTerms, WeightTerms]:
        cell = self.model.layers[l][d]
        out = []
        for name, w, q in (("W", cell.W, cq.qW), ("R", cell.R, cq.qR)):
            e = cq.spec[name].exp2_inv
            key = (l, d, name, cq.spec[name].bits, e.tobytes())
            if key not in self._terms:
                self._terms[key] = WeightTerms.of(w, q, e)
            out.append(self._terms[key])
        return out[0], out[1]

    def grid(self, cells: list[list[CellQuant]]) -> tuple[dict[tuple[int, int, str], float], float]:
        """The grid-aware SNR of every traced tensor and of the output; weights and biases get
        the exact SNR of their grids."""
        per: dict[tuple[int, int, str], float] = {}
        n_x = None
        out_p = out_n = 0.0
        for l, row in enumerate(cells):
            noise_h = []
            for d, cq in enumerate(row):
                w, r = self._weights(l, d, cq)
                res = predict_cell(cq, w, r, self.stats[l][d], n_x, self.steps, self._own_error(l, d))
                for name, (p, n) in res.items():
                    per[(l, d, name)] = snr_db(p, n)
                for name, t in (("W", w), ("R", r)):
                    per[(l, d, name)] = snr_db(t.sq.sum(), t.err2.sum())
                per[(l, d, "bx")] = per[(l, d, "br")] = math.inf  # 32-bit biases
                noise_h.append(res["h"])
            n_x = sum(n for _, n in noise_h) / len(noise_h)
            out_p, out_n = (sum(p for p, _ in noise_h), sum(n for _, n in noise_h))
        return per, snr_db(out_p, out_n)

    def predict(self, cells: list[list[CellQuant]]) -> Prediction:
        grid, out = self.grid(cells)
        pzero_db = {(l, d, n): v for l, row in enumerate(cells) for d, cq in enumerate(row)
                   for n, v in pzero_cell(self.stats[l][d], cq.spec, cq.form).items()}
        return Prediction(pzero_db, grid, out)
