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
import re
import time
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from qtool.core.graph import Graph as QtoolGraph  # qtool's IR; Graph is the ONNX file's
from qtool.core.graph import Node
from qtool.errors import QtoolError
from qtool.importers.checks import MAX_TENSOR_ELEMENTS, framework_run, reason
from qtool.importers.once import once
from qtool.importers.onnx import fake_quant
from qtool.importers.onnx.fold import evaluate, foldable
from qtool.importers.onnx.graph import Graph, attr
from qtool.importers.onnx.model_layout import PROBE_N, PROBE_T, Layout, LayoutError
from qtool.importers.onnx.nodes import unread_recurrent
from qtool.importers.ranges import GraphRanges

# the graph input's layout, in the order they are tried: batch-first, time-first, PyTorch's Conv1d
INPUT_LAYOUTS = {"[N, T, C]": ("N", "T", 0), "[T, N, C]": ("T", "N", 0), "[N, C, T]": ("N", 0, "T")}
# elementwise ops that may make up one activation function of one computed input and scalar constants
# (PyTorch's Erf-based GELU, the dynamo exporter's thresholded Softplus): matched by evaluating them
FUNCTION_OPS = {"Add", "Sub", "Mul", "Div", "Pow", "Sqrt", "Erf", "Tanh", "Sigmoid", "Exp", "Log", "Neg", "Abs",
                "Reciprocal", "Softplus", "Relu", "Clip", "Max", "Min", "Where", "Greater", "Less", "GreaterOrEqual",
                "LessOrEqual", "Equal", "Cast", "HardSigmoid", "LeakyRelu", "Gelu", "Identity"}
PROBE_X = np.concatenate([np.linspace(-8, 8, 1601), [-1e4, -1e3, -100, -40, -25, -20.5, -15, 15, 20.5, 25, 40, 100, 1e3,
                                                      1e4]]).astype(np.float32)
FIT_TOLERANCE = 1e-5
TOLERANCE = 1e-4  # the ONNX Runtime check, relative to the output's magnitude where it exceeds 1
CHECK_N, CHECK_T = 3, 8  # the check's batch and steps where the file leaves them dynamic
FLOAT = 1  # TensorProto.FLOAT
AFFINE_EPSILON = 1e-12  # a per-channel affine is a batchnorm of mean 0, var 1 and this epsilon: exact in float32


@dataclass(frozen=True)
class Part:
    """Channels [lo, hi) of edge `edge` (of `full` channels): PyTorch's `h_n[-2]` of a bidirectional GRU.
    Only a Concat that puts the parts back together (or layout ops) may read it."""

    edge: str
    lo: int
    hi: int
    full: int


@dataclass(frozen=True)
class Stack:
    """Values joined on ONNX axis `axis` that is not their channel axis: PyTorch's `h_n` of a stacked GRU
    (each layer's final state). Only a Gather of one of them may read it."""

    axis: int
    parts: tuple  # ((edge, Layout), ...)


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


# ONNX Runtime's status code and where in its sources it failed (`[ONNXRuntimeError] : 1 : FAIL :
# /onnxruntime_src/...h:46 void f(...)`): not the reason, which follows
ORT_NOISE = re.compile(r"\[ONNXRuntimeError\] : \d+ : \w+ : |/onnxruntime_src/\S+:\d+ .*?\) (?=[A-Z])")


def read_onnx_graph(path) -> QtoolGraph:
    """The whole model in ONNX file `path` as a qtool graph, proved well formed (qtool.layers.check)."""
    return _import(Path(path))[0]


def import_onnx_graph(path, check: bool = True) -> QtoolGraph:
    """`read_onnx_graph`, and with `check` its ONNX Runtime check (`graph.check_result`), from one
    reading of the file."""
    graph, ports, reader = once("onnx", path, lambda: _import(Path(path)))
    graph.check_result = _check(Path(path), graph, ports, reader) if check else None
    return graph


def check_onnx_graph(path, graph: QtoolGraph | None = None) -> dict:
    """Run file `path` with ONNX Runtime and `graph` (its import when None) with qtool.layers.run on
    the same random inputs; raises when they differ by more than TOLERANCE (relative where the output
    exceeds 1). Returns what was checked, or `{"checked": False, "reason": ...}` without ONNX Runtime."""
    read, ports, reader = _import(Path(path))
    return _check(Path(path), graph or read, ports, reader)


def _check(path: Path, graph: QtoolGraph, ports: Ports, reader: _Reader) -> dict:
    import qtool.layers as L

    try:
        with framework_run():  # importing it writes a file into the temporary folder
            import onnxruntime as ort
    except ImportError as e:
        return {"checked": False, "reason": f"ONNX Runtime cannot be imported (no module {e.name or 'onnxruntime'!r})"}
    t0 = time.perf_counter()
    feeds, xs, n, t = _check_inputs(reader, ports)
    opts = ort.SessionOptions()
    opts.log_severity_level = 4  # ORT would print its own errors; qtool says them in one line
    opts.intra_op_num_threads = 1
    if any(n.op_type == "DequantizeLinear" for n in reader.model.graph.node):
        # its optimizer fuses DequantizeLinear into integer kernels of other numerics: the float model
        # the file stands for is what it computes unoptimized
        opts.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    try:
        with framework_run():
            sess = ort.InferenceSession(_checked_model(reader).SerializeToString(), opts,
                                        providers=["CPUExecutionProvider"])
            want = dict(zip(ports.outputs, sess.run(list(ports.outputs), feeds)))
    except Exception as e:  # ONNX Runtime raises its own types on files it cannot run
        raise QtoolError(f"{path}: ONNX Runtime cannot run this file ({reason(ORT_NOISE.sub('', str(e)))})") from None
    got = L.run(graph, xs)
    worst = 0.0
    for name, (edge, layout) in ports.outputs.items():
        ref = layout.to_qtool(np.asarray(want[name], np.float32), n)
        if ref.shape != got[edge].shape:
            raise QtoolError(f"{path}: output '{name}': ONNX Runtime gives {list(want[name].shape)} "
                             f"({list(ref.shape)} channels-last), qtool's graph {list(got[edge].shape)}")
        diff = float(np.abs(ref - got[edge]).max(initial=0.0)) / max(1.0, float(np.abs(ref).max(initial=0.0)))
        if not diff <= TOLERANCE:
            raise QtoolError(f"{path}: output '{name}' of the imported graph differs from ONNX Runtime by up to "
                             f"{diff:.3g} (relative where above 1; tolerance {TOLERANCE:g}); refusing a wrong import")
        worst = max(worst, diff)
    pairs = {"fake_quant_pairs": len(reader.fake_quant)} if reader.fake_quant else {}
    unused = {"note": f"input(s) {', '.join(repr(s) for s in ports.states)} feed none of the outputs: left out"
              } if ports.states else {}
    return {"checked": True, "framework": "ONNX Runtime", "max_abs_diff": worst, "sequences": n, "steps": t,
            "seconds": round(time.perf_counter() - t0, 3), **pairs, **unused}


