"""The float tail, over the channel axis:

softmax: `exp(x - max(x)) / sum(exp(x - max(x)))`.
l2_normalize: `x / max(||x||, epsilon)`, `epsilon` 1e-12 by default (Keras 3's UnitNormalization
and PyTorch's F.normalize). An epsilon on the squared norm (tf.math.l2_normalize, Keras 2's
K.l2_normalize: `x / sqrt(max(sum(x^2), e))`) is the same op with epsilon = sqrt(e).

Both run in float on the dequantized output (`FLOAT_TAIL`): a classifier's class is the argmax of
its integer logits, which softmax does not change.
"""

from __future__ import annotations

import numpy as np

from qtool.core.graph import Node
from qtool.core.node_args import attr_float, only, want_inputs

OPS = ("softmax", "l2_normalize")
FLOAT_TAIL = True


def out_shape(node: Node, shapes: list[tuple]) -> list[tuple]:
    only(node, ("epsilon",) if node.op == "l2_normalize" else ())
    want_inputs(node, shapes)
    if node.op == "l2_normalize":
        attr_float(node, "epsilon", 1e-12, positive=True)
    return [shapes[0]]


def forward(node: Node, xs: list[np.ndarray]) -> list[np.ndarray]:
    x = xs[0]
    if node.op == "softmax":
        e = np.exp(x - x.max(axis=-1, keepdims=True))  # the largest exponent is 0: no overflow
        return [e / e.sum(axis=-1, keepdims=True)]
    norm = np.sqrt(np.square(x).sum(axis=-1, keepdims=True))
    return [x / np.maximum(norm, np.float32(attr_float(node, "epsilon", 1e-12, positive=True)))]
