"""Weighted ops: MatMul, Einsum and Gemm (dense; a grouped Einsum is conv1d), Conv (conv1d),
BatchNormalization, and Add, Sub, Mul,
Div (of two computed tensors; a MatMul's bias; a per-channel affine, folded into one batchnorm)."""

from __future__ import annotations

import numpy as np

from qtool.core.node_args import same_pads
from qtool.importers.onnx.graph import attr
from qtool.importers.onnx.model_layout import Layout
from qtool.importers.onnx.ops.activation import activation
from qtool.importers.onnx.ops.layout import conform
from qtool.importers.onnx.ops.registry import handles

EINSUM_READ = ("qtool reads an Einsum of the data by a constant matrix along its last axis ('...i,ih->...h') or "
               "per group ('...gi,gih->...gh')")
AFFINE_EPSILON = 1e-12  # a per-channel affine is a batchnorm of mean 0, var 1 and this epsilon: exact in float32

@handles("MatMul")
def mat_mul(r, node, W=None) -> None:
    edge, lay = r.input(node)
    W = r.const(node, 1) if W is None else W
    last = lay.axes[-1] if lay.axes else None
    if W is not None and W.ndim == 2 and isinstance(last, int) and len(lay.cdims) > 1 and last == len(lay.cdims) - 1 \
            and W.shape[0] == lay.cdims[last]:
        return _matmul_last_factor(r, node, edge, lay, W)
    if isinstance(last, int) and len(lay.cdims) > 1 and W is not None and W.ndim == 2 and \
            W.shape[0] == lay.cdims[last]:
        frame = " x ".join(str(d) for d in lay.cdims)
        raise r.fail(node, f"multiplies {lay.describe()} along its axis of {W.shape[0]}, which is not the innermost "
                           f"of the map's frames ({frame}, after the permutes before it); qtool reads a MatMul "
                           "along a map's innermost axis (a Linear along frequency on [N, C, T, F] as PyTorch "
                           "holds it) or of all its channels")
    if W.ndim != 2 or not lay.holds_channels(len(lay.axes) - 1) or W.shape[0] != lay.channels:
        raise r.fail(node, f"multiplies {lay.describe()} by a constant of shape {list(W.shape)}; qtool "
                              "reads a MatMul of the channels (last axis) by a [C_in, C_out] matrix")
    q = r.emit(node, "dense", [edge], lay.with_channels(len(lay.axes) - 1, W.shape[1]),
                   params={"W": r.floats(node, W.T)})
    if r.uses.get(node.output[0]) == 1:
        r.dense[node.output[0]] = q


def _matmul_last_factor(r, node, edge, lay, W) -> None:
    """A MatMul along the last of a map's channel factors (its frequencies, as GTCRN's ERB bands
    are a Linear along frequency): the same matrix for every value of the factors before it,
    which is conv1d of kernel 1 with a group each, its weights the matrix repeated."""
    groups = lay.channels // lay.cdims[-1]
    Wg = np.tile(r.floats(node, W.T)[:, :, None], (groups, 1, 1))  # [groups * F', F, 1]
    out = lay.replace(cdims=lay.cdims[:-1] + (W.shape[1],))
    q = r.emit(node, "conv1d", [edge], out, {"kernel": 1, "groups": groups}, {"W": Wg}, source="MatMul")
    if r.uses.get(node.output[0]) == 1:
        r.dense[node.output[0]] = q