def _import(path: Path) -> tuple[QtoolGraph, Ports, _Reader]:
    import qtool.layers as L
    from qtool.importers.onnx.gru import load_onnx

    model = load_onnx(path)
    if not model.graph.output or not model.graph.node:
        raise QtoolError(f"{path}: holds no ONNX graph with outputs (an empty or truncated file?)")
    errors: list[QtoolError] = []
    for name, axes in INPUT_LAYOUTS.items():
        reader = _Reader(path, model, name, axes)
        try:
            graph, ports = reader.read()
            return L.check(graph, str(path)), ports, reader
        except QtoolError as e:
            # the first layout's error stands, unless it was one of layout and another layout reads the graph
            if not errors and (not isinstance(e, LayoutError) or not reader.rank3):
                raise QtoolError(str(e)) from None
            errors.append(e)
        except (ValueError, TypeError, AttributeError, IndexError, KeyError, UnicodeError, RecursionError) as e:
            if not errors:
                raise QtoolError(f"{path}: malformed ONNX graph ({reason(e)})") from None
    # a layout that got past the layout questions met the model's real problem (an unsupported op), or
    # found its channels too many: say that rather than the first layout's complaint
    worst = [e for e in errors if not isinstance(e, LayoutError)] + [e for e in errors if isinstance(e, TooWide)]
    raise QtoolError(str((worst or errors)[0])) from None


def _ints(a) -> list[int]:
    return [int(v) for v in np.asarray(a).reshape(-1)]


