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

from qtool.core.edges import channels, vector
from qtool.core.graph import Node
from qtool.core.node_args import attr_int, attr_padding, fail, only, same_pads, want_inputs, windows
from qtool.core.qmodel import TensorQ
from qtool.layers.c import CNode, Window, ctype, lit, requantize_expr
from qtool.layers.integer import LayerBits, average, requantize

OPS = ("avg_pool1d", "max_pool1d", "global_avg_pool1d", "global_max_pool1d")
ATTRS = ("pool", "stride", "padding")
SHARES_GRID = ("max_pool1d", "global_max_pool1d")


def _attrs(node: Node) -> tuple[int, int, str | tuple[int, int]]:
    pool = attr_int(node, "pool")
    return pool, attr_int(node, "stride", pool), attr_padding(node, ("valid", "same"))


def out_shape(node: Node, shapes: list[tuple]) -> list[tuple]:
    want_inputs(node, shapes, seq=True)
    if node.op.startswith("global_"):
        only(node)
        return [vector(channels(shapes[0]))]
    only(node, ATTRS)
    pool, _, padding = _attrs(node)
    if isinstance(padding, tuple) and max(padding) >= pool:
        # a window of padding alone has no real step to take the max or average of
        raise fail(node, f"padding {padding} must be smaller than the pool ({pool})")
    return [shapes[0]]


def _pooled(node: Node, x: np.ndarray, zero, lowest) -> tuple[np.ndarray, np.ndarray | int]:
    """(max or sum over each window, count of real steps in it): padded steps hold `lowest` for
    max, `zero` for the sum."""
    if x.shape[1] == 0:
        raise fail(node, "pools an empty sequence")
    if node.op == "global_avg_pool1d":
        return (x - zero).sum(axis=1), x.shape[1]
    if node.op == "global_max_pool1d":
        return x.max(axis=1), 1
    pool, stride, padding = _attrs(node)
    if padding == "valid":
        left, right = 0, 0
    elif padding == "same":
        left, right = same_pads(x.shape[1], pool, stride)
    else:
        left, right = padding
    pads = ((0, 0), (left, right), (0, 0))
    if node.op == "max_pool1d":
        return windows(node, np.pad(x, pads, constant_values=lowest), pool, stride).max(axis=2), 1
    real = np.pad(np.ones((1, x.shape[1], 1), np.int64), pads)  # 1 where a step is real
    total = windows(node, np.pad(x - zero, pads), pool, stride).sum(axis=2)
    return total, windows(node, real, pool, stride).sum(axis=2)


def forward(node: Node, xs: list[np.ndarray]) -> list[np.ndarray]:
    y, count = _pooled(node, xs[0], 0, -np.inf)
    return [y / np.float32(count) if node.op.endswith("avg_pool1d") else y]


def quantize(node: Node, g_in: list[TensorQ], g_out: list[TensorQ], bits: LayerBits) -> dict:
    return {}


def forward_int(node: Node, qp: dict, qs: list[np.ndarray], g_in: list[TensorQ], g_out: list[TensorQ]
                ) -> list[np.ndarray]:
    x, gx, gy = np.asarray(qs[0], np.int64), g_in[0], g_out[0]
    if node.op.endswith("max_pool1d"):
        return [requantize(_pooled(node, x, 0, np.iinfo(np.int64).min)[0], gx, gy)]
    s, count = _pooled(node, x, gx.zp, 0)
    return [average(s, count, gx, gy)]


def c_code(node: Node, qp: dict, g_in: list[TensorQ], g_out: list[TensorQ], f: str, widths: list[int]) -> CNode:
    """A window of real input frames (a padded tap is NULL: not a value) -> its max or average;
    the global pools as a running max or sum over every frame."""
    gx, gy, C = g_in[0], g_out[0], widths[0]
    x_t, y_t = ctype(gx), ctype(gy)
    d = int(gy.exp2_inv) - int(gx.exp2_inv)
    avg = f"QGRU_SAT64(qlayers_average({{s}}, {{n}}, {d}, {gx.bits}, {gy.bits}) + {lit(gy.zp)}, {gy.bits})"
    if node.op.startswith("global_"):
        if node.op == "global_max_pool1d":
            add, out, acc_t, most = "acc[c] = count == 0 || x[c] > acc[c] ? x[c] : acc[c];", \
                f"y[c] = {requantize_expr('acc[c]', gx, gy)};", "int32_t", 0
        else:  # 2 s 2^d + n stays in int64 while 2 bit_length(count) + bits_x + bits_y + 3 <= 62
            add, acc_t = f"acc[c] = (count == 0 ? 0 : acc[c]) + x[c] - {lit(gx.zp)};", "int64_t"
            out = f"y[c] = ({y_t}){avg.format(s='acc[c]', n='count')};"
            most = (1 << ((59 - gx.bits - gy.bits) // 2)) - 1
        code = f"""/* {node.label}: {node.op}, one frame at a time */
static void {f}_add({acc_t} *acc, const {x_t} *x, int32_t count)
{{
    int32_t c;
    (void)count;
    for (c = 0; c < {C}; c++) {{
        {add}
    }}
}}

static void {f}_out(const {acc_t} *acc, int32_t count, {y_t} *y)
{{
    int32_t c;
    (void)count;
    for (c = 0; c < {C}; c++) {{
        {out}
    }}
}}
"""
        return CNode("reduce", code, acc_t=acc_t, max_steps=most)
    pool, stride, padding = _attrs(node)
    if node.op == "max_pool1d":
        inner = ("if (rows[j] != NULL && (m == INT32_MIN || rows[j][c] > m)) {\n"
                 "                m = rows[j][c];\n            }")
        init, out = "int32_t m = INT32_MIN;", f"y[c] = {requantize_expr('m', gx, gy)};"
    else:
        inner = f"if (rows[j] != NULL) {{\n                s += rows[j][c] - {lit(gx.zp)};\n            }}"
        init, out = "int32_t s = 0;", f"y[c] = ({y_t}){avg.format(s='s', n='n_real')};"
    code = f"""/* {node.label}: {node.op} over a window of {pool} frames (NULL: a padded step) */
static void {f}(const {x_t} *const *rows, int32_t n_real, {y_t} *y)
{{
    int32_t c, j;
    (void)n_real;
    for (c = 0; c < {C}; c++) {{
        {init}
        for (j = 0; j < {pool}; j++) {{
            {inner}
        }}
        {out}
    }}
}}
"""
    pads = (0, 0) if padding == "valid" else padding
    return CNode("window", code, window=Window(pool, stride, 1, pads, pad_value=False))
