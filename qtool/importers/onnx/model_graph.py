"""A whole ONNX model as qtool's graph (qtool.core.graph), for files as `torch.onnx.export` writes them
(the TorchScript exporter, dynamo=False, with or without dynamic axes; the default one, dynamo=True,
with or without its optimizer).

Each value computed from the graph input carries a Layout (onnx/model_layout.py): which axis is the
batch, which the time steps, which the channels. Layout-only ops (Transpose, Reshape, Squeeze,
Unsqueeze, Flatten, Identity, Dropout, Cast to float, Expand to its own shape, Slice of a whole axis,
the Transpose/Reshape that join a GRU's directions) only change that bookkeeping; shape arithmetic
(Shape, Gather, Concat, ConstantOfShape, ...) is evaluated on a probe of the declared (or probe)
sizes, constants by the GRU importer's Graph (onnx/graph.py, fold.py). Compute ops become qtool
nodes on channels-last edges: docs/graph.md, "ONNX", lists them and how each maps.

A rank-3 graph input is read batch-first `[N, T, C]`; when the graph only makes sense otherwise (a
GRU reading it directly, time-first `[T, N, C]`, or a Conv reading it as `[N, C, T]`) that layout
is taken. `check_onnx_graph` runs the whole file with ONNX Runtime against `qtool.layers.run`.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from qtool.core.graph import Graph as QtoolGraph  # qtool's IR; Graph is the ONNX file's
from qtool.core.graph import Node
from qtool.errors import QtoolError
from qtool.importers.checks import reason
from qtool.importers.once import once
from qtool.importers.onnx import fake_quant
from qtool.importers.onnx.check import check_graph
from qtool.importers.onnx.fold import evaluate, foldable
from qtool.importers.onnx.graph import Graph, attr
from qtool.importers.onnx.loops import loop_notes, unread_recurrent
from qtool.importers.onnx.model_layout import (
    FLOAT,
    PROBE_N,
    PROBE_T,
    FixedSteps,
    Layout,
    LayoutError,
    Part,
    Stack,
    ints,
)
from qtool.importers.onnx.ops import HANDLERS
from qtool.importers.onnx.ops.activation import FUNCTION_OPS, function
from qtool.importers.onnx.streaming import stream_note, stream_pairs, unreturned_hint
from qtool.importers.ranges import GraphRanges

EXPORTER_NAMES = ("tf2onnx", "torch_jit", "main_graph", "torch-jit-export", "model")

# the graph input's layout, in the order they are tried: batch-first, time-first, PyTorch's Conv1d
INPUT_LAYOUTS = {"[N, T, C]": ("N", "T", 0), "[T, N, C]": ("T", "N", 0), "[N, C, T]": ("N", 0, "T")}
# a feature map's input, tried in the same turns: TensorFlow's [N, T, F, C], then PyTorch's [N, C, T, F]
MAP_LAYOUTS = {"[N, T, F, C]": ("N", "T", 0, 1), "[N, C, T, F]": ("N", 0, "T", 1)}



@dataclass
class Ports:
    """How the qtool graph's edges sit in the ONNX file: for the ONNX Runtime check."""

    inputs: dict[str, Layout] = field(default_factory=dict)  # data inputs (ONNX name = qtool edge)
    outputs: dict[str, tuple[str, Layout]] = field(default_factory=dict)  # ONNX output -> (qtool edge, layout)
    states: list[str] = field(default_factory=list)  # inputs no output reads (fed zeros to ONNX Runtime; said)
    notes: list[str] = field(default_factory=list)
    layout: str = "[N, T, C]"
    batch: int | None = None  # the batch size and steps the file fixes (None: dynamic)
    steps: int | None = None


class TooWide(LayoutError):
    """An input read in some layout has more channels than qtool takes (in another it may fit)."""


def read_onnx_graph(path) -> QtoolGraph:
    """The whole model in ONNX file `path` as a qtool graph, proved well formed (qtool.layers.check)."""
    return _import(Path(path))[0]


