"""add, mul: the elementwise sum or product of two or more inputs of one shape (Keras' Add and
Multiply, ONNX's Add and Mul between two computed edges). No broadcasting: a sequence and a
vector do not mix."""

from __future__ import annotations

import numpy as np

from qtool.core.graph import Node
from qtool.layers import fail, only, want_inputs

OPS = ("add", "mul")


def out_shape(node: Node, shapes: list[tuple]) -> list[tuple]:
    only(node)
    want_inputs(node, shapes, count=None)
    if any(s != shapes[0] for s in shapes):
        raise fail(node, f"inputs of different shapes: {', '.join(map(str, shapes))}")
    return [shapes[0]]


def forward(node: Node, xs: list[np.ndarray]) -> list[np.ndarray]:
    y = xs[0]
    for x in xs[1:]:  # left to right, as the frameworks fold them
        y = y + x if node.op == "add" else y * x
    return [y]
