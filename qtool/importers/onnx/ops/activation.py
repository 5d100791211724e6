"""Activations and normalizations: one op each (Relu, Clip(0, 6), Softmax, F.normalize's
ReduceL2 and Div ...), or an activation written as elementwise ops (PyTorch's Erf GELU), matched
by evaluating the ops on a probe."""

from __future__ import annotations

import numpy as np

from qtool.core.graph import Node
from qtool.errors import QtoolError
from qtool.importers.onnx.fold import evaluate
from qtool.importers.onnx.graph import attr
from qtool.importers.onnx.ops.registry import handles

# elementwise ops that may make up one activation function of one computed input and scalar constants
# (PyTorch's Erf-based GELU, the dynamo exporter's thresholded Softplus): matched by evaluating them
FUNCTION_OPS = {"Add", "Sub", "Mul", "Div", "Pow", "Sqrt", "Erf", "Tanh", "Sigmoid", "Exp", "Log", "Neg", "Abs",
                "Reciprocal", "Softplus", "Relu", "Clip", "Max", "Min", "Where", "Greater", "Less", "GreaterOrEqual",
                "LessOrEqual", "Equal", "Cast", "HardSigmoid", "LeakyRelu", "Gelu", "Identity"}
PROBE_X = np.concatenate([np.linspace(-8, 8, 1601), [-1e4, -1e3, -100, -40, -25, -20.5, -15, 15, 20.5, 25, 40, 100, 1e3,
                                                      1e4]]).astype(np.float32)
FIT_TOLERANCE = 1e-5
PLAIN = {"Relu": "relu", "Sigmoid": "sigmoid", "Tanh": "tanh", "Softplus": "softplus",
         "Sqrt": "sqrt"}  # op -> its kind, no attrs


def activation(r, node, kind: str, **attrs) -> None:
    edge, lay = r.input(node)
    if kind == "linear":
        r.alias(node, edge, lay)
    else:
        r.emit(node, "activation", [edge], lay, {"kind": kind, **attrs})


@handles(*PLAIN)
def plain(r, node) -> None:
    activation(r, node, PLAIN[node.op_type])


@handles("LeakyRelu")
def leaky_relu(r, node) -> None:
    activation(r, node, "leaky_relu", alpha=float(attr(node, "alpha", 0.01)))


@handles("Pow")
def power(r, node) -> None:
    """Pow(x, 2): square (x.pow(2), x ** 2); Pow(x, 1): no node."""
    e = r.const(node, 1)
    e = None if e is None or np.size(e) != 1 else float(np.asarray(e).reshape(()))
    if e not in (1.0, 2.0):
        raise r.fail(node, f"raises to the power {e}; qtool reads Pow(x, 2) (square)")
    activation(r, node, "square" if e == 2.0 else "linear")


@handles("PRelu")
def prelu(r, node) -> None:
    """One slope: leaky_relu (an exact table); a slope per channel (repeated at each frequency of a
    map): prelu."""
    edge, lay = r.input(node)
    slope = r.floats(node, r.const(node, 1))
    if slope.size == 1:
        return activation(r, node, "leaky_relu", alpha=float(slope.reshape(-1)[0]))
    per = lay.per_channel(slope)
    if per is None:
        raise r.fail(node, f"has a slope of shape {list(slope.shape)} for {lay.describe()}; qtool reads one slope "
                           "or one per channel")
    r.emit(node, "prelu", [edge], lay, params={"alpha": per[0]})


@handles("HardSigmoid")
def hard_sigmoid(r, node) -> None:
    activation(r, node, "hard_sigmoid", alpha=float(attr(node, "alpha", 0.2)),
                     beta=float(attr(node, "beta", 0.5)))


@handles("Gelu")
def gelu(r, node) -> None:
    activation(r, node, "gelu", approximate=attr(node, "approximate", "none"))


@handles("Clip")
def clip(r, node) -> None:
    if len(node.input) > 1:
        lo, hi = r.const(node, 1), r.const(node, 2)
    else:  # Clip-6: attributes
        lo, hi = attr(node, "min", None), attr(node, "max", None)
    lo = None if lo is None or float(np.asarray(lo).reshape(())) <= -3.4e38 else float(np.asarray(lo).reshape(()))
    hi = None if hi is None or float(np.asarray(hi).reshape(())) >= 3.4e38 else float(np.asarray(hi).reshape(()))
    kinds = {(None, None): "linear", (0.0, None): "relu", (0.0, 6.0): "relu6"}
    if (lo, hi) not in kinds:
        raise r.fail(node, f"clips to [{lo}, {hi}]; qtool reads Clip(0, 6) (relu6) and Clip(0) (relu)")
    activation(r, node, kinds[lo, hi])


@handles("Softmax")
def softmax(r, node) -> None:
    edge, lay = r.input(node)
    axis = attr(node, "axis", 1 if r.opset < 13 else -1) % len(lay.axes)
    tail = all(a == "1" for a in lay.axes[axis + 1:]) if r.opset < 13 else True
    if not lay.holds_channels(axis) or not tail:
        raise r.fail(node, f"normalizes axis {axis} of {lay.describe()}; qtool's softmax is over the channels",
                        layout=True)
    r.emit(node, "softmax", [edge], lay)


@handles("LpNormalization")
def lp_normalization(r, node) -> None:
    edge, lay = r.input(node)
    axis = attr(node, "axis", -1) % len(lay.axes)
    if attr(node, "p", 2) != 2 or not lay.holds_channels(axis):
        raise r.fail(node, f"takes the L{attr(node, 'p', 2)} norm over axis {axis} of {lay.describe()}; "
                              "qtool's l2_normalize is the L2 norm over the channels")
    r.emit(node, "l2_normalize", [edge], lay)


