"""ONNX QDQ around `GRU` nodes, as ONNX Runtime's `quantize_static(quant_format=QDQ,
op_types_to_quantize=["GRU"])` writes them: DequantizeLinear on integer weight initializers (per
tensor, or per channel with `axis`) gives W, R and B; QuantizeLinear -> DequantizeLinear on the
node's input X and on its output Y give the ranges of x and h.

`dequantized_constants` folds DequantizeLinear on constants into float constants (seed 002: the
fake-quant on a constant folds into it), which is all the float ONNX importer needs to read a QDQ
file; `read_qdq` reads the quantizers themselves.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from qtool.errors import QtoolError
from qtool.importers.onnx_graph import Graph, any_tensor, attr
from qtool.importers.ranges import Imported, ImportedRange, learned_range, source_key
from qtool.model import GruModel

# ONNX TensorProto data types of quantized integers: (bits, signed)
INT_TYPES = {2: (8, False), 3: (8, True), 4: (16, False), 5: (16, True)}


def _bounds(elem_type: int) -> tuple[int, int, int]:
    """(bits, qmin, qmax) of an ONNX integer type."""
    if elem_type not in INT_TYPES:
        raise QtoolError(f"quantized ONNX type {elem_type} is not supported (int8, uint8, int16, uint16)")
    bits, signed = INT_TYPES[elem_type]
    return (bits, -(1 << (bits - 1)), (1 << (bits - 1)) - 1) if signed else (bits, 0, (1 << bits) - 1)


def _broadcast(param: np.ndarray, shape: tuple, axis: int) -> np.ndarray:
    """A DequantizeLinear scale or zero point (scalar, or 1-D along `axis`) against its input."""
    param = np.asarray(param)
    if param.ndim == 0 or param.size == 1:
        return np.broadcast_to(param.reshape(()), shape)
    view = [1] * len(shape)
    view[axis % len(shape)] = param.size
    return np.broadcast_to(param.reshape(view), shape)


def _dequantizer(node, consts: dict, where: str) -> tuple[np.ndarray, np.ndarray, int]:
    """(scale, zero point, ONNX integer type) of a QuantizeLinear/DequantizeLinear node."""
    if attr(node, "block_size", 0):
        raise QtoolError(f"{where}: blocked quantization (block_size) is not supported")
    try:
        scale = consts[node.input[1]]
    except KeyError:
        raise QtoolError(f"{where}: the scale of '{node.name}' is not a constant") from None
    zp_name = node.input[2] if len(node.input) > 2 else ""
    if zp_name and zp_name not in consts:
        raise QtoolError(f"{where}: the zero point of '{node.name}' is not a constant")
    zp = consts[zp_name] if zp_name else np.zeros((), np.uint8)
    return np.asarray(scale, np.float64), zp, _np_type(zp)


def _np_type(a: np.ndarray) -> int:
    return {np.dtype(np.uint8): 2, np.dtype(np.int8): 3, np.dtype(np.uint16): 4,
            np.dtype(np.int16): 5}.get(np.asarray(a).dtype, 0)


def dequantize_node(node, consts: dict) -> np.ndarray:
    q = consts[node.input[0]]
    scale, zp, _ = _dequantizer(node, consts, "DequantizeLinear")
    axis = attr(node, "axis", 1)
    return ((q.astype(np.float64) - _broadcast(zp, q.shape, axis)) * _broadcast(scale, q.shape, axis)
            ).astype(np.float32)


def dequantized_constants(graph, consts: dict) -> dict:
    """Outputs of DequantizeLinear nodes on constant integers, as float constants."""
    return {n.output[0]: dequantize_node(n, consts) for n in graph.node
            if n.op_type == "DequantizeLinear" and n.input[0] in consts}


def _gru_nodes(graph, model: GruModel) -> list:
    """The GRU nodes the float import chose, layer by layer (see importers.import_model)."""
    nodes = [n for n in graph.node if n.op_type == "GRU"]
    key = source_key(model)
    if key:
        nodes = [n for i, n in enumerate(nodes) if (n.name or f"GRU_{i}") == key]
    if len(nodes) != model.num_layers:
        raise QtoolError(f"{model.source}: {len(nodes)} GRU nodes for {model.num_layers} layers")
    return nodes


def _weight_ranges(node, index: int, producer: dict, consts: dict, where: str):
    """Per direction and row: the learned range of a DequantizeLinear-fed weight input."""
    dq = producer.get(node.input[index]) if len(node.input) > index else None
    if dq is None or dq.op_type != "DequantizeLinear" or dq.input[0] not in consts:
        return None
    q = consts[dq.input[0]]
    scale, zp, _ = _dequantizer(dq, consts, where)
    bits, qmin, qmax = _bounds(_np_type(q))
    axis = attr(dq, "axis", 1)
    s, z = _broadcast(scale, q.shape, axis), _broadcast(zp, q.shape, axis).astype(np.int64)
    lo, hi = learned_range(s, z, qmin, qmax)
    desc = "per channel" if np.asarray(scale).size > 1 else "per tensor"
    return lo, hi, s, bits, f"DequantizeLinear '{dq.name}' (int{bits}, {desc})"


def _activation_range(dq_or_q, consts: dict, where: str):
    scale, zp, elem = _dequantizer(dq_or_q, consts, where)
    if scale.size != 1:
        raise QtoolError(f"{where}: '{dq_or_q.name}' quantizes an activation per channel; not supported")
    bits, qmin, qmax = _bounds(elem)
    lo, hi = learned_range(float(scale.reshape(())), int(np.asarray(zp).reshape(())), qmin, qmax)
    return ImportedRange(float(lo), float(hi), f"{dq_or_q.op_type} '{dq_or_q.name}' (int{bits}, scale "
                         f"{float(scale.reshape(())):.6g})", float(scale.reshape(())), bits)


def read_qdq(path: Path, model: GruModel) -> Imported | None:
    """The quantizers around the chosen GRU nodes; None when the file has no QDQ around them."""
    import onnx

    graph = onnx.load(str(path), load_external_data=False).graph  # external data: read by Graph, checked
    g = Graph(graph, str(path), Path(path).parent)
    consts = {k: any_tensor(str(path), g.tensor(k), k) for k in g.consts}  # each size checked first
    producer = g.producer
    consumers: dict[str, list] = {}
    for n in graph.node:
        for i in n.input:
            consumers.setdefault(i, []).append(n)
    imported = Imported("ONNX QDQ")
    for l, node in enumerate(_gru_nodes(graph, model)):
        where = f"{path}: GRU node '{node.name}'"
        for index, name in ((1, "W"), (2, "R")):
            found = _weight_ranges(node, index, producer, consts, where)
            if found is None:
                continue
            lo, hi, s, bits, source = found  # [dirs, 3H, C]
            for d in range(lo.shape[0]):
                imported.add(l, d, name, ImportedRange(lo[d].min(1), hi[d].max(1), source, s[d].max(1), bits))
        b = producer.get(node.input[3]) if len(node.input) > 3 and node.input[3] else None
        if b is not None and b.op_type == "DequantizeLinear":
            imported.notes.append(f"'{b.name}': the biases are int{_bounds(_np_type(consts[b.input[0]]))[0]} "
                                  "in the file; their values are kept on qtool's 32-bit bias grid")
        dq = producer.get(node.input[0])
        if dq is not None and dq.op_type == "DequantizeLinear" and dq.input[0] not in consts:
            imported.add(l, 0, "x", _activation_range(dq, consts, where))
        for out in node.output[:2]:  # Y (every step) and Y_h (the last step) are both h
            for q in consumers.get(out, []):
                if q.op_type == "QuantizeLinear":
                    imported.add(l, 0, "h", _activation_range(q, consts, where))
        if len(node.input) > 5 and node.input[5]:
            imported.notes.append(f"'{node.name}': initial_h is ignored; qtool's GRU starts from h0 = 0")
    return imported if imported.ranges else None
