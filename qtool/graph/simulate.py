"""Run a quantized whole model in integers and measure it against its float graph
(docs/graph.md, "Simulation"): every edge of the core (SNR, cosine, saturation), the model's
outputs, and for a classifier (a vector output of two or more classes) the top-1 agreement
with float and, given labels, both accuracies. Mode fakequant measures the fake-quant model
(qtool.graph.fakequant) instead; mode both measures the two and how many integers they share."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

import numpy as np

from qtool.core import edges
from qtool.core.qgraph import MODEL_OPS, QGraph
from qtool.engine.metrics import Distance
from qtool.errors import QtoolError
from qtool.graph.fakequant import run_fakequant
from qtool.io.files import SequenceData, rows
from qtool.layers import check_data, layer, run
from qtool.numerics.fakequant import to_int
from qtool.numerics.qparams import dequantize, qrange, quantize


def run_int(qg: QGraph, x: np.ndarray | dict[str, np.ndarray], runner=None) -> dict[str, np.ndarray]:
    """The integer core on float inputs: every core edge's integers (int64). `runner`: the GRU
    engine's run_model (qtool.engine.backend.select_backend; the CPU's by default)."""
    if not isinstance(x, dict):
        x = {next(iter(qg.graph.inputs)): x}
    x = qg.graph.scale_inputs(x)
    q = {e: quantize(np.asarray(v, np.float32), int(qg.grids[e].exp2_inv), qg.grids[e].zp, qg.grids[e].bits)
         for e, v in x.items()}
    for name in qg.core:
        node = qg.node(name)
        qp = qg.qparams[name] if runner is None or node.op not in MODEL_OPS else {**qg.qparams[name], "runner": runner}
        outs = layer(node.op, node.label).forward_int(
            node, qp, [q[e] for e in node.inputs], [qg.grids[e] for e in node.inputs],
            [qg.grids[e] for e in node.outputs])
        q.update(zip(node.outputs, outs))
    return q


def dequantized(qg: QGraph, q: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    """The model's outputs from the core's integers: dequantize, then the float tail."""
    return with_tail(qg, {e: dequantize(q[e], int(qg.grids[e].exp2_inv), qg.grids[e].zp) for e in qg.core_outputs})


def with_tail(qg: QGraph, core_values: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    """The model's outputs from the core's output values: the float tail."""
    values = {e: np.asarray(core_values[e], np.float32) for e in qg.core_outputs}
    for name in qg.tail:
        node = qg.node(name)
        values.update(zip(node.outputs, layer(node.op, node.label).forward(node, [values[e] for e in node.inputs])))
    return {e: values[e] for e in qg.graph.outputs}


@dataclass
class GraphSimulation:
    edges: dict[str, Distance]  # every core edge: dequantized integers against float
    outputs: dict[str, Distance]  # the model's outputs (after the float tail)
    samples: int = 0
    units: int = 0  # classifier: what it classifies, sequences (or, a tagger's, frames)
    per_frame: bool = False  # a tagger: a class per output frame
    agree: int = 0  # classifier: integer top-1 equal to float's
    correct_float: int = 0  # with labels: float top-1 equal to the label
    correct_quant: int = 0
    labelled: bool = False
    is_classifier: bool = False
    backend: str = "cpu"  # the GRUs' engine
    backend_reason: str = ""
    kept: dict = field(default_factory=dict)  # with keep: float/y, quant/y, quant/y_int (output k: yk)
    mode: str = "integer"  # integer, fakequant (edges and outputs then measure the fake-quant model) or both
    fq_edges: dict = field(default_factory=dict)  # mode both: the fake-quant model's Distance per edge
    fq_outputs: dict = field(default_factory=dict)
    same: dict = field(default_factory=dict)  # mode both: per edge, integers equal to the fake-quant model's
    counts: dict = field(default_factory=dict)  # mode both: per edge, integers compared
    fq_agree: int = 0  # mode both, classifier: the fake-quant model's top-1 equal to float's
    fq_correct: int = 0  # mode both, with labels: the fake-quant model's top-1 equal to the label
    core_outputs: list = field(default_factory=list)  # the integer core's outputs (a classifier's logits): edges

    @property
    def output(self) -> dict:
        """The integer core's outputs together (a classifier's logits; `output_snr_db`'s measure)
        as one distance, and a classifier's top-1 agreement: what `SimulationResult.output` is
        for a GRU alone."""
        d = Distance()
        for e in self.core_outputs:
            d = d.merge(self.edges[e])
        return {**d.as_dict(), **({"top1_agreement": self.agree / self.units} if self.is_classifier else {})}

    def to_dict(self) -> dict:
        out = {"mode": self.mode, "samples": self.samples, "backend": self.backend,
               "backend_reason": self.backend_reason, "outputs": {e: d.as_dict() for e, d in self.outputs.items()},
               "core_outputs": {e: self.edges[e].as_dict() for e in self.core_outputs},
               "edges": {e: d.as_dict() for e, d in self.edges.items()}}
        if self.mode == "both":
            out["fakequant"] = {"outputs": {e: d.as_dict() for e, d in self.fq_outputs.items()},
                                "edges": {e: d.as_dict() for e, d in self.fq_edges.items()},
                                "same_integers": {e: self.same[e] / max(self.counts[e], 1) for e in self.same}}
            if self.is_classifier:
                out["fakequant"]["top1_agreement"] = self.fq_agree / self.units
                if self.labelled:
                    out["fakequant"]["accuracy_quant"] = self.fq_correct / self.units
        if self.is_classifier:
            out["top1_agreement"] = self.agree / self.units
            out["classified"] = "frames" if self.per_frame else "sequences"
            if self.labelled:
                out["accuracy_float"] = self.correct_float / self.units
                out["accuracy_quant"] = self.correct_quant / self.units
        return out


def _clipped(ref: np.ndarray, g) -> int:
    """Float values the grid clips: beyond its ends by more than half a step (a value that sits
    on an end, such as a ReLU's zeros on a grid starting at 0, is represented, not clipped)."""
    lo, hi = qrange(g.bits)
    step = np.ldexp(1.0, -int(g.exp2_inv))
    return int(np.count_nonzero((ref < (lo - g.zp - 0.5) * step) | (ref >= (hi - g.zp + 0.5) * step)))


def references(qg: QGraph, ref: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    """What each edge's integers stand for in float: the float graph's values, but on an edge
    written onto the grid of the relu that reads it (fuse_clamps) the values that grid is to
    hold, those the relu drops brought to its ends (where the layer saturates by design), so
    that only rounding and the clipping of values the relu passes count as error."""
    out = dict(ref)
    for e, name in qg.info.get("fused_clamps", {}).items():
        node, g = qg.node(name), qg.grids[e]
        low, high = ((q - g.zp) * np.ldexp(1.0, -int(g.exp2_inv)) for q in qrange(g.bits))
        out[e] = layer(node.op, node.label).fused_reference(node, ref[e], low, high)
    return out


def classes(qg: QGraph) -> int | None:
    """The classes of a classifier: a first output that is a vector of two or more, or a sequence
    of them that a softmax makes (a tagger: a class per frame); None else."""
    out = qg.graph.outputs[0]
    shape = qg.graph.shapes.get(out)
    if shape is None or not edges.is_sequence(shape):
        return None if shape is None else edges.classes(shape)
    softmax = any(n.op == "softmax" and out in n.outputs for n in qg.graph.nodes)
    return edges.channels(shape) if softmax and edges.channels(shape) >= 2 else None


def measure_chunk(qg: QGraph, x: np.ndarray, labels: np.ndarray | None, keep: bool, runner=None,
                  mode: str = "integer", observe: Callable[[dict], None] | None = None) -> GraphSimulation:
    """One chunk of sequences, measured on its own (fold the chunks in order with `fold`);
    `observe` sees the chunk's float reference, every edge's values (the report reads each GRU's
    input there)."""
    out0 = qg.graph.outputs[0]
    part = GraphSimulation({e: Distance() for e in qg.grids}, {e: Distance() for e in qg.graph.outputs}, rows(x),
                           labelled=labels is not None, is_classifier=classes(qg) is not None, mode=mode,
                           core_outputs=list(qg.core_outputs))
    ref = run(qg.graph, x, keep=True)
    if observe is not None:
        observe(ref)
    meant = references(qg, ref)
    sides = []  # (edge distances, output distances, core values, integers)
    if mode != "fakequant":
        q = run_int(qg, x, runner)
        values = {e: dequantize(q[e], int(qg.grids[e].exp2_inv), qg.grids[e].zp) for e in q}
        sides.append((part.edges, part.outputs, values, q))
    if mode != "integer":
        fq = run_fakequant(qg, x)
        q_fq = {e: to_int(v, qg.grids[e]) for e, v in fq.items()}
        if mode == "both":
            part.fq_edges = {e: Distance() for e in qg.grids}
            part.fq_outputs = {e: Distance() for e in qg.graph.outputs}
            part.same = {e: int(np.count_nonzero(q_fq[e] == q[e])) for e in qg.grids}
            part.counts = {e: int(q[e].size) for e in qg.grids}
            sides.append((part.fq_edges, part.fq_outputs, fq, q_fq))
        else:
            sides.append((part.edges, part.outputs, fq, q_fq))
    top_f = np.argmax(ref[out0], axis=-1)  # [n], or a tagger's [n, T]
    if part.is_classifier:
        part.units, part.per_frame = int(top_f.size), top_f.ndim == 2
    if part.is_classifier and labels is not None:
        if labels.shape != top_f.shape:
            raise QtoolError(f"labels of shape {list(labels.shape)} for the output's classes of shape "
                             f"{list(top_f.shape)}: a class per sequence, or a tagger's per output frame")
        part.correct_float = int(np.count_nonzero(top_f == labels))
    ys, tops = [], []  # the integer model's (fakequant: the fake-quant model's), then with both the fake-quant one's
    for measured, outputs, values, q in sides:
        for e, d in measured.items():
            d.add(values[e], meant[e], _clipped(meant[e], qg.grids[e]))
        ys.append(with_tail(qg, values))
        for e, d in outputs.items():
            d.add(ys[-1][e], ref[e])
        if part.is_classifier:
            top = np.argmax(q[out0] if out0 in q else ys[-1][out0], axis=-1)
            tops.append((int(np.count_nonzero(top == top_f)),
                         0 if labels is None else int(np.count_nonzero(top == labels))))
    if tops:
        part.agree, part.correct_quant = tops[0]
        part.fq_agree, part.fq_correct = tops[-1] if len(tops) > 1 else (0, 0)
    q, y = sides[0][3], ys[0]
    if keep:  # output k > 0 as float/yk, quant/yk and, where the core computes it, quant/yk_int
        edge = out0 if out0 in q else qg.core_outputs[0]
        part.kept = {"float/y": ref[out0], "quant/y": y[out0], "quant/y_int": q[edge].astype(np.int32)}
        for k, out in enumerate(qg.graph.outputs[1:], 1):
            part.kept.update({f"float/y{k}": ref[out], f"quant/y{k}": y[out]})
            if out in q:
                part.kept[f"quant/y{k}_int"] = q[out].astype(np.int32)
    return part


def fold(total: GraphSimulation | None, part: GraphSimulation) -> GraphSimulation:
    """`total` with the next chunk's `part` added: the same float additions, in the same order,
    as measuring the chunks one after another in one pass."""
    if total is None:
        part.kept = {k: [v] for k, v in part.kept.items()}
        return part
    for mine, theirs in ((total.edges, part.edges), (total.outputs, part.outputs)):
        for e in mine:
            mine[e] = mine[e].merge(theirs[e])
    if total.mode == "both":
        for mine, theirs in ((total.fq_edges, part.fq_edges), (total.fq_outputs, part.fq_outputs)):
            for e in mine:
                mine[e] = mine[e].merge(theirs[e])
        for e in total.same:
            total.same[e] += part.same[e]
            total.counts[e] += part.counts[e]
    total.samples += part.samples
    total.units += part.units
    total.agree += part.agree
    total.correct_float += part.correct_float
    total.correct_quant += part.correct_quant
    total.fq_agree += part.fq_agree
    total.fq_correct += part.fq_correct
    for k, v in part.kept.items():
        total.kept[k].append(v)
    return total


def finish(total: GraphSimulation) -> GraphSimulation:
    total.kept = {k: np.concatenate(v) for k, v in total.kept.items()}
    return total


def output_snr_db(sim: GraphSimulation, qg: QGraph) -> float:
    """The SNR (dB) of the integer core's outputs together (`qg.core_outputs`: a classifier's
    logits, not the probabilities its float softmax makes of them, which flatten the error):
    their float power over their error's. What calibrate's auto and advise measure a model by."""
    ds = [sim.edges[e] for e in qg.core_outputs]
    ref2 = sum(d.ref2 for d in ds)
    err2 = sum(d.err2 for d in ds)
    return float("inf") if err2 == 0 else 10 * float(np.log10(ref2 / err2)) if ref2 > 0 else float("-inf")


def check_inputs(qg: QGraph, data: SequenceData, n: int, labels: np.ndarray | None) -> None:
    check_data(qg.graph, data)
    if labels is not None and (len(labels) < n or labels.dtype.kind not in "iu"):
        raise QtoolError(f"labels must be {n} integer class indexes, got {len(labels)} of dtype {labels.dtype}")


def simulate_graph(qg: QGraph, data: SequenceData, n: int | None = None, chunk: int = 256,
                   labels: np.ndarray | None = None, keep: bool = False,
                   progress: Callable[[int], None] | None = None, runner=None, mode: str = "integer",
                   observe: Callable[[dict], None] | None = None) -> GraphSimulation:
    """The integer model against the float graph over the first `n` sequences of `data`."""
    n = data.num_sequences if n is None else min(n, data.num_sequences)
    check_inputs(qg, data, n, labels)
    total = None
    for start, x in data.chunks(chunk, n):
        lab = None if labels is None else labels[start:start + rows(x)]
        total = fold(total, measure_chunk(qg, x, lab, keep, runner, mode, observe))
        if progress:
            progress(start + rows(x))
    return finish(total)
