"""`qtool advise` for a whole model (docs/advisor.md, "Whole models"): int8 or int16 per unit.

A unit is a layer's weights, a layer's (or the model input's) output, or a tensor of the GRUs
(the bits file's tensors and layers tables, which every GRU of the model shares). The rule is
the GRU's: the P_zero prediction at 8 bits (qtool.advisor.pzero) of every product (a dense,
conv or batchnorm layer's weights times its input; the GRU's own products) and of every other
tensor; a unit whose lowest prediction is at most T dB gets 16 bits. With held-out data the
search measures (qtool.advisor.search.UnitSearch), promoting units in the order of that
prediction, lowest first. Every configuration is calibrated by `--method auto`; the bits file
names the method of every edge and GRU tensor that calibration chose, so that `qtool calibrate
--bits FILE` (any --method) rebuilds the very same model.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from qtool.advisor import pzero
from qtool.advisor.advise import Advice, with_methods
from qtool.advisor.configs import HIGH, LOW, TIED, all_units, bits_config, flash_bytes, unit_key
from qtool.advisor.search import UnitSearch, unit_snr
from qtool.advisor.stats import model_stats, new_estimators
from qtool.calibration.observe import model_config, observe_batch
from qtool.calibrators.sampled import SampledStatsObserver, observer_seed
from qtool.core.graph import Graph, Node
from qtool.core.qgraph import QGraph
from qtool.core.tensors import METHOD_NAMES, BitsConfig, bits_from_table, bits_table, preset_config, table_toml
from qtool.errors import QtoolError
from qtool.graph.calibrate import FILE_CANDIDATES, SELF_CALIBRATED, Prepared, auto_graph, prepare, quantize_graph
from qtool.graph.simulate import output_snr_db, simulate_graph
from qtool.io.files import SequenceData
from qtool.io.phases import phase
from qtool.layers import check_data, layer
from qtool.numerics.qparams import dequantize

Progress = Callable[[str, int, int | None], None]
ADVISED = Path("the advised bits file")  # what errors in the file `Space.table` writes would name


def graph_flash(qg: QGraph) -> int:
    """The whole model's flash as `qtool export c` counts it: each GRU's, and every other layer's
    from the C its module writes (qtool.exporters.c_graph.node_flash)."""
    from qtool.exporters.c_graph import node_flash

    return sum(flash_bytes(qg.qparams[name]["qm"]) if "qm" in qg.qparams[name] else node_flash(qg, name)
               for name in qg.core)


@dataclass
class GraphCandidate:
    promoted: frozenset
    qg: QGraph
    flash: int
    snr_db: float  # measured output SNR on the evaluation data (nan: not measured)

    def methods(self) -> dict:
        """What auto chose, as a GRU's `methods` says it (`advise --json`): the winner, its
        held-out output SNR (None when scored on the calibration data), and each edge's method."""
        auto = self.qg.info.get("auto", {})
        chosen = auto.get("chosen")
        held = auto.get("output_snr_db", {}).get(chosen) if auto.get("held_out") else None
        return {"winner": chosen, "held_out_snr_db": held,
                "edges": [{"edge": e, "method": m} for e, m in self.qg.info.get("edge_methods", {}).items()]}