class _Reader:
    def __init__(self, path: Path, model, layout: str, axes: tuple) -> None:
        self.path, self.where, self.model = path, str(path), model
        opset = next((int(o.version) for o in model.opset_import if o.domain in ("", "ai.onnx")), 14)
        self.g = Graph(model.graph, str(path), path.parent, opset, model)
        self.g.fold_dequantized(model.graph, str(path))
        self.opset, self.layout, self.input_axes = opset, layout, axes
        self.data: dict[str, tuple[str, Layout]] = {}  # ONNX value -> (qtool edge, layout)
        self.nodes: list[Node] = []
        self.names: set[str] = set()
        self.done: set[int] = set()  # ids of ONNX nodes taken into a pattern already
        self.probe: dict[str, np.ndarray] = {}
        self.dense: dict[str, Node] = {}  # a MatMul's output -> its dense node, while it has no bias
        self.affine: dict[str, Node] = {}  # a per-channel affine's output -> its batchnorm node
        self.ranges = GraphRanges("ONNX QDQ")  # the fake-quant pairs' grids, by qtool edge
        self.fake_quant: dict[str, tuple[str, bool]] = {}  # a pair's Quantize output -> (its input, clips at 0)
        self.notes: list[str] = []
        self.rank3 = False
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
                raise QtoolError(f"{self.where}: output '{name}' is a part of a computed tensor or several of them "
                                 f"({edge}); qtool's outputs are whole edges")
            if "N" not in layout.axes and "NT" not in layout.axes:
                raise QtoolError(f"{self.where}: output '{name}' has no batch axis ({layout.describe()})")
            ports.outputs[name] = (edge, layout)
        before = {name: edge for name, (edge, _) in ports.outputs.items()}
        self._name_outputs(ports, set(inputs))
        keep = self._prune([e for e, _ in ports.outputs.values()])
        ranges = fake_quant.finish(self, keep, inputs, {before[k]: e for k, (e, _) in ports.outputs.items()
                                                        if before[k] != e})
        ports.notes = self.notes
        ports.batch, ports.steps = (self.declared + [None, None])[:2]
        name = graph.name or self.path.stem
        producer = " ".join(s for s in (self.model.producer_name, self.model.producer_version) if s)
        source = f"ONNX ({producer})" if producer else "ONNX"
        if self.rank3 and self.layout != next(iter(INPUT_LAYOUTS)):
            source += f", input read as {self.layout}"
        graph = QtoolGraph(keep, inputs, list(dict.fromkeys(e for e, _ in ports.outputs.values())), name, source,
                           steps=ports.steps if self.rank3 else None)
        graph.ranges = ranges
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
        if not tt.HasField("shape") or len(dims) not in (2, 3):
            raise QtoolError(f"{where} has shape {dims if tt.HasField('shape') else 'unknown'}; qtool reads "
                             "sequences [N, T, C] and vectors [N, C]")
        axes = self.input_axes if len(dims) == 3 else ("N", 0)
        self.rank3 = self.rank3 or len(dims) == 3
        sizes = dict(zip(axes, dims))
        error = LayoutError if len(dims) == 3 else QtoolError  # read as another layout, the channels may fit
        if sizes[0] is None:
            raise error(f"{where} has shape {dims}: the channels (axis {axes.index(0)} of {self.layout}) "
                        "must have a fixed size")
        if sizes[0] > (1 << 20):
            raise (TooWide if len(dims) == 3 else QtoolError)(f"{where} declares {sizes[0]:,} channels (at most "
                                                              f"{1 << 20:,})")
        if not self.declared:
            self.declared = [sizes.get("N"), sizes.get("T")]
        n, t = sizes.get("N") or PROBE_N, sizes.get("T") or PROBE_T
        return Layout.make(axes, (sizes[0],), n, t)

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
        if node.op_type in FUNCTION_OPS and self._function(node):
            return
        handler = getattr(self, f"_op_{node.op_type}", None)
        if handler is None:
            self._unsupported(node)
        handler(node)

    def _unsupported(self, node) -> None:
        ops = sorted({n[4:] for n in dir(self) if n.startswith("_op_")} | {"Shape", "Size"})
        raise QtoolError(f"{self.where}: {self.label(node)} is not supported in a whole-model import "
                         f"(supported: {', '.join(ops)}; and one activation written as elementwise ops, "
                         "such as PyTorch's Erf-based GELU)")

    def fail(self, node, what: str, layout: bool = False):
        return (LayoutError if layout else QtoolError)(f"{self.where}: {self.label(node)} {what}")

    # ---- values

    def _in(self, node, k: int = 0) -> tuple[str, Layout]:
        name = node.input[k] if len(node.input) > k else ""
        if name not in self.data:
            raise self.fail(node, f"reads '{name}' as data, but it is {'a constant' if name else 'absent'}; "
                                  "qtool reads ops on one computed tensor here")
        return self.data[name]

    def _const(self, node, k: int, default=None):
        """Input `k` of `node`, a constant (None when absent: `default`)."""
        name = node.input[k] if len(node.input) > k else ""
        if not name:
            return default
        if name not in self.g.constant:
            raise self.fail(node, f"takes '{name}' from the data where qtool needs a constant")
        return self.g.array(name)

    def _value(self, node, k: int, default=None):
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

    def _alias(self, node, edge: str, layout: Layout, out: int = 0) -> None:
        self.data[node.output[out]] = (edge, layout)

    def _emit(self, node, op: str, inputs: list[str], layout: Layout, attrs: dict | None = None,
              params: dict | None = None, out: int = 0, source: str = "", suffix: str = "") -> Node:
        """A qtool node for ONNX `node`, writing the edge named after its output `out` (with `suffix`: an
        edge of its own, for a node before the one that writes the output)."""
        part = next((e for e in inputs if not isinstance(e, str)), None)
        if part is not None:
            raise self.fail(node, f"reads channels [{part.lo}:{part.hi}] of the {part.full} of '{part.edge}' "
                                  f"alone; qtool's {op} reads whole edges (only a Concat may join the parts back)")
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

    def _used(self, node, k: int) -> bool:
        return len(node.output) > k and bool(node.output[k]) and node.output[k] in self.uses

    # ---- layout-only ops

    def _op_Identity(self, node) -> None:
        self._alias(node, *self._in(node))

    def _op_Dropout(self, node) -> None:
        if self._const(node, 2, False):
            raise self.fail(node, "runs in training mode")
        if self._used(node, 1):
            raise self.fail(node, "has its mask read; qtool imports inference graphs")
        self._alias(node, *self._in(node))

    def _op_Cast(self, node) -> None:
        if attr(node, "to", FLOAT) != FLOAT:
            raise self.fail(node, f"casts the data to ONNX type {attr(node, 'to', 0)}; qtool computes in float32")
        self._alias(node, *self._in(node))

    def _op_Transpose(self, node) -> None:
        edge, lay = self._in(node)
        perm = attr(node, "perm", None) or list(range(len(lay.axes)))[::-1]
        if sorted(perm) != list(range(len(lay.axes))):
            raise self.fail(node, f"has perm {perm} for a rank-{len(lay.axes)} input")
        self._alias(node, edge, lay.transpose(list(perm)))

    def _axes(self, node, k: int, rank: int, name: str = "axes") -> list[int] | None:
        a = self._value(node, k) if len(node.input) > k and node.input[k] else attr(node, name, None)
        return None if a is None else [int(v) % rank for v in _ints(a)]

    def _op_Squeeze(self, node) -> None:
        edge, lay = self._in(node)
        axes = self._axes(node, 1, len(lay.axes))
        if axes is None:
            axes = [k for k, s in enumerate(lay.shape()) if s == 1]
        self._alias(node, edge, lay.squeeze(axes, f"{self.where}: {self.label(node)}") if axes else lay)

    def _op_Unsqueeze(self, node) -> None:
        edge, lay = self._in(node)
        raw = _ints(self._value(node, 1, attr(node, "axes", [])))
        self._alias(node, edge, lay.unsqueeze([a % (len(lay.axes) + len(raw)) for a in raw]))

    def _op_Reshape(self, node) -> None:
        edge, lay = self._in(node)
        target, ins = _ints(self._value(node, 1)), lay.shape()
        if not attr(node, "allowzero", 0):
            target = [ins[k] if s == 0 and k < len(ins) else s for k, s in enumerate(target)]
        if target.count(-1) > 1 or any(s < -1 for s in target):
            raise self.fail(node, f"has shape {target}")
        if -1 in target:
            rest = math.prod(s for s in target if s != -1)
            target[target.index(-1)] = math.prod(ins) // rest if rest else 0
        self._alias(node, edge, lay.reshape(target, f"{self.where}: {self.label(node)}"))

    def _op_Flatten(self, node) -> None:
        edge, lay = self._in(node)
        ins = lay.shape()
        axis = attr(node, "axis", 1) % (len(ins) + 1)
        self._alias(node, edge, lay.reshape([math.prod(ins[:axis]), math.prod(ins[axis:])],
                                            f"{self.where}: {self.label(node)}"))

    def _op_Expand(self, node) -> None:
        edge, lay = self._in(node)
        ins, target = lay.shape(), _ints(self._value(node, 1))
        rank = max(len(ins), len(target))
        full = [1] * (rank - len(ins)) + ins
        to = [1] * (rank - len(target)) + target
        if any(t not in (1, s) for s, t in zip(full, to)):
            raise self.fail(node, f"broadcasts {ins} to {target}; qtool only follows an Expand to the data's own shape")
        self._alias(node, edge, lay.unsqueeze(list(range(rank - len(ins)))) if rank > len(ins) else lay)

    def _op_Slice(self, node) -> None:
        edge, lay = self._in(node)
        shape = lay.shape()
        if len(node.input) > 1:
            starts, ends = _ints(self._value(node, 1)), _ints(self._value(node, 2))
            axes = self._axes(node, 3, len(shape)) or list(range(len(starts)))
            steps = _ints(self._value(node, 4, [1] * len(starts)))
        else:  # Slice-1: attributes
            starts, ends = attr(node, "starts", []), attr(node, "ends", [])
            axes = [a % len(shape) for a in attr(node, "axes", list(range(len(starts))))]
            steps = [1] * len(starts)
        for a, s, e, step in zip(axes, starts, ends, steps):
            size = shape[a]
            s = min(max(s + size if s < 0 else s, 0), size)
            e = min(max(e + size if e < 0 else e, 0), size)
            if step == 1 and s == 0 and e == size:
                continue
            if step == 1 and lay.axes[a] == "T" and s == size - 1 and e == size:
                q = self._emit(node, "last_step", [edge], lay.replace(axes=lay.axes[:a] + ("1",) + lay.axes[a + 1:]),
                               source="Slice")
                edge, lay = q.outputs[0], self.data[q.outputs[0]][1]
                continue
            raise self.fail(node, f"takes [{s}:{e}:{step}] of axis {a} ({lay.axes[a]}) of {lay.describe()}; qtool "
                                  "follows a Slice of a whole axis or of the last time step only",
                            layout=lay.axes[a] in ("N", "NT"))
        self._alias(node, edge, lay)

    def _op_Gather(self, node) -> None:
        edge, lay = self._in(node)
        index = np.asarray(self._value(node, 1))
        if index.size != 1 or index.ndim > 1:
            raise self.fail(node, f"gathers {index.size} indices; qtool follows one index (the last time step)")
        i, keep = int(index.reshape(())), index.ndim == 1
        axis = attr(node, "axis", 0)
        if isinstance(edge, Stack):  # one of the joined values, then the index within it
            sizes = [la.shape()[edge.axis] for _, la in edge.parts]
            if axis % (len(edge.parts[0][1].axes)) != edge.axis or not -sum(sizes) <= i < sum(sizes):
                raise self.fail(node, f"takes index {i} of axis {axis} of values joined on axis {edge.axis}")
            i %= sum(sizes)
            k = next(k for k in range(len(sizes)) if i < sum(sizes[:k + 1]))
            (edge, lay), i = edge.parts[k], i - sum(sizes[:k])
        axis %= len(lay.axes)
        role, size = lay.axes[axis], lay.shape()[axis]
        if not -size <= i < size:
            raise self.fail(node, f"takes index {i} of axis {axis}, of size {size} ({lay.describe()})")
        i %= size
        if role == "1":
            self._alias(node, edge, lay.take(axis, keep))
        elif role == "T" and i == size - 1:
            self._emit(node, "last_step", [edge], lay.take(axis, keep), source="Gather")
        elif role == 0:  # the outermost channel factor: a part of the channels
            inner = math.prod(lay.cdims[1:])
            base, full = (edge.lo, edge.full) if isinstance(edge, Part) else (0, lay.channels)
            name = edge.edge if isinstance(edge, Part) else edge
            lo, hi = base + i * inner, base + (i + 1) * inner
            self._alias(node, name if (lo, hi) == (0, full) else Part(name, lo, hi, full), lay.take(axis, keep))
        else:
            raise self.fail(node, f"takes index {i} of axis {axis} ({role}) of {lay.describe()}; qtool follows the "
                                  "last time step, and an index of a GRU's directions or layers",
                            layout=role in ("N", "NT"))

    # ---- compute ops

    def _op_MatMul(self, node) -> None:
        edge, lay = self._in(node)
        W = self._const(node, 1)
        if W.ndim != 2 or not lay.holds_channels(len(lay.axes) - 1) or W.shape[0] != lay.channels:
            raise self.fail(node, f"multiplies {lay.describe()} by a constant of shape {list(W.shape)}; qtool "
                                  "reads a MatMul of the channels (last axis) by a [C_in, C_out] matrix")
        q = self._emit(node, "dense", [edge], lay.with_channels(len(lay.axes) - 1, W.shape[1]),
                       params={"W": self._float(node, W.T)})
        if self.uses.get(node.output[0]) == 1:
            self.dense[node.output[0]] = q

    def _op_Gemm(self, node) -> None:
        edge, lay = self._in(node)
        trans_a = attr(node, "transA", 0)
        B = self._const(node, 1)
        if len(lay.axes) != 2 or not lay.holds_channels(1 - trans_a) or B.ndim != 2:
            raise self.fail(node, f"reads {lay.describe()} (transA={trans_a}); qtool reads a Gemm of [N, C]")
        B = B.T if attr(node, "transB", 0) else B
        if B.shape[0] != lay.channels:
            raise self.fail(node, f"has B of shape {list(B.shape)} for {lay.channels} channels")
        params = {"W": self._float(node, attr(node, "alpha", 1.0) * B.T)}
        C = self._const(node, 2)
        if C is not None:
            try:
                bias = np.broadcast_to(self._float(node, C), (1, B.shape[1]))[0]
            except ValueError:
                raise self.fail(node, f"adds C of shape {list(np.shape(C))}; qtool reads a bias per output "
                                      "channel") from None
            params["b"] = (np.float32(attr(node, "beta", 1.0)) * bias).astype(np.float32)
        out = lay.transpose([1, 0]) if trans_a else lay
        self._emit(node, "dense", [edge], out.with_channels(1, B.shape[1]), params=params)

    def _float(self, node, a) -> np.ndarray:
        a = np.asarray(a)
        if a.dtype.kind != "f":
            raise self.fail(node, f"has a constant of type {a.dtype}; qtool's weights are real floating point")
        a = a.astype(np.float32)
        if not np.all(np.isfinite(a)):
            raise self.fail(node, "has a constant with NaN or Inf")
        return a

    def _op_Conv(self, node) -> None:
        edge, lay = self._in(node)
        W = self._const(node, 1)
        if W.ndim != 3:
            raise self.fail(node, f"is a {W.ndim - 2}-D convolution; qtool reads Conv over one axis (Conv1d)")
        self._ncw(node, lay)
        k = W.shape[2]
        stride, dilation = attr(node, "strides", [1])[0], attr(node, "dilations", [1])[0]
        group = attr(node, "group", 1)
        if list(attr(node, "kernel_shape", [k])) != [k]:
            raise self.fail(node, f"has kernel_shape {attr(node, 'kernel_shape', None)} but weights of {k} taps")
        if W.shape[1] * group != lay.channels:
            raise self.fail(node, f"has weights {list(W.shape)} and group {group} for {lay.channels} channels")
        padding, t = self._window(node, lay.t, k, stride, dilation, conv=True)
        params = {"W": self._float(node, W)}
        bias = self._const(node, 2)
        if bias is not None:
            params["b"] = self._float(node, bias).reshape(-1)
        attrs = dict(kernel=k, stride=stride, dilation=dilation, groups=group, padding=padding)
        self._emit(node, "conv1d", [edge], lay.with_channels(1, W.shape[0]).replace(t=t), attrs, params)

    def _ncw(self, node, lay: Layout) -> None:
        if len(lay.axes) != 3 or lay.axes[0] != "N" or lay.axes[2] != "T" or not lay.holds_channels(1):
            raise self.fail(node, f"reads {lay.describe()}; ONNX's {node.op_type} reads [N, C, T]", layout=True)

    def _window(self, node, t: int, k: int, stride: int, dilation: int, conv: bool = False) -> tuple:
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

    def _op_BatchNormalization(self, node) -> None:
        edge, lay = self._in(node)
        if len(lay.axes) < 2 or not lay.holds_channels(1):
            raise self.fail(node, f"reads {lay.describe()}; ONNX's BatchNormalization normalizes axis 1", layout=True)
        if attr(node, "training_mode", 0) or any(self._used(node, k) for k in (1, 2, 3, 4)):
            raise self.fail(node, "runs in training mode")
        params = {name: self._float(node, self._const(node, k)).reshape(-1)
                  for k, name in enumerate(("gamma", "beta", "mean", "var"), 1)}
        self._emit(node, "batchnorm", [edge], lay, {"epsilon": float(attr(node, "epsilon", 1e-5))}, params)

    def _activation(self, node, kind: str, **attrs) -> None:
        edge, lay = self._in(node)
        if kind == "linear":
            self._alias(node, edge, lay)
        else:
            self._emit(node, "activation", [edge], lay, {"kind": kind, **attrs})

    def _op_Relu(self, node) -> None:
        self._activation(node, "relu")

    def _op_Sigmoid(self, node) -> None:
        self._activation(node, "sigmoid")

    def _op_Tanh(self, node) -> None:
        self._activation(node, "tanh")

    def _op_Softplus(self, node) -> None:
        self._activation(node, "softplus")

    def _op_LeakyRelu(self, node) -> None:
        self._activation(node, "leaky_relu", alpha=float(attr(node, "alpha", 0.01)))

    def _op_HardSigmoid(self, node) -> None:
        self._activation(node, "hard_sigmoid", alpha=float(attr(node, "alpha", 0.2)),
                         beta=float(attr(node, "beta", 0.5)))

    def _op_Gelu(self, node) -> None:
        self._activation(node, "gelu", approximate=attr(node, "approximate", "none"))

    def _op_Clip(self, node) -> None:
        if len(node.input) > 1:
            lo, hi = self._const(node, 1), self._const(node, 2)
        else:  # Clip-6: attributes
            lo, hi = attr(node, "min", None), attr(node, "max", None)
        lo = None if lo is None or float(np.asarray(lo).reshape(())) <= -3.4e38 else float(np.asarray(lo).reshape(()))
        hi = None if hi is None or float(np.asarray(hi).reshape(())) >= 3.4e38 else float(np.asarray(hi).reshape(()))
        kinds = {(None, None): "linear", (0.0, None): "relu", (0.0, 6.0): "relu6"}
        if (lo, hi) not in kinds:
            raise self.fail(node, f"clips to [{lo}, {hi}]; qtool reads Clip(0, 6) (relu6) and Clip(0) (relu)")
        self._activation(node, kinds[lo, hi])

    def _arith(self, node) -> None:
        """Add, Sub, Mul, Div: of two computed tensors (add, mul), a MatMul's bias, or a per-channel affine."""
        op, (a, b) = node.op_type, (list(node.input) + ["", ""])[:2]
        if a in self.data and b in self.data:
            (ea, la), (eb, lb) = self.data[a], self.data[b]
            if op not in ("Add", "Mul"):
                raise self.fail(node, "computes on two computed tensors; qtool reads Add and Mul of them")
            if (la.axes, la.cdims, la.t if la.seq else 0) != (lb.axes, lb.cdims, lb.t if lb.seq else 0):
                raise self.fail(node, f"combines {la.describe()} and {lb.describe()} (channels {la.channels} and "
                                      f"{lb.channels}); qtool's {op.lower()} takes two tensors of one shape, "
                                      "without broadcasting")
            self._emit(node, op.lower(), [ea, eb], la)
            return
        first = a in self.data
        x = a if first else b
        edge, lay = self.data[x]
        c = self._const(node, 1 if first else 0)
        found = lay.per_channel(self._float(node, c))
        if found is None:
            raise self.fail(node, f"{op.lower()}s {lay.describe()} by a constant of shape {list(np.shape(c))}, which "
                                  "varies along the batch or time axis; qtool reads per-channel constants")
        vec, extra = found
        out = lay.unsqueeze(list(range(extra))) if extra else lay
        if op == "Add" and x in self.dense and not extra:  # a MatMul's bias
            q = self.dense.pop(x)
            q.params["b"], q.source = vec, "MatMul+Add"
            self.ranges.drop(edge, f"it rounds {q.name}'s values before its bias, which qtool's dense adds "
                                   "before it rounds")
            self._alias(node, edge, out)
            return
        if op == "Div" and not first:
            raise self.fail(node, "divides a constant by the data; qtool reads per-channel affine ops only")
        scale, shift = {"Mul": (vec, 0.0), "Add": (1.0, vec), "Sub": ((1.0, -vec) if first else (-1.0, vec)),
                        "Div": (np.float32(1) / vec, 0.0)}[op]
        C = lay.channels
        scale = np.broadcast_to(np.asarray(scale, np.float32), (C,))
        shift = np.broadcast_to(np.asarray(shift, np.float32), (C,))
        prev = self.affine.pop(x, None)
        if prev is not None and not extra:  # fold into the affine before it: s2 (s1 x + b1) + b2
            prev.params["gamma"] = (scale * prev.params["gamma"]).astype(np.float32)
            prev.params["beta"] = (scale * prev.params["beta"] + shift).astype(np.float32)
            prev.source += f"+{op}"
            self._alias(node, edge, out)
            if self.uses.get(node.output[0]) == 1:
                self.affine[node.output[0]] = prev
            return
        q = self._emit(node, "batchnorm", [edge], out, {"epsilon": AFFINE_EPSILON},
                       {"gamma": scale.copy(), "beta": shift.copy(), "mean": np.zeros(C, np.float32),
                        "var": np.ones(C, np.float32)}, source=f"{op} (per-channel affine)")
        if self.uses.get(node.output[0]) == 1:
            self.affine[node.output[0]] = q

    _op_Add = _op_Sub = _op_Mul = _op_Div = _arith
    _op_QuantizeLinear = fake_quant.quantize_linear
    _op_DequantizeLinear = fake_quant.dequantize_linear

    def _op_Concat(self, node) -> None:
        ins = [i for i in node.input if i]
        if any(i not in self.data for i in ins):
            raise self.fail(node, "joins the data with a constant; qtool's concat joins computed tensors")
        edges, lays = [self.data[i][0] for i in ins], [self.data[i][1] for i in ins]
        axis = attr(node, "axis", 0) % len(lays[0].axes)
        if not all(la.holds_channels(axis) for la in lays):
            rest = {(la.take(axis, False).axes, la.take(axis, False).cdims) for la in lays}
            if all(la.axes[axis] in ("1", 0) for la in lays) and len(rest) == 1:  # PyTorch's h_n of a stack
                self._alias(node, Stack(axis, tuple(zip(edges, lays))), lays[0])
                return
            raise self.fail(node, f"joins {', '.join(la.describe() for la in lays)} on axis {axis}; qtool joins "
                                  "tensors of one layout on their channel axis", layout=True)
        for lay in lays:
            rest = [r for k, r in enumerate(lay.axes) if k != axis]
            if rest != [r for k, r in enumerate(lays[0].axes) if k != axis] or (lay.seq and lay.t != lays[0].t):
                raise self.fail(node, f"joins {', '.join(la.describe() for la in lays)} on axis {axis}; qtool "
                                      "joins tensors of one layout on their channel axis", layout=True)
        out = lays[0].with_channels(axis, sum(la.channels for la in lays))
        if any(isinstance(e, Part) for e in edges):  # parts of one edge put back together, in order
            names = {e.edge if isinstance(e, Part) else e for e in edges}
            parts = [e if isinstance(e, Part) else None for e in edges]
            whole = (len(names) == 1 and None not in parts and parts[0].lo == 0 and parts[-1].hi == parts[0].full and
                     all(a.hi == b.lo for a, b in zip(parts, parts[1:])))
            if not whole:
                raise self.fail(node, "joins parts of the channels of computed tensors other than back into the "
                                      "whole; qtool's concat joins whole edges")
            self._alias(node, names.pop(), out)
            return
        self._emit(node, "concat", edges, out)

    def _op_Softmax(self, node) -> None:
        edge, lay = self._in(node)
        axis = attr(node, "axis", 1 if self.opset < 13 else -1) % len(lay.axes)
        tail = all(a == "1" for a in lay.axes[axis + 1:]) if self.opset < 13 else True
        if not lay.holds_channels(axis) or not tail:
            raise self.fail(node, f"normalizes axis {axis} of {lay.describe()}; qtool's softmax is over the channels",
                            layout=True)
        self._emit(node, "softmax", [edge], lay)

    def _op_LpNormalization(self, node) -> None:
        edge, lay = self._in(node)
        axis = attr(node, "axis", -1) % len(lay.axes)
        if attr(node, "p", 2) != 2 or not lay.holds_channels(axis):
            raise self.fail(node, f"takes the L{attr(node, 'p', 2)} norm over axis {axis} of {lay.describe()}; "
                                  "qtool's l2_normalize is the L2 norm over the channels")
        self._emit(node, "l2_normalize", [edge], lay)

    def _op_ReduceL2(self, node) -> None:
        """x / max(ReduceL2(x), eps) over the channels (PyTorch's F.normalize): l2_normalize."""
        edge, lay = self._in(node)
        axes = self._axes(node, 1, len(lay.axes))
        chain, v, eps = [node], node.output[0], None
        ok = axes is not None and len(axes) == 1 and lay.holds_channels(axes[0]) and attr(node, "keepdims", 1)
        while ok:
            users = self.readers.get(v, [])
            if len(users) != 1 or self.uses.get(v) != 1:
                ok = False
                break
            u = users[0]
            if u.op_type == "Div" and list(u.input[:2]) == [node.input[0], v]:
                chain.append(u)
                break
            if u.op_type in ("Clip", "Max") and u.input[0] == v and eps is None and len(u.input) > 1 and \
                    u.input[1] in self.g.constant and not (u.op_type == "Clip" and len(u.input) > 2 and u.input[2]):
                eps = float(np.asarray(self.g.array(u.input[1])).reshape(()))
            elif u.op_type not in ("Expand", "Identity") or u.input[0] != v:
                ok = False
                break
            chain.append(u)
            v = u.output[0]
        if not ok:
            raise self.fail(node, "is not the norm of x / max(||x||, eps) over the channels (F.normalize); qtool "
                                  "reads ReduceL2 only there")
        attrs = {"epsilon": eps} if eps is not None and eps > 0 else {}
        self.done.update(id(n) for n in chain[1:])
        div = chain[-1]
        self._emit(div, "l2_normalize", [edge], lay, attrs, source="ReduceL2+Div")

    def _reduce_time(self, node, op: str) -> None:
        edge, lay = self._in(node)
        axes = self._axes(node, 1, len(lay.axes))
        roles = [lay.axes[a] for a in axes or []]
        if roles.count("T") != 1 or any(r not in ("T", "1") for r in roles):
            raise self.fail(node, f"reduces axes {axes} of {lay.describe()}; qtool reads a {node.op_type} over the "
                                  "time steps only", layout=True)
        keep = attr(node, "keepdims", 1)
        axes_out = tuple("1" if k in axes else a for k, a in enumerate(lay.axes) if keep or k not in axes)
        self._emit(node, op, [edge], lay.replace(axes=axes_out))

    def _op_ReduceMean(self, node) -> None:
        self._reduce_time(node, "global_avg_pool1d")

    def _op_ReduceMax(self, node) -> None:
        self._reduce_time(node, "global_max_pool1d")

    def _op_GlobalAveragePool(self, node, op: str = "global_avg_pool1d") -> None:
        edge, lay = self._in(node)
        self._ncw(node, lay)
        self._emit(node, op, [edge], lay.replace(axes=("N", lay.axes[1], "1")))

    def _op_GlobalMaxPool(self, node) -> None:
        self._op_GlobalAveragePool(node, "global_max_pool1d")

    def _op_AveragePool(self, node) -> None:
        self._pool(node, "avg_pool1d")

    def _op_MaxPool(self, node) -> None:
        if self._used(node, 1):
            raise self.fail(node, "has its indices read")
        if attr(node, "storage_order", 0):
            raise self.fail(node, "has storage_order 1")
        self._pool(node, "max_pool1d")

    def _pool(self, node, op: str) -> None:
        edge, lay = self._in(node)
        self._ncw(node, lay)
        kernel = attr(node, "kernel_shape", [])
        if len(kernel) != 1:
            raise self.fail(node, f"has kernel_shape {kernel}; qtool pools over one axis")
        k, stride = int(kernel[0]), int(attr(node, "strides", [1])[0])
        if list(attr(node, "dilations", [1])) != [1]:
            raise self.fail(node, f"has dilations {attr(node, 'dilations', None)}; qtool's pools are dense windows")
        padding, t = self._window(node, lay.t, k, stride, 1)
        if op == "avg_pool1d" and attr(node, "count_include_pad", 0) and padding != "valid":
            if padding == "same":
                raise self.fail(node, "averages 'same' padding as zeros (count_include_pad=1); qtool's 'same' "
                                      "average counts real steps only")
            q = self._emit(node, "zero_pad1d", [edge], lay, {"pad": padding}, suffix=".pad",
                           source="AveragePool (count_include_pad)")
            edge, padding = q.outputs[0], "valid"
        self._emit(node, op, [edge], lay.replace(t=t), {"pool": k, "stride": stride, "padding": padding})

    def _op_Pad(self, node) -> None:
        edge, lay = self._in(node)
        if attr(node, "mode", "constant") != "constant":
            raise self.fail(node, f"pads in mode '{attr(node, 'mode', '')}'; qtool pads with zeros")
        rank = len(lay.axes)
        if len(node.input) > 1:
            pads = _ints(self._value(node, 1))
            value = self._const(node, 2, 0.0)
            axes = self._axes(node, 3, rank) or list(range(rank))
        else:  # Pad-2: attributes
            pads, value, axes = list(attr(node, "pads", [])), attr(node, "value", 0.0), list(range(rank))
        if np.any(np.asarray(value) != 0) or len(pads) != 2 * len(axes):
            raise self.fail(node, f"pads with {value} ({len(pads)} pads for {len(axes)} axes); qtool pads with zeros")
        before, after = {}, {}
        for k, a in enumerate(axes):
            before[a], after[a] = pads[k], pads[k + len(axes)]
        bad = [a for a in axes if (before[a] or after[a]) and (lay.axes[a] != "T" or before[a] < 0 or after[a] < 0)]
        if bad:
            raise self.fail(node, f"pads axis {bad[0]} ({lay.axes[bad[0]]}) of {lay.describe()} by "
                                  f"({before[bad[0]]}, {after[bad[0]]}); qtool pads the time steps with zeros",
                            layout=lay.axes[bad[0]] in ("N", "NT"))
        a = lay.axes.index("T") if "T" in lay.axes else None
        if a is None or not (before.get(a) or after.get(a)):
            self._alias(node, edge, lay)
            return
        pad = (int(before[a]), int(after[a]))
        self._emit(node, "zero_pad1d", [edge], lay.replace(t=lay.t + sum(pad)), {"pad": pad})

    def _op_GRU(self, node) -> None:
        from qtool.core.model import DIRECTIONS
        from qtool.importers.onnx.gru import _cells, _check_attributes
        from qtool.importers.onnx.gru import _check_inputs as _gru_inputs

        edge, lay = self._in(node)
        if len(lay.axes) != 3 or lay.axes[:2] != ("T", "N") or not lay.holds_channels(2):
            raise self.fail(node, f"reads X as {lay.describe()}; ONNX's GRU reads [T, N, C] (time-first)",
                            layout=True)
        where = f"{self.where}: GRU {self.label(node)}"
        dirs = _check_attributes(node, where)
        _gru_inputs(self.g, node, where)
        cells = _cells(self.g, node, dirs, where)
        if any(c.form != cells[0].form for c in cells):
            raise self.fail(node, f"computes different cells in its directions ({cells[0].form.describe()}; "
                            f"{cells[1].form.describe()}); a gru node has one cell form")
        H = cells[0].R.shape[1]
        params = {f"l0.{DIRECTIONS[d]}.{w}": getattr(c, w) for d, c in enumerate(cells) for w in ("W", "R", "bx", "br")}
        attrs = {"layers": 1, "bidirectional": dirs == 2, **cells[0].form.attrs()}
        seq = lay.replace(axes=("T", 0, "N", 1), cdims=(dirs, H))  # Y: [T, dirs, N, H]
        last = lay.replace(axes=(0, "N", 1), cdims=(dirs, H))  # Y_h: [dirs, N, H]
        if self._used(node, 0):
            y = self._emit(node, "gru", [edge], seq, {**attrs, "return_sequences": True}, params)
        if self._used(node, 1):
            if self._used(node, 0) and dirs == 1:
                self._emit(node, "last_step", [y.outputs[0]], last, out=1, source="GRU (Y_h)")
            else:
                self._emit(node, "gru", [edge], last, {**attrs, "return_sequences": False}, dict(params), out=1)

    # ---- an activation written as several elementwise ops

    def _function(self, node) -> bool:
        """Whether `node` starts an activation written as elementwise ops of one computed value and scalar
        constants (PyTorch's Erf GELU, the dynamo exporter's thresholded Softplus): the ops are evaluated
        on a probe and matched against qtool's activations. Single ops are left to their handlers."""
        data = {i for i in node.input if i in self.data}
        if len(data) != 1 or not self._elementwise(node, data):
            return False
        x = data.pop()
        start, region, made, grown = self.order[id(node)], {id(node): node}, {x, *node.output}, True
        while grown:  # the elementwise ops after `node` that read only `x`, each other and scalars
            grown = False
            for v in list(made):
                for n in self.readers.get(v, []):
                    if id(n) not in region and id(n) not in self.done and self.order[id(n)] > start and \
                            self._elementwise(n, made):
                        region[id(n)] = n
                        made.update(o for o in n.output if o)
                        grown = True
        if len(region) < 2:
            return False
        region = sorted(region.values(), key=lambda n: self.order[id(n)])
        values = {x: PROBE_X}
        for n in region:  # on the probe, once: a node that cannot run leaves its outputs out
            try:
                ins = [None if not i else values[i] if i in values else self.g.array(i) for i in n.input]
                values.update(zip(n.output, evaluate(self.where, self.g.inlined(n), ins, self.opset)))
            except (QtoolError, ValueError, TypeError, KeyError):
                continue
        best = None
        for end in region[1:]:
            cone = self._cone(end, region)
            ids, out = {id(n) for n in cone}, end.output[0]
            if id(node) not in ids or (best and len(best[0]) >= len(cone)) or out not in values:
                continue
            if any(o != out and (o in self.outputs or any(id(u) not in ids for u in self.readers.get(o, [])))
                   for n in cone for o in n.output if o):
                continue  # an intermediate value is read elsewhere too
            kind = _fit(values[out])
            if kind is not None:
                best = (cone, kind)
        if best is None:
            return False
        cone, (kind, attrs) = best
        self.done.update(id(n) for n in cone)
        edge, lay = self.data[x]
        end = cone[-1]
        if kind == "linear":
            self.data[end.output[0]] = (edge, lay)
        else:
            self._emit(end, "activation", [edge], lay, {"kind": kind, **attrs},
                       source="+".join(n.op_type for n in cone))
        return True

    def _elementwise(self, node, allowed: set) -> bool:
        """An elementwise op reading only values of `allowed` (one at least) and scalar constants."""
        if node.op_type not in FUNCTION_OPS or node.domain not in ("", "ai.onnx") or len(node.output) != 1 or \
                not any(i in allowed for i in node.input):
            return False
        for i in node.input:
            if i and i not in allowed and (i not in self.g.constant or np.size(self.g.array(i)) != 1):
                return False
        return True

    def _cone(self, end, region: list) -> list:
        by_out = {o: n for n in region for o in n.output if o}
        keep, todo = set(), [end]
        while todo:
            n = todo.pop()
            if id(n) in keep:
                continue
            keep.add(id(n))
            todo.extend(by_out[i] for i in n.input if i in by_out)
        return [n for n in region if id(n) in keep]

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


