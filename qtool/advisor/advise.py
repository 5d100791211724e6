"""`qtool advise` (docs/advisor.md): the precision estimator and predictions for every tensor,
the int8/int16 threshold rule, and (with held-out data) the search for the least flash that
reaches a measured output SNR or the best SNR within a flash budget. The result is a bits file for `qtool calibrate`."""

from __future__ import annotations

import math
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from qtool.advisor import pzero
from qtool.advisor.configs import HIGH, LOW, TIED, Unit, all_units, bits_config, flash_bytes, tied
from qtool.advisor.predict import Prediction, Predictor
from qtool.advisor.search import Candidate, Evaluator, Search, threshold_rule
from qtool.advisor.stats import model_stats, new_estimators
from qtool.calibration.auto import AutoCalibrator, AutoChoice, chosen_methods
from qtool.calibration.observe import model_config
from qtool.calibrators import GATE_OUTPUTS
from qtool.calibrators.sampled import GAMMA, K
from qtool.core.model import DIRECTIONS, GruModel
from qtool.core.qmodel import QuantModel
from qtool.core.tensors import TensorConfig, bits_toml, cell_tensors
from qtool.errors import QtoolError
from qtool.io.files import SequenceData
from qtool.simulation.run import simulate, tensor_key

# The threshold rule's T (dB) on the P_zero prediction's int8 SNR, chosen by the experiment in
# docs/advisor.md (benchmarks/advise_threshold.py).
THRESHOLD_DB = 18.5

Progress = Callable[[str, int, int | None], None]  # (stage, done, total or None)


@dataclass
class Advice:
    """The advisor's answer, for a GRU alone or a whole model. `chosen`: the configuration
    (promoted units, quantized model, flash, measured output SNR; a GRU's auto methods);
    `presets`: flash and output SNR of int8/w8a16/int16 (measured when held-out data was given,
    else predicted for a GRU, flash alone for a whole model); `rows`: one per unit (a GRU's
    tensors; a whole model's layer weights, outputs and GRU tensors); `predicted_output_db`: a
    GRU's predicted output SNR (None for a whole model)."""

    mode: str                      # "rule", "target" or "budget"
    chosen: Candidate              # or qtool.advisor.graph.GraphCandidate
    measured_on: str               # what the measured SNRs were measured on
    predicted_output_db: float | None
    rows: list[dict]
    presets: dict[str, dict]
    bits_toml: str
    threshold_db: float
    simulations: int
    seconds: float
    target_db: float | None = None
    max_flash: int | None = None
    extra: dict = field(default_factory=dict)
    unit_count: int = 0            # the units that can go to 16 bits (rows less a GRU's 32-bit biases)

    def summary(self) -> dict:
        measured = None if math.isnan(self.chosen.snr_db) else self.chosen.snr_db
        return {"mode": self.mode, "flash_bytes": self.chosen.flash, "measured_snr_db": measured,
                "measured_on": self.measured_on, "predicted_snr_db": self.predicted_output_db,
                "int16_tensors": len(self.chosen.promoted), "unit_count": self.unit_count, "presets": self.presets,
                "threshold_db": self.threshold_db, "target_snr_db": self.target_db,
                "max_flash": self.max_flash, "simulations": self.simulations, "seconds": self.seconds,
                "methods": self.chosen.methods()}


def file_configs(model: GruModel, promoted: frozenset[Unit], plan) -> list[dict[str, TensorConfig]]:
    """Per layer: the bits, and the method auto chose for every tensor it chooses, so that
    `qtool calibrate --bits FILE` rebuilds the very same model in one pass."""
    return with_methods(model_config(bits_config(model, promoted), model.num_layers), chosen_methods(model, plan))


def with_methods(cfgs: list[dict[str, TensorConfig]], methods: list[dict[str, str]]) -> list[dict[str, TensorConfig]]:
    """The per-layer configs `cfgs` naming, per layer, the method of each tensor in `methods[l]`
    (`chosen_methods`: a GRU alone's, or each GRU of a whole model's)."""
    for cfg, named in zip(cfgs, methods):
        for name, m in named.items():
            cfg[name] = TensorConfig(cfg[name].bits, cfg[name].symmetric, m)
    return cfgs


def measured_presets(**presets: Candidate) -> dict[str, dict]:
    return {k: {"flash_bytes": c.flash, "snr_db": c.snr_db} for k, c in presets.items()}


