"""Ops that only move steps; their integers keep the input's grid (`SHARES_GRID`).

zero_pad1d: `pad` (before, after) steps of zeros around a sequence (Keras' ZeroPadding1D, ONNX's
Pad on the time axis). In integers the padded steps hold the zero point, the grid's exact zero.

last_step: `x[:, -1]`, a sequence's last step as a vector (PyTorch's `output[:, -1]`, ONNX's
Gather/Slice of the last step).
"""

from __future__ import annotations

import numpy as np

from qtool.core.edges import channels, vector
from qtool.core.graph import Node
from qtool.core.node_args import MAX_STEPS, attr_steps, fail, only, want_inputs
from qtool.core.qmodel import TensorQ
from qtool.layers.c import CNode, Window, ctype, requantize_expr
from qtool.layers.integer import requantize

OPS = ("zero_pad1d", "last_step")
SCALE_PASSES = OPS  # they only move values: a per-channel scale of the input passes through them
SHARES_GRID = OPS  # their output may keep the input's grid: no requantization


def _pad(node: Node) -> tuple[int, int]:
    pair = attr_steps(node, "pad")
    if pair is None:
        raise fail(node, f"attribute 'pad' must be (before, after) steps in 0..{MAX_STEPS}, "
                         f"got {node.attrs.get('pad')!r:.40}")
    return pair


def out_shape(node: Node, shapes: list[tuple]) -> list[tuple]:
    want_inputs(node, shapes, seq=True)
    if node.op == "last_step":
        only(node)
        return [vector(channels(shapes[0]))]
    only(node, ("pad",))
    _pad(node)
    return [shapes[0]]


def _move(node: Node, x: np.ndarray, zero) -> np.ndarray:
    if node.op == "zero_pad1d":
        return np.pad(x, ((0, 0), _pad(node), (0, 0)), constant_values=zero)
    if x.shape[1] == 0:
        raise fail(node, "an empty sequence has no last step")
    return x[:, -1]


def forward(node: Node, xs: list[np.ndarray]) -> list[np.ndarray]:
    return [_move(node, xs[0], 0)]


def quantize(node: Node, g_in: list[TensorQ], g_out: list[TensorQ], cfg) -> dict:
    return {}


def forward_int(node: Node, qp: dict, qs: list[np.ndarray], g_in: list[TensorQ], g_out: list[TensorQ]
                ) -> list[np.ndarray]:
    return [requantize(_move(node, qs[0], g_in[0].zp), g_in[0], g_out[0])]


def c_code(node: Node, qp: dict, g_in: list[TensorQ], g_out: list[TensorQ], f: str, widths: list[int]) -> CNode:
    """One frame onto the output's grid (the integers themselves where the grids agree); the
    assembler pads (`pads`: the zero point's frames) or takes the last frame."""
    code = f"""/* {node.label}: {node.op} */
static void {f}(const {ctype(g_in[0])} *x0, {ctype(g_out[0])} *y)
{{
    int32_t c;
    for (c = 0; c < {widths[0]}; c++) {{
        y[c] = {requantize_expr('x0[c]', g_in[0], g_out[0])};
    }}
}}
"""
    pads = _pad(node) if node.op == "zero_pad1d" else None
    return CNode("pad" if pads else "last", code, window=None if pads is None else Window(1, 1, 1, pads, True))
