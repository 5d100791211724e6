"""Calibration: run the float GRU over data, observe every tensor of the tensor table, and turn
the observations into a QuantModel (scales, zero points, integer weights, tables, shifts).

Ties that keep the integer program free of extra requantization:
- h is shared by both directions of a layer (one observer over both);
- the input x of layer l > 0 is the h of layer l - 1, so its integers pass through unchanged;
- z_out's range is widened to also hold 1 - z, because (1 - z) reuses z_out's parameters.

The LUT-fed pre-activations (z_pre, r_pre, g_pre) are bounded where sigmoid/tanh saturate on the
output grid: beyond that bound every input gives the same output integer, so clipping there is
free whatever the method (docs/calibration.md).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, field

import numpy as np

from qtool.calibrators import DEFAULT_PERCENTILE, Observer, make_observer
from qtool.calibrators.base import NO_BOUND
from qtool.core.model import GruCell, GruModel
from qtool.core.qmodel import CellQuant, QuantModel, TensorQ
from qtool.core.tensors import BY_NAME, BitsConfig, TensorConfig, cell_names, cell_tensors, layer_config
from qtool.errors import QtoolError
from qtool.io.files import SequenceData
from qtool.numerics.float_gru import run_float, traced
from qtool.numerics.lut import GATES, build_lut, cell_gates
from qtool.numerics.qparams import choose_qparams, grid_range, qrange, quantize
from qtool.numerics.rescale import derive_cell

Observers = list[list[dict[str, Observer]]]


def _identity(y: float) -> float:
    return y


# a table function's inverse and its range [f(-inf), f(+inf)]
INVERSE = {"sigmoid": (lambda y: math.log(y / (1.0 - y)), 0.0, 1.0), "tanh": (math.atanh, -1.0, 1.0),
           "relu": (_identity, 0.0, math.inf), "linear": (_identity, -math.inf, math.inf)}


def inverse(func: str) -> tuple[Callable[[float], float], float, float]:
    """(f^-1, f(-inf), f(+inf)) of a table function by name (qtool.numerics.lut.function)."""
    if func.startswith("hard_sigmoid:"):
        alpha, beta = (float(v) for v in func.split(":")[1:])
        return (lambda y: (y - beta) / alpha), 0.0, 1.0
    return INVERSE[func]


@dataclass
class MethodPlan:
    """The calibration method of every tensor: a config file's per-tensor `method` (for one
    layer in `layer_overrides[l]`, else for all), else `weights` for W and R, else
    `activations`. Biases (32-bit) keep min/max."""

    activations: str = "minmax"
    weights: str = "minmax"
    percentile: float = DEFAULT_PERCENTILE
    overrides: dict[str, str] = field(default_factory=dict)
    layer_overrides: dict[int, dict[str, str]] = field(default_factory=dict)

    @classmethod
    def from_config(cls, config: dict[str, TensorConfig], activations: str = "minmax",
                    weights: str = "minmax", percentile: float = DEFAULT_PERCENTILE) -> MethodPlan:
        layers = {l: {n: c.method for n, c in cfg.items() if c.method}
                  for l, cfg in getattr(config, "layers", {}).items()}
        return cls(activations, weights, percentile, {n: c.method for n, c in config.items() if c.method},
                   {l: m for l, m in layers.items() if m})

    def for_layer(self, layer: int) -> MethodPlan:
        """The plan of one layer: its own overrides over the all-layer ones."""
        if not self.layer_overrides.get(layer):
            return self
        return MethodPlan(self.activations, self.weights, self.percentile,
                          {**self.overrides, **self.layer_overrides[layer]})

    def method(self, name: str) -> str:
        kind = BY_NAME[name].kind
        default = {"bias": "minmax", "weight": self.weights}.get(kind, self.activations)
        return self.overrides.get(name, default)

    def observer(self, name: str) -> Observer:
        return make_observer(self.method(name), name, self.percentile)

    def label(self) -> str:
        def one(m: str) -> str:
            return f"percentile {self.percentile:g}" if m == "percentile" else m
        text = one(self.activations)
        if self.weights != "minmax":
            text += f", weights {one(self.weights)}"
        if self.overrides:
            text += ", " + ", ".join(f"{n} {one(m)}" for n, m in sorted(self.overrides.items()))
        for l, over in sorted(self.layer_overrides.items()):
            text += "".join(f", layer{l} {n} {one(m)}" for n, m in sorted(over.items()))
        return text


def as_plan(plan: MethodPlan | str | None) -> MethodPlan:
    return plan if isinstance(plan, MethodPlan) else MethodPlan(plan or "minmax")


def new_observers(model: GruModel, plan: MethodPlan | str) -> Observers:
    """An observer for every tensor each cell's float run records (its form's tensors)."""
    plan = as_plan(plan)
    return [[{n: plan.for_layer(l).observer(n) for n in traced(cell.form)} for cell in cells]
            for l, cells in enumerate(model.layers)]


def observe_batch(model: GruModel, x: np.ndarray, *obs_sets: Observers, traces: list | None = None) -> None:
    """Run the float GRU on one batch `[N, T, C]` once and feed every traced tensor to its
    observer in each set. `traces` may carry the trace arrays over from the previous batch."""
    traces = [] if traces is None else traces
    run_float(model, x, traces)
    for l, cells in enumerate(traces):
        for d, trace in enumerate(cells):
            for name, values in trace.items():
                if name == "x" and d == 1:
                    continue  # the backward direction sees the same inputs, reversed
                for obs in obs_sets:
                    obs[l][d][name].observe(values)


def collect_many(model: GruModel, data: SequenceData, plans: list[MethodPlan | str], chunk: int = 64,
                 limit: int | None = None, progress: Callable[[int], None] | None = None
                 ) -> list[Observers]:
    """Observe the float GRU over the data for several plans in one pass, streamed in chunks of
    `chunk` sequences; `progress(done)` sees the number of sequences observed so far."""
    data.check_features(model.input_size)
    sets = [new_observers(model, p) for p in plans]
    traces: list = []
    for start, x in data.chunks(chunk, limit):
        observe_batch(model, x, *sets, traces=traces)
        if progress:
            progress(start + len(x))
    return sets


def collect(model: GruModel, data: SequenceData, plan: MethodPlan | str, chunk: int = 64,
            limit: int | None = None, progress: Callable[[int], None] | None = None) -> Observers:
    return collect_many(model, data, [plan], chunk, limit, progress)[0]


def merge_observers(a: Observers, b: Observers) -> Observers:
    """Observers of the same model and plan from disjoint data (other files, other processes:
    they pickle) merged into one, as if one pass had seen all of it."""
    return [[{n: o.merge(b[l][d][n]) for n, o in cell.items()} for d, cell in enumerate(layer)]
            for l, layer in enumerate(a)]


def _observer(obs: Observers, l: int, d: int, name: str) -> Observer:
    """The observer whose statistics set a tensor's parameters, after the ties."""
    if name == "x" and l > 0:
        return _observer(obs, l - 1, 0, "h")
    if name == "h":
        merged = obs[l][0]["h"]
        for other in obs[l][1:]:
            if other["h"] is not obs[l][0]["h"]:  # directions may already share one observer
                merged = merged.merge(other["h"])
        return merged
    return obs[l][0 if name == "x" else d][name]


