"""Pools: over a window of steps (AveragePool, MaxPool) or over all of them (GlobalAveragePool,
GlobalMaxPool, ReduceMean and ReduceMax over the time axis)."""

from __future__ import annotations

from qtool.importers.onnx.graph import attr
from qtool.importers.onnx.ops.norm import norm_groups, written_layer_norm
from qtool.importers.onnx.ops.registry import handles

# a reduction over all the steps -> the qtool op
OVER_TIME = {"ReduceMean": "global_avg_pool1d", "ReduceMax": "global_max_pool1d",
             "GlobalAveragePool": "global_avg_pool1d", "GlobalMaxPool": "global_max_pool1d"}


@handles("ReduceMean", "ReduceMax")
def reduce_time(r, node) -> None:
    edge, lay = r.input(node)
    axes = r.axes_of(node, 1, len(lay.axes))
    roles = [lay.axes[a] for a in axes or []]
    if node.op_type == "ReduceMean" and roles and any(isinstance(a, int) for a in roles) and "T" not in roles:
        return _reduce_channels(r, node, edge, lay, axes)
    if roles.count("T") != 1 or any(role not in ("T", "1") for role in roles):
        raise r.fail(node, f"reduces axes {axes} of {lay.describe()}; qtool reads a {node.op_type} over the "
                              "time steps only", layout=True)
    keep = attr(node, "keepdims", 1)
    axes_out = tuple("1" if k in axes else a for k, a in enumerate(lay.axes) if keep or k not in axes)
    r.emit(node, OVER_TIME[node.op_type], [edge], lay.replace(axes=axes_out))


def _reduce_channels(r, node, edge, lay, axes: list[int]) -> None:
    """A mean over channel factors of a map (its frequencies, say): reduce_mean over those groups;
    or the first op of a LayerNorm written out (qtool.importers.onnx.ops.norm)."""
    size, stride = norm_groups(r, node, lay, axes)
    if written_layer_norm(r, node, edge, lay, axes, size, stride):
        return
    out = lay
    for a in sorted(axes, reverse=True):
        out = out.take(a, bool(attr(node, "keepdims", 1))) if isinstance(out.axes[a], int) else \
            (out if attr(node, "keepdims", 1) else out.squeeze([a], r.label(node)))
    r.emit(node, "reduce_mean", [edge], out, {"size": size, "stride": stride})


@handles("GlobalAveragePool", "GlobalMaxPool")
def global_pool(r, node) -> None:
    edge, lay = r.input(node)
    over = list(range(2, len(lay.axes)))  # channels there: the mean of a LayerNorm written out (tf2onnx's)
    if node.op_type == "GlobalAveragePool" and over and all(isinstance(lay.axes[a], int) or lay.axes[a] == "1"
                                                              for a in over):
        size, stride = norm_groups(r, node, lay, over)
        if written_layer_norm(r, node, edge, lay, over, size, stride):
            return
    r.ncw(node, lay)
    r.emit(node, OVER_TIME[node.op_type], [edge], lay.replace(axes=("N", lay.axes[1], "1")))


@handles("AveragePool")
def average_pool(r, node) -> None:
    _pool(r, node, "avg_pool1d")


@handles("MaxPool")
def max_pool(r, node) -> None:
    if r.used(node, 1):
        raise r.fail(node, "has its indices read")
    if attr(node, "storage_order", 0):
        raise r.fail(node, "has storage_order 1")
    _pool(r, node, "max_pool1d")


def _pool(r, node, op: str) -> None:
    edge, lay = r.input(node)
    r.ncw(node, lay)
    kernel = attr(node, "kernel_shape", [])
    if len(kernel) != 1:
        raise r.fail(node, f"has kernel_shape {kernel}; qtool pools over one axis")
    k, stride = int(kernel[0]), int(attr(node, "strides", [1])[0])
    if list(attr(node, "dilations", [1])) != [1]:
        raise r.fail(node, f"has dilations {attr(node, 'dilations', None)}; qtool's pools are dense windows")
    padding, t = r.window(node, lay.t, k, stride, 1)
    if op == "avg_pool1d" and attr(node, "count_include_pad", 0) and padding != "valid":
        if padding == "same":
            raise r.fail(node, "averages 'same' padding as zeros (count_include_pad=1); qtool's 'same' "
                                  "average counts real steps only")
        q = r.emit(node, "zero_pad1d", [edge], lay, {"pad": padding}, suffix=".pad",
                       source="AveragePool (count_include_pad)")
        edge, padding = q.outputs[0], "valid"
    r.emit(node, op, [edge], lay.replace(t=t), {"pool": k, "stride": stride, "padding": padding})