def import_onnx_graph(path, check: bool = True) -> QtoolGraph:
    """`read_onnx_graph`, and with `check` its ONNX Runtime check (`graph.check_result`), from one
    reading of the file."""
    graph, ports, reader = once("onnx", path, lambda: _import(Path(path)))
    # a streaming file's reading over whole sequences is qtool's own: checked frame by frame always
    # (reading it took ONNX Runtime already)
    graph.check_result = _check(Path(path), graph, ports, reader) if check or stream_pairs(reader.model) else None
    return graph


def check_onnx_graph(path, graph: QtoolGraph | None = None) -> dict:
    """Run file `path` with ONNX Runtime and `graph` (its import when None) with qtool.layers.run on
    the same random inputs; raises when they differ by more than TOLERANCE (relative where the output
    exceeds 1). Returns what was checked, or `{"checked": False, "reason": ...}` without ONNX Runtime."""
    read, ports, reader = _import(Path(path))
    return _check(Path(path), graph or read, ports, reader)


def _check(path: Path, graph: QtoolGraph, ports, reader) -> dict:
    """The import check against the file's own runtime: ONNX Runtime, or LiteRT for a TFLite file."""
    from qtool.importers.tflite.reader import is_tflite

    if is_tflite(path):
        from qtool.importers.tflite.check import check_tflite

        return check_tflite(path, graph, ports, reader)
    return check_graph(path, graph, ports, reader)


def _import(path: Path) -> tuple[QtoolGraph, Ports, _Reader]:
    import qtool.layers as L
    from qtool.importers.onnx.loops import load_onnx

    model = load_onnx(path)
    if not model.graph.output or not model.graph.node:
        raise QtoolError(f"{path}: holds no ONNX graph with outputs (an empty or truncated file?)")
    errors: list[QtoolError] = []
    for (name, axes), map_layout in _readings(model):
        reader = _Reader(path, model, name, axes, map_layout)
        try:
            try:
                graph, ports = reader.read()
            except FixedSteps as e:  # once, with the steps the graph fixes
                reader = _Reader(path, model, name, axes, map_layout, e.steps)
                graph, ports = reader.read()
                graph.notes.append(f"the graph computes on {e.steps} time steps whatever its input declares "
                                   "(its exporter fixed them): its sequences have that many")
            return L.check(graph, str(path)), ports, reader
        except QtoolError as e:
            # the first layout's error stands, unless it was one of layout and another layout reads the graph
            if not errors and (not isinstance(e, LayoutError) or not (reader.rank3 or reader.rank4)):
                raise QtoolError(str(e) + unreturned_hint(model)) from None
            e.progress = len(reader.nodes)  # how far this reading got
            errors.append(e)
        except (ValueError, TypeError, AttributeError, IndexError, KeyError, UnicodeError, RecursionError) as e:
            if not errors:
                raise QtoolError(f"{path}: malformed ONNX graph ({reason(e)})") from None
    # a layout that got past the layout questions met the model's real problem (an unsupported op), or
    # found its channels too many: say that rather than the first layout's complaint; among complaints of
    # layout alone, the one of the reading that got furthest (the others stumbled before it)
    worst = [e for e in errors if not isinstance(e, LayoutError)] + [e for e in errors if isinstance(e, TooWide)]
    furthest = max(errors, key=lambda e: getattr(e, "progress", 0)) if errors else None
    raise QtoolError(str((worst or [furthest])[0]) + unreturned_hint(model)) from None


def _readings(model) -> list[tuple[tuple[str, tuple], tuple[str, tuple]]]:
    """The layouts to read the inputs in, in turn: (a 3-D input's, a 4-D input's). The same turns
    for both first ([N, T, C] with TensorFlow's maps, the others with PyTorch's); a file with
    inputs of both ranks then tries the other pairs (DeepFilterNet's decoders take an embedding
    [N, T, C] beside PyTorch's maps [N, C, T, F])."""
    ranks = {len(i.type.tensor_type.shape.dim) for i in model.graph.input}
    seqs, maps = list(INPUT_LAYOUTS.items()), list(MAP_LAYOUTS.items())
    turns = [(k, min(k, len(maps) - 1)) for k in range(len(seqs) if 3 in ranks else len(maps))]
    if {3, 4} <= ranks:
        turns += [(k, m) for k in range(len(seqs)) for m in range(len(maps)) if (k, m) not in turns]
    return [(seqs[k], maps[m]) for k, m in turns]


