"""What the ONNX importer needs to know about a graph besides the GRU nodes: constants (read only
after their sizes are checked, from external data beside the model too, and constant subgraphs
evaluated by onnx_fold), whether an initial state is provably zero, and whether one GRU feeds the
next as a stack (its output's directions concatenated per time step)."""

from __future__ import annotations

from functools import cached_property
from pathlib import Path

import numpy as np

from qtool.errors import QtoolError
from qtool.importers.checks import MAX_ARCHIVE_BYTES, as_float32, check_size
from qtool.importers.onnx.external import inline
from qtool.importers.onnx.fold import attr, evaluate, foldable

FLOAT_TYPES = {1: np.float32, 10: np.float16, 11: np.float64, 16: None}  # 16: bfloat16, 2 bytes
# ops whose outputs only take values from their inputs (a state made of zeros through them is still
# zeros), with the positions of those inputs; None: all of them
ZERO_PRESERVING = {"Expand": [0], "Tile": [0], "Identity": [0], "Dropout": [0], "Cast": [0], "CastLike": [0],
                   "Reshape": [0], "Unsqueeze": [0], "Squeeze": [0], "Transpose": [0], "Flatten": [0], "Slice": [0],
                   "Gather": [0], "GatherElements": [0], "GatherND": [0], "Split": [0], "Concat": None,
                   "Where": [1, 2]}
LAYOUT_OPS = ("Identity", "Dropout", "Transpose", "Reshape", "Squeeze", "Unsqueeze", "Flatten")
# ops that may carry one GRU's output to the next: they only move values (positions of the moved input)
MOVING_OPS = {**{op: [0] for op in LAYOUT_OPS + ("Slice", "Gather", "Split")}, "Concat": None}
# a QDQ file's fake-quant of h between two layers: qtool imports it as h's grid (qtool.importers.onnx.qdq)
FAKE_QUANT_OPS = ("QuantizeLinear", "DequantizeLinear")
SHAPE_OPS = ("Shape", "Size")  # their outputs depend on the shape of the data, not its values
PROBE_T, PROBE_N = 7, 5  # a probe sequence for the ops between two GRUs
MAX_PROBE = 1 << 20


def _payload(where: str, tp, name: str, itemsize: int) -> None:
    """The values a tensor stores must be the values its dims declare (checked before allocating)."""
    if tp.data_location == 1:  # EXTERNAL: Graph.tensor reads it first (onnx_external)
        raise QtoolError(f"{where}: tensor '{name}' is stored in an external file, which qtool reads only "
                         "beside the model file")
    n = int(np.prod(check_size(where, name, tp.dims), dtype=np.int64))
    stored = (len(tp.raw_data) / itemsize if tp.raw_data else
              len(tp.float_data) + len(tp.double_data) + len(tp.int32_data) + len(tp.int64_data))
    if stored != n:
        raise QtoolError(f"{where}: tensor '{name}' declares dims {list(tp.dims)} ({n:,} values) but stores "
                         f"{stored:,g}")


def float_tensor(where: str, tp, name: str) -> np.ndarray:
    """A constant as float32: real floating point only, its payload matching its dims."""
    from onnx import numpy_helper

    if tp.data_type not in FLOAT_TYPES:
        raise QtoolError(f"{where}: tensor '{name}' has ONNX data type {tp.data_type}; GRU weights must "
                         "be real floating point (float16, bfloat16, float32 or float64)")
    dtype = FLOAT_TYPES[tp.data_type]
    _payload(where, tp, name, 2 if dtype is None else np.dtype(dtype).itemsize)
    return as_float32(where, name, numpy_helper.to_array(tp).astype(np.float32))


def any_tensor(where: str, tp, name: str) -> np.ndarray:
    """A numeric constant of any type, its payload checked against its dims before allocating."""
    from onnx import helper, numpy_helper

    try:
        dtype = np.dtype(helper.tensor_dtype_to_np_dtype(tp.data_type))
    except (KeyError, TypeError, ValueError):
        raise QtoolError(f"{where}: tensor '{name}' has unknown ONNX data type {tp.data_type}") from None
    _payload(where, tp, name, dtype.itemsize)
    return numpy_helper.to_array(tp)