@dataclass
class Space:
    """The units of one prepared model, which unit sets each edge's bits, and each unit's lowest
    predicted SNR at 8 bits."""

    prep: Prepared
    rows: int
    edge_unit: dict[str, tuple]
    units: list[tuple]
    predicted: dict[tuple, float]
    grus: list[Node]

    def table(self, promoted: frozenset, qg: QGraph | None = None) -> dict:
        """The bits file of a configuration (as `bits_table`): int8 everywhere, 16 bits on the
        promoted units (a GRU layer whose g_out is no unit, tied to g_pre in every GRU, takes
        g_pre's bits there): the GRUs' tensors, and a [graph.NAME] table per layer whose bits differ
        from a layer's default (the file's W and h). With `qg`, calibrated on this configuration,
        also the method qg's calibration gave every observed edge and every GRU tensor (the file
        sets a tensor once for all GRUs: where they chose differently, the first GRU's), so that
        `qtool calibrate --bits FILE` rebuilds qg whatever its --method."""
        layers = max((SELF_CALIBRATED[n.op](n).num_layers for n in self.grus), default=1)
        tied_at = frozenset(l for l, n in self.units if n == TIED["g_out"] and (l, "g_out") not in self.units)
        cfgs = model_config(bits_config(None, frozenset(u for u in promoted if not isinstance(u[0], str)), tied_at),
                            layers)
        graph: dict[str, dict] = {}
        if qg is not None:
            methods: list[dict[str, str]] = [{} for _ in range(layers)]
            for node in self.grus:
                for l, named in enumerate(qg.info["gru_methods"][node.name]):
                    for name, m in named.items():
                        methods[l].setdefault(name, m)
            with_methods(cfgs, methods)
            g = self.prep.graph
            owner = {e: e for e in g.inputs} | {e: n.name for n in g.nodes for e in n.outputs}
            for e, m in qg.info["edge_methods"].items():
                if m in METHOD_NAMES:  # not a GRU's edge, a shared or a file's grid
                    graph.setdefault(owner[e], {})["method"] = m
        table = bits_table("int8", cfgs, methods_apart=True)  # the methods leave the layers' defaults as they are
        base = bits_from_table(table, ADVISED)
        default = {"weight": base["W"].bits, "activation": base["h"].bits}  # a layer's (qtool.graph.calibrate)
        for name, kind in (u for u in self.units if isinstance(u[0], str)):
            bits = HIGH if (name, kind) in promoted else LOW
            if bits != default[kind]:
                graph.setdefault(name, {})[kind] = bits
        table["graph"] = {name: {k: graph[name][k] for k in ("weight", "activation", "method") if k in graph[name]}
                          for name in sorted(graph)}
        return table

    def config(self, promoted: frozenset, qg: QGraph | None = None) -> BitsConfig:
        """The configuration as its bits file (`table`) reads: what `qtool calibrate --bits FILE`
        calibrates."""
        return bits_from_table(self.table(promoted, qg), ADVISED)


def _stats(values: np.ndarray, key: str, seed: int, gamma: float, repeats: int):
    o = SampledStatsObserver(gamma, repeats, observer_seed(seed, key))
    o.observe(np.asarray(values, np.float64).reshape(1, -1))
    return o.stats()


WEIGHTS = ("W", "gamma", "alpha")  # the params a layer keeps on its weight bits: a GEMM's, a layernorm's scale, slopes


def _weights(node: Node, qp: dict) -> np.ndarray | None:
    """A layer's float weights on its weight bits (a batchnorm's per-channel factors: its integers
    read back; a layernorm's gamma, a prelu's slopes); None for a layer without."""
    if "q_W" in qp and "W" not in node.params:
        return dequantize(qp["q_W"].reshape(len(qp["q_W"]), -1), qp["exp2_inv_W"][:, None], 0)
    return next((node.params[k] for k in WEIGHTS if k in node.params and f"q_{k}" in qp), None)


def space(prep: Prepared, rows: int, seed: int, gamma: float, repeats: int, chunk: int) -> Space:
    g = prep.graph
    core = [n for n in g.nodes if n.name in prep.core]
    grus = [n for n in core if n.op in SELF_CALIBRATED]
    edge_unit: dict[str, tuple] = {}
    predicted: dict[tuple, float] = {}

    def low(u: tuple, db: float) -> None:
        predicted[u] = min(predicted.get(u, math.inf), db)

    edge_stats: dict[str, object] = {}  # an edge read by a weighted layer is estimated once

    def of_edge(e: str):
        if e not in edge_stats:
            edge_stats[e] = _stats(prep.values[e][:rows], e, seed, gamma, repeats)
        return edge_stats[e]
    for node in grus:
        m = SELF_CALIBRATED[node.op](node)
        edge_unit[node.inputs[0]] = (0, "x")
        edge_unit[node.outputs[0]] = (m.num_layers - 1, "h")
        obs = new_estimators(m, seed, gamma, repeats)
        x_gru = layer(node.op, node.label).sequences(node, prep.values[node.inputs[0]][:rows])
        for _, x in SequenceData(x_gru, False, node.name).chunks(chunk):
            observe_batch(m, x, obs)
        for u, db in unit_snr(model_stats(m, obs, seed, gamma, repeats), m).items():
            low(u, db)
    for e in g.inputs:
        edge_unit.setdefault(e, (e, "activation"))
    int8 = quantize_graph(prep, rows, BitsConfig(preset_config("int8")), "minmax", 99.99, chunk, None)
    for node in (n for n in core if n.op not in SELF_CALIBRATED):
        shares = node.op in getattr(layer(node.op, node.label), "SHARES_GRID", ())
        for e in node.outputs:
            if e in int8.info["fused_clamps"]:  # its grid is its relu's
                clamp = int8.node(int8.info["fused_clamps"][e])
                edge_unit.setdefault(e, edge_unit.get(clamp.outputs[0], (clamp.name, "activation")))
            edge_unit.setdefault(e, edge_unit[node.inputs[0]] if shares else (node.name, "activation"))
        weights = _weights(node, int8.qparams[node.name])
        if weights is not None:
            w = _stats(weights, f"{node.name}.W", seed, gamma, repeats)
            x = of_edge(node.inputs[0])
            db = pzero.snr_db(pzero.p_zero(w, LOW), pzero.p_zero(x, LOW))
            low((node.name, "weight"), db)
            low(edge_unit[node.inputs[0]], db)
    for e, u in edge_unit.items():  # every other edge: the one-vector form
        if isinstance(u[0], str):
            low(u, pzero.snr_db(pzero.p_zero(of_edge(e), LOW)))
    gru_units = list(dict.fromkeys(u for n in grus for u in all_units(SELF_CALIBRATED[n.op](n))))
    graph_units = list(dict.fromkeys(u for u in [*edge_unit.values(), *predicted] if isinstance(u[0], str)))
    return Space(prep, rows, edge_unit, gru_units + graph_units, predicted, grus)