class _Reader:
    def __init__(self, path: Path, model, layout: str, axes: tuple, map_layout: tuple,
                 steps: int | None = None) -> None:
        self.path, self.where, self.model = path, str(path), model
        self.fixed_steps = steps  # the steps the graph fixes, where its input declares none
        self.input_maps: dict[str, tuple] = {}  # a 4-D input's (order, F, C)
        self.input_steps: dict[str, int | None] = {}  # each input's declared steps (None: dynamic)
        opset = next((int(o.version) for o in model.opset_import if o.domain in ("", "ai.onnx")), 14)
        self.g = Graph(model.graph, str(path), path.parent, opset, model)
        self.g.fold_dequantized(model.graph, str(path))
        self.opset, self.layout, self.input_axes = opset, layout, axes
        self.map_layout = map_layout  # (name, axes) for a 4-D input
        self.data: dict[str, tuple[str, Layout]] = {}  # ONNX value -> (qtool edge, layout)
        self.nodes: list[Node] = []
        self.names: set[str] = set()
        self.done: set[int] = set()  # ids of ONNX nodes taken into a pattern already
        self.probe: dict[str, np.ndarray] = {}
        self.dense: dict[str, Node] = {}  # a MatMul's output -> its dense node, while it has no bias
        self.affine: dict[str, Node] = {}  # a per-channel affine's output -> its batchnorm node
        self.freq_pads: dict[str, tuple] = {}  # a Pad along a map's frequencies -> (edge, layout, pads) for its Conv
        self.ranges = GraphRanges("ONNX QDQ")  # the fake-quant pairs' grids, by qtool edge
        self.fake_quant: dict[str, tuple[str, bool]] = {}  # a pair's Quantize output -> (its input, clips at 0)
        self.notes: list[str] = loop_notes(model) + ([stream_note(model)] if stream_note(model) else [])
        self.rank3 = self.rank4 = False
        self.declared: list = []

    # ---- the walk

    def read(self) -> tuple[QtoolGraph, Ports]:
        g, graph = self.g, self.model.graph
        unread = unread_recurrent(graph.node)  # a loop body reads outer values no dependency walk sees
        if unread:
            raise QtoolError(f"{self.where}: {unread}")
        outputs = [o.name for o in graph.output]
        live, self.uses = self._live(outputs)
        self.live, self.outputs, self.readers = live, set(outputs), {}
        for n in g.nodes:
            if id(n) in live:
                for i in n.input:
                    self.readers.setdefault(i, []).append(n)
        self.order = {id(n): k for k, n in enumerate(g.nodes)}
        ports = Ports(layout=self.layout)
        declared = {i.name: i for i in graph.input if i.name not in g.consts}
        inputs = {}
        for name, info in declared.items():
            if name in self.uses:
                layout = self._input(info)
                self.data[name] = (name, layout)
                inputs[name] = layout.edge_shape()
                ports.inputs[name] = layout
            else:
                ports.states.append(name)
        steps = {name: self.input_steps[name] for name in inputs if self.input_steps.get(name)}
        if len(set(steps.values())) > 1:  # the inputs of one model run over the same steps
            raise LayoutError(f"{self.where}: read as {self.layout} and {self.map_layout[0]}, the inputs would have "
                              "different steps (" + ", ".join(f"'{k}' {v}" for k, v in steps.items()) + ")")
        defined = set(declared) | set(g.consts)
        for k, node in enumerate(g.nodes):
            if id(node) in live:
                for i in node.input:
                    if i and i not in defined:
                        raise QtoolError(f"{self.where}: {self.label(node)} reads '{i}', which nothing before it "
                                         "computes (a dangling input or a cycle)")
                if id(node) not in self.done and any(i in self.data for i in node.input) and \
                        node.op_type not in ("Shape", "Size"):
                    self._node(node, k)
            defined.update(o for o in node.output if o)
        for name in outputs:
            if name not in defined:
                raise QtoolError(f"{self.where}: output '{name}' is computed by no node")
            if name not in self.data:
                raise QtoolError(f"{self.where}: output '{name}' does not depend on the model's input")
            edge, layout = self.data[name]
            if not isinstance(edge, str):
                what = (f"joins {len(edge.parts)} computed tensors on an axis other than the channels (PyTorch's "
                        "h_n of a stacked GRU: each layer's final state)" if isinstance(edge, Stack) else
                        f"is channels [{edge.lo}:{edge.hi}] of the {edge.full} of '{edge.edge}'")
                raise QtoolError(f"{self.where}: output '{name}' {what}; qtool's outputs are whole edges (return "
                                 "the GRU's output sequence, or one layer's final state such as h_n[-1])")
            if "N" not in layout.axes and "NT" not in layout.axes:
                raise QtoolError(f"{self.where}: output '{name}' has no batch axis ({layout.describe()})")
            ports.outputs[name] = (edge, layout)
            if len(layout.cdims) > 1:  # a map: say how its frames hold it, which no shape shows
                order = " then ".join(f"axis {layout.axes.index(k)} ({d})" for k, d in enumerate(layout.cdims))
                self.notes.append(f"output '{name}' is a map {layout.describe()}: each frame qtool gives holds "
                                  f"its {order}, flattened in that order")
        before = {name: edge for name, (edge, _) in ports.outputs.items()}
        self._name_outputs(ports, set(inputs))
        keep = self._prune([e for e, _ in ports.outputs.values()])
        ranges = fake_quant.finish(self, keep, inputs, {before[k]: e for k, (e, _) in ports.outputs.items()
                                                        if before[k] != e})
        ports.notes = self.notes
        ports.batch, ports.steps = (self.declared + [None, None])[:2]
        # an exporter's own name for every graph it writes names no model: the file's does
        name = self.path.stem if graph.name in EXPORTER_NAMES or not graph.name else graph.name
        producer = " ".join(s for s in (self.model.producer_name, self.model.producer_version) if s)
        source = f"ONNX ({producer})" if producer else "ONNX"
        if self.model.producer_name == "TFLite":  # qtool's reading of a TFLite file (tflite.to_onnx)
            source = "TFLite"
        if self.rank3 and self.layout != next(iter(INPUT_LAYOUTS)):
            source += f", input read as {self.layout}"
        if self.rank4:  # and what its data's frames are; of several inputs, which are maps
            maps = [e for e in inputs if e in self.input_maps]
            which = f"inputs {', '.join(maps)}" if len(inputs) > 1 and len(maps) > 1 else \
                f"input {maps[0]}" if len(inputs) > 1 and maps else "input"
            source += (f", {which} read as {self.map_layout[0]}: data [N, T, C, F]"
                       if self.map_layout[0] != next(iter(MAP_LAYOUTS)) else f", {which} read as [N, T, F, C]")
        graph = QtoolGraph(keep, inputs, list(dict.fromkeys(e for e, _ in ports.outputs.values())), name, source,
                           steps=ports.steps if (self.rank3 or self.rank4) and not stream_note(self.model) else None)
        graph.ranges, graph.notes = ranges, list(self.notes)
        graph.input_maps = {e: m for e, m in self.input_maps.items() if e in graph.inputs}
        return graph, ports

    def _live(self, outputs: list[str]) -> tuple[set, dict]:
        """The nodes the outputs depend on (a GRU's initial state aside: proved zero or a state input),
        and how many of them read each value (an output counts as a reader)."""
        live, uses, todo = set(), {}, list(outputs)
        for o in outputs:
            uses[o] = uses.get(o, 0) + 1
        seen = set()
        while todo:
            v = todo.pop()
            if v in seen or v in self.g.constant:
                continue
            seen.add(v)
            node = self.g.producer.get(v)
            if node is None or id(node) in live:
                continue
            live.add(id(node))
            for k, i in enumerate(node.input):
                if i and not (node.op_type == "GRU" and k >= 4):
                    uses[i] = uses.get(i, 0) + 1
                    todo.append(i)
        return live, uses

    def _input(self, info) -> Layout:
        where = f"{self.where}: input '{info.name}'"
        tt = info.type.tensor_type
        if not info.type.HasField("tensor_type") or tt.elem_type != FLOAT:
            raise QtoolError(f"{where} is not a float32 tensor (ONNX type {tt.elem_type}); qtool reads float32 "
                             "inputs")
        dims = [d.dim_value if d.HasField("dim_value") and d.dim_value > 0 else None for d in tt.shape.dim]
        if not tt.HasField("shape") or len(dims) not in (2, 3, 4):
            raise QtoolError(f"{where} has shape {dims if tt.HasField('shape') else 'unknown'}; qtool reads "
                             "sequences [N, T, C], feature maps [N, T, F, C] or [N, C, T, F] and vectors [N, C]")
        layout, axes = {3: (self.layout, self.input_axes), 4: self.map_layout}.get(len(dims), ("[N, C]", ("N", 0)))
        self.rank3 = self.rank3 or len(dims) == 3
        self.rank4 = self.rank4 or len(dims) == 4
        sizes = dict(zip(axes, dims))
        error = LayoutError if len(dims) > 2 else QtoolError  # read as another layout, the channels may fit
        factors = [a for a in axes if isinstance(a, int)]
        if any(sizes[f] is None for f in factors):
            raise error(f"{where} has shape {dims}: the channels (axis {axes.index(0)} of {layout}) "
                        "must have a fixed size" if len(factors) == 1 else
                        f"{where} has shape {dims}: read as {layout}, its frequencies and channels must have "
                        "fixed sizes")
        width = math.prod(sizes[f] for f in factors)
        if width > (1 << 20):
            raise (TooWide if len(dims) > 2 else QtoolError)(f"{where} declares {width:,} channels (at most "
                                                             f"{1 << 20:,})")
        if len(dims) == 4:  # its data's frames: [F, C] or [C, F]
            self.input_maps[info.name] = ("fc", sizes[0], sizes[1]) if axes[2] == 0 else ("cf", sizes[1], sizes[0])
        if not self.declared:
            self.declared = [sizes.get("N"), sizes.get("T") or self.fixed_steps]
        self.input_steps[info.name] = sizes.get("T")
        n, t = sizes.get("N") or PROBE_N, sizes.get("T") or self.fixed_steps or PROBE_T
        return Layout.make(axes, tuple(sizes[f] for f in factors), n, t)

    def label(self, node) -> str:
        return f"node '{node.name or (node.output[0] if node.output else '?')}' ({node.op_type})"

    def _node(self, node, k: int) -> None:
        self.k = k
        if node.op_type not in ("Gather", "Identity") and any(isinstance(self.data[i][0], Stack)
                                                                for i in node.input if i in self.data):
            raise self.fail(node, "reads several computed tensors joined on an axis other than the channels "
                                  "(PyTorch's h_n of a stacked GRU); qtool follows a Gather of one of them only")
        if node.domain not in ("", "ai.onnx"):
            raise self.fail(node, f"is an op of domain '{node.domain}'; qtool reads the default ONNX domain's ops")
        if node.op_type in FUNCTION_OPS and function(self, node):
            return
        handler = HANDLERS.get(node.op_type)
        if handler is None:
            self._unsupported(node)
        handler(self, node)

    def _unsupported(self, node) -> None:
        if node.op_type == "ReverseSequence":  # what it is in the files that hold it: say so, not the op list
            raise QtoolError(f"{self.where}: {self.label(node)} runs a sequence backward in time: a GRU that reads "
                             "it backward (Keras' go_backwards=True, or the backward half of a Bidirectional "
                             "GRU, as tf2onnx writes them around a Loop), which qtool does not read yet; a Keras "
                             "Bidirectional GRU that tf2onnx writes as an ONNX GRU node (reset_after=True, sigmoid "
                             "and tanh) imports")
        ops = sorted({*HANDLERS, "Shape", "Size"})
        raise QtoolError(f"{self.where}: {self.label(node)} is not supported in a whole-model import "
                         f"(supported: {', '.join(ops)}; and one activation written as elementwise ops, "
                         "such as PyTorch's Erf-based GELU)")

    def fail(self, node, what: str, layout: bool = False):
        return (LayoutError if layout else QtoolError)(f"{self.where}: {self.label(node)} {what}")

    # ---- values

    def input(self, node, k: int = 0) -> tuple[str, Layout]:
        name = node.input[k] if len(node.input) > k else ""
        if name not in self.data:
            raise self.fail(node, f"reads '{name}' as data, but it is {'a constant' if name else 'absent'}; "
                                  "qtool reads ops on one computed tensor here")
        return self.data[name]

    def const(self, node, k: int, default=None):
        """Input `k` of `node`, a constant (None when absent: `default`)."""
        name = node.input[k] if len(node.input) > k else ""
        if not name:
            return default
        if name not in self.g.constant:
            raise self.fail(node, f"takes '{name}' from the data where qtool needs a constant")
        return self.g.array(name)

    def value(self, node, k: int, default=None):
        """Input `k` of `node` on the probe: a constant or computed from the shapes of the data."""
        name = node.input[k] if len(node.input) > k else ""
        if not name:
            return default
        return self._probe(name, node)

    def _probe(self, name: str, user) -> np.ndarray:
        if name in self.probe:
            return self.probe[name]
        if name in self.g.constant:
            return self.g.array(name)
        if name in self.data:
            raise self.fail(user, f"takes '{name}' from the data's values where qtool needs a constant or a shape")
        p = self.g.producer.get(name)
        if p is not None and p.op_type in ("Shape", "Size") and p.input and p.input[0] in self.data:
            if isinstance(self.data[p.input[0]][0], Stack):
                raise self.fail(p, "reads the shape of values joined on an axis other than the channels")
            shape = self.data[p.input[0]][1].shape()
            if p.op_type == "Size":
                value = np.array(math.prod(shape), np.int64)
            else:
                start, end = attr(p, "start", 0), attr(p, "end", None)
                value = np.array(shape[slice(start, end)], np.int64)
        elif p is not None and foldable(p):
            ins = [self._probe(i, p) if i else None for i in p.input]
            outs = evaluate(self.where, self.g.inlined(p), ins, self.opset)
            value = outs[list(p.output).index(name)]
        else:
            raise self.fail(user, f"takes '{name}', which qtool cannot compute from constants and shapes")
        self.probe[name] = value
        return value

    def alias(self, node, edge: str, layout: Layout, out: int = 0) -> None:
        self.data[node.output[out]] = (edge, layout)

    def _part(self, node, part: Part, k: int) -> str:
        """Channels [lo, hi) of an edge read on their own (PyTorch's `x[:, 0]` of a map): a select."""
        return self.emit(node, "select", [part.edge], None, {"index": tuple(range(part.lo, part.hi))},
                         source="Gather", suffix=f"_part{k}").outputs[0]

    def emit(self, node, op: str, inputs: list[str], layout: Layout, attrs: dict | None = None,
              params: dict | None = None, out: int = 0, source: str = "", suffix: str = "") -> Node:
        """A qtool node for ONNX `node`, writing the edge named after its output `out` (with `suffix`: an
        edge of its own, for a node before the one that writes the output)."""
        inputs = [e if isinstance(e, str) else self._part(node, e, k) for k, e in enumerate(inputs)]
        base = (node.name or f"{node.op_type}_{self.k}") + suffix
        name, i = base, 1
        while name in self.names:
            name, i = f"{base}_{i}", i + 1
        self.names.add(name)
        edge = node.output[out] + suffix
        q = Node(name, op, list(inputs), [edge], attrs or {}, params or {}, source or node.op_type)
        self.nodes.append(q)
        if not suffix:
            self.data[edge] = (edge, layout)
        return q

    def used(self, node, k: int) -> bool:
        return len(node.output) > k and bool(node.output[k]) and node.output[k] in self.uses

    # ---- layout-only ops





    def axes_of(self, node, k: int, rank: int, name: str = "axes") -> list[int] | None:
        a = self.value(node, k) if len(node.input) > k and node.input[k] else attr(node, name, None)
        return None if a is None else [int(v) % rank for v in ints(a)]








    # ---- compute ops



    def floats(self, node, a) -> np.ndarray:
        a = np.asarray(a)
        if a.dtype.kind != "f":
            raise self.fail(node, f"has a constant of type {a.dtype}; qtool's weights are real floating point")
        a = a.astype(np.float32)
        if not np.all(np.isfinite(a)):
            raise self.fail(node, "has a constant with NaN or Inf")
        return a


    def ncw(self, node, lay: Layout) -> None:
        if len(lay.axes) != 3 or lay.axes[0] != "N" or lay.axes[2] != "T" or not lay.holds_channels(1):
            raise self.fail(node, f"reads {lay.describe()}; ONNX's {node.op_type} reads [N, C, T]", layout=True)

    def window(self, node, t: int, k: int, stride: int, dilation: int, conv: bool = False) -> tuple:
        """(qtool padding, the probe's output steps) of a Conv or pool's window attributes."""
        if min(k, stride, dilation) < 1:
            raise self.fail(node, f"has kernel {k}, stride {stride}, dilation {dilation}")
        padding, steps = self._window_steps(node, t, k, stride, dilation, conv)
        if steps < 1:
            raise self.fail(node, f"leaves {steps} of {t} steps (kernel {k}, stride {stride}, dilation {dilation})")
        return padding, steps

    def _window_steps(self, node, t: int, k: int, stride: int, dilation: int, conv: bool) -> tuple:
        auto = attr(node, "auto_pad", "NOTSET")
        span = (k - 1) * dilation + 1
        if auto == "VALID":
            return "valid", (t - span) // stride + 1
        if auto in ("SAME_UPPER", "SAME_LOWER"):
            total = (k - 1) * dilation
            if auto == "SAME_LOWER" and (stride != 1 or total % 2):
                raise self.fail(node, "has auto_pad SAME_LOWER with an odd padding; qtool's 'same' pads the odd "
                                      "step after")
            return "same", -(-t // stride)
        if auto != "NOTSET":
            raise self.fail(node, f"has auto_pad {auto}")
        pads = list(attr(node, "pads", [0, 0]))
        if len(pads) != 2 or min(pads) < 0:
            raise self.fail(node, f"has pads {pads}")
        if not conv and attr(node, "ceil_mode", 0):
            raise self.fail(node, "has ceil_mode 1; qtool's pools round the number of windows down")
        return ("valid" if pads == [0, 0] else (int(pads[0]), int(pads[1]))), (t + sum(pads) - span) // stride + 1



























    # ---- an activation written as several elementwise ops




    # ---- the end

    def _name_outputs(self, ports: Ports, inputs: set) -> None:
        """Name each output edge after the ONNX output it is (when it is one edge for one output)."""
        edges = [e for e, _ in ports.outputs.values()]
        taken = {e for n in self.nodes for e in n.outputs} | inputs
        for name, (edge, layout) in ports.outputs.items():
            if edge == name or edge in inputs or edges.count(edge) > 1 or name in taken:
                continue
            for n in self.nodes:
                n.inputs = [name if e == edge else e for e in n.inputs]
                n.outputs = [name if e == edge else e for e in n.outputs]
            ports.outputs[name] = (name, layout)

    def _prune(self, outputs: list[str]) -> list[Node]:
        """The qtool nodes the outputs need, in order."""
        need, keep = set(outputs), []
        for n in reversed(self.nodes):
            if any(o in need for o in n.outputs):
                keep.append(n)
                need.update(n.inputs)
        return keep[::-1]