def _fit(y) -> tuple[str, dict] | None:
    """The qtool activation (kind, attrs) whose values on PROBE_X are `y`, or None."""
    from qtool.layers import layer

    y = np.asarray(y, np.float32).reshape(-1)
    if y.shape != PROBE_X.shape or not np.all(np.isfinite(y)):
        return None
    at = {v: int(np.argmin(np.abs(PROBE_X - v))) for v in (-1.0, 0.0, 1.0)}
    kinds = [("relu", {}), ("relu6", {}), ("sigmoid", {}), ("tanh", {}), ("softplus", {}), ("linear", {}),
             ("gelu", {"approximate": "none"}), ("gelu", {"approximate": "tanh"}),
             ("hard_sigmoid", {"alpha": 1 / 6, "beta": 0.5}), ("hard_sigmoid", {"alpha": 0.2, "beta": 0.5}),
             ("leaky_relu", {"alpha": float(-y[at[-1.0]])}),
             ("hard_sigmoid", {"alpha": float(y[at[1.0]] - y[at[-1.0]]) / 2, "beta": float(y[at[0.0]])})]
    act = layer("activation", "fit")
    for kind, attrs in kinds:
        ref = act.forward(Node("fit", "activation", ["x"], ["y"], {"kind": kind, **attrs}), [PROBE_X])[0]
        if np.all(np.abs(ref - y) <= FIT_TOLERANCE * (1 + np.abs(ref))):
            return kind, attrs
    return None