def cell_observers(obs: Observers, l: int, d: int) -> dict[str, Observer]:
    """The observers that set one cell's parameters, after the ties."""
    return {n: _observer(obs, l, d, n) for n in obs[l][d]}


def tensor_q(o: Observer, cfg: TensorConfig, bound: tuple[float, float] = NO_BOUND,
              name: str = "") -> TensorQ:
    """Parameters from the observer; the recorded range is the part of its range the grid keeps."""
    try:
        return _observed_q(o, cfg, bound)
    except QtoolError as e:
        raise QtoolError(f"{name}: {e}" if name else str(e)) from None


def _observed_q(o: Observer, cfg: TensorConfig, bound: tuple[float, float]) -> TensorQ:
    if o.empty:
        e, zp = choose_qparams(0.0, 0.0, cfg.bits, cfg.symmetric)
        return TensorQ(cfg.bits, cfg.symmetric, e, zp, 0.0, 0.0)
    e, zp = o.compute_params(cfg.bits, cfg.symmetric, bound)
    lo, hi = o.range()
    g_lo, g_hi = grid_range(e, zp, cfg.bits)
    return TensorQ(cfg.bits, cfg.symmetric, e, zp, max(lo, g_lo, bound[0]), min(hi, g_hi, bound[1]))


def saturation_bound(func: str, out: TensorQ, bits_in: int) -> tuple[float, float]:
    """Inputs beyond which `func` quantized on the `out` grid no longer changes: below lo (above
    hi) every input rounds to the output integer of f(-inf) (f(+inf)). Widened by the most one
    step of a `bits_in` grid over the bound can be, so rounding the bound itself stays free."""
    f_inv, f_min, f_max = inverse(func)
    qmin, qmax = qrange(out.bits)
    step = math.ldexp(1.0, -out.exp2_inv)

    def level(y: float) -> int:
        if math.isinf(y):  # relu's and linear's ends: the grid's own
            return qmax if y > 0 else qmin
        return int(min(max(math.floor(y / step + 0.5) + out.zp, qmin), qmax))

    # round-half-up: y gives level k iff (k - zp - 0.5) step <= y < (k - zp + 0.5) step
    y_hi = (level(f_max) - out.zp - 0.5) * step
    y_lo = (level(f_min) - out.zp + 0.5) * step
    hi = f_inv(y_hi) if f_min < y_hi < f_max else math.inf
    lo = f_inv(y_lo) if f_min < y_lo < f_max else -math.inf
    if math.isinf(lo) or math.isinf(hi) or hi <= lo:
        return NO_BOUND
    margin = (hi - lo) / ((1 << bits_in) - 3)
    return lo - margin, hi + margin


