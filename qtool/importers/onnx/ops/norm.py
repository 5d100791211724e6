"""Normalizations over channels: ONNX's LayerNormalization (opset 17), and a LayerNorm written out
as the TorchScript exporter below opset 17 and tf2onnx write it (ReduceMean, Sub, Pow or Mul,
ReduceMean, Add, Sqrt, Div or Reciprocal and Mul, then the affine), matched op for op: each
qtool's layernorm."""

from __future__ import annotations

import numpy as np

from qtool.importers.onnx.graph import attr
from qtool.importers.onnx.ops.registry import handles


def norm_groups(r, node, lay, axes: list[int]) -> tuple[int, int]:
    """(size, stride) of qtool's layernorm for a normalization over ONNX axes `axes` of `lay`: the
    channel factors it spans, a run of them in the edge's channel order."""
    names = [lay.axes[a] for a in axes]
    factors = sorted(a for a in names if isinstance(a, int))
    if any(a not in ("1",) and not isinstance(a, int) for a in names) or not factors or \
            factors != list(range(factors[0], factors[-1] + 1)):
        raise r.fail(node, f"normalizes axes {axes} of {lay.describe()}; qtool normalizes channels (and a map's "
                           "frequencies), never batch or time", layout=True)
    size = int(np.prod([lay.cdims[f] for f in factors]))
    return size, int(np.prod(lay.cdims[factors[-1] + 1:], dtype=np.int64))


@handles("LayerNormalization")
def layer_normalization(r, node) -> None:
    edge, lay = r.input(node)
    rank = len(lay.axes)
    axis = attr(node, "axis", -1) % rank
    if r.used(node, 1) or r.used(node, 2):
        raise r.fail(node, "has its Mean or InvStdDev read; qtool's layernorm gives the normalized value only")
    size, stride = norm_groups(r, node, lay, list(range(axis, rank)))
    params = {}
    for k, name, default in ((1, "gamma", 1.0), (2, "beta", 0.0)):
        c = r.const(node, k)
        c = np.full(lay.shape()[axis:], default, np.float32) if c is None else r.floats(node, c)
        per = lay.per_channel(c)
        if per is None:
            raise r.fail(node, f"has a {name} of shape {list(c.shape)} for {lay.describe()}")
        params[name] = per[0]
    r.emit(node, "layernorm", [edge], lay, {"size": size, "stride": stride,
                                            "epsilon": float(attr(node, "epsilon", 1e-5))}, params)


def _const(r, name: str):
    """A constant input's value, or None."""
    return r.g.array(name) if name in r.g.constant else None


def _scalar(r, name: str) -> float | None:
    c = _const(r, name)
    return None if c is None or np.size(c) != 1 else float(np.asarray(c).reshape(()))


def _only(r, value: str, op: str | tuple, region: list):
    """The one node reading `value` (read by nothing else, no model output), of op type `op`."""
    users = r.readers.get(value, [])
    ops = (op,) if isinstance(op, str) else op
    if len(users) != 1 or value in r.outputs or users[0].op_type not in ops or id(users[0]) in r.done:
        return None
    region.append(users[0])
    return users[0]


def _other(node, value: str) -> str:
    """A binary node's input other than `value`."""
    a, b = (list(node.input) + ["", ""])[:2]
    return b if a == value else a


def written_layer_norm(r, mean, edge, lay, axes: list[int], size: int, stride: int) -> bool:
    """Whether ReduceMean `mean` starts a LayerNorm written out over `axes`; if so, one layernorm
    node for it all (its gamma and beta the Mul and Add by constants after it, where there are)."""
    x, region = mean.input[0], [mean]
    users = r.readers.get(mean.output[0], [])
    sub = users[0] if len(users) == 1 and users[0].op_type == "Sub" and list(users[0].input) == [x, mean.output[0]] \
        else None
    if sub is None or mean.output[0] in r.outputs:
        return False
    region.append(sub)
    d = sub.output[0]
    readers = [n for n in r.readers.get(d, [])]
    square = next((n for n in readers if (n.op_type == "Pow" and _scalar(r, n.input[1]) == 2.0) or
                   (n.op_type == "Mul" and list(n.input) == [d, d])), None)
    if square is None or len(readers) != 2 or d in r.outputs:
        return False
    region.append(square)
    var = _only(r, square.output[0], "ReduceMean", region)
    if var is None or r.axes_of(var, 1, len(lay.axes)) != axes or not attr(var, "keepdims", 1):
        return False
    add = _only(r, var.output[0], "Add", region)
    eps = None if add is None else _scalar(r, _other(add, var.output[0]))
    root = None if eps is None else _only(r, add.output[0], "Sqrt", region)
    if root is None:
        return False
    divide = next((n for n in readers if n is not square), None)
    if divide.op_type == "Div" and list(divide.input) == [d, root.output[0]]:
        region.append(divide)
    else:  # 1 / sqrt, then a product
        inv = _only(r, root.output[0], "Reciprocal", region)
        if inv is None or divide.op_type != "Mul" or set(divide.input) != {d, inv.output[0]}:
            return False
        region.append(divide)
    if not attr(mean, "keepdims", 1) or not eps > 0:
        return False
    out, params = divide.output[0], {"gamma": np.ones(lay.channels, np.float32),
                                     "beta": np.zeros(lay.channels, np.float32)}
    for op, name in (("Mul", "gamma"), ("Add", "beta")):
        users = r.readers.get(out, [])
        c = None if len(users) != 1 or users[0].op_type != op or out in r.outputs else \
            _const(r, _other(users[0], out))
        per = None if c is None else lay.per_channel(r.floats(users[0], c))
        if per is None or per[1]:
            continue
        region.append(users[0])
        params[name] = per[0]
        out = users[0].output[0]
    r.done.update(id(n) for n in region)
    end = region[-1]
    r.emit(end, "layernorm", [edge], lay, {"size": size, "stride": stride, "epsilon": eps}, params,
           source="+".join(n.op_type for n in region))
    return True
