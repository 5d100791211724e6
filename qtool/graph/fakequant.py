"""A whole model's simulated quantization (`simulate --mode fakequant|both`): the float graph
with every weight and bias replaced by its dequantized integers and every edge rounded onto its
grid (quantize, then dequantize), each GRU the fake-quant GRU (qtool.numerics.fakequant). Beside
the integer model it shows what the integer arithmetic itself costs: for the layers around the
GRU nothing but float rounding, since their integers are exact functions of their grids."""

from __future__ import annotations

import copy

import numpy as np

from qtool.core.graph import Node
from qtool.core.qgraph import QGraph
from qtool.core.qmodel import TensorQ
from qtool.layers import layer
from qtool.numerics.fakequant import qdq as fq_qdq
from qtool.numerics.fakequant import run_fakequant as run_fakequant_gru
from qtool.numerics.qparams import dequantize, qrange


def qdq(v: np.ndarray, g: TensorQ) -> np.ndarray:
    """v rounded onto grid g, saturating (the GRU's fake-quant rounding)."""
    return fq_qdq(np, np.asarray(v, np.float64), np.ldexp(1.0, int(g.exp2_inv)), g.zp, *qrange(g.bits))


def _dequantized_weights(node: Node, qp: dict, g_x: TensorQ) -> Node:
    """The node with its params replaced by what its integers stand for."""
    e_W = qp["exp2_inv_W"]
    W = dequantize(qp["q_W"].reshape(len(e_W), -1), e_W, 0).reshape(qp["q_W"].shape)
    b = dequantize(qp["q_b"], e_W + int(g_x.exp2_inv), 0)
    out = copy.copy(node)
    out.params = {"W": W.astype(np.float64), "b": b}
    return out


def forward_fq(qg: QGraph, node: Node, xs: list[np.ndarray]) -> list[np.ndarray]:
    """One core node on values already on their grids; its outputs rounded onto theirs."""
    qp, g_in = qg.qparams[node.name], [qg.grids[e] for e in node.inputs]
    if node.op == "gru":
        y = run_fakequant_gru(qp["qm"], xs[0])
        from qtool.layers.gru import _final

        ys = [_final(node, y, qp["qm"].model.hidden_size, qp["qm"].model.num_directions)]
    elif node.op in ("dense", "conv1d"):
        ys = layer(node.op, node.label).forward(_dequantized_weights(node, qp, g_in[0]), xs)
    elif node.op == "batchnorm":  # the integer per-channel affine x * a + c
        fq = _dequantized_weights(node, qp, g_in[0])
        ys = [xs[0] * fq.params["W"][:, 0] + fq.params["b"]]
    else:
        ys = layer(node.op, node.label).forward(node, [np.asarray(x, np.float32) for x in xs])
    return [qdq(y, qg.grids[e]) for y, e in zip(ys, node.outputs)]


def run_fakequant(qg: QGraph, x: np.ndarray | dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    """Every core edge's fake-quant values (float64), from float inputs."""
    if not isinstance(x, dict):
        x = {next(iter(qg.graph.inputs)): x}
    v = {e: qdq(val, qg.grids[e]) for e, val in x.items()}
    for name in qg.core:
        node = qg.node(name)
        v.update(zip(node.outputs, forward_fq(qg, node, [v[e] for e in node.inputs])))
    return v
