"""Normalizations over channels: ONNX's LayerNormalization (opset 17), and a LayerNorm written out,
matched op for op, each qtool's layernorm:

- as the TorchScript exporter below opset 17 writes it: ReduceMean, Sub, Pow or Mul, ReduceMean,
  Add, Sqrt, Div (or Reciprocal and Mul), then the affine;
- as tf2onnx writes Keras 2's LayerNormalization where the fused kernel takes it (its epsilon at
  least 1.001e-5): a training-mode batch norm over the rows of the reshaped input, whose moments
  are ReduceMean and ReduceSumSquare over the other axes, then the affine;
- and where it does not, as tf.nn.batch_normalization's formula: moments by ReduceMean or
  GlobalAveragePool, s = gamma / sqrt(var + epsilon), y = x * s + (beta - mean * s)."""

from __future__ import annotations

import math

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
    users = list({id(n): n for n in r.readers.get(value, [])}.values())  # Mul(d, d) reads d twice
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
    """Whether `mean` (a ReduceMean, or a GlobalAveragePool over every axis after the second)
    starts a LayerNorm written out over `axes`; if so, one layernorm node for it all."""
    if mean.op_type == "ReduceMean" and not attr(mean, "keepdims", 1):
        return False
    return (_divided(r, mean, edge, lay, axes, size, stride) or _formula(r, mean, edge, lay, axes, size, stride)
            or _fused_rows(r, mean, edge, lay, axes, size, stride))


def _same_mean(r, mean, other, rank: int) -> bool:
    """Whether `other` is a mean over the axes `mean` takes, keeping them."""
    if other is None or other.op_type != mean.op_type:
        return False
    return mean.op_type != "ReduceMean" or (attr(other, "keepdims", 1) and
                                           r.axes_of(other, 1, rank) == r.axes_of(mean, 1, rank))


def _square(r, d: str, node) -> bool:
    return node is not None and ((node.op_type == "Pow" and _scalar(r, node.input[1]) == 2.0) or
                                 (node.op_type == "Mul" and list(node.input) == [d, d]))


def _per_channel(r, node, lay, name: str):
    """A constant input of `node` other than `name`, one number per channel of `lay`; None otherwise."""
    c = _const(r, _other(node, name))
    per = None if c is None else lay.per_channel(r.floats(node, c))
    return None if per is None or per[1] else per[0]


def _emit(r, region: list, edge, lay, size: int, stride: int, eps: float, gamma=None, beta=None) -> None:
    r.done.update(id(n) for n in region)
    params = {"gamma": np.ones(lay.channels, np.float32) if gamma is None else gamma,
              "beta": np.zeros(lay.channels, np.float32) if beta is None else beta}
    r.emit(region[-1], "layernorm", [edge], lay, {"size": size, "stride": stride, "epsilon": eps}, params,
           source="+".join(n.op_type for n in region))


