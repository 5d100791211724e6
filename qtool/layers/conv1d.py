"""conv1d: PyTorch's Conv1d on channels-last sequences `[N, T, C_in]` -> `[N, T', C_out]`:

    y[n, t, o] = b[o] + sum_{j, c} W[o, c, j] * xp[n, t * stride + j * dilation, g(o) * C_in/groups + c]

with `xp` the input padded with zeros, `g(o) = o // (C_out / groups)` the output's group
(depthwise: groups == C_in). Padding: "valid" (none), "same" (Keras': ceil(T / stride) steps,
total zeros max((ceil(T/stride) - 1) * stride + (kernel - 1) * dilation + 1 - T, 0), the odd one
after), "causal" ((kernel - 1) * dilation before) or explicit (left, right) (PyTorch's
`padding=p` is (p, p))."""

from __future__ import annotations

import numpy as np

from qtool.core.graph import Node
from qtool.layers import attr_int, attr_padding, f32, fail, only, param, same_pads, want_inputs, windows

OP = "conv1d"
ATTRS = ("kernel", "stride", "dilation", "groups", "padding")


def _attrs(node: Node) -> tuple[int, int, int, int, str | tuple[int, int]]:
    return (attr_int(node, "kernel"), attr_int(node, "stride", 1), attr_int(node, "dilation", 1),
            attr_int(node, "groups", 1), attr_padding(node, ("valid", "same", "causal")))


def out_shape(node: Node, shapes: list[tuple]) -> list[tuple]:
    only(node, ATTRS, params=("W",), optional=("b",))
    want_inputs(node, shapes, seq=True)
    kernel, _, _, groups, _ = _attrs(node)
    c_in = shapes[0][-1]
    if c_in % groups:
        raise fail(node, f"groups {groups} does not divide the input's {c_in} channels")
    W = param(node, "W", (None, c_in // groups, kernel))
    if W.shape[0] % groups:
        raise fail(node, f"groups {groups} does not divide the {W.shape[0]} output channels of W")
    param(node, "b", (W.shape[0],), optional=True)
    return [(None, W.shape[0])]


def forward(node: Node, xs: list[np.ndarray]) -> list[np.ndarray]:
    kernel, stride, dilation, groups, padding = _attrs(node)
    x = xs[0]
    if padding == "valid":
        left, right = 0, 0
    elif padding == "same":
        left, right = same_pads(x.shape[1], kernel, stride, dilation)
    elif padding == "causal":
        left, right = (kernel - 1) * dilation, 0
    else:
        left, right = padding
    x = np.pad(x, ((0, 0), (left, right), (0, 0)))
    taps = windows(node, x, kernel, stride, dilation)  # [N, T', kernel, C_in]
    W = f32(node.params["W"])
    c_out, c_g = W.shape[0], W.shape[1]
    n, t_out = taps.shape[:2]
    taps = taps.reshape(n, t_out, kernel, groups, c_g)
    Wg = W.reshape(groups, c_out // groups, c_g, kernel)
    y = np.einsum("ntjgc,gocj->ntgo", taps, Wg, optimize=True).reshape(n, t_out, c_out)
    if "b" in node.params:
        y = y + f32(node.params["b"])
    return [y]
