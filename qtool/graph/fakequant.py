"""A whole model's simulated quantization (`simulate --mode fakequant|both`): the float graph
with every weight and bias replaced by its dequantized integers and every edge rounded onto its
grid (quantize, then dequantize), each GRU the fake-quant GRU (qtool.numerics.fakequant). Beside
the integer model it shows what the integer arithmetic itself costs: for the layers around the
GRU nothing but float rounding, since their integers are exact functions of their grids."""

from __future__ import annotations

import numpy as np

from qtool.core.graph import Node
from qtool.core.qgraph import QGraph
from qtool.core.qmodel import TensorQ
from qtool.layers import layer
from qtool.numerics.fakequant import qdq as fq_qdq
from qtool.numerics.qparams import qrange


def qdq(v: np.ndarray, g: TensorQ) -> np.ndarray:
    """v rounded onto grid g, saturating (the GRU's fake-quant rounding)."""
    return fq_qdq(np, np.asarray(v, np.float64), np.ldexp(1.0, int(g.exp2_inv)), g.zp, *qrange(g.bits))


def forward_fq(qg: QGraph, node: Node, xs: list[np.ndarray]) -> list[np.ndarray]:
    """One core node on values already on their grids; its outputs rounded onto theirs. A module
    with a fake-quant of its own (`forward_fq`: a weighted layer on its dequantized weights, an
    activation's interpolated table) computes it; any other its float forward, in float64 (which
    holds the product of two 16-bit values exactly; float32 would round it)."""
    module = layer(node.op, node.label)
    if hasattr(module, "forward_fq"):
        ys = module.forward_fq(node, qg.qparams[node.name], [qg.grids[e] for e in node.inputs],
                               [qg.grids[e] for e in node.outputs], xs)
    else:
        ys = module.forward(node, [np.asarray(x, np.float64) for x in xs])
    return [qdq(y, qg.grids[e]) for y, e in zip(ys, node.outputs)]


def run_fakequant(qg: QGraph, x: np.ndarray | dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    """Every core edge's fake-quant values (float64), from float inputs."""
    if not isinstance(x, dict):
        x = {next(iter(qg.graph.inputs)): x}
    v = {e: qdq(val, qg.grids[e]) for e, val in qg.graph.scale_inputs(x).items()}
    for name in qg.core:
        node = qg.node(name)
        v.update(zip(node.outputs, forward_fq(qg, node, [v[e] for e in node.inputs])))
    return v
