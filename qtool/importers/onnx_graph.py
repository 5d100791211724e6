"""What the ONNX importer needs to know about a graph besides the GRU nodes: constants (read only
after their sizes are checked), whether an initial state is provably zero, and whether one GRU
feeds the next as a stack (its output's directions concatenated per time step)."""

from __future__ import annotations

import numpy as np

from qtool.errors import QtoolError
from qtool.importers.validate import as_float32, check_size

FLOAT_TYPES = {1: np.float32, 10: np.float16, 11: np.float64, 16: None}  # 16: bfloat16, 2 bytes
INT64 = 7
# ops that only move values: a state made of zeros through them is still zeros
ZERO_PRESERVING = ("Expand", "Tile", "Identity", "Cast", "Reshape", "Unsqueeze", "Squeeze", "Transpose")
LAYOUT_OPS = ("Identity", "Dropout", "Transpose", "Reshape", "Squeeze", "Unsqueeze")
# a QDQ file's fake-quant of h between two layers: qtool imports it as h's grid (qtool.importers.qdq)
FAKE_QUANT_OPS = ("QuantizeLinear", "DequantizeLinear")
PROBE_T, PROBE_N = 7, 5  # a probe sequence for the layout ops between two GRUs


def attr(node, name: str, default):
    from onnx import helper

    for a in node.attribute:
        if a.name == name:
            v = helper.get_attribute_value(a)
            if isinstance(v, bytes):
                return v.decode(errors="replace")
            return [s.decode(errors="replace") if isinstance(s, bytes) else s for s in v] if isinstance(v, list) else v
    return default


def _payload(where: str, tp, name: str, itemsize: int) -> None:
    """The values a tensor stores must be the values its dims declare (checked before allocating)."""
    if tp.data_location == 1:  # EXTERNAL
        raise QtoolError(f"{where}: tensor '{name}' is stored in an external file; save the model with "
                         "onnx.save(model, path, save_as_external_data=False)")
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


def int_tensor(where: str, tp, name: str) -> np.ndarray | None:
    """A small int64 constant (shapes, axes), or None when it is not one."""
    from onnx import numpy_helper

    if tp.data_type != INT64:
        return None
    _payload(where, tp, name, 8)
    return numpy_helper.to_array(tp)


class Graph:
    """Constants, producers and graph inputs of an ONNX graph, by value name."""

    def __init__(self, graph) -> None:
        self.consts = {t.name: t for t in graph.initializer}
        self.producer = {}
        for node in graph.node:
            for out in node.output:
                self.producer[out] = node
            if node.op_type == "Constant" and node.output and attr(node, "value", None) is not None:
                self.consts[node.output[0]] = attr(node, "value", None)
        self.inputs = {i.name for i in graph.input} - set(self.consts)

    def fold_dequantized(self, graph, where: str) -> None:
        """QDQ files (seed 002: fake-quant on a constant folds into it): DequantizeLinear of an
        integer constant becomes the float constant it stands for."""
        from onnx import numpy_helper

        from qtool.importers.qdq import dequantized_constants

        needed = {i for n in graph.node if n.op_type == "DequantizeLinear" for i in n.input if i}
        arrays = {k: any_tensor(where, self.consts[k], k) for k in needed if k in self.consts}
        for name, value in dequantized_constants(graph, arrays).items():
            self.consts[name] = numpy_helper.from_array(value, name)

    def is_zero(self, where: str, name: str, depth: int = 0) -> bool:
        """Whether the value `name` is provably all zeros (a constant, or zeros moved by layout ops)."""
        if name in self.consts:
            tp = self.consts[name]
            return tp.data_type in FLOAT_TYPES and not np.any(float_tensor(where, tp, name))
        node = self.producer.get(name)
        if node is None or depth > len(self.producer):  # a cycle: not a valid graph, not provably zero
            return False
        if node.op_type == "ConstantOfShape":
            value = attr(node, "value", None)
            return value is None or not np.any(float_tensor(where, value, name))
        if node.op_type == "DequantizeLinear":  # DQ(Q(0)) = 0 when both use the same scale and zero point
            q = self.producer.get(node.input[0])
            same = q is not None and q.op_type == "QuantizeLinear" and list(q.input[1:]) == list(node.input[1:])
            return same and self.is_zero(where, q.input[0], depth + 1)
        return node.op_type in ZERO_PRESERVING and self.is_zero(where, node.input[0], depth + 1)

    def feeds_next(self, a, b) -> bool:
        """Whether GRU node `b` reads GRU node `a`'s output Y with its directions concatenated per time
        step (what a stack means), through layout ops only: replayed on a probe to be sure."""
        ops, name = [], b.input[0]
        while name != (a.output[0] if a.output else None):
            node = self.producer.get(name)
            if node is None or node.op_type not in LAYOUT_OPS + FAKE_QUANT_OPS or len(ops) > len(self.producer):
                return False
            ops.append(node)
            name = node.input[0]
        dirs = 2 if attr(a, "direction", "forward") == "bidirectional" else 1
        H = int(self.consts[a.input[2]].dims[-1])
        y = np.arange(PROBE_T * dirs * PROBE_N * H, dtype=np.float64).reshape(PROBE_T, dirs, PROBE_N, H)
        want = y.transpose(0, 2, 1, 3).reshape(PROBE_T, PROBE_N, dirs * H)  # [T, N, dirs * H]
        v = y
        try:
            for node in reversed(ops):
                v = self._replay(node, v)
        except (ValueError, TypeError, IndexError, QtoolError):
            return False
        return v.shape == want.shape and bool(np.array_equal(v, want))

    def _ints(self, node, index: int, name: str):
        """An int list from attribute `name` (older opsets) or constant input `index` (newer)."""
        if len(node.input) > index and node.input[index]:
            tp = self.consts.get(node.input[index])
            values = None if tp is None else int_tensor(f"node '{node.name}'", tp, node.input[index])
            if values is None:
                raise ValueError("not a constant")
            return [int(i) for i in values.reshape(-1)]
        return attr(node, name, None)

    def _replay(self, node, v: np.ndarray) -> np.ndarray:
        op = node.op_type
        if op in ("Identity", "Dropout") + FAKE_QUANT_OPS:
            return v
        if op == "Transpose":
            return v.transpose(attr(node, "perm", None) or list(range(v.ndim))[::-1])
        if op == "Squeeze":
            axes = self._ints(node, 1, "axes")
            return np.squeeze(v, axis=None if axes is None else tuple(axes))
        if op == "Unsqueeze":
            axes = sorted(a % (v.ndim + len(self._ints(node, 1, "axes"))) for a in self._ints(node, 1, "axes"))
            for a in axes:
                v = np.expand_dims(v, a)
            return v
        shape = self._ints(node, 1, "shape")  # Reshape: 0 copies the input's dim unless allowzero
        if not attr(node, "allowzero", 0):
            shape = [v.shape[i] if s == 0 else s for i, s in enumerate(shape)]
        return v.reshape(shape)