def _per_channel(name: str, values: np.ndarray, cfg: TensorConfig, plan: MethodPlan) -> TensorQ:
    """Symmetric parameters per output channel (row), each from its own observer."""
    rows = values.reshape(values.shape[0], -1)
    e, lo, hi = [], [], []
    for row in rows:
        o = plan.observer(name)
        o.observe(row[None])
        t = tensor_q(o, cfg, name=name)
        e.append(t.exp2_inv)
        lo.append(t.lo)
        hi.append(t.hi)
    return TensorQ(cfg.bits, True, np.array(e, np.int32), 0, np.array(lo), np.array(hi))


def lut_input_bounds(spec: dict[str, TensorQ], config: dict[str, TensorConfig], gates=GATES
                     ) -> dict[str, tuple[float, float]]:
    """The saturation bound of each LUT input (z_pre, r_pre, g_pre) from its output's grid
    (`gates`: the cell's, lut.cell_gates)."""
    return {src: saturation_bound(func, spec[dst], config[src].bits) for _, func, src, dst in gates}


def _tied(cell: GruCell) -> tuple[str, ...]:
    """A relu or linear candidate's g_out takes g_pre's grid: its table is then the identity (relu:
    above g_pre's zero point, which is the grid's lowest level), exact under interpolation at any
    input width. For tanh, nothing is tied."""
    return ("g_out",) if cell.form.candidate in ("relu", "linear") else ()