def tensor_rows(stats, pred: Prediction, measured: dict, qm: QuantModel, choice: AutoChoice) -> list[dict]:
    rows = []
    for l, cells in enumerate(qm.cells):
        plan = choice.plan.for_layer(l)
        for d, cq in enumerate(cells):
            st = stats[l][d]
            for td in cell_tensors(cq.form):
                name, s = td.name, st[td.name]
                m = measured["tensors"].get(tensor_key(l, d, name), {}).get("snr_db")
                method = None if td.kind != "activation" else plan.method(name)
                if name in GATE_OUTPUTS:
                    method = "minmax"
                if tied(cq.form) and name in TIED:  # on the grid of the tensor it is tied to
                    method = plan.method(TIED[name])
                rows.append({
                    "layer": l, "direction": DIRECTIONS[d], "tensor": name, "mu": s.mu, "sigma": s.sigma,
                    "M": s.M, "p_zero_8": pzero.p_zero(s, LOW), "p_zero_16": pzero.p_zero(s, HIGH),
                    "predicted_seed_db": pred.pzero_db.get((l, d, name)),
                    "predicted_grid_db": pred.grid_db.get((l, d, name)),
                    "measured_snr_db": m, "bits": cq.spec[name].bits,
                    "method": method})
    return rows


def advise(model: GruModel, data: SequenceData, eval_data: SequenceData | None = None,
           target_db: float | None = None, max_flash: int | None = None,
           threshold_db: float = THRESHOLD_DB, seed_value: int = 0, gamma: float = GAMMA,
           repeats: int = K, chunk: int = 64, limit: int | None = None,
           progress: Progress | None = None, info: dict | None = None) -> Advice:
    """Estimate, predict, decide (and search, with `eval_data` and a target or a budget)."""
    if target_db is not None and eval_data is None:
        raise QtoolError("`target_snr` needs `test`: held-out sequences to measure the output SNR on")
    if max_flash is not None and eval_data is None:
        raise QtoolError("`max_flash` needs `test`: held-out sequences to measure the output SNR on")
    if not 0.0 < gamma <= 1.0 or repeats < 1:
        raise QtoolError("`gamma` must be in (0, 1] and `repeats` at least 1")
    if eval_data is not None:
        eval_data.check_features(model.input_size)
    t0 = time.perf_counter()
    n = data.num_sequences if limit is None else min(limit, data.num_sequences)
    tick = progress or (lambda *a: None)
    ac = AutoCalibrator(model, data, n, chunk, extra=[lambda: new_estimators(model, seed_value, gamma, repeats)],
                        progress=lambda done: tick("calibrating", done, n))
    stats = model_stats(model, ac.extra_sets[0], seed_value, gamma, repeats)
    predictor = Predictor(model, stats, data.shape[1], ac.all_views.hist)
    info = {"bits": "advise", "data_file": data.name, "samples": n, "time_steps": data.shape[1], **(info or {})}
    if eval_data is not None:
        ev = Evaluator(ac, eval_data, info, on_simulation=lambda k: tick("simulations", k, None))
    if target_db is not None or max_flash is not None:
        search = Search(ev, predictor)
        mode = "target" if target_db is not None else "budget"
        chosen = search.for_target(target_db, max_flash) if target_db is not None else search.within(max_flash)
        presets = measured_presets(int8=search.low, w8a16=search.w8a16, int16=search.high)
    else:
        mode = "rule"
        promoted = threshold_rule(stats, threshold_db, model)
        if eval_data is not None:
            chosen = ev(promoted)
            presets = measured_presets(int8=ev(frozenset()), int16=ev(frozenset(all_units(model))))
        else:
            qm, choice = ac.quantize(bits_config(model, promoted), info)
            chosen = Candidate(promoted, qm, choice, flash_bytes(qm), float("nan"))
            presets = {}
            for k, units in (("int8", frozenset()), ("int16", frozenset(all_units(model)))):
                # the chosen methods' grids (zero points and folded biases move a few bytes);
                # int16 on min/max grids, whose 16-bit search is instant
                cfg = bits_config(model, units)
                q = ac.build(cfg, choice.plan if k == "int8" else ac.fixed_plan(cfg, "minmax"), {})
                presets[k] = {"flash_bytes": flash_bytes(q), "predicted_snr_db": predictor.grid(q.cells)[1]}
    measured: dict = {"tensors": {}}
    measured_on = "nothing (no `test`: predictions only)"
    if eval_data is not None:
        tick("measuring", 0, None)
        measured = simulate(chosen.qm, eval_data).results()
        measured_on = f"{eval_data.num_sequences} test sequences of {Path(eval_data.name).name}"
    pred = predictor.predict(chosen.qm.cells)
    rows = tensor_rows(stats, pred, measured, chosen.qm, chosen.choice)
    snr = (f"output SNR {chosen.snr_db:.2f} dB measured on {measured_on}" if eval_data is not None
           else f"output SNR {pred.output_db:.1f} dB predicted (no held-out data)")
    comment = (f"qtool advise: {mode}; {snr}; flash {chosen.flash:,} bytes; {len(chosen.promoted)} of "
               f"{len(all_units(model))} units at 16 bits")
    toml = bits_toml("int8", file_configs(model, chosen.promoted, chosen.choice.plan), comment)
    sims = ev.simulations if eval_data is not None else 0
    return Advice(mode, chosen, measured_on, pred.output_db, rows, presets, toml, threshold_db, sims,
                  time.perf_counter() - t0, target_db, max_flash, unit_count=len(all_units(model)))


__all__ = ["Advice", "advise", "THRESHOLD_DB"]
