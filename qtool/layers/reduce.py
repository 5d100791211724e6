"""reduce_mean: the mean over each group of a frame's channels (ONNX's ReduceMean over a map's
frequencies or channels, keepdims either way; GTCRN's attention takes the mean over frequency).

The frame of W channels is viewed as `[W / (size * stride), size, stride]` (as layernorm's
groups) and averaged along its middle axis: W / size channels out, `[W / (size * stride),
stride]` flattened. On a map of "cf" frames `[C, F]`, `size` F, `stride` 1 averages over
frequency into C channels; on "fc" frames `[F, C]`, `size` F, `stride` C.

Integers: the exact rounded mean of avg_pool1d (qtool.layers.integer.average) of the group's
`q - zp_x`, onto the output's grid.
"""

from __future__ import annotations

import numpy as np

from qtool.core.edges import channels, with_channels
from qtool.core.graph import Node
from qtool.core.node_args import attr_int, fail, only, want_inputs
from qtool.core.qmodel import TensorQ
from qtool.layers.c import CNode, ctype, lit
from qtool.layers.integer import LayerBits, average

OP = "reduce_mean"


def groups(node: Node, width: int) -> tuple[int, int]:
    """(size, stride) of the groups, tiling a frame of `width` channels."""
    size, stride = attr_int(node, "size"), attr_int(node, "stride", 1)
    if width % (size * stride):
        raise fail(node, f"groups of {size} channels {stride} apart do not tile the frame's {width} channels")
    return size, stride


def out_shape(node: Node, shapes: list[tuple]) -> list[tuple]:
    only(node, ("size", "stride"))
    want_inputs(node, shapes)
    size, _ = groups(node, channels(shapes[0]))
    return [with_channels(shapes[0], channels(shapes[0]) // size)]


def _view(node: Node, x: np.ndarray) -> np.ndarray:
    size, stride = groups(node, x.shape[-1])
    return x.reshape(*x.shape[:-1], -1, size, stride)


def forward(node: Node, xs: list[np.ndarray]) -> list[np.ndarray]:
    x = xs[0]
    return [_view(node, x).mean(axis=-2).reshape(*x.shape[:-1], -1).astype(x.dtype)]


def quantize(node: Node, g_in: list[TensorQ], g_out: list[TensorQ], bits: LayerBits) -> dict:
    return {}


def forward_int(node: Node, qp: dict, qs: list[np.ndarray], g_in: list[TensorQ], g_out: list[TensorQ]
                ) -> list[np.ndarray]:
    q = np.asarray(qs[0], np.int64)
    s = (_view(node, q) - g_in[0].zp).sum(axis=-2).reshape(*q.shape[:-1], -1)
    return [average(s, groups(node, q.shape[-1])[0], g_in[0], g_out[0])]


def c_code(node: Node, qp: dict, g_in: list[TensorQ], g_out: list[TensorQ], f: str, widths: list[int]) -> CNode:
    gx, gy = g_in[0], g_out[0]
    size, stride = groups(node, widths[0])
    d = int(gy.exp2_inv) - int(gx.exp2_inv)
    y_t = ctype(gy)
    mean = f"QGRU_SAT64(qlayers_average(sum, {size}, {d}, {gx.bits}, {gy.bits}) + {lit(gy.zp)}, {gy.bits})"
    code = f"""/* {node.label}: the mean over groups of {size} channels {stride} apart */
static void {f}(const {ctype(gx)} *x0, {y_t} *y)
{{
    int32_t g, s, k;
    for (g = 0; g < {widths[0] // (size * stride)}; g++) {{
        for (s = 0; s < {stride}; s++) {{
            int64_t sum = 0;
            for (k = 0; k < {size}; k++) {{
                sum += (int64_t)x0[(g * {size} + k) * {stride} + s] - {lit(gx.zp)};
            }}
            y[g * {stride} + s] = ({y_t}){mean};
        }}
    }}
}}
"""
    return CNode("frame", code, macs=widths[0])
