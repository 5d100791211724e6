"""QDQ files taken whole: ONNX Runtime's `quantize_static(quant_format=QDQ)` and `torch.onnx.export`
of a torch.ao QAT model put a QuantizeLinear -> DequantizeLinear pair on edges between layers (and
DequantizeLinear on integer weights, which the importer folds into the floats they stand for).

A pair on the data rounds it onto the file's grid: in qtool's float graph it is the identity, and
its grid becomes the edge's learned range (`GraphRanges`), which `calibrate` takes as that edge's
grid. A grid that starts at 0 also clips below it; ONNX Runtime's quantizer removes a Relu into
such a pair, so a pair of that kind on values that may be negative is a relu. Anything that hands
integers on to the model (a QOperator file's QLinearConv and the like, a Quantize read as
integers) is refused.
"""

from __future__ import annotations

import numpy as np

from qtool.importers.onnx.qdq import activation_range
from qtool.importers.ranges import GraphRanges

NON_NEGATIVE = ("relu", "relu6", "sigmoid", "hard_sigmoid", "softplus")  # activations a relu leaves alone


def _params(reader, node) -> tuple[dict, list]:
    """The constants a Quantize/DequantizeLinear reads (scale, zero point), and their values in order."""
    consts = {}
    for name in node.input[1:3]:
        if name:
            if name not in reader.g.constant:
                raise reader.fail(node, f"takes its scale or zero point '{name}' from the data")
            consts[name] = reader.g.array(name)
    return consts, [np.asarray(consts[n]) for n in node.input[1:3] if n]


def _undoes(q_values: list, dq_values: list) -> bool:
    """Whether a DequantizeLinear's scale and zero point are its QuantizeLinear's."""
    if len(dq_values) == 1 and len(q_values) == 2:  # a zero point of 0 is the default
        dq_values = [*dq_values, np.zeros_like(q_values[1])]
    return len(q_values) == len(dq_values) and all(
        a.shape == b.shape and a.dtype == b.dtype and np.array_equal(a, b) for a, b in zip(q_values, dq_values))


def _carry(reader, src: str, dst: str) -> None:
    """A pending MatMul (waiting for its bias) or per-channel affine stays pending through the pair."""
    for pending in (reader.dense, reader.affine):
        if src in pending and reader.uses.get(dst) == 1:
            pending[dst] = pending.pop(src)


def quantize_linear(reader, node) -> None:
    users = reader.readers.get(node.output[0], [])
    if node.output[0] in reader.outputs or not users or any(u.op_type != "DequantizeLinear" for u in users):
        raise reader.fail(node, "hands integers on to the model (a QOperator-format file, or an integer output); "
                                "qtool reads QDQ files, where each QuantizeLinear on the data feeds "
                                "DequantizeLinear only")
    consts, q_values = _params(reader, node)
    for u in users:
        if not _undoes(q_values, _params(reader, u)[1]):
            raise reader.fail(u, f"dequantizes with another scale or zero point than '{node.name}' quantized "
                                 "with; qtool reads fake-quant pairs that round onto one grid")
    r = activation_range(node, consts, f"{reader.where}: {reader.label(node)}")
    edge, lay = reader.input(node)
    if not isinstance(edge, str):
        raise reader.fail(node, "quantizes a part of a computed tensor; qtool's grids are whole edges'")
    producer = next((n for n in reader.nodes if edge in n.outputs), None)
    clips = r.lo == 0 and not (producer is not None and producer.op == "activation"
                               and producer.attrs.get("kind") in NON_NEGATIVE)
    if clips:  # the pair is also a relu (ONNX Runtime's quantizer folds a Relu into it)
        reader.emit(node, "activation", [edge], lay, {"kind": "relu"}, source="QuantizeLinear, clipping at 0")
        edge = node.output[0]
        reader.ranges.notes.append(f"{reader.label(node)} clips below 0 (its grid starts there): imported as a relu")
    else:
        reader.alias(node, edge, lay)
        _carry(reader, node.input[0], node.output[0])
    reader.fake_quant[node.output[0]] = (node.input[0], clips)
    reader.ranges.add(edge, r)


def dequantize_linear(reader, node) -> None:
    if node.input[0] not in reader.fake_quant:
        raise reader.fail(node, "dequantizes integers the model computes (a QOperator-format file); qtool reads "
                                "QDQ files, where DequantizeLinear on the data follows a QuantizeLinear")
    reader.alias(node, *reader.input(node))
    _carry(reader, node.input[0], node.output[0])


def finish(reader, nodes: list, inputs, renamed: dict[str, str]) -> GraphRanges | None:
    """The ranges on edges of the graph as imported (output edges renamed after the outputs)."""
    ranges: GraphRanges = reader.ranges
    for old, new in renamed.items():
        if old in ranges.edges:
            ranges.edges[new] = ranges.edges.pop(old)
    edges = set(inputs) | {e for n in nodes for e in n.outputs}
    for e in [e for e in ranges.edges if e not in edges]:
        ranges.drop(e, "the values it rounds do not reach the model's outputs")
    return ranges if ranges.edges else None


def without_fake_quant(model, pairs: dict[str, tuple[str, bool]]) -> None:
    """The model as its float graph computes it (the import check): each fake-quant pair on the
    data replaced by the identity, or by a relu where it clips at 0; in place."""
    from onnx import helper

    nodes = []
    for node in model.graph.node:
        if node.op_type == "QuantizeLinear" and node.output and node.output[0] in pairs:
            continue
        if node.op_type == "DequantizeLinear" and node.input and node.input[0] in pairs:
            src, clips = pairs[node.input[0]]
            node = helper.make_node("Relu" if clips else "Identity", [src], [node.output[0]], name=node.name)
        nodes.append(node)
    del model.graph.node[:]
    model.graph.node.extend(nodes)