def _identity_candidate(cell: GruCell, g_pre: Observer | TensorQ, cfg: TensorConfig) -> dict[str, TensorQ]:
    """g_pre's and g_out's grid of a relu or linear candidate. relu's g_pre keeps [0, hi] with its
    zero point at the lowest level: every negative sum saturates to 0, which relu maps to 0."""
    if isinstance(g_pre, TensorQ):  # given (imported or trained ranges)
        return {"g_pre": g_pre, "g_out": g_pre}
    if cell.form.candidate == "linear" or cfg.symmetric:
        t = tensor_q(g_pre, cfg, name="g_pre")
    else:
        t = tensor_q(g_pre, cfg, (0.0, math.inf), "g_pre")
        qmin, _ = qrange(cfg.bits)
        _, g_hi = grid_range(t.exp2_inv, qmin, cfg.bits)
        t = TensorQ(cfg.bits, False, t.exp2_inv, qmin, max(float(t.lo), 0.0), min(float(t.hi), g_hi))
    return {"g_pre": t, "g_out": t}


def cell_spec(cell: GruCell, observers: dict[str, Observer], config: dict[str, TensorConfig],
              plan: MethodPlan | None = None, fixed: dict[str, TensorQ] | None = None,
              weights_cache: dict | None = None) -> dict[str, TensorQ]:
    """Every tensor's grid in one cell; tensors in `fixed` keep the quantization given there
    (imported or trained ranges). `weights_cache` keeps the per-channel grids of this cell's
    weights for configs built one after another."""
    plan = plan or MethodPlan()
    spec: dict[str, TensorQ] = dict(fixed or {})
    cache = {} if weights_cache is None else weights_cache
    for name in ("W", "R", "bx", "br"):
        if name in spec:
            continue
        key = (id(cell), name, config[name], plan.method(name), plan.percentile)
        if key not in cache:
            cache[key] = _per_channel(name, getattr(cell, name), config[name], plan)
        spec[name] = cache[key]
    for name, o in observers.items():
        if name in spec:
            continue
        if name == "z_out":  # 1 - z must fit the same grid
            lo, hi = o.range()
            o = make_observer("minmax", name)
            o.observe(np.array([[lo, hi, 1.0 - hi, 1.0 - lo]]))
        if name not in ("z_pre", "r_pre", "g_pre", *_tied(cell)):
            spec[name] = tensor_q(o, config[name], name=name)
    if _tied(cell) and "g_out" not in spec:
        spec.update(_identity_candidate(cell, spec.get("g_pre") or observers["g_pre"], config["g_pre"]))
    for src, bound in lut_input_bounds(spec, config, cell_gates(cell.form)).items():
        if src not in spec:
            spec[src] = tensor_q(observers[src], config[src], bound, src)
    return spec


def quantize_cell(cell: GruCell, observers: dict[str, Observer], config: dict[str, TensorConfig],
                  plan: MethodPlan | None = None, fixed: dict[str, TensorQ] | None = None,
                  weights_cache: dict | None = None) -> CellQuant:
    """Parameters, integer weights, tables and shifts of one cell from its tensors' observers."""
    return cell_from_spec(cell, cell_spec(cell, observers, config, plan, fixed, weights_cache))


def cell_from_spec(cell: GruCell, spec: dict[str, TensorQ]) -> CellQuant:
    """Integer weights, tables and shifts of one cell whose every tensor's quantization is known."""
    q = {n: quantize(getattr(cell, n), spec[n].exp2_inv, 0, spec[n].bits) for n in ("W", "R", "bx", "br")}
    luts, shifts, errors = {}, [], {}
    for lut, func, src, dst in cell_gates(cell.form):
        a, b = spec[src], spec[dst]
        luts[lut], shift, errors[lut] = build_lut(func, a.bits, a.exp2_inv, a.zp,
                                                  b.bits, b.exp2_inv, b.zp)
        shifts.append(shift)
    P, CH = derive_cell(cell.form, spec, q["W"], q["R"], q["bx"], q["br"], tuple(shifts))
    spec = {t.name: spec[t.name] for t in cell_tensors(cell.form)}
    return CellQuant(spec, q["W"], q["R"], q["bx"], q["br"], P, CH, luts, errors, cell.form)


