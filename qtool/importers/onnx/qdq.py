"""ONNX QDQ around `GRU` nodes, as ONNX Runtime's `quantize_static(quant_format=QDQ,
op_types_to_quantize=["GRU"])` writes them: DequantizeLinear on integer weight initializers (per
tensor, or per channel with `axis`) gives W, R and B; QuantizeLinear -> DequantizeLinear on the
node's input X and on its output Y give the ranges of x and h.

`dequantized_constants` folds DequantizeLinear on constants into float constants (a
fake-quant on a constant folds into it: docs/qat.md), which is all the float ONNX importer
needs to read a QDQ file; `read_qdq` reads the quantizers themselves.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from qtool.core.model import GruModel
from qtool.errors import QtoolError
from qtool.importers.onnx.dequant import bounds, broadcast, dequantizer, np_type
from qtool.importers.onnx.graph import Graph, any_tensor, attr
from qtool.importers.onnx.loops import load_onnx
from qtool.importers.ranges import Imported, ImportedRange, learned_range, source_key


def _gru_nodes(graph, model: GruModel) -> list:
    """The GRU nodes the float import chose, layer by layer (see importers.import_model)."""
    nodes = [n for n in graph.node if n.op_type == "GRU"]
    key = source_key(model)
    took = model.extra.get("import", {}).get("took") or [key]  # the nodes of a stack its first names
    if key:
        names = [n.name or f"GRU_{i}" for i, n in enumerate(nodes)]
        nodes = [n for name in took for n, own in zip(nodes, names) if own == name]
    if len(nodes) != model.num_layers:
        raise QtoolError(f"{model.source}: {len(nodes)} GRU nodes for {model.num_layers} layers")
    return nodes


def _weight_ranges(node, index: int, producer: dict, consts: dict, where: str):
    """Per direction and row: the learned range of a DequantizeLinear-fed weight input."""
    dq = producer.get(node.input[index]) if len(node.input) > index else None
    if dq is None or dq.op_type != "DequantizeLinear" or dq.input[0] not in consts:
        return None
    q = consts[dq.input[0]]
    scale, zp, _ = dequantizer(dq, consts, where)
    bits, qmin, qmax = bounds(np_type(q))
    axis = attr(dq, "axis", 1)
    s, z = broadcast(scale, q.shape, axis), broadcast(zp, q.shape, axis).astype(np.int64)
    lo, hi = learned_range(s, z, qmin, qmax)
    desc = "per channel" if np.asarray(scale).size > 1 else "per tensor"
    return lo, hi, s, bits, f"DequantizeLinear '{dq.name}' ({int_type(bits, qmin)}, {desc})"


def int_type(bits: int, qmin: int) -> str:
    """How a quantizer's integers are named: int8, uint8, ..."""
    return f"{'u' if qmin == 0 else ''}int{bits}"


def activation_range(dq_or_q, consts: dict, where: str):
    scale, zp, elem = dequantizer(dq_or_q, consts, where)
    if scale.size != 1:
        raise QtoolError(f"{where}: '{dq_or_q.name}' quantizes an activation per channel; not supported")
    bits, qmin, qmax = bounds(elem)
    lo, hi = learned_range(float(scale.reshape(())), int(np.asarray(zp).reshape(())), qmin, qmax)
    return ImportedRange(float(lo), float(hi), f"{dq_or_q.op_type} '{dq_or_q.name}' ({int_type(bits, qmin)}, scale "
                         f"{float(scale.reshape(())):.6g})", float(scale.reshape(())), bits)


def read_qdq(path: Path, model: GruModel) -> Imported | None:
    """The quantizers around the chosen GRU nodes; None when the file has no QDQ around them."""
    graph = load_onnx(path).graph  # its loops read as GRU nodes; external data: read by Graph, checked
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
            imported.notes.append(f"'{b.name}': the biases are int{bounds(np_type(consts[b.input[0]]))[0]} "
                                  "in the file; their values are kept on qtool's 32-bit bias grid")
        dq = producer.get(node.input[0])
        if dq is not None and dq.op_type == "DequantizeLinear" and dq.input[0] not in consts:
            imported.add(l, 0, "x", activation_range(dq, consts, where))
        for out in node.output[:2]:  # Y (every step) and Y_h (the last step) are both h
            for q in consumers.get(out, []):
                if q.op_type == "QuantizeLinear":
                    imported.add(l, 0, "h", activation_range(q, consts, where))
        if len(node.input) > 5 and node.input[5]:
            imported.notes.append(f"'{node.name}': initial_h is ignored; qtool's GRU starts from h0 = 0")
    return imported if imported.ranges else None