def _formula(r, mean, edge, lay, axes: list[int], size: int, stride: int) -> bool:
    """tf.nn.batch_normalization's formula: d = x - mean, var = mean(d * d), s = 1 / sqrt(var +
    eps) (times gamma), y = x * s + (beta - mean * s) (or - mean * s without beta)."""
    x, m, rank = mean.input[0], mean.output[0], len(lay.axes)
    users = r.readers.get(m, [])
    sub = next((n for n in users if n.op_type == "Sub" and list(n.input) == [x, m]), None)
    shifted = next((n for n in users if n.op_type == "Mul" and m in n.input), None)
    if m in r.outputs or len(users) != 2 or sub is None or shifted is None:
        return False
    region = [mean, sub]
    square = _only(r, sub.output[0], ("Mul", "Pow"), region)
    var = None if not _square(r, sub.output[0], square) else _only(r, square.output[0], mean.op_type, region)
    add = _only(r, var.output[0], "Add", region) if _same_mean(r, mean, var, rank) else None
    eps = None if add is None else _scalar(r, _other(add, var.output[0]))
    root = _only(r, add.output[0], "Sqrt", region) if eps is not None and eps > 0 else None
    inv = None if root is None else _only(r, root.output[0], "Reciprocal", region)
    if inv is None:
        return False
    s, gamma = inv.output[0], None
    scale = r.readers.get(s, [])
    if len(scale) == 1 and scale[0].op_type == "Mul" and _per_channel(r, scale[0], lay, s) is not None:
        gamma = _per_channel(r, scale[0], lay, s)
        region.append(scale[0])
        s = scale[0].output[0]
    times = r.readers.get(s, [])
    product = next((n for n in times if n is not shifted and n.op_type == "Mul" and set(n.input) == {x, s}), None)
    if s in r.outputs or len(times) != 2 or shifted not in times or set(shifted.input) != {m, s} or product is None:
        return False
    region += [shifted, product]
    offset = _only(r, shifted.output[0], ("Sub", "Neg"), region)
    beta = None
    if offset is not None and offset.op_type == "Sub":
        c = _const(r, offset.input[0])
        per = None if c is None or offset.input[1] != shifted.output[0] else lay.per_channel(r.floats(offset, c))
        if per is None or per[1]:
            return False
        beta = per[0]
    total = None if offset is None else _only(r, offset.output[0], "Add", region)
    if total is None or set(total.input) != {product.output[0], offset.output[0]} or \
            r.readers.get(product.output[0], []) != [total] or product.output[0] in r.outputs:
        return False
    _emit(r, region, edge, lay, size, stride, eps, gamma, beta)
    return True


def _fused_rows(r, mean, edge, lay, axes: list[int], size: int, stride: int) -> bool:
    """A training-mode batch norm over the rows of axis 1: mean = ReduceMean(x) and var =
    ReduceSumSquare(x - mean) / count over every other axis, given to a BatchNormalization of x
    whose scale is 1 and bias 0 (its affine follows, a per-channel affine of its own)."""
    x, m, rank = mean.input[0], mean.output[0], len(lay.axes)
    users = r.readers.get(m, [])
    sub = next((n for n in users if n.op_type == "Sub" and list(n.input) == [x, m]), None)
    moved = next((n for n in users if n.op_type in ("Squeeze", "Reshape", "Identity")), None)
    if mean.op_type != "ReduceMean" or sorted(axes) != [a for a in range(rank) if a != 1] or \
            m in r.outputs or len(users) != 2 or sub is None or moved is None:
        return False
    region = [mean, sub]
    sums = _only(r, sub.output[0], "ReduceSumSquare", region)
    div = None
    if sums is not None and r.axes_of(sums, 1, rank) == r.axes_of(mean, 1, rank):
        div = _only(r, sums.output[0], "Div", region)
    if div is None or div.input[0] != sums.output[0] or np.size(r.value(div, 1)) != 1 or \
            float(np.asarray(r.value(div, 1)).reshape(())) != math.prod(lay.shape()[a] for a in axes):
        return False
    region.append(moved)
    bn = _only(r, div.output[0], "BatchNormalization", region)
    if bn is None or list(bn.input[:1]) + list(bn.input[3:5]) != [x, moved.output[0], div.output[0]] or \
            r.readers.get(moved.output[0], []) != [bn] or any(r.used(bn, k) for k in (1, 2, 3, 4)):
        return False
    if not (np.all(np.asarray(r.value(bn, 1)) == 1) and np.all(np.asarray(r.value(bn, 2)) == 0)):
        return False
    region.remove(bn)  # the batch norm writes the normalized value: last
    region.append(bn)
    _emit(r, region, edge, lay, size, stride, float(attr(bn, "epsilon", 1e-5)))
    return True


def _divided(r, mean, edge, lay, axes: list[int], size: int, stride: int) -> bool:
    """PyTorch's LayerNorm below opset 17: (x - mean) / sqrt(mean((x - mean)^2) + eps), then the
    Mul and Add by constants after it, where there are."""
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
    var = _only(r, square.output[0], mean.op_type, region)
    if not _same_mean(r, mean, var, len(lay.axes)):
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
    if not eps > 0:
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
    _emit(r, region, edge, lay, size, stride, eps, params["gamma"], params["beta"])
    return True