@handles("ReduceL2")
def reduce_l2(r, node) -> None:
    """x / max(ReduceL2(x), eps) over the channels (PyTorch's F.normalize): l2_normalize."""
    edge, lay = r.input(node)
    axes = r.axes_of(node, 1, len(lay.axes))
    chain, v, eps = [node], node.output[0], None
    ok = axes is not None and len(axes) == 1 and lay.holds_channels(axes[0]) and attr(node, "keepdims", 1)
    while ok:
        users = r.readers.get(v, [])
        if len(users) != 1 or r.uses.get(v) != 1:
            ok = False
            break
        u = users[0]
        if u.op_type == "Div" and list(u.input[:2]) == [node.input[0], v]:
            chain.append(u)
            break
        if u.op_type in ("Clip", "Max") and u.input[0] == v and eps is None and len(u.input) > 1 and \
                u.input[1] in r.g.constant and not (u.op_type == "Clip" and len(u.input) > 2 and u.input[2]):
            eps = float(np.asarray(r.g.array(u.input[1])).reshape(()))
        elif u.op_type not in ("Expand", "Identity") or u.input[0] != v:
            ok = False
            break
        chain.append(u)
        v = u.output[0]
    if not ok:
        raise r.fail(node, "is not the norm of x / max(||x||, eps) over the channels (F.normalize); qtool "
                              "reads ReduceL2 only there")
    attrs = {"epsilon": eps} if eps is not None and eps > 0 else {}
    r.done.update(id(n) for n in chain[1:])
    div = chain[-1]
    r.emit(div, "l2_normalize", [edge], lay, attrs, source="ReduceL2+Div")


def function(r, node) -> bool:
    """Whether `node` starts an activation written as elementwise ops of one computed value and scalar
    constants (PyTorch's Erf GELU, the dynamo exporter's thresholded Softplus): the ops are evaluated
    on a probe and matched against qtool's activations. Single ops are left to their handlers."""
    data = {i for i in node.input if i in r.data}
    if len(data) != 1 or not _elementwise(r, node, data):
        return False
    x = data.pop()
    start, region, made, grown = r.order[id(node)], {id(node): node}, {x, *node.output}, True
    while grown:  # the elementwise ops after `node` that read only `x`, each other and scalars
        grown = False
        for v in list(made):
            for n in r.readers.get(v, []):
                if id(n) not in region and id(n) not in r.done and r.order[id(n)] > start and \
                        _elementwise(r, n, made):
                    region[id(n)] = n
                    made.update(o for o in n.output if o)
                    grown = True
    if len(region) < 2:
        return False
    region = sorted(region.values(), key=lambda n: r.order[id(n)])
    values = {x: PROBE_X}
    for n in region:  # on the probe, once: a node that cannot run leaves its outputs out
        try:
            ins = [None if not i else values[i] if i in values else r.g.array(i) for i in n.input]
            values.update(zip(n.output, evaluate(r.where, r.g.inlined(n), ins, r.opset)))
        except (QtoolError, ValueError, TypeError, KeyError):
            continue
    best = None
    for end in region[1:]:
        cone = _cone(r, end, region)
        ids, out = {id(n) for n in cone}, end.output[0]
        if id(node) not in ids or (best and len(best[0]) >= len(cone)) or out not in values:
            continue
        if any(o != out and (o in r.outputs or any(id(u) not in ids for u in r.readers.get(o, [])))
               for n in cone for o in n.output if o):
            continue  # an intermediate value is read elsewhere too
        kind = _fit(values[out])
        if kind is not None:
            best = (cone, kind)
    if best is None:
        return False
    cone, (kind, attrs) = best
    r.done.update(id(n) for n in cone)
    edge, lay = r.data[x]
    end = cone[-1]
    if kind == "linear":
        r.data[end.output[0]] = (edge, lay)
    else:
        r.emit(end, "activation", [edge], lay, {"kind": kind, **attrs},
                   source="+".join(n.op_type for n in cone))
    return True


def _elementwise(r, node, allowed: set) -> bool:
    """An elementwise op reading only values of `allowed` (one at least) and scalar constants."""
    if node.op_type not in FUNCTION_OPS or node.domain not in ("", "ai.onnx") or len(node.output) != 1 or \
            not any(i in allowed for i in node.input):
        return False
    for i in node.input:
        if i and i not in allowed and (i not in r.g.constant or np.size(r.g.array(i)) != 1):
            return False
    return True


def _cone(r, end, region: list) -> list:
    by_out = {o: n for n in region for o in n.output if o}
    keep, todo = set(), [end]
    while todo:
        n = todo.pop()
        if id(n) in keep:
            continue
        keep.add(id(n))
        todo.extend(by_out[i] for i in n.input if i in by_out)
    return [n for n in region if id(n) in keep]


def _fit(y) -> tuple[str, dict] | None:
    """The qtool activation (kind, attrs) whose values on PROBE_X are `y`, or None."""
    from qtool.layers import layer

    y = np.asarray(y, np.float32).reshape(-1)
    if y.shape != PROBE_X.shape or not np.all(np.isfinite(y)):
        return None
    at = {v: int(np.argmin(np.abs(PROBE_X - v))) for v in (-1.0, 0.0, 1.0)}
    kinds = [("relu", {}), ("relu6", {}), ("sigmoid", {}), ("tanh", {}), ("softplus", {}), ("linear", {}),
             ("square", {}),
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