class GraphEvaluator:
    """Builds a configuration by `--method auto`, counts its flash and measures its output SNR
    on the evaluation data (none: not measured); remembers every configuration it saw."""

    def __init__(self, sp: Space, data: SequenceData | None, percentile: float, chunk: int, info: dict,
                 on_simulation: Callable[[int], None] | None = None) -> None:
        self.sp, self.data, self.percentile, self.chunk, self.info = sp, data, percentile, chunk, info
        self.seen: dict[frozenset, GraphCandidate] = {}
        self.simulations = 0
        self.on_simulation = on_simulation

    def __call__(self, promoted: frozenset) -> GraphCandidate:
        if promoted not in self.seen:
            phase(f"advise: calibrating a configuration of {len(promoted)} unit{'s' * (len(promoted) != 1)} at 16 bits"
                  + (f", simulation {self.simulations + 1}" if self.data is not None else ""))
            qg = auto_graph(self.sp.prep, self.sp.rows, self.sp.config(promoted), self.percentile, self.chunk,
                            dict(self.info), candidates=FILE_CANDIDATES)  # its bits file rebuilds the model
            snr = math.nan
            if self.data is not None:
                snr = output_snr_db(simulate_graph(qg, self.data), qg)
                self.simulations += 1
                if self.on_simulation:
                    self.on_simulation(self.simulations)
            self.seen[promoted] = GraphCandidate(promoted, qg, graph_flash(qg), snr)
        return self.seen[promoted]

    def flash_only(self, promoted: frozenset, like: GraphCandidate) -> int:
        """Flash of a configuration on min/max grids (no choice, no simulation): what orders the
        searches' units by cost, not a figure to print."""
        return graph_flash(quantize_graph(self.sp.prep, self.sp.rows, self.sp.config(promoted), "minmax",
                                          self.percentile, self.chunk, None))


class GraphSearch(UnitSearch):
    """The searches over a whole model's units, in the order of their predicted SNR at 8 bits."""

    def __init__(self, ev: GraphEvaluator) -> None:
        super().__init__(ev, ev.sp.units)

    def _order(self) -> list:
        """Lowest predicted SNR first; flash-free units before costly ones of the same SNR."""
        p = self.ev.sp.predicted
        return sorted(self.units, key=lambda u: (p.get(u, math.inf), max(self.cost[u], 0), unit_key(u)))

    def least_important(self, promoted: frozenset, free: list) -> list:
        p = self.ev.sp.predicted
        return sorted(free, key=lambda u: (-p.get(u, math.inf), unit_key(u)))


def unit_name(u: tuple) -> tuple[str, str]:
    """(layer, tensor) as the tables print a unit: a GRU tensor of layer l, or a layer's output
    or weights."""
    if isinstance(u[0], str):
        return u[0], "output" if u[1] == "activation" else "weights"
    return f"GRU layer {u[0]}", u[1]


def unit_rows(sp: Space, chosen: GraphCandidate, measured: dict[str, float]) -> list[dict]:
    """One row per unit: what it is, its lowest predicted SNR at 8 bits, the measured SNR of the
    edge it sets (layers' outputs), its bits."""
    edges: dict[tuple, str] = {}
    fused = chosen.qg.info.get("fused_clamps", {})  # on its relu's grid: the relu's edge is the unit's
    for e, u in sp.edge_unit.items():
        if e not in fused:
            edges.setdefault(u, e)
    rows = []
    for u in sp.units:
        name, tensor = unit_name(u)
        if isinstance(u[0], str) and u[0] in sp.prep.graph.inputs:  # not a GRU's tensor of the same name
            name = f"input {name}"
        e = edges.get(u) if u[1] != "weight" else None
        rows.append({"layer": name, "tensor": tensor, "edge": e, "predicted_int8_db": sp.predicted.get(u),
                     "measured_snr_db": measured.get(e) if e else None,
                     "bits": HIGH if u in chosen.promoted else LOW})
    return rows


