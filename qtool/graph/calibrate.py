"""Calibrate a whole model: every edge's grid and every layer's integers (docs/graph.md,
"Calibration").

One float pass over the calibration data records every edge the integer core reads or writes.
Each GRU is calibrated on its own input exactly as `qtool calibrate` calibrates a GRU alone
(qtool.calibration), which fixes the grid of its input edge (x's) and of its output (h's). The
grid passes then give every other edge its grid in graph order:

- share_grids: an op that only moves or selects values (zero_pad1d, last_step, max pooling)
  keeps its input's grid on its output, so its integers pass unchanged;
- fuse_clamps: a layer whose output only a relu or relu6 reads writes onto that relu's grid,
  so the grid spans the relu's range and each value is rounded once;
- every other edge is observed: with `method` "per-edge", per edge the method (minmax,
  percentile, mse) whose grid leaves the least squared error on the data; otherwise the method
  named.

`method` auto (`auto_graph`) checks that choice at the model's output: per-edge, minmax, mse
and three percentiles each calibrate on the first 80% of the data and are scored on the rest
(under 10 sequences: on all of it); the best is then calibrated on all of it.

Layer integers follow from the grids (each layer module's `quantize`).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

import numpy as np

from qtool.calibration.observe import (
    MethodPlan,
    build_quant_model,
    cell_from_spec,
    check_named,
    checked_once,
    collect,
    tensor_q,
)
from qtool.calibrators import make_observer
from qtool.core.graph import Graph, Node
from qtool.core.qgraph import QGraph
from qtool.core.qmodel import QuantModel, TensorQ
from qtool.core.tensors import TensorConfig
from qtool.engine.metrics import coarse_bits_note
from qtool.errors import QtoolError
from qtool.graph.passes import partition, run_float_passes
from qtool.io.files import ModelData, SequenceData, rows
from qtool.io.phases import phase
from qtool.layers import check_data, layer, run
from qtool.layers.gru import model as gru_model
from qtool.layers.integer import LayerBits
from qtool.numerics.qparams import dequantize, quantize

AUTO_METHODS = ("minmax", "percentile", "mse")
# The calibrate stage's table: the ops calibrated as a model of their own on their input's values
# (a GRU's tensors by the GRU pipeline, qtool.calibration), op -> the float model of such a node.
SELF_CALIBRATED = {"gru": gru_model}
MAX_ERROR_SAMPLES = 1 << 21  # values an edge's auto choice measures its error on
# A grid per input channel (scale_input_channels) where a channel's own grid would be at least this
# many bits finer than the input's one grid; a channel's shift is at most SHIFT_MAX
SHIFT_MIN_GAIN, SHIFT_MAX = 2, 15


def layer_bits(config: dict[str, TensorConfig], name: str | None = None, method_weights: str = "minmax"
               ) -> LayerBits:
    """The bits of a layer around the GRU: the GRU's weight, bias and activation bits, or what
    the bits file's `graph` table sets for layer `name`; its weights' range method."""
    entry = getattr(config, "graph", {}).get(name, {})
    return LayerBits(entry.get("weight", config["W"].bits), entry.get("bias", config["bx"].bits),
                     entry.get("activation", config["h"].bits), method_weights)


def check_bits_names(graph: Graph, config: dict[str, TensorConfig]) -> None:
    """Every layer a bits file's `graph` table names is a layer (not a GRU: its tensors are set by
    `tensors` and `layers`) or an input of the model."""
    nodes = {n.name: n for n in graph.nodes}
    for name in getattr(config, "graph", {}):
        if name in graph.inputs:
            continue
        if name not in nodes:
            known = ", ".join([*graph.inputs, *(n for n in nodes if nodes[n].op not in SELF_CALIBRATED)][:8])
            raise QtoolError(f"the bits file's graph table names '{name}', which is no layer of the model "
                             f"(layers: {known}, ...)")
        if nodes[name].op in SELF_CALIBRATED:
            raise QtoolError(f"the bits file's graph table names the GRU '{name}': a GRU's bits are its "
                             "tensors' (the file's tensors and layers tables)")


def clamp_reader(graph: Graph, edge: str, core: list[str]) -> Node | None:
    """The clamp (a relu, relu6: its layer's `clamps_only`) that alone reads `edge`. The edge's
    writer then writes onto the clamp's output grid (fuse_clamps): a grid of the clamp's range,
    not the writer's, rounded onto once, and the clamp clamps on it."""
    readers = graph.consumers(edge)
    if len(readers) != 1 or edge in graph.outputs or readers[0].name not in core:
        return None
    r = readers[0]
    return r if getattr(layer(r.op, r.label), "clamps_only", lambda _: False)(r) else None


def edge_values(graph: Graph, core: list[str], data: SequenceData, n: int, chunk: int,
                progress: Callable[[int], None] | None) -> dict[str, np.ndarray]:
    """Every edge of the core over the first `n` sequences, float32, batch first."""
    edges = set(graph.inputs) | {e for node in graph.nodes if node.name in core for e in node.outputs}
    parts: dict[str, list] = {e: [] for e in edges}
    for start, x in data.chunks(chunk, n):
        values = run(graph, x, keep=True)
        for e in edges:
            parts[e].append(values[e])
        if progress:
            progress(start + rows(x))
    return {e: np.concatenate(v) for e, v in parts.items()}


def _squared_error(v: np.ndarray, g: TensorQ) -> float:
    q = quantize(v, int(g.exp2_inv), g.zp, g.bits)
    return float(np.square(dequantize(q, int(g.exp2_inv), g.zp) - v).sum())


def observed_grid(values: np.ndarray, bits: int, method: str, percentile: float, name: str) -> tuple[TensorQ, str]:
    """An asymmetric grid for one edge from its values, and the method that set it."""
    flat = values.reshape(-1)
    if flat.size > MAX_ERROR_SAMPLES:
        flat = flat[np.random.default_rng(0).choice(flat.size, MAX_ERROR_SAMPLES, replace=False)]
    grids = {}
    for m in AUTO_METHODS if method == "per-edge" else (method,):
        o = make_observer(m, "edge", percentile)
        o.observe(flat[None])
        grids[m] = tensor_q(o, TensorConfig(bits, False), name=name)
    best = min(grids, key=lambda m: _squared_error(flat, grids[m]))
    return grids[best], best


def calibrate_gru(node: Node, x: np.ndarray, config: dict, method: str, percentile: float, chunk: int,
                  info: dict, calibrators: dict | None = None, method_weights: str = "minmax"
                  ) -> tuple[QuantModel, MethodPlan]:
    """The node's GRU calibrated on its input `x` as `qtool calibrate` does a GRU alone, and the
    method of each of its tensors (auto's choice, or `method` under the config's own).
    `calibrators` keeps the observations of this GRU on `x` for the next config."""
    gru = SELF_CALIBRATED[node.op](node)
    data = SequenceData(x, False, f"the input of {node.name}")
    try:
        if method in ("auto", "per-edge"):
            from qtool.calibration.auto import calibrate_auto

            qm, choice = calibrate_auto(gru, data, len(x), config, method_weights, percentile, chunk, None, info,
                                        calibrators)
            return qm, choice.plan
        plan = MethodPlan.from_config(config, method, method_weights, percentile)
        cache = {} if calibrators is None else calibrators
        key = ("observers", repr(plan))  # what the observers depend on, whatever the bits
        if key not in cache:
            cache[key] = collect(gru, data, plan, chunk)
        return build_quant_model(gru, cache[key], config, info, plan), plan
    except QtoolError as e:  # its tensors' names (x, h, z_pre ...) are the GRU's own: say whose
        raise QtoolError(f"layer '{node.name}' ({node.op}): {e}") from None


def with_edge_grids(qm: QuantModel, x: TensorQ | None = None, h: TensorQ | None = None) -> QuantModel:
    """The GRU with its input x (of its first layer) and its output h (of its last layer) on
    grids fixed elsewhere: the h of the GRU before it, a QDQ file's grid. Everything a grid sets
    (shifts, compensations, tables) is derived anew from the cell's spec."""
    cells = [list(row) for row in qm.cells]
    for l, name, g in ((0, "x", x), (len(cells) - 1, "h", h)):
        if g is not None:
            cells[l] = [cell_from_spec(cell, {**cq.spec, name: g}) for cell, cq in zip(qm.model.layers[l], cells[l])]
    return QuantModel(qm.model, cells, qm.info)


@dataclass
class FileGrids:
    """A QDQ file's ranges on the graph's edges (`Graph.ranges`), snapped onto power-of-two grids
    as a GRU's imported ranges are (qtool.calibration.from_file); `rows` says what became of each."""

    ranges: object  # qtool.importers.ranges.GraphRanges
    snap: str
    rows: list[dict] = field(default_factory=list)

    def grid(self, edge: str, bits: int) -> TensorQ | None:
        from qtool.calibration.from_file import snap_range

        r = self.ranges.edges.get(edge) if self.ranges is not None else None
        if r is None:
            return None
        t, row = snap_range(r, TensorConfig(bits, False), self.snap)
        self.rows.append({"edge": edge, "bits": t.bits, "exp2_inv": int(t.exp2_inv), "zp": int(t.zp), **row,
                          "used": True})
        return t

    def unused(self, edge: str, why: str) -> None:
        r = self.ranges.edges.get(edge) if self.ranges is not None else None
        if r is not None:
            self.rows.append({"edge": edge, "source": r.source, "used": False, "why": why})

    def info(self) -> dict:
        if self.ranges is None:
            return {}
        return {"imported": {"kind": self.ranges.kind, "snap": self.snap, "rows": self.rows,
                             "notes": list(self.ranges.notes)}}


@dataclass
class Prepared:
    """What every calibration of one graph on one data set shares: the graph after the float
    passes, its partition, and the float values of its core's edges."""

    graph: Graph
    passes: list[tuple[str, str]]
    core: list[str]
    tail: list[str]
    values: dict[str, np.ndarray]  # edge -> [N, ...] float32
    grus: dict = field(default_factory=dict)  # calibrated GRUs by (node, rows, config, method)
    autos: dict = field(default_factory=dict)  # a GRU's observations by (node, rows, percentile, chunk)

    def gru(self, node: Node, rows: int, config: dict[str, TensorConfig], method: str, percentile: float,
            chunk: int, info: dict, method_weights: str = "minmax") -> tuple[QuantModel, MethodPlan]:
        """The node's GRU calibrated on its input's first `rows` sequences, once per config, and
        its tensors' methods (`calibrate_gru`)."""
        key = (node.name, rows, method, method_weights, percentile, repr(sorted(config.items())),
               repr(sorted(getattr(config, "layers", {}).items())))
        if key not in self.grus:
            autos = self.autos.setdefault((node.name, rows, percentile, chunk, method_weights), {})
            x = layer(node.op, node.label).sequences(node, self.values[node.inputs[0]][:rows])
            self.grus[key] = calibrate_gru(node, x, config, method, percentile, chunk, info, autos, method_weights)
        return self.grus[key]


def channel_shifts(span: np.ndarray, bits: int) -> np.ndarray:
    """Per channel of its `span` (max - min), how many bits finer than the coarsest channel's its
    own min-max power-of-two grid of `bits` is (0 for a constant channel)."""
    span = np.asarray(span, np.float64)
    live = span > 0
    if not live.any():
        return np.zeros(span.shape, np.int32)
    e = np.floor(np.log2((2.0 ** bits - 1) / np.where(live, span, 1.0)))
    return np.where(live, np.clip(e - e[live].min(), 0, SHIFT_MAX), 0).astype(np.int32)


def scale_input_channels(g: Graph, data: SequenceData, n: int, chunk: int, config: dict[str, TensorConfig]) -> str:
    """A power-of-two grid per channel of the model's input where the channels' ranges differ (an
    MFCC's first coefficient spans ten times the others): channel c times 2^k_c at the input, the
    first layers' weights divided by it (exact; each reader a layer linear in its input: a GRU's
    W x, dense, conv1d, batchnorm, through the ops that only move values: `_absorbers`), so that
    one grid on the scaled input is a grid 2^k_c finer on channel c."""
    if g.input_shifts:
        return "the model's input channels keep the shifts the graph holds: " + _shifts_text(g)
    done, why = [], []
    for edge in g.inputs:
        readers, blocker = _absorbers(g, edge)
        if blocker:
            why.append(f"{edge} is read by {blocker}")
            continue
        lo = hi = None
        for _, x in data.chunks(chunk, n):  # each channel's range, a chunk at a time
            x = x[edge] if isinstance(x, dict) else x
            flat = x.reshape(-1, x.shape[-1]).astype(np.float64)
            lo = flat.min(0) if lo is None else np.minimum(lo, flat.min(0))
            hi = flat.max(0) if hi is None else np.maximum(hi, flat.max(0))
        if lo is None:
            continue
        shifts = channel_shifts(hi - lo, layer_bits(config, edge).activation)
        if shifts.max(initial=0) < SHIFT_MIN_GAIN:
            why.append(f"{edge}'s channels' ranges are alike")
            continue
        for r in readers:
            layer(r.op, r.label).scale_input(r, shifts)
        g.input_shifts[edge] = tuple(int(k) for k in shifts)
        done.append(edge)
    text = "; ".join(([f"input {_shifts_text(g)}"] if done else []) + [f"one grid: {w}" for w in why])
    return text or "no input to scale"


def _absorbers(g: Graph, edge: str) -> tuple[list[Node], str | None]:
    """The layers that take a per-channel scale of `edge` into their weights (`scale_input`),
    through the ops that only move values (`SCALE_PASSES`); or the first reader that cannot."""
    nodes, todo = [], [edge]
    while todo:
        e = todo.pop()
        if e in g.outputs:
            return [], "a model output"
        for r in g.consumers(e):
            mod = layer(r.op, r.label)
            if r.op in getattr(mod, "SCALE_PASSES", ()):
                todo.extend(r.outputs)
            elif (hasattr(mod, "scale_input") and getattr(mod, "scales_input", lambda _: True)(r)
                  and r.inputs[:1] == [e] and e not in r.inputs[1:]):
                nodes.append(r)
            else:
                return [], f"{r.name} ({r.attrs.get('kind') or r.op}), which is not linear in it"
    return nodes, None


def _shifts_text(g: Graph) -> str:
    return "; ".join(f"{e}: channel c x 2^k_c, k = {list(k)}" for e, k in g.input_shifts.items())


def prepare(graph: Graph, data: SequenceData, n: int, config: dict[str, TensorConfig], chunk: int = 64,
            progress: Callable[[int], None] | None = None) -> Prepared:
    g, done = run_float_passes(graph)
    if g.ranges is not None:
        for edge in [e for e in g.ranges.edges if e not in g.shapes]:
            g.ranges.drop(edge, "the passes removed the edge it rounds")
    core, tail, what = partition(g)
    done.append(("partition", what))
    check_data(g, data)
    check_bits_names(g, config)
    done.append(("scale_input_channels", scale_input_channels(g, data, n, chunk, config)))
    return Prepared(g, done, core, tail, edge_values(g, core, data, n, chunk, progress))


def calibrate_graph(graph: Graph, data: SequenceData, n: int, config: dict[str, TensorConfig],
                    method: str = "auto", percentile: float = 99.99, chunk: int = 64,
                    progress: Callable[[int], None] | None = None, info: dict | None = None,
                    snap: str = "up") -> QGraph:
    """The quantized graph of `graph` calibrated on the first `n` sequences of `data`."""
    return quantize_graph(prepare(graph, data, n, config, chunk, progress), n, config, method, percentile, chunk,
                          info, snap)


def quantize_graph(prep: Prepared, rows: int, config: dict[str, TensorConfig], method: str, percentile: float,
                   chunk: int, info: dict | None, snap: str = "up", method_weights: str = "minmax") -> QGraph:
    """Every grid and layer integer from the first `rows` sequences of the prepared values; an
    edge a QDQ file quantizes (`Graph.ranges`) takes the file's grid (`snap` as for a GRU's).
    `method_weights`: each layer's weights per output channel, and each GRU's W and R."""
    from qtool.calibration.auto import chosen_methods

    g, core, tail, done = prep.graph, prep.core, prep.tail, list(prep.passes)
    models = {n.name: SELF_CALIBRATED[n.op](n) for n in g.nodes if n.name in core and n.op in SELF_CALIBRATED}
    check_named(list(models.values()), config, whole=True)
    config = checked_once(config)
    values = {e: v[:rows] for e, v in prep.values.items()}
    node_bits: dict[str, list] = {}  # [weight, bias, activation(, weight method)]
    chosen = getattr(config, "graph", {})
    grids: dict[str, TensorQ] = {}
    qparams: dict[str, dict] = {}
    methods: dict[str, str] = {}
    gru_methods: dict[str, list[dict[str, str]]] = {}  # a GRU -> per layer, its tensors' methods
    files = FileGrids(g.ranges, snap)
    for node in (g_node for g_node in g.nodes if g_node.name in models):
        qm, plan = prep.gru(node, rows, config, method, percentile, chunk, info or {}, method_weights)
        gru_methods[node.name] = chosen_methods(models[node.name], plan)
        x_in, h_out = node.inputs[0], node.outputs[0]
        x_file = None if x_in in grids else files.grid(x_in, config["x"].bits)
        h_file = files.grid(h_out, config["h"].bits)
        if x_in in grids or x_file is not None or h_file is not None:  # x: another GRU's h, or the file's
            qm = with_edge_grids(qm, grids.get(x_in, x_file), h_file)
        grids[x_in], grids[h_out] = qm.cells[0][0].spec["x"], qm.cells[-1][0].spec["h"]
        for edge, fixed in ((x_in, x_file), (h_out, h_file)):
            methods[edge] = "the file's" if fixed is not None else f"{node.name}'s calibration"
        qparams[node.name] = {"qm": qm}
    for name in chosen:  # a GRU's x or h has the GRU's bits: a graph entry there would be ignored
        edges = [name] if name in g.inputs else next(n.outputs for n in g.nodes if n.name == name)
        if any(e in grids for e in edges) and {"activation", "method"} & set(chosen[name]):
            raise QtoolError(f"the bits file sets the output of '{name}', which is a GRU's input or output: "
                             "its bits and method are the GRU's x and h (the file's tensors table)")
    def own_grid(name: str, edge: str) -> tuple[TensorQ, str]:  # layer (or input) `name`'s: the file's, or observed
        bits = layer_bits(config, name).activation
        if (fixed := files.grid(edge, bits)) is not None:
            return fixed, "the file's"
        return observed_grid(values[edge], bits, chosen.get(name, {}).get("method", method), percentile, edge)

    shared = []
    for edge in g.inputs:
        if edge not in grids:
            grids[edge], methods[edge] = own_grid(edge, edge)
    fused: dict[str, str] = {}  # an edge -> the clamp whose grid it takes

    for node in (g_node for g_node in g.nodes if g_node.name in core):
        own = layer_bits(config, node.name, method_weights)
        for edge in node.outputs:
            if edge in grids:
                continue
            set_here = {"activation", "method"} & set(chosen.get(node.name, {}))  # a bits file's own grid
            in_file = g.ranges is not None and edge in g.ranges.edges
            clamp = None if set_here or in_file else clamp_reader(g, edge, core)
            if node.op in getattr(layer(node.op, node.label), "SHARES_GRID", ()) and node.name not in chosen:
                grids[edge], methods[edge] = grids[node.inputs[0]], "shared"
                shared.append(edge)
                files.unused(edge, f"{node.name} only moves values, so its output keeps its input's grid")
            elif clamp is not None:
                out = clamp.outputs[0]
                if out not in grids:
                    grids[out], methods[out] = own_grid(clamp.name, out)
                grids[edge], methods[edge] = grids[out], f"{clamp.name}'s"
                fused[edge] = clamp.name
            else:
                grids[edge], methods[edge] = own_grid(node.name, edge)
        if node.op not in SELF_CALIBRATED:
            mod = layer(node.op, node.label)
            qparams[node.name] = mod.quantize(node, [grids[e] for e in node.inputs], [grids[e] for e in node.outputs],
                                              own)
            node_bits[node.name] = [own.weight, own.bias, own.activation, own.weight_method][
                :3 if own.weight_method == "minmax" or "W" not in node.params else 4]
    if files.ranges is not None:
        used = [r["edge"] for r in files.rows if r["used"]]
        kind = files.ranges.kind
        done.append(("fold_fake_quant", f"{len(used)} edge(s) on the {kind} file's grids: {', '.join(used)}"
                     if used else f"none of the {kind} file's grids is used"))
    done.append(("share_grids", f"{len(shared)} edge(s) keep their input's grid: {', '.join(shared)}"
                 if shared else "no edge to share"))
    done.append(("fuse_clamps", f"{len(fused)} edge(s) on the grid of the relu that reads them: "
                 + ", ".join(f"{e} ({c})" for e, c in fused.items()) if fused else "no relu to fuse"))
    return QGraph(g, grids, qparams, core, tail, done, {**(info or {}), "edge_methods": methods,
                                                        "gru_methods": gru_methods, "layer_bits": node_bits,
                                                        "fused_clamps": fused,
                                                        **files.info()})


# Percentiles clip: at 99.9 a spectrum's rare peaks give up their grid's top bit to every other
# value (GTCRN's int8 cosine 0.984 -> 0.996), yet a model whose tails carry it loses; scored.
AUTO_CANDIDATES = ("per-edge", "minmax", "mse", "percentile 99.9", "percentile 99.95", "percentile 99.99")
FILE_CANDIDATES = AUTO_CANDIDATES[:3]  # those a bits file names (advise's): a method, not its percentile
HELD_OUT = 0.2  # the share of the data auto scores its candidates on
MIN_HELD_OUT = 10  # with fewer sequences, the candidates are scored on the calibration data itself


def candidate(label: str, percentile: float) -> tuple[str, float]:
    """A candidate's method and percentile: "percentile 99.9" -> ("percentile", 99.9); any
    other method with the percentile given (per-edge's percentile edges)."""
    method, _, level = label.partition(" ")
    return method, float(level) if level else percentile


def held_data(x: dict[str, np.ndarray], name: str) -> SequenceData | ModelData:
    """The model's inputs `x` (batch first) as data: one input's SequenceData, or a ModelData."""
    if len(x) == 1:
        return SequenceData(next(iter(x.values())), False, name)
    return ModelData.from_arrays(x, False, name)


def auto_graph(prep: Prepared, n: int, config: dict[str, TensorConfig], percentile: float = 99.99,
               chunk: int = 64, info: dict | None = None, snap: str = "up", method_weights: str = "minmax",
               candidates: tuple[str, ...] = AUTO_CANDIDATES) -> QGraph:
    """Each of `candidates` calibrated on the first 80% of the sequences and scored
    by the output SNR on the rest; the best one calibrated on all of them. With fewer than
    MIN_HELD_OUT sequences, each is calibrated on all and scored on them (none to hold out)."""
    from qtool.graph.simulate import output_snr_db, simulate_graph

    fit = n - max(1, int(n * HELD_OUT)) if n >= MIN_HELD_OUT else n
    name = "the held-out calibration sequences" if fit < n else "the calibration sequences"
    held = held_data(prep.graph.scale_inputs({e: prep.values[e][fit if fit < n else 0:n] for e in prep.graph.inputs},
                                             -1), name)
    scores, kept, seen = {}, {}, {}
    for k, label in enumerate(candidates):
        phase(f"auto: calibrating {label} on {fit} sequences, scoring it on "
              + (f"the other {n - fit} " if fit < n else "them ") + f"({k + 1} of {len(candidates)})")
        qg = quantize_graph(prep, fit, config, *candidate(label, percentile), chunk, info, snap, method_weights)
        same = seen.setdefault(qg.fingerprint(), label)  # a bits file's methods can make candidates one model
        scores[label] = scores[same] if same != label else output_snr_db(simulate_graph(qg, held), qg)
        if fit == n:  # calibrated on all: the one to keep if it wins
            kept[label] = qg
    best = max(candidates, key=lambda m: scores[m])  # ties: the first, per-edge
    if fit < n:
        phase(f"auto: {best} scored best; calibrating it on all {n} sequences")
    method, level = candidate(best, percentile)
    qg = kept[best] if fit == n else quantize_graph(prep, n, config, method, level, chunk, info, snap,
                                                    method_weights)
    qg.info["auto"] = {"held_out": n - fit, "output_snr_db": scores, "chosen": best}
    if method in ("percentile", "per-edge"):
        qg.info["percentile"] = level
    note = coarse_bits_note(scores[best], held.name, qg.info.get("bits"))  # every candidate is poor
    if note:
        qg.info["notes"] = [*qg.info.get("notes", []), note]
    return qg
