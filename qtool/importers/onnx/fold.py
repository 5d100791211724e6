"""Constant subgraphs of an ONNX graph, evaluated node by node with the evaluator the `onnx` package
ships (`onnx.reference`), not matched against patterns: exporters write weights as Concat/Slice/
Unsqueeze of initializers, shapes as Shape/Gather/Concat, and change how from one release to the next.

Before a node runs, the size of what it will produce is worked out from its inputs' shapes and
values and checked against qtool's limits, so that a file declaring a huge ConstantOfShape, Expand,
Tile, Range, Pad or Gather is refused in one line instead of allocating.
"""

from __future__ import annotations

import math

import numpy as np

from qtool.errors import QtoolError
from qtool.importers.checks import check_size, quiet, reason

# deterministic ops without subgraphs whose outputs are no larger than their inputs together
BOUNDED = {"Identity", "Dropout", "Cast", "CastLike", "Reshape", "Transpose", "Squeeze", "Unsqueeze", "Flatten",
           "Slice", "Split", "Concat", "Shape", "Size", "Constant", "Neg", "Abs", "Floor", "Ceil", "Round", "Sqrt",
           "Reciprocal", "Not", "Sign", "Exp", "Log", "Relu", "Sigmoid", "Tanh", "Clip", "CumSum", "Trilu",
           "ReduceSum", "ReduceMax", "ReduceMin", "ReduceMean", "ReduceProd", "ArgMax", "ArgMin", "EyeLike",
           "QuantizeLinear", "DequantizeLinear"}
# elementwise ops: the output has the inputs' broadcast shape
BROADCAST = {"Add", "Sub", "Mul", "Div", "Pow", "Mod", "Equal", "Less", "Greater", "LessOrEqual", "GreaterOrEqual",
             "And", "Or", "Xor", "Where", "Max", "Min", "Sum", "Mean", "BitShift"}
# ops whose output can be far larger than their inputs: sized by _grown before they run
GROWING = {"ConstantOfShape", "Expand", "Tile", "Range", "Pad", "Gather", "GatherElements"}
FOLDABLE = BOUNDED | BROADCAST | GROWING


def attr(node, name: str, default):
    """An ONNX node's attribute as a plain Python value (strings decoded), or `default`."""
    from onnx import helper

    for a in node.attribute:
        if a.name == name:
            v = helper.get_attribute_value(a)
            if isinstance(v, bytes):
                return v.decode(errors="replace")
            return [s.decode(errors="replace") if isinstance(s, bytes) else s for s in v] if isinstance(v, list) else v
    return default


def foldable(node) -> bool:
    """Whether `node` computes the same every time from its inputs alone (so constant inputs fold)."""
    return node.domain in ("", "ai.onnx") and node.op_type in FOLDABLE


def label(node) -> str:
    return f"'{node.name or (node.output[0] if node.output else '')}' ({node.op_type})"


def _ints(a) -> list[int]:
    return [int(v) for v in np.asarray(a).reshape(-1)]


def broadcast(where: str, shapes: list[tuple]) -> tuple:
    """ONNX (numpy) multidirectional broadcasting of `shapes`, in Python ints (nothing is allocated)."""
    rank = max((len(s) for s in shapes), default=0)
    out = []
    for i in range(rank):
        dims = {s[i - rank + len(s)] for s in shapes if i - rank + len(s) >= 0}
        dims.discard(1)
        if len(dims) > 1:
            raise QtoolError(f"{where}: shapes {', '.join(str(tuple(s)) for s in shapes)} do not broadcast")
        out.append(dims.pop() if dims else 1)
    return tuple(out)


def _pad_shape(node, ins: list, opset: int) -> tuple:
    shape = list(ins[0].shape)
    pads = _ints(ins[1]) if opset >= 11 else list(attr(node, "pads", []))
    axes = _ints(ins[3]) if len(ins) > 3 and ins[3] is not None else list(range(len(shape)))
    if len(pads) != 2 * len(axes):
        raise ValueError(f"{len(pads)} pads for {len(axes)} axes")
    for k, a in enumerate(axes):
        shape[a] += pads[k] + pads[k + len(axes)]
    return tuple(shape)


def _range_shape(where: str, ins: list) -> tuple:
    start, limit, delta = (float(np.asarray(v).reshape(())) for v in ins[:3])
    if delta == 0 or not all(math.isfinite(v) for v in (start, limit, delta)):
        raise QtoolError(f"{where}: Range({start:g}, {limit:g}, {delta:g}) has no finite length")
    return (max(math.ceil((limit - start) / delta), 0),)


def _grown(where: str, node, ins: list, opset: int) -> tuple:
    """The shape a GROWING node will produce, from its inputs."""
    op = node.op_type
    if op == "ConstantOfShape":
        return tuple(_ints(ins[0]))
    if op == "Expand":
        return broadcast(where, [ins[0].shape, tuple(_ints(ins[1]))])
    if op == "Tile":
        return tuple(s * r for s, r in zip(ins[0].shape, _ints(ins[1])))
    if op == "Range":
        return _range_shape(where, ins)
    if op == "Pad":
        return _pad_shape(node, ins, opset)
    if op == "GatherElements":
        return ins[1].shape
    axis = attr(node, "axis", 0) % max(ins[0].ndim, 1)  # Gather
    return ins[0].shape[:axis] + ins[1].shape + ins[0].shape[axis + 1:]


def output_shape_bound(where: str, node, ins: list, opset: int) -> tuple:
    """A shape at least as large as each of `node`'s outputs, known before it runs."""
    present = [a for a in ins if a is not None]
    if node.op_type in GROWING:
        return _grown(where, node, ins, opset)
    if node.op_type in BROADCAST:
        return broadcast(where, [a.shape for a in present])
    return (sum(int(a.size) for a in present),)


def _evaluator_opset(node, opset: int) -> int:
    """The opset the evaluator runs `node` at: its file's, except for Quantize/DequantizeLinear,
    which `onnx.reference` implements from opset 19 on only (the same computation on the integer
    types of opsets 10 and 13; 19 added float8)."""
    return max(opset, 19) if node.op_type in ("QuantizeLinear", "DequantizeLinear") else opset


def evaluate(where: str, node, ins: list, opset: int) -> list:
    """The outputs of `node` (a FOLDABLE op) on the arrays `ins` (None for an omitted input), one per
    output name; refused before anything is allocated when an output would exceed qtool's limits."""
    from onnx import ValueInfoProto, helper
    from onnx.reference import ReferenceEvaluator

    out_name, at = next((o for o in node.output if o), "?"), f"{where}: node {label(node)}"
    try:
        check_size(at, out_name, output_shape_bound(at, node, ins, opset))
    except (ValueError, TypeError, IndexError, OverflowError) as e:
        raise QtoolError(f"{at} has inputs it cannot take ({reason(e)})") from None
    feeds = {n: a for n, a in zip(node.input, ins) if n}
    graph = helper.make_graph([node], "fold", [ValueInfoProto(name=n) for n in feeds],
                              [ValueInfoProto(name=o) for o in node.output if o])
    try:
        with quiet():
            got = ReferenceEvaluator(graph, opsets={"": _evaluator_opset(node, opset)}).run(None, feeds)
    except Exception as e:  # the evaluator raises many types on malformed nodes
        raise QtoolError(f"{where}: cannot evaluate constant node {label(node)} ({reason(e)})") from None
    outs = dict(zip([o for o in node.output if o], got))
    return [None if not o else np.asarray(outs[o]) for o in node.output]