@handles("Einsum")
def einsum(r, node) -> None:
    """torch.einsum of the data by a constant: `...i,ih->...h` is a MatMul; `...gi,gih->...gh` a
    Linear per group (DeepFilterNet's GroupedLinearEinsum: the channels split into G groups of I,
    each with its own [I, H] matrix), which is conv1d of kernel 1 with a group each. A leading
    `...` on the data and the output is their batch axes."""
    eq = str(attr(node, "equation", "")).replace(" ", "")
    lhs, _, out = eq.partition("->")
    terms = lhs.split(",")
    if len(terms) != 2:
        raise r.fail(node, f"computes '{eq}' of {len(terms)} tensors; {EINSUM_READ}")
    if node.input[1] not in r.g.constant:
        raise r.fail(node, f"computes '{eq}' of two computed tensors; {EINSUM_READ}")
    W = r.const(node, 1)
    a, b = terms
    if a.startswith("...") and out.startswith("..."):
        a, out = a[3:], out[3:]
    letters = a + b
    if "." in letters + out or any(letters.count(c) != (c in a) + (c in b) for c in letters) or \
            len(set(out)) != len(out):
        raise r.fail(node, f"computes '{eq}'; {EINSUM_READ}")
    if len(b) == 2 and a[-1:] == b[0] and out == a[:-1] + b[1] and not set(a[:-1]) & set(b):
        return mat_mul(r, node, W)
    if not (len(b) == 3 and a[-2:] == b[:2] and out == a[:-1] + b[2] and not set(a[:-2]) & set(b)):
        raise r.fail(node, f"computes '{eq}'; {EINSUM_READ}")
    if W.shape[0] == 1:  # one group: a Linear, beside a unit axis
        return mat_mul(r, node, W[0])
    edge, lay = r.input(node)
    f = len(lay.cdims)
    if f < 2 or lay.axes[-2:] != (f - 2, f - 1) or lay.cdims[-2:] != W.shape[:2]:
        raise r.fail(node, f"multiplies {lay.describe()} per group by weights {list(W.shape)}; qtool reads a "
                           "grouped Einsum over the last two of a map's channel factors, groups then inputs")
    G, I, H = W.shape
    groups = lay.channels // I  # a group per G of every value of the factors before them
    Wg = np.tile(r.floats(node, W).transpose(0, 2, 1)[:, :, :, None], (groups // G, 1, 1, 1))
    out_lay = lay.replace(cdims=lay.cdims[:-1] + (H,))
    q = r.emit(node, "conv1d", [edge], out_lay, {"kernel": 1, "groups": groups}, {"W": Wg.reshape(groups * H, I, 1)},
               source="Einsum")
    if r.uses.get(node.output[0]) == 1:
        r.dense[node.output[0]] = q


@handles("Gemm")
def gemm(r, node) -> None:
    edge, lay = r.input(node)
    trans_a = attr(node, "transA", 0)
    B = r.const(node, 1)
    if len(lay.axes) != 2 or not lay.holds_channels(1 - trans_a) or B.ndim != 2:
        raise r.fail(node, f"reads {lay.describe()} (transA={trans_a}); qtool reads a Gemm of [N, C]")
    B = B.T if attr(node, "transB", 0) else B
    if B.shape[0] != lay.channels:
        raise r.fail(node, f"has B of shape {list(B.shape)} for {lay.channels} channels")
    params = {"W": r.floats(node, attr(node, "alpha", 1.0) * B.T)}
    C = r.const(node, 2)
    if C is not None:
        try:
            bias = np.broadcast_to(r.floats(node, C), (1, B.shape[1]))[0]
        except ValueError:
            raise r.fail(node, f"adds C of shape {list(np.shape(C))}; qtool reads a bias per output "
                                  "channel") from None
        params["b"] = (np.float32(attr(node, "beta", 1.0)) * bias).astype(np.float32)
    out = lay.transpose([1, 0]) if trans_a else lay
    r.emit(node, "dense", [edge], out.with_channels(1, B.shape[1]), params=params)


def _unit_axis_conv(r, node, lay, W):
    """A 2-D Conv over [N, C, 1, T] (or [N, C, T, 1]) with a kernel of 1 along the unit axis: a
    Conv1d written in 2-D (tf2onnx's Keras Conv1D: ExpandDims, Conv2D, Squeeze). Returns the node
    with 1-D attributes, the layout without the unit axis, its position and W in 3-D; None otherwise."""
    from onnx import NodeProto, helper

    if W.ndim != 4 or len(lay.axes) != 4:
        return None
    unit = next((k for k in (2, 3) if lay.axes[k] == "1" and W.shape[k] == 1), None)
    if unit is None:
        return None
    keep = 5 - unit  # the other spatial axis, in W's and the attributes' order (2 or 3)
    one = {"kernel_shape": [1, 1], "strides": [1, 1], "dilations": [1, 1], "pads": [0, 0, 0, 0]}
    flat = NodeProto()
    flat.CopyFrom(node)
    del flat.attribute[:]
    for a in node.attribute:
        v = helper.get_attribute_value(a)
        if a.name in one:
            at = unit - 2
            if a.name == "pads":
                if v[at] or v[at + 2]:
                    return None
                v = [v[keep - 2], v[keep]]
            elif v[at] != 1:
                return None
            else:
                v = [v[keep - 2]]
        flat.attribute.append(helper.make_attribute(a.name, v))
    return flat, lay.squeeze([unit], f"{r.where}: {r.label(node)}"), unit, W.reshape(*W.shape[:2], -1)


@handles("Conv")
def conv(r, node) -> None:
    _conv(r, node, r.const(node, 1))


@handles("ConvTranspose")
def conv_transpose(r, node) -> None:
    """A transposed convolution of stride 1 along time is the Conv of its flipped kernel (input and
    output channels swapped within each group), padded by (k - 1) * d - p at each end and the
    output padding after; along a map's frequency a stride u spreads the input's frequencies u
    apart first (conv2d's freq_up)."""
    from onnx import NodeProto, helper

    edge, lay = r.input(node)
    W, group = r.const(node, 1), attr(node, "group", 1)
    nd = W.ndim - 2
    if attr(node, "auto_pad", "NOTSET") not in ("NOTSET", "VALID") or attr(node, "output_shape", None) is not None:
        raise r.fail(node, "sets auto_pad or output_shape; qtool reads a ConvTranspose by its pads")
    k = list(W.shape[2:])
    strides, dil = list(attr(node, "strides", [1] * nd)), list(attr(node, "dilations", [1] * nd))
    pads, opad = list(attr(node, "pads", [0] * 2 * nd)), list(attr(node, "output_padding", [0] * nd))
    time = [a for a in range(nd) if len(lay.axes) == nd + 2 and lay.axes[2 + a] == "T"]
    if any(strides[a] != 1 for a in time):
        raise r.fail(node, f"upsamples time (strides {strides}); qtool's layers keep or reduce the steps")
    if W.shape[0] % group or len(pads) != 2 * nd or len(opad) != nd:
        raise r.fail(node, f"has weights {list(W.shape)}, group {group}, pads {pads}, output_padding {opad}")
    begin = [dil[a] * (k[a] - 1) - pads[a] for a in range(nd)]
    end = [dil[a] * (k[a] - 1) - pads[nd + a] + opad[a] for a in range(nd)]
    if min(begin + end) < 0:
        raise r.fail(node, f"crops its output (pads {pads} beyond its kernel's reach); qtool reads a ConvTranspose "
                           "whose pads are at most (kernel - 1) * dilation")
    c_in_g = W.shape[0] // group
    Wc = W.reshape(group, c_in_g, W.shape[1], *k).swapaxes(1, 2).reshape(group * W.shape[1], c_in_g, *k)
    Wc = np.ascontiguousarray(np.flip(Wc, axis=tuple(range(2, 2 + nd))))
    as_conv = NodeProto()
    as_conv.CopyFrom(node)
    del as_conv.attribute[:]
    as_conv.attribute.extend([helper.make_attribute("kernel_shape", k), helper.make_attribute("strides", [1] * nd),
                              helper.make_attribute("dilations", dil), helper.make_attribute("pads", begin + end),
                              helper.make_attribute("group", group)])
    ups = {strides[a] for a in range(nd) if a not in time}
    _conv(r, as_conv, Wc, max(ups, default=1) if nd == 2 else 1)


def _conv(r, node, W, up: int = 1) -> None:
    """A Conv (or a ConvTranspose written as one) of weights W; `up`: its input's frequencies spread apart."""
    edge, lay = r.input(node)
    unit = None
    flat = _unit_axis_conv(r, node, lay, W)
    if flat is not None:
        node, lay, unit, W = flat
    elif W.ndim == 4:
        return _conv2d(r, node, edge, lay, W, up)
    if W.ndim != 3:
        raise r.fail(node, f"is a {W.ndim - 2}-D convolution; qtool reads Conv over one axis (Conv1d, or a 2-D "
                           "Conv whose kernel is 1 along a unit axis)")
    r.ncw(node, lay)
    k = W.shape[2]
    stride, dilation = attr(node, "strides", [1])[0], attr(node, "dilations", [1])[0]
    group = attr(node, "group", 1)
    if list(attr(node, "kernel_shape", [k])) != [k]:
        raise r.fail(node, f"has kernel_shape {attr(node, 'kernel_shape', None)} but weights of {k} taps")
    if W.shape[1] * group != lay.channels:
        raise r.fail(node, f"has weights {list(W.shape)} and group {group} for {lay.channels} channels")
    padding, t = r.window(node, lay.t, k, stride, dilation, conv=True)
    params = {"W": r.floats(node, W)}
    bias = r.const(node, 2)
    if bias is not None:
        params["b"] = r.floats(node, bias).reshape(-1)
    attrs = dict(kernel=k, stride=stride, dilation=dilation, groups=group, padding=padding)
    out = lay.with_channels(1, W.shape[0]).replace(t=t)
    r.emit(node, "conv1d", [edge], out if unit is None else out.unsqueeze([unit]), attrs, params)


def _read_order(r, node, freq_axis: int, default: str) -> str:
    """The order in which the model reads a Conv's output map: following its one reader through
    ops that keep the layout, "fc" where a Transpose puts the frequencies before the channels
    (TensorFlow's NCHW -> NHWC), else `default`. Any order computes the same; this one spares
    the reshape that follows a permutation of the channels."""
    value, seen = node.output[0], 0
    while seen < 16:
        readers = [n for n in r.readers.get(value, []) if n.op_type not in ("Shape", "Size")]  # read no values
        if len(readers) != 1:
            break
        n = readers[0]
        if n.op_type == "Transpose":
            perm = list(attr(n, "perm", [3, 2, 1, 0]))
            return "fc" if perm.index(freq_axis) < perm.index(1) else "cf"
        if n.op_type not in KEEPS_LAYOUT:
            break
        value, seen = n.output[0], seen + 1
    return default


KEEPS_LAYOUT = ("Relu", "LeakyRelu", "PRelu", "Clip", "Sigmoid", "Tanh", "BatchNormalization", "Add", "Mul",
                "Identity", "Dropout", "Elu", "Selu", "HardSigmoid", "HardSwish")


def _conv2d(r, node, edge, lay, W, up: int = 1) -> None:
    """A 2-D Conv over [N, C, T, F] or [N, C, F, T] where C and F are channel factors of a feature
    map (qtool.layers.conv.conv2d): its time axis is T, its frequency axis the other. A Pad of the
    frequencies before it (r.freq_pads) is its own."""
    before = r.freq_pads.get(node.input[0])
    if before is not None:
        edge, lay, extra = before
    axes = lay.axes
    if len(axes) != 4 or axes[0] != "N" or "T" not in axes[2:] or not isinstance(axes[5 - axes.index("T")], int) \
            or not (isinstance(axes[1], int) or axes[1] == "1"):
        raise r.fail(node, f"reads {lay.describe()}; qtool reads a 2-D Conv over a feature map [N, C, T, F] (or "
                           "[N, C, F, T]) whose frequencies F have a fixed size", layout=True)
    ti = axes.index("T") - 2  # the time axis among the two spatial ones
    fa = axes[3 - ti]  # the frequency's channel factor
    ca = axes[1] if isinstance(axes[1], int) else None
    F, c_in = lay.cdims[fa], (lay.cdims[ca] if ca is not None else 1)
    group = attr(node, "group", 1)
    if W.shape[1] * group != c_in or len(lay.cdims) != 1 + (ca is not None):
        raise r.fail(node, f"has weights {list(W.shape)} and group {group} for a map {lay.describe()} of "
                           f"{lay.cdims} channel factors")
    if list(attr(node, "kernel_shape", W.shape[2:])) != list(W.shape[2:]):
        raise r.fail(node, f"has kernel_shape {attr(node, 'kernel_shape', None)} but weights {list(W.shape)}")

    def pick(v) -> tuple[int, int]:  # (time, frequency) of a pair of spatial values
        return int(v[ti]), int(v[1 - ti])

    W = W if ti == 0 else W.transpose(0, 1, 3, 2)  # [C_out, C_in/g, kt, kf]
    kernel, stride = (W.shape[2], W.shape[3]), pick(attr(node, "strides", [1, 1]))
    dilation = pick(attr(node, "dilations", [1, 1]))
    auto, pads = attr(node, "auto_pad", "NOTSET"), list(attr(node, "pads", [0, 0, 0, 0]))
    if auto in ("SAME_UPPER", "SAME_LOWER"):
        total = (kernel[1] - 1) * dilation[1]
        if auto == "SAME_LOWER" and (stride != (1, 1) or total % 2 or (kernel[0] - 1) * dilation[0] % 2):
            raise r.fail(node, "has auto_pad SAME_LOWER with an odd padding; qtool's 'same' pads the odd step after")
        spread = (F - 1) * up + 1 + (sum(before[2]) if before is not None else 0)
        padding, freq_pads = "same", same_pads(spread, kernel[1], stride[1], dilation[1])
        t = -(-lay.t // stride[0])
    elif auto in ("NOTSET", "VALID") and len(pads) == 4 and min(pads) >= 0:
        pads = [0, 0, 0, 0] if auto == "VALID" else pads
        time_pads, freq_pads = (pads[ti], pads[2 + ti]), (pads[1 - ti], pads[3 - ti])
        padding = "valid" if time_pads == (0, 0) else time_pads
        t = (lay.t + sum(time_pads) - (kernel[0] - 1) * dilation[0] - 1) // stride[0] + 1
    else:
        raise r.fail(node, f"has auto_pad {auto} and pads {pads}")
    order = "cf" if ca is None or ca < fa else "fc"
    if before is not None:
        if up > 1:
            raise r.fail(node, "spreads frequencies a Pad before it padded; qtool pads after the spreading")
        freq_pads = (freq_pads[0] + extra[0], freq_pads[1] + extra[1])
    attrs = dict(kernel=kernel, stride=stride, dilation=dilation, groups=group, padding=padding, freq=F,
                 freq_pads=tuple(int(p) for p in freq_pads), order=order, out_order=_read_order(r, node, 3 - ti, order))
    f_out = ((F - 1) * up + 1 + sum(freq_pads) - (kernel[1] - 1) * dilation[1] - 1) // stride[1] + 1
    if up > 1:
        attrs["freq_up"] = up
    if t < 1 or f_out < 1:
        raise r.fail(node, f"leaves {t} steps and {f_out} frequencies of {lay.t} and {F}")
    params = {"W": r.floats(node, W)}
    bias = r.const(node, 2)
    if bias is not None:
        params["b"] = r.floats(node, bias).reshape(-1)
    c_first = attrs["out_order"] == "cf"
    out_axes = list(axes)
    out_axes[1], out_axes[3 - ti] = (0, 1) if c_first else (1, 0)
    cdims = (W.shape[0], f_out) if c_first else (f_out, W.shape[0])
    r.emit(node, "conv2d", [edge], Layout.make(tuple(out_axes), cdims, lay.n, t), attrs, params)


@handles("BatchNormalization")
def batch_normalization(r, node) -> None:
    edge, lay = r.input(node)
    if len(lay.axes) < 2 or not (lay.holds_channels(1) or isinstance(lay.axes[1], int)):
        raise r.fail(node, f"reads {lay.describe()}; ONNX's BatchNormalization normalizes axis 1", layout=True)
    if attr(node, "training_mode", 0) or any(r.used(node, k) for k in (1, 2, 3, 4)):
        raise r.fail(node, "runs in training mode")
    along = (-1,) + (1,) * (len(lay.axes) - 2)  # axis 1's values; on a map, repeated at each frequency
    params = {name: lay.per_channel(r.floats(node, r.const(node, k)).reshape(along))[0]
              for k, name in enumerate(("gamma", "beta", "mean", "var"), 1)}
    r.emit(node, "batchnorm", [edge], lay, {"epsilon": float(attr(node, "epsilon", 1e-5))}, params)


def _repeat(wide, narrow) -> tuple[int, int] | None:
    """(size, stride) of elementwise's `repeat` where `narrow` is `wide` with a run of its channel
    factors broadcast (a unit axis there, or fewer leading axes); None otherwise."""
    axes = ("1",) * (len(wide.axes) - len(narrow.axes)) + narrow.axes
    if len(axes) != len(wide.axes) or (wide.seq and wide.t != narrow.t):
        return None
    missing = []
    for a, b in zip(wide.axes, axes):
        if isinstance(a, int) and b == "1":
            missing.append(a)
        elif (a, b) != (a, a) and not (isinstance(a, int) and isinstance(b, int)):
            return None
    missing.sort()
    kept = tuple(d for k, d in enumerate(wide.cdims) if k not in missing)
    if not missing or missing != list(range(missing[0], missing[-1] + 1)) or kept != narrow.cdims:
        return None
    return int(np.prod([wide.cdims[k] for k in missing])), int(np.prod(wide.cdims[missing[-1] + 1:], dtype=np.int64))


@handles("Add", "Sub", "Mul", "Div")
def arith(r, node) -> None:
    """Add, Sub, Mul, Div: of two computed tensors (add, mul), a MatMul's bias, or a per-channel affine."""
    op, (a, b) = node.op_type, (list(node.input) + ["", ""])[:2]
    if a in r.data and a == b and op == "Mul":  # x * x
        return activation(r, node, "square")
    if a in r.data and b in r.data:
        (ea, la), (eb, lb) = r.data[a], r.data[b]
        if op not in ("Add", "Sub", "Mul"):
            raise r.fail(node, "computes on two computed tensors; qtool reads Add, Sub and Mul of them")
        if (la.axes, la.cdims, la.t if la.seq else 0) == (lb.axes, lb.cdims, lb.t if lb.seq else 0):
            r.emit(node, op.lower(), [ea, eb], la)
            return
        moved = conform(r, node, eb, lb, la, "_order")  # the same map, its frames in another order
        if moved is not None:
            r.emit(node, op.lower(), [ea, moved], la)
            return
        rep = _repeat(la, lb) or _repeat(lb, la)
        if rep is None:
            raise r.fail(node, f"combines {la.describe()} and {lb.describe()} (channels {la.channels} and "
                                  f"{lb.channels}); qtool's {op.lower()} takes two tensors of one shape, or "
                                  "one repeated over a map's frequencies or channels")
        r.emit(node, op.lower(), [ea, eb], la if la.channels >= lb.channels else lb, {"repeat": rep})
        return
    first = a in r.data
    x = a if first else b
    edge, lay = r.data[x]
    c = r.const(node, 1 if first else 0)
    found = lay.per_channel(r.floats(node, c))
    if found is None:
        raise r.fail(node, f"{op.lower()}s {lay.describe()} by a constant of shape {list(np.shape(c))}, which "
                              "varies along the batch or time axis; qtool reads per-channel constants")
    vec, extra = found
    out = lay.unsqueeze(list(range(extra))) if extra else lay
    if op == "Add" and x in r.dense and not extra:  # a MatMul's bias
        q = r.dense.pop(x)
        q.params["b"], q.source = vec, "MatMul+Add"
        r.ranges.drop(edge, f"it rounds {q.name}'s values before its bias, which qtool's dense adds "
                               "before it rounds")
        r.alias(node, edge, out)
        return
    if op == "Div" and not first:
        raise r.fail(node, "divides a constant by the data; qtool reads per-channel affine ops only")
    scale, shift = {"Mul": (vec, 0.0), "Add": (1.0, vec), "Sub": ((1.0, -vec) if first else (-1.0, vec)),
                    "Div": (np.float32(1) / vec, 0.0)}[op]
    C = lay.channels
    scale = np.broadcast_to(np.asarray(scale, np.float32), (C,))
    shift = np.broadcast_to(np.asarray(shift, np.float32), (C,))
    prev = r.affine.pop(x, None)
    if prev is not None and not extra:  # fold into the affine before it: s2 (s1 x + b1) + b2
        prev.params["gamma"] = (scale * prev.params["gamma"]).astype(np.float32)
        prev.params["beta"] = (scale * prev.params["beta"] + shift).astype(np.float32)
        prev.source += f"+{op}"
        r.alias(node, edge, out)
        if r.uses.get(node.output[0]) == 1:
            r.affine[node.output[0]] = prev
        return
    q = r.emit(node, "batchnorm", [edge], out, {"epsilon": AFFINE_EPSILON},
                   {"gamma": scale.copy(), "beta": shift.copy(), "mean": np.zeros(C, np.float32),
                    "var": np.ones(C, np.float32)}, source=f"{op} (per-channel affine)")
    if r.uses.get(node.output[0]) == 1:
        r.affine[node.output[0]] = q
