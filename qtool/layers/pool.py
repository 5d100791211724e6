"""Pooling over time, channels-last `[N, T, C]`:

avg_pool1d, max_pool1d: windows of `pool` steps every `stride` (default `pool`, as in Keras and
PyTorch); padding "valid", "same" (Keras': ceil(T / stride) steps, the odd padded step after)
or explicit (left, right). Padded steps are not values: max ignores them, avg divides by the
number of real steps in the window (TensorFlow's "same"; PyTorch's AvgPool1d with
count_include_pad=False). A zero-counting average (PyTorch's default count_include_pad=True)
is zero_pad1d followed by a "valid" avg_pool1d.

global_avg_pool1d, global_max_pool1d: over all steps, `[N, T, C]` -> `[N, C]`.
"""

from __future__ import annotations

import numpy as np

from qtool.core.graph import Node
from qtool.layers import attr_int, attr_padding, fail, only, same_pads, want_inputs, windows

OPS = ("avg_pool1d", "max_pool1d", "global_avg_pool1d", "global_max_pool1d")
ATTRS = ("pool", "stride", "padding")


def _attrs(node: Node) -> tuple[int, int, str | tuple[int, int]]:
    pool = attr_int(node, "pool")
    return pool, attr_int(node, "stride", pool), attr_padding(node, ("valid", "same"))


def out_shape(node: Node, shapes: list[tuple]) -> list[tuple]:
    want_inputs(node, shapes, seq=True)
    if node.op.startswith("global_"):
        only(node)
        return [(shapes[0][-1],)]
    only(node, ATTRS)
    pool, _, padding = _attrs(node)
    if isinstance(padding, tuple) and max(padding) >= pool:
        # a window of padding alone has no real step to take the max or average of
        raise fail(node, f"padding {padding} must be smaller than the pool ({pool})")
    return [shapes[0]]


def forward(node: Node, xs: list[np.ndarray]) -> list[np.ndarray]:
    x = xs[0]
    if x.shape[1] == 0:
        raise fail(node, "pools an empty sequence")
    if node.op == "global_avg_pool1d":
        return [x.mean(axis=1)]
    if node.op == "global_max_pool1d":
        return [x.max(axis=1)]
    pool, stride, padding = _attrs(node)
    if padding == "valid":
        left, right = 0, 0
    elif padding == "same":
        left, right = same_pads(x.shape[1], pool, stride)
    else:
        left, right = padding
    real = np.pad(np.ones((1, x.shape[1], 1), np.float32), ((0, 0), (left, right), (0, 0)))  # 1 where a step is real
    if node.op == "max_pool1d":
        padded = np.pad(x, ((0, 0), (left, right), (0, 0)), constant_values=-np.inf)
        return [windows(node, padded, pool, stride).max(axis=2)]
    total = windows(node, np.pad(x, ((0, 0), (left, right), (0, 0))), pool, stride).sum(axis=2)
    return [total / windows(node, real, pool, stride).sum(axis=2)]
