"""`--method auto`: each activation tensor's calibration method, chosen on held-out data.

The calibration sequences are split into FOLDS contiguous folds. One float pass observes every
tensor of every fold into a histogram, the statistics that minmax, percentile, mse and kl all
read (ema, the sequential per-step EMA, has no exact merge and is not a candidate). Each fold in
turn is held out and the other folds, merged exactly, fit the grids (k-fold cross-validation:
every sequence is held out once). Then, for a bits config:

1. per fold, every method's grids come from the other folds;
2. per tensor (per layer, both directions together), the method whose grids have the least
   squared error on their held-out folds' histograms, summed over the folds, wins; LUT inputs
   count their mass beyond the saturation bound at the bound, where clipping is free
   (`--compare`'s question, per tensor);
3. that per-tensor mix and each single method are built per fold from the other folds and
   simulated on the held-out fold's sequences (at most HELD_SIM in all); the output distances
   of all folds pooled give each candidate one output SNR, and the best wins (ties keep the
   mix). A method whose grid moves when a few rare values join the data (an mse or kl grid one
   exponent coarser) loses in the folds that hold them, as it would on new data;
4. the winner is rebuilt from all the data: the fold histograms merge exactly, as one pass
   would have seen them (a bits file naming these methods reproduces the model).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from functools import reduce

import numpy as np

from qtool.calibration.observe import (
    MethodPlan,
    Observers,
    build_quant_model,
    cell_observers,
    cell_spec,
    collect,
    lut_input_bounds,
    merge_observers,
    model_config,
    new_observers,
    observe_batch,
)
from qtool.calibrators import GATE_OUTPUTS, METHODS
from qtool.calibrators.base import NO_BOUND, Observer
from qtool.calibrators.histogram import HistogramObserver
from qtool.calibrators.mse import grid_error
from qtool.core.model import GruModel
from qtool.core.qmodel import QuantModel
from qtool.core.tensors import TensorConfig
from qtool.engine.metrics import Distance, coarse_bits_note
from qtool.io.files import SequenceData
from qtool.io.phases import phase
from qtool.numerics.float_gru import TRACED, TRACED_RESET_BEFORE, traced
from qtool.numerics.lut import cell_gates
from qtool.numerics.qparams import qrange
from qtool.simulation.run import Simulation, float_output

AUTO_METHODS = ("minmax", "percentile", "mse", "kl")
FOLDS = 5         # each fold (a fifth of the sequences) is held out once
HELD_SIM = 1024   # sequences (over all folds) the candidates are simulated on
# the tensors whose method auto chooses: activations whose grid a method sets (gate outputs
# always keep min/max; the x of layers l > 0 is the h below)
CHOSEN = tuple(n for n in dict.fromkeys(TRACED + TRACED_RESET_BEFORE) if n not in GATE_OUTPUTS)


def fold_bounds(n: int) -> list[tuple[int, int]]:
    """The folds' [start, end) over n sequences: FOLDS contiguous, near-equal folds (one per
    sequence below FOLDS; none below 2 sequences, where nothing can be held out)."""
    if n < 2:
        return []
    k = min(FOLDS, n)
    edges = [n * i // k for i in range(k + 1)]
    return list(zip(edges[:-1], edges[1:]))


def merge_sets(a: list[Observers], b: list[Observers]) -> list[Observers]:
    return [merge_observers(x, y) for x, y in zip(a, b)]


class _Memo(Observer):
    """An observer's parameters, computed once per (bits, symmetric, bound): the search builds
    many configs from the same statistics."""

    def __init__(self, inner: Observer) -> None:
        self.inner = inner
        self.memo: dict = {}

    def observe(self, values: np.ndarray) -> None:
        raise TypeError("a method view is read-only")

    def merge(self, other: Observer) -> Observer:
        raise TypeError("a method view is read-only")

    def range(self) -> tuple[float, float]:
        return self.inner.range()

    def compute_params(self, bits: int, symmetric: bool, bound: tuple[float, float] = NO_BOUND
                       ) -> tuple[int, int]:
        key = (bits, symmetric, bound)
        if key not in self.memo:
            self.memo[key] = self.inner.compute_params(bits, symmetric, bound)
        return self.memo[key]

    @property
    def empty(self) -> bool:
        return self.inner.empty


class MethodViews:
    """Observers of any method over one set of histogram observers (and an optional ema set),
    made once per tensor and method and memoised. h is one observer over both directions."""

    def __init__(self, hist: Observers, percentile: float, ema: Observers | None = None) -> None:
        self.hist, self.ema, self.percentile = hist, ema, percentile
        self.cache: dict = {}

    def observers(self, plan: MethodPlan) -> Observers:
        return [[{n: self.view(l, d, n, plan.for_layer(l).method(n)) for n in cell}
                 for d, cell in enumerate(cells)] for l, cells in enumerate(self.hist)]

    def view(self, l: int, d: int, name: str, method: str) -> Observer:
        d = 0 if name == "h" else d
        key = (l, d, name, method)
        if key not in self.cache:
            self.cache[key] = _Memo(self._make(l, d, name, method))
        return self.cache[key]

    def _make(self, l: int, d: int, name: str, method: str) -> Observer:
        o = self.hist[l][d][name]
        if name == "h":
            for other in self.hist[l][1:]:
                o = o.merge(other["h"])
        if method == "ema" and name in ("x", "h"):
            e = self.ema[l][d][name]
            for other in (self.ema[l][1:] if name == "h" else ()):
                e = e.merge(other["h"])
            return e
        if not isinstance(o, HistogramObserver):
            return o  # the gate outputs' min/max observers
        if method in ("minmax", "ema"):
            view = HistogramObserver()  # the base rule on the histogram's exact min/max
        else:
            view = METHODS[method](self.percentile) if method == "percentile" else METHODS[method]()
        view.hist = o.hist
        return view


@dataclass
class AutoChoice:
    """What auto chose: the plan, which candidate won on the held-out sequences (`per-tensor`
    or a single method), each candidate's held-out output SNR, and per tensor (layer, name) the
    method and every method's held-out squared error."""

    plan: MethodPlan
    winner: str
    held_snr_db: dict[str, float] = field(default_factory=dict)
    per_tensor: dict[tuple[int, str], str] = field(default_factory=dict)
    errors: dict[tuple[int, str], dict[str, float]] = field(default_factory=dict)
    note: str = ""

    def as_dict(self) -> dict:
        order = sorted(self.per_tensor, key=lambda k: (k[0], CHOSEN.index(k[1])))
        return {"winner": self.winner, "held_out_snr_db": self.held_snr_db, "note": self.note or None,
                "tensors": [{"layer": l, "tensor": n, "method": self.per_tensor[(l, n)],
                             "held_out_error": self.errors.get((l, n))} for l, n in order]}