def as_file_builds(sp: Space, chosen: GraphCandidate, data: SequenceData | None, percentile: float, chunk: int,
                   info: dict) -> GraphCandidate:
    """The chosen model as its bits file (`Space.table` with its methods) rebuilds it: the same
    model, or (GRUs that chose differently for a tensor the file sets once) the rebuilt one,
    measured anew."""
    qg = quantize_graph(sp.prep, sp.rows, sp.config(chosen.promoted, chosen.qg), "minmax", percentile, chunk,
                        {**info, "method": "bits file"})
    if qg.fingerprint() == chosen.qg.fingerprint():
        return chosen
    snr = output_snr_db(simulate_graph(qg, data), qg) if data is not None else math.nan
    return GraphCandidate(chosen.promoted, qg, graph_flash(qg), snr)


def advise_graph(graph: Graph, data: SequenceData, n: int, eval_data: SequenceData | None = None,
                 target_db: float | None = None, max_flash: int | None = None, threshold_db: float = 18.5,
                 seed: int = 0, gamma: float = 0.01, repeats: int = 5, chunk: int = 64,
                 progress: Progress | None = None, info: dict | None = None) -> Advice:
    """Predict, decide (and search, with `eval_data` and a target or a budget) for a whole model."""
    if (target_db is not None or max_flash is not None) and eval_data is None:
        raise QtoolError("`target_snr` and `max_flash` need `test`: held-out sequences to measure the output SNR on")
    if not 0.0 < gamma <= 1.0 or repeats < 1:
        raise QtoolError("`gamma` must be in (0, 1] and `repeats` at least 1")
    t0 = time.perf_counter()
    tick = progress or (lambda *a: None)
    config0 = BitsConfig(preset_config("int8"))
    prep = prepare(graph, data, n, config0, chunk, lambda done: tick("calibrating", done, n))
    if eval_data is not None:
        check_data(prep.graph, eval_data)
    sp = space(prep, n, seed, gamma, repeats, chunk)
    info = {"bits": "advise", **(info or {}), "method": "auto"}
    ev = GraphEvaluator(sp, eval_data, 99.99, chunk, info, lambda k: tick("simulations", k, None))
    search = GraphSearch(ev)
    if target_db is not None:
        mode, chosen = "target", search.for_target(target_db, max_flash)
    elif max_flash is not None:
        mode, chosen = "budget", search.within(max_flash)
    else:
        mode = "rule"
        chosen = ev(frozenset(u for u in sp.units if sp.predicted.get(u, math.inf) <= threshold_db))
    chosen = as_file_builds(sp, chosen, eval_data, 99.99, chunk, info)
    if eval_data is not None:
        presets = {k: {"flash_bytes": c.flash, "snr_db": c.snr_db}
                   for k, c in (("int8", search.low), ("w8a16", search.w8a16), ("int16", search.high))}
    else:  # flash alone, each preset built as `qtool calibrate --bits PRESET` builds it (method auto:
        # a LUT's size follows its input's grid, so min/max grids would count other tables)
        presets = {k: {"flash_bytes": c.flash} for k, c in (("int8", search.low), ("w8a16", search.w8a16),
                                                             ("int16", search.high))}
    measured: dict[str, float] = {}
    measured_on = "nothing (no `test`: predictions only)"
    if eval_data is not None:
        sim = simulate_graph(chosen.qg, eval_data)
        measured = {e: d.snr_db for e, d in sim.edges.items()}
        measured_on = f"{eval_data.num_sequences} test sequences of {Path(eval_data.name).name}"
    at = ", ".join(chosen.qg.core_outputs)
    snr = (f"output SNR {chosen.snr_db:.2f} dB at the integer core's output ({at}) measured on {measured_on}"
           if eval_data is not None
           else "output SNR not measured (no held-out data)")
    comment = (f"qtool advise: {mode}; {snr}; flash {chosen.flash:,} bytes; {len(chosen.promoted)} of "
               f"{len(sp.units)} units at 16 bits")
    return Advice(mode, chosen, measured_on, None, unit_rows(sp, chosen, measured), presets,
                       table_toml(sp.table(chosen.promoted, chosen.qg), comment), threshold_db, ev.simulations,
                       time.perf_counter() - t0, target_db, max_flash, unit_count=len(sp.units))


__all__ = ["advise_graph", "graph_flash"]