def model_config(config: dict[str, TensorConfig], num_layers: int) -> list[dict[str, TensorConfig]]:
    """The config of every layer; the x of layer l > 0 takes the bits of layer l - 1's h."""
    extra = [l for l in getattr(config, "layers", {}) if l >= num_layers]
    if extra:
        raise QtoolError(f"the bits config sets layer {max(extra)}; the model has {num_layers} layer(s)")
    cfgs = [layer_config(config, l) for l in range(num_layers)]
    for l in range(1, num_layers):
        cfgs[l]["x"] = cfgs[l - 1]["h"]
    return cfgs


def check_named(models: list[GruModel], config: dict[str, TensorConfig], whole: bool = False) -> None:
    """A bits file that names a tensor no cell of the models (or of the layer it names) has, a
    g_out of other bits than its g_pre where a relu or linear candidate ties the two, or (`whole`
    False: a GRU alone) `graph` tables, is refused in one line: it would otherwise be silently
    ignored. `models`: every GRU the config quantizes (a whole model's GRUs share it)."""
    source, named = getattr(config, "named", None) or ("", set())
    if source and getattr(config, "graph", None) and not whole:
        raise QtoolError(f"{source}: [graph.{next(iter(config.graph))}]: graph tables set a whole model's layers; "
                         "this is a GRU alone")
    for l, name in sorted(named, key=lambda k: (k[0] is not None, k[0] or 0, k[1])):
        where = "" if l is None else f"layers.{l}."
        cells = [c for m in models for ll, row in enumerate(m.layers) if l in (None, ll) for c in row]
        if not any(name in cell_names(c.form) for c in cells):
            forms = "a reset-before cell" if name == "rh" else "a haste-form (reset-after) cell"
            scope = "" if l is None else f"of layer {l} "
            raise QtoolError(f"{source}: {where}{name}: no GRU cell {scope}of this model has it ({name} belongs "
                             f"to {forms})")
        if name != "g_out":
            continue
        for m in models:
            cfgs = model_config(config, m.num_layers)
            if any(l in (None, ll) and any(_tied(c) for c in row) and cfgs[ll]["g_out"].bits != cfgs[ll]["g_pre"].bits
                   for ll, row in enumerate(m.layers)):
                raise QtoolError(f"{source}: {where}g_out: a relu or linear candidate's g_out takes g_pre's "
                                 f"grid (its table is the identity); set g_pre's bits instead")


def checked_once(config: dict[str, TensorConfig]) -> dict[str, TensorConfig]:
    """The config with what a bits file named already checked (`check_named` over every GRU of a
    whole model): each GRU's own build then skips the check that only the whole can make."""
    if not getattr(config, "named", None):
        return config
    return BitsConfig(dict(config), config.layers, config.graph)


def build_quant_model(model: GruModel, obs: Observers | None, config: dict[str, TensorConfig],
                      info: dict, plan: MethodPlan | str | None = None,
                      fixed: list[list[dict[str, TensorQ]]] | None = None,
                      weights_cache: dict | None = None) -> QuantModel:
    """Turn observations into a QuantModel. Layers l > 0 take their x bits from h. `fixed[l][d]`
    holds tensors whose quantization is already known (the ties must hold among them); with every
    tensor fixed, `obs` may be None."""
    check_named([model], config)
    plan = as_plan(plan)
    cells = []
    for l, (layer, cfg) in enumerate(zip(model.layers, model_config(config, model.num_layers))):
        row = []
        for d, cell in enumerate(layer):
            observers = cell_observers(obs, l, d) if obs is not None else {}
            row.append(quantize_cell(cell, observers, cfg, plan.for_layer(l), fixed[l][d] if fixed else None,
                                     weights_cache))
        cells.append(row)
    return QuantModel(model, cells, info)