class AutoCalibrator:
    """Observes calibration data once (per fold) and quantizes any bits config with the auto
    choice. `extra` makes further observer sets (the advisor's estimator) fed in the same
    float pass; `extra_sets` holds them, merged over all the data."""

    def __init__(self, model: GruModel, data: SequenceData, n: int, chunk: int = 64,
                 weights: str = "minmax", percentile: float = 99.99, ema: bool = False,
                 extra: Sequence[Callable[[], Observers]] = (),
                 progress: Callable[[int], None] | None = None) -> None:
        data.check_features(model.input_size)
        self.model, self.data, self.chunk = model, data, chunk
        self.weights, self.percentile, self.n = weights, percentile, n
        self.folds = fold_bounds(n)

        def sets() -> list[Observers]:
            out = [new_observers(model, "mse")] + [make() for make in extra]
            return out + ([new_observers(model, "ema")] if ema else [])

        parts = [sets() for _ in self.folds or [(0, n)]]
        for part, (lo, hi) in zip(parts, self.folds or [(0, n)]):
            traces: list = []
            for start in range(lo, hi, chunk):
                observe_batch(model, data.chunk(start, min(start + chunk, hi)), *part, traces=traces)
                if progress:
                    progress(min(start + chunk, hi))
        every = reduce(merge_sets, parts)
        self.parts = [[p[0]] + ([p[-1]] if ema else []) for p in parts]  # per fold: histograms, ema
        self.held = [p[0] for p in parts]
        self.all_views = MethodViews(every[0], percentile, every[-1] if ema else None)
        self.extra_sets = every[1:1 + len(extra)]
        self.fold_cache: dict[int, MethodViews] = {}
        self.held_float: dict[int, list[np.ndarray]] = {}
        self.weights_cache: dict = {}

    def fold_views(self, i: int) -> MethodViews:
        """The views fitted without fold i: every other fold's statistics, merged."""
        if i not in self.fold_cache:
            fit = reduce(merge_sets, [p for j, p in enumerate(self.parts) if j != i])
            self.fold_cache[i] = MethodViews(fit[0], self.percentile, fit[1] if len(fit) > 1 else None)
        return self.fold_cache[i]

    def fixed_plan(self, config: dict[str, TensorConfig], method: str) -> MethodPlan:
        """One method for every activation, under the config file's per-tensor methods."""
        return MethodPlan.from_config(config, method, self.weights, self.percentile)

    def build(self, config: dict[str, TensorConfig], plan: MethodPlan, info: dict,
              fold: int | None = None) -> QuantModel:
        """The quantized model from all the data, or (`fold`) from every fold but that one."""
        views = self.all_views if fold is None else self.fold_views(fold)
        return build_quant_model(self.model, views.observers(plan), config, info, plan,
                                 weights_cache=self.weights_cache)

    def choose(self, config: dict[str, TensorConfig]) -> AutoChoice:
        """Steps 1-3 of the module's recipe for one bits config."""
        if not self.folds:
            plan = self.fixed_plan(config, "minmax")
            return AutoChoice(plan, "minmax", note="auto needs 2 or more calibration sequences to "
                              "hold some out; used minmax")
        phase(f"GRU auto: each tensor's least-error method on {len(self.folds)} held-out folds")
        per_tensor, errors = self._per_tensor(config)
        base = self.fixed_plan(config, "minmax")
        layers: dict[int, dict[str, str]] = {}
        for (l, name), m in per_tensor.items():
            if m != "minmax":
                layers.setdefault(l, {})[name] = m
        for l, over in base.layer_overrides.items():  # the config file's choices stay
            layers.setdefault(l, {}).update(over)
        mix = MethodPlan("minmax", self.weights, self.percentile, base.overrides, layers)
        plans = {"per-tensor": mix, **{m: self.fixed_plan(config, m) for m in AUTO_METHODS}}
        phase(f"GRU auto: checking the choice at the GRU's output against {len(plans) - 1} single methods")
        snr = self._held_snr(config, plans)
        winner = max(plans, key=lambda k: snr[k])  # first of equals: the mix
        if winner != "per-tensor":
            per_tensor = {k: winner for k in per_tensor}
        note = coarse_bits_note(snr[winner], "the held-out sequences", None) or ""
        return AutoChoice(plans[winner], winner, snr, per_tensor, errors, note)

    def quantize(self, config: dict[str, TensorConfig], info: dict) -> tuple[QuantModel, AutoChoice]:
        choice = self.choose(config)
        # "auto: mse" where one method won; "auto (per tensor): minmax, layer0 z_pre mse, ..."
        method = f"auto (per tensor): {choice.plan.label()}" if choice.winner == "per-tensor" else \
            f"auto: {choice.plan.label()}"
        qm = self.build(config, choice.plan, {**info, "method": method})
        return qm, choice

    def _per_tensor(self, config: dict[str, TensorConfig]
                    ) -> tuple[dict[tuple[int, str], str], dict[tuple[int, str], dict[str, float]]]:
        """Per (layer, tensor) the method with the least held-out squared error over the folds."""
        cfgs = model_config(config, self.model.num_layers)
        fixed = self.fixed_plan(config, "minmax")
        errors: dict[tuple[int, str], dict[str, float]] = {}
        for i, m in ((i, m) for i in range(len(self.folds)) for m in AUTO_METHODS):
            obs = self.fold_views(i).observers(self.fixed_plan(config, m))
            for l, cells in enumerate(self.model.layers):
                for d, cell in enumerate(cells):
                    spec = cell_spec(cell, cell_observers(obs, l, d), cfgs[l], fixed.for_layer(l),
                                     weights_cache=self.weights_cache)
                    bounds = lut_input_bounds(spec, cfgs[l], cell_gates(cell.form))
                    for name in (n for n in CHOSEN if n in spec):
                        if self._fixed(fixed, l, name) or (name == "x" and (l > 0 or d > 0)):
                            continue
                        err = self._held_error(self.held[i][l][d][name], spec[name], bounds.get(name, NO_BOUND))
                        e = errors.setdefault((l, name), {})
                        e[m] = e.get(m, 0.0) + err
        choice = {k: min(AUTO_METHODS, key=lambda m: e[m]) for k, e in errors.items()}
        return choice, errors

    @staticmethod
    def _fixed(plan: MethodPlan, l: int, name: str) -> bool:
        return name in plan.overrides or name in plan.layer_overrides.get(l, {})

    @staticmethod
    def _held_error(o: Observer, t, bound: tuple[float, float]) -> float:
        if o.empty:
            return 0.0
        counts, start, _, _ = o.clamped(bound)
        qmin, qmax = qrange(t.bits)
        return float(grid_error(counts, start, o.hist.w, int(t.exp2_inv), int(t.zp), qmin, qmax))

    def held_sequences(self, i: int) -> np.ndarray:
        """Fold i's sequences the candidates are simulated on (its first ones, HELD_SIM in all)."""
        lo, hi = self.folds[i]
        return self.data.chunk(lo, min(hi, lo + -(-HELD_SIM // len(self.folds))))

    def _held_snr(self, config: dict[str, TensorConfig], plans: dict[str, MethodPlan]) -> dict[str, float]:
        """Each candidate's output SNR over every fold's held-out sequences, its model fitted on
        the other folds: one float run per fold, one integer run per distinct set of grids."""
        out = {k: Distance() for k in plans}
        for i in range(len(self.folds)):
            qms = {k: self.build(config, p, {}, fold=i) for k, p in plans.items()}
            for k, d in self._fold_snr(i, qms).items():
                out[k] = out[k].merge(d)
        return {k: d.snr_db for k, d in out.items()}

    def _fold_snr(self, i: int, qms: dict[str, QuantModel]) -> dict[str, Distance]:
        held = self.held_sequences(i)
        if i not in self.held_float:
            qm = next(iter(qms.values()))  # any: the float reference depends on the float model alone
            self.held_float[i] = [float_output(qm, held[j:j + 256]) for j in range(0, len(held), 256)]
        unique: dict[bytes, Simulation] = {}
        sims = {k: unique.setdefault(grids_key(qm), Simulation(qm, per_tensor=False, per_step=False))
                for k, qm in qms.items()}
        for j, y_float in enumerate(self.held_float[i]):
            for sim in unique.values():
                sim.run_chunk(held[j * 256:(j + 1) * 256], y_float)
        return {k: sim.output for k, sim in sims.items()}


def grids_key(qm: QuantModel) -> bytes:
    """Every tensor's (bits, exp2_inv, zp): two models with the same key compute the same."""
    parts = [np.asarray([t.bits, t.zp, *np.ravel(t.exp2_inv)], np.int64).tobytes()
             for cells in qm.cells for cq in cells for t in cq.spec.values()]
    return b"|".join(parts)



def chosen_methods(model: GruModel, plan: MethodPlan) -> list[dict[str, str]]:
    """Per layer, the method `plan` gives each tensor of the layer's cells whose method auto
    chooses (CHOSEN): what a bits file names so that `qtool calibrate --bits FILE` rebuilds the
    model in one pass, whatever its --method."""
    out = []
    for l, cells in enumerate(model.layers):
        p = plan.for_layer(l)
        mine = {n for c in cells for n in traced(c.form)}  # this layer's cells' tensors
        out.append({n: p.method(n) for n in CHOSEN if n in mine})
    return out


def all_fixed(model: GruModel, plan: MethodPlan) -> bool:
    """Whether a bits file already names the method of every tensor auto would choose."""
    return all(AutoCalibrator._fixed(plan, l, n) for l, cells in enumerate(model.layers)
               for n in CHOSEN if (n != "x" or l == 0) and any(n in traced(c.form) for c in cells))


def calibrate_auto(model: GruModel, data: SequenceData, n: int, config: dict[str, TensorConfig],
                   weights: str = "minmax", percentile: float = 99.99, chunk: int = 64,
                   progress: Callable[[int], None] | None = None, info: dict | None = None,
                   calibrators: dict | None = None) -> tuple[QuantModel, AutoChoice]:
    """`qtool calibrate --method auto`: the quantized model and what auto chose. A bits file
    that names every method (as `qtool advise` writes them) needs no choice: one pass.
    `calibrators` keeps the observations of this model on this data for the next config (the
    advisor's candidates): one float pass for all of them."""
    info = info or {}
    plan = MethodPlan.from_config(config, "minmax", weights, percentile)
    if all_fixed(model, plan):
        obs = collect(model, data, plan, chunk, n, progress)
        qm = build_quant_model(model, obs, config, {**info, "method": f"bits file: {plan.label()}"}, plan)
        return qm, AutoChoice(plan, "bits file", note="the bits file sets every tensor's method")
    methods = set(plan.overrides.values()) | {m for o in plan.layer_overrides.values() for m in o.values()}
    ema = "ema" in methods
    ac = (calibrators or {}).get(("auto", ema))
    if ac is None:
        ac = AutoCalibrator(model, data, n, chunk, weights, percentile, ema=ema, progress=progress)
        if calibrators is not None:
            calibrators["auto", ema] = ac
    return ac.quantize(config, info)