def _check_inputs(reader: _Reader, ports: Ports) -> tuple[dict, dict, int, int]:
    """ONNX Runtime's feeds (each in its own layout) and qtool's inputs (channels-last): random data,
    zeros for state inputs."""
    from onnx import helper

    rng = np.random.default_rng(0)
    n, t = ports.batch or CHECK_N, ports.steps or CHECK_T
    for name, lay in ports.inputs.items():  # a file may fix its batch and length: bounded before allocating
        if n * (t if lay.seq else 1) * lay.channels > MAX_TENSOR_ELEMENTS:
            raise QtoolError(f"{reader.where}: input '{name}' is fixed at {n:,} sequences x {t:,} steps x "
                             f"{lay.channels:,} channels, too large to check (more than {MAX_TENSOR_ELEMENTS:,} "
                             "values); `check=False` imports it unchecked")
    feeds, xs, params = {}, {}, {}
    for name, lay in ports.inputs.items():
        x = rng.standard_normal((n, t, lay.channels) if lay.seq else (n, lay.channels)).astype(np.float32)
        xs[name], feeds[name] = x, np.ascontiguousarray(lay.from_qtool(x))
        info = next(i for i in reader.model.graph.input if i.name == name)
        for a, d in zip(lay.axes, info.type.tensor_type.shape.dim):
            if d.dim_param:
                params[d.dim_param] = n if a == "N" else t
    for name in ports.states:
        info = next(i for i in reader.model.graph.input if i.name == name)
        dims = [d.dim_value if d.HasField("dim_value") else params.get(d.dim_param, n)
                for d in info.type.tensor_type.shape.dim]
        feeds[name] = np.zeros(dims, helper.tensor_dtype_to_np_dtype(info.type.tensor_type.elem_type or FLOAT))
    return feeds, xs, n, t


def _checked_model(reader: _Reader):
    """What ONNX Runtime runs for the check: the file inline, its fake-quant pairs on the data
    replaced by what qtool's float graph computes for them (the identity, or a relu)."""
    model = _inlined_model(reader)
    fake_quant.without_fake_quant(model, reader.fake_quant)
    return model


def _inlined_model(reader: _Reader):
    """A copy of the model with every stored tensor inline (external data read by qtool, checked first)."""
    from onnx import ModelProto

    model = ModelProto()
    model.CopyFrom(reader.model)
    graph = model.graph
    inits = [reader.g.tensor(t.name) for t in graph.initializer]
    del graph.initializer[:]
    graph.initializer.extend(inits)
    for k, node in enumerate(graph.node):
        inlined = reader.g.inlined(node)
        if inlined is not node:
            graph.node[k].CopyFrom(inlined)
    return model
