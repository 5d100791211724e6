"""batchnorm (inference): `(x - mean) / sqrt(var + epsilon) * gamma + beta` per channel.
`epsilon` has no default: Keras' is 1e-3, PyTorch's 1e-5, so the importer states it."""

from __future__ import annotations

import numpy as np

from qtool.core.graph import Node
from qtool.layers import attr_float, f32, fail, only, param, want_inputs

OP = "batchnorm"
PARAMS = ("gamma", "beta", "mean", "var")


def out_shape(node: Node, shapes: list[tuple]) -> list[tuple]:
    only(node, ("epsilon",), params=PARAMS)
    want_inputs(node, shapes)
    attr_float(node, "epsilon", positive=True)
    for name in PARAMS:
        param(node, name, (shapes[0][-1],))
    if np.any(node.params["var"] < 0):
        raise fail(node, "param 'var' has negative entries")
    return [shapes[0]]


def forward(node: Node, xs: list[np.ndarray]) -> list[np.ndarray]:
    gamma, beta, mean, var = (f32(node.params[k]) for k in PARAMS)
    eps = np.float32(attr_float(node, "epsilon", positive=True))
    return [(xs[0] - mean) / np.sqrt(var + eps) * gamma + beta]
