"""concat: inputs joined on the channel axis, in order (all sequences or all vectors). In
integers each input is requantized onto the output's grid first (nothing where they agree)."""

from __future__ import annotations

import numpy as np

from qtool.core.edges import channels, is_sequence, with_channels
from qtool.core.graph import Node
from qtool.core.node_args import fail, only, same_steps, want_inputs
from qtool.core.qmodel import TensorQ
from qtool.layers.c import CNode, ctype, requantize_expr
from qtool.layers.integer import LayerBits, requantize

OP = "concat"


def out_shape(node: Node, shapes: list[tuple]) -> list[tuple]:
    only(node)
    want_inputs(node, shapes, count=None)
    if len({is_sequence(s) for s in shapes}) > 1:
        raise fail(node, f"joins sequences and vectors: {', '.join(map(str, shapes))}")
    return [with_channels(shapes[0], sum(channels(s) for s in shapes))]


def forward(node: Node, xs: list[np.ndarray]) -> list[np.ndarray]:
    same_steps(node, xs)
    return [np.concatenate(xs, axis=-1)]


def quantize(node: Node, g_in: list[TensorQ], g_out: list[TensorQ], bits: LayerBits) -> dict:
    return {}


def forward_int(node: Node, qp: dict, qs: list[np.ndarray], g_in: list[TensorQ], g_out: list[TensorQ]
                ) -> list[np.ndarray]:
    same_steps(node, qs)
    return [np.concatenate([requantize(q, g, g_out[0]) for q, g in zip(qs, g_in)], axis=-1)]


def c_code(node: Node, qp: dict, g_in: list[TensorQ], g_out: list[TensorQ], f: str, widths: list[int]) -> CNode:
    """Each input requantized into its slice of the output frame."""
    y_t = ctype(g_out[0])
    args = ", ".join(f"const {ctype(g)} *x{i}" for i, g in enumerate(g_in))
    loops, at = [], 0
    for i, (g, w) in enumerate(zip(g_in, widths)):
        y = requantize_expr(f"x{i}[c]", g, g_out[0])
        loops.append(f"    for (c = 0; c < {w}; c++) {{\n        y[{at} + c] = {y};\n    }}")
        at += w
    code = f"""/* {node.label}: concat */
static void {f}({args}, {y_t} *y)
{{
    int32_t c;
{chr(10).join(loops)}
}}
"""
    return CNode("frame", code)
