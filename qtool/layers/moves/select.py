"""select: output channel j is input channel `index[j]`, in each frame (or of a vector), or zero
where the index is -1:

    y[j] = x[index[j]]   (0 where index[j] = -1)

What an ONNX Slice or Split of part of a map's channel factor writes (GTCRN's two halves of the
channels, each its own GRU), and the channel order a Concat along an inner factor or a Reshape
that interleaves factors (a channel shuffle) makes; with -1s, a Pad along a map's frequencies
and PyTorch's Unfold (its windows of frequencies). It only moves values: its output keeps its
input's grid (`SHARES_GRID`), so its integers are the input's, taken, and its C copies them
through a const index table.
"""

from __future__ import annotations

import numpy as np

from qtool.core.edges import channels, with_channels
from qtool.core.graph import Node
from qtool.core.node_args import fail, only, want_inputs
from qtool.core.qmodel import TensorQ
from qtool.layers.c import CNode, ctype, lit, requantize_expr, table_type
from qtool.layers.integer import requantize

OP = "select"
SCALE_PASSES = ()  # each output channel is one input channel, but a scale per channel would need moving too
SHARES_GRID = (OP,)


def _index(node: Node, width: int) -> np.ndarray:
    index = node.attrs.get("index")
    ok = isinstance(index, (tuple, list)) and len(index) > 0 and all(
        isinstance(i, (int, np.integer)) and not isinstance(i, bool) and -1 <= i < width for i in index)
    if not ok:
        raise fail(node, f"attribute 'index' must be channels of its input (0..{width - 1}) or -1 (zero), "
                         f"got {index!r:.40}")
    return np.asarray(index, np.int64)


def out_shape(node: Node, shapes: list[tuple]) -> list[tuple]:
    only(node, ("index",))
    want_inputs(node, shapes)
    return [with_channels(shapes[0], len(_index(node, channels(shapes[0]))))]


def _take(node: Node, x: np.ndarray, zero) -> np.ndarray:
    index = _index(node, x.shape[-1])
    y = np.take(x, np.maximum(index, 0), axis=-1)
    y[..., index < 0] = zero
    return y


def forward(node: Node, xs: list[np.ndarray]) -> list[np.ndarray]:
    return [_take(node, xs[0], 0)]


def quantize(node: Node, g_in: list[TensorQ], g_out: list[TensorQ], bits) -> dict:
    return {}


def forward_int(node: Node, qp: dict, qs: list[np.ndarray], g_in: list[TensorQ], g_out: list[TensorQ]
                ) -> list[np.ndarray]:
    return [requantize(_take(node, np.asarray(qs[0]), g_in[0].zp), g_in[0], g_out[0])]


def c_code(node: Node, qp: dict, g_in: list[TensorQ], g_out: list[TensorQ], f: str, widths: list[int]) -> CNode:
    index = _index(node, widths[0])
    x = f"x0[{f}_index[j]]" if index.min() >= 0 else f"({f}_index[j] < 0 ? {lit(g_in[0].zp)} : x0[{f}_index[j]])"
    code = f"""/* {node.label}: select */
static void {f}(const {ctype(g_in[0])} *x0, {ctype(g_out[0])} *y)
{{
    int32_t j;
    for (j = 0; j < {len(index)}; j++) {{
        y[j] = {requantize_expr(x, g_in[0], g_out[0])};
    }}
}}
"""
    return CNode("frame", code, [(table_type(index), f"{f}_index", index)])