def computed_float(where: str, name: str, a: np.ndarray) -> np.ndarray:
    """A value computed from constants, as GRU weights: real floating point only, as float32."""
    if a.dtype.kind != "f" and a.dtype.name != "bfloat16":
        raise QtoolError(f"{where}: tensor '{name}' (computed from constants) has dtype {a.dtype}; GRU weights "
                         "must be real floating point (float16, bfloat16, float32 or float64)")
    return as_float32(where, name, a.astype(np.float32))


class Graph:
    """Constants, producers and graph inputs of an ONNX graph, by value name; `where` names the file
    in messages, `folder` is where its external data may lie, `opset` the default domain's version."""

    def __init__(self, graph, where: str = "", folder: Path | None = None, opset: int = 14, model=None) -> None:
        self.where, self.folder, self.opset, self.model = where or "ONNX graph", folder, opset, model
        self.nodes = list(graph.node)
        self.consts = {t.name: t for t in graph.initializer}
        self.producer = {}
        for node in graph.node:
            for out in node.output:
                self.producer[out] = node
            if node.op_type == "Constant" and node.output and attr(node, "value", None) is not None:
                self.consts[node.output[0]] = attr(node, "value", None)
        self.inputs = {i.name for i in graph.input} - set(self.consts)
        self._values: dict[str, np.ndarray] = {}
        self._bytes = 0

    def fold_dequantized(self, graph, where: str) -> None:
        """QDQ files (a fake-quant on a constant folds into it): DequantizeLinear of an
        integer constant becomes the float constant it stands for."""
        from onnx import numpy_helper

        from qtool.importers.onnx.dequant import dequantized_constants

        needed = {i for n in graph.node if n.op_type == "DequantizeLinear" for i in n.input if i}
        arrays = {k: any_tensor(where, self.tensor(k), k) for k in needed if k in self.consts}
        for name, value in dequantized_constants(graph, arrays).items():
            self.consts[name] = numpy_helper.from_array(value, name)
        self.__dict__.pop("constant", None)

    @cached_property
    def constant(self) -> set[str]:
        """Names of the values that are constant: initializers, Constant nodes, and the outputs of
        deterministic ops whose inputs are all constant (in graph order, which ONNX requires)."""
        names = set(self.consts)
        for node in self.nodes:
            if foldable(node) and all(i in names for i in node.input if i):
                names.update(o for o in node.output if o)
        return names

    def tensor(self, name: str):
        """The TensorProto of constant `name` (named so), its external data read in (checked first)."""
        from onnx import TensorProto

        tp = inline(self.where, self.consts[name], self.folder)
        if tp.name != name:  # a Constant node's value is named after nothing in particular
            named = TensorProto()
            named.CopyFrom(tp)
            named.name, tp = name, named
        return tp

    def array(self, name: str) -> np.ndarray:
        """The value of constant `name`, evaluated (with the nodes it needs) on first use."""
        if name not in self.constant:  # never run a node that reads data (or a GRU) to get a "constant"
            raise QtoolError(f"{self.where}: '{name}' is not a constant")
        if name not in self._values:
            if name in self.consts:
                self._keep(name, any_tensor(self.where, self.tensor(name), name))
            else:
                for node in self._cone([name], set(self._values))[0]:
                    ins = [self.array(i) if i else None for i in node.input]
                    outs = evaluate(self.where, self.inlined(node), ins, self.opset)
                    for out, value in zip(node.output, outs):
                        if out:
                            self._keep(out, value)
        return self._values[name]

    def _keep(self, name: str, value: np.ndarray) -> None:
        check_size(self.where, name, value.shape)
        self._bytes += value.nbytes
        if self._bytes > MAX_ARCHIVE_BYTES:  # the per-tensor limit bounds each; this bounds them together
            raise QtoolError(f"{self.where}: its constant subgraphs evaluate to more than {MAX_ARCHIVE_BYTES:,} "
                             "bytes, beyond qtool's limit")
        self._values[name] = value

    def weight(self, where: str, name: str) -> np.ndarray:
        """A GRU weight as float32: a constant initializer or a value computed from constants."""
        if name in self.consts:
            return float_tensor(where, self.tensor(name), name)
        return computed_float(where, name, self.array(name))

    def _cone(self, names: list, known: set) -> tuple[list, list]:
        """(the nodes that compute constants `names` from stored tensors and the `known` values, in graph
        order; the stored tensors they read)."""
        order = {id(n): i for i, n in enumerate(self.nodes)}
        nodes, leaves, todo, seen = {}, [], list(names), set()
        while todo:
            v = todo.pop()
            if v in seen or v in known:
                continue
            seen.add(v)
            if v in self.consts:
                leaves.append(v)
                continue
            node = self.producer[v]
            nodes[id(node)] = node
            todo.extend(i for i in node.input if i)
        return sorted(nodes.values(), key=lambda n: order[id(n)]), sorted(leaves)

    def cone(self, names: list) -> tuple[list, list]:
        """The constant subgraph computing `names` (which must be constant): (nodes, stored tensors),
        tensor attributes stored in external data read into the nodes."""
        nodes, leaves = self._cone([n for n in names if n], set())
        return [self.inlined(n) for n in nodes], leaves

    def inlined(self, node):
        """`node`, or a copy of it whose tensor attributes (ConstantOfShape's value, ...) stored in external
        data are read in (`onnx.save(..., convert_attribute=True)` writes them there)."""
        from onnx import AttributeProto, NodeProto

        external = [a for a in node.attribute if a.type == AttributeProto.TENSOR and a.t.data_location == 1]
        if not external:
            return node
        copy = NodeProto()
        copy.CopyFrom(node)
        for a in copy.attribute:
            if a.type == AttributeProto.TENSOR and a.t.data_location == 1:
                a.t.CopyFrom(inline(self.where, a.t, self.folder))
        return copy

    def state_origin(self, name: str) -> set | None:
        """Where a GRU's initial state takes its values from: the set of graph inputs (empty when it
        is provably all zeros), or None when it may hold values computed otherwise (not provable)."""
        sources, todo, seen = set(), [name], set()
        while todo:
            v = todo.pop()
            if v in seen:
                continue
            seen.add(v)
            if v in self.constant:
                a = self.array(v)
                if (a.dtype.kind not in "biuf" and a.dtype.name != "bfloat16") or np.any(a.astype(np.float32) != 0):
                    return None
            elif v in self.inputs:
                sources.add(v)
            else:
                moved = self._zero_preserving_inputs(self.producer.get(v))
                if moved is None:
                    return None
                todo.extend(moved)
        return sources

    def _zero_preserving_inputs(self, node) -> list | None:
        """The inputs whose values `node` passes on when it only moves values (zeros stay zeros);
        None when it computes new values."""
        if node is None:
            return None
        op = node.op_type
        if op == "ConstantOfShape":  # zero whatever its (possibly data-dependent) shape
            value = attr(self.inlined(node), "value", None)
            return [] if value is None or not np.any(any_tensor(self.where, value, node.output[0])) else None
        if op == "Pad":
            if attr(node, "mode", "constant") != "constant":
                return [node.input[0]]  # edge, reflect, wrap: values of the input
            if self.opset < 11:
                return [node.input[0]] if attr(node, "value", 0.0) == 0 else None
            return [i for i in (node.input[0], *node.input[2:3]) if i]  # the pad value must be zero too
        if op == "DequantizeLinear":  # DQ(Q(0)) = 0 when both use the same scale and zero point
            q = self.producer.get(node.input[0])
            same = q is not None and q.op_type == "QuantizeLinear" and list(q.input[1:]) == list(node.input[1:])
            return [q.input[0]] if same else None
        if op not in ZERO_PRESERVING or node.domain not in ("", "ai.onnx"):
            return None
        positions = ZERO_PRESERVING[op]
        return [i for k, i in enumerate(node.input) if i and (positions is None or k in positions)]

    def feeds_next(self, a, b, dirs: int, H: int) -> bool:
        """Whether GRU node `b` reads GRU node `a`'s output Y with its directions concatenated per time
        step (what a stack means), through ops that only move values: the ops between them (and the
        shape arithmetic they use) are evaluated on a probe whose values are all different."""
        if not a.output or not a.output[0] or not b.input or not b.input[0]:
            return False
        for T, N in self._probe_sizes(a.output[0]):
            y = np.arange(T * dirs * N * H, dtype=np.float64).reshape(T, dirs, N, H)
            want = y.transpose(0, 2, 1, 3).reshape(T, N, dirs * H)  # [T, N, dirs * H]
            try:
                got = self._replay(a.output[0], y, b.input[0])
            except (ValueError, TypeError, IndexError, KeyError, QtoolError):
                got = None
            if got is not None and got.shape == want.shape and np.array_equal(got, want):
                return True
        return False

    def _probe_sizes(self, name: str) -> list:
        """Probe (T, N): a generic pair, and the file's own when it declares fixed sizes (an exporter
        may write them into the Reshape between two layers)."""
        sizes = [(PROBE_T, PROBE_N)]
        dims = self._static_dims.get(name)
        if dims and len(dims) == 4 and all(d > 0 for d in dims) and np.prod(dims, dtype=np.int64) <= MAX_PROBE:
            sizes.append((dims[0], dims[2]))
        return sizes

    @cached_property
    def _static_dims(self) -> dict:
        """Value name -> fixed dims, by ONNX shape inference (no data is read); empty if it fails."""
        from onnx import shape_inference

        if self.model is None:
            return {}
        try:
            inferred = shape_inference.infer_shapes(self.model).graph
        except Exception:  # shape inference is a help here, never a requirement
            return {}
        dims = {}
        for v in list(inferred.value_info) + list(inferred.output):
            shape = v.type.tensor_type.shape.dim
            if all(d.HasField("dim_value") for d in shape):
                dims[v.name] = [int(d.dim_value) for d in shape]
        return dims

    def _replay(self, source: str, probe: np.ndarray, target: str) -> np.ndarray | None:
        """The value `target` takes when `source` is `probe`, or None when it depends on anything
        but `probe` and constants, or when the probe's values pass through an op that computes."""
        needed, todo, seen = {}, [target], set()
        while todo:
            v = todo.pop()
            if v in seen or v == source or v in self.constant:
                continue
            seen.add(v)
            node = self.producer.get(v)
            if node is None:  # a graph input: not a function of the first GRU alone
                return None
            needed[id(node)] = node
            todo.extend(i for i in node.input if i)
        values, data = {source: probe}, {source}
        for node in (n for n in self.nodes if id(n) in needed):
            ins = [None if not i else values[i] if i in values else self.array(i) for i in node.input]
            carried = [k for k, i in enumerate(node.input) if i in data]
            outs = self._replay_node(node, ins, carried)
            if outs is None:
                return None
            values.update((o, v) for o, v in zip(node.output, outs) if o)
            if carried and node.op_type not in SHAPE_OPS:
                data.update(o for o in node.output if o)
        return values.get(target)

    def _replay_node(self, node, ins: list, carried: list) -> list | None:
        op = node.op_type
        if carried and op in FAKE_QUANT_OPS:  # fake-quant of h: the grid is imported, the layout kept
            return [ins[0]] if carried == [0] else None
        if carried and op not in SHAPE_OPS:
            positions = MOVING_OPS.get(op, [])
            if node.domain not in ("", "ai.onnx") or any(positions is not None and k not in positions
                                                         for k in carried):
                return None
        elif not foldable(node):
            return None
        return evaluate(self.where, self.inlined(node), ins, self.opset)

