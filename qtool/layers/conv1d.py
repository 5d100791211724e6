"""conv1d: PyTorch's Conv1d on channels-last sequences `[N, T, C_in]` -> `[N, T', C_out]`:

    y[n, t, o] = b[o] + sum_{j, c} W[o, c, j] * xp[n, t * stride + j * dilation, g(o) * C_in/groups + c]

with `xp` the input padded with zeros, `g(o) = o // (C_out / groups)` the output's group
(depthwise: groups == C_in). Padding: "valid" (none), "same" (Keras': ceil(T / stride) steps,
total zeros max((ceil(T/stride) - 1) * stride + (kernel - 1) * dilation + 1 - T, 0), the odd one
after), "causal" ((kernel - 1) * dilation before) or explicit (left, right) (PyTorch's
`padding=p` is (p, p)).

Integers: as dense's (per output channel weights, W_sum_mul_x_zp over the channel's taps), on
the input padded with its zero point, so that a padded tap adds exactly nothing."""

from __future__ import annotations

import numpy as np

from qtool.core.graph import Node
from qtool.core.qmodel import TensorQ
from qtool.layers import attr_int, attr_padding, f32, fail, only, param, same_pads, want_inputs, windows
from qtool.layers.c import CNode, Window, gemm_c
from qtool.layers.integer import EXACT_FLOAT, LayerBits, gemm_params, matmul, rescale

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


def _pads(node: Node, steps: int) -> tuple[int, int]:
    kernel, stride, dilation, _, padding = _attrs(node)
    if padding == "valid":
        return 0, 0
    if padding == "same":
        return same_pads(steps, kernel, stride, dilation)
    if padding == "causal":
        return (kernel - 1) * dilation, 0
    return padding


def _taps(node: Node, x: np.ndarray, zero) -> np.ndarray:
    """The windows of the padded input, by group: [N, T', groups, kernel * C_in / groups]."""
    kernel, stride, dilation, groups, _ = _attrs(node)
    taps = windows(node, np.pad(x, ((0, 0), _pads(node, x.shape[1]), (0, 0)), constant_values=zero),
                   kernel, stride, dilation)  # [N, T', kernel, C_in]
    n, t_out = taps.shape[:2]
    return taps.reshape(n, t_out, kernel, groups, -1).transpose(0, 1, 3, 2, 4).reshape(n, t_out, groups, -1)


def _by_group(W: np.ndarray, groups: int) -> np.ndarray:
    """W [C_out, C_in / groups, kernel] as [groups, C_out / groups, kernel * C_in / groups]."""
    c_out, c_g, kernel = W.shape
    return W.reshape(groups, c_out // groups, c_g, kernel).transpose(0, 1, 3, 2).reshape(groups, c_out // groups, -1)


def forward(node: Node, xs: list[np.ndarray]) -> list[np.ndarray]:
    groups = _attrs(node)[3]
    taps = _taps(node, xs[0], 0)
    Wg = _by_group(f32(node.params["W"]), groups)
    y = np.einsum("ntgk,gok->ntgo", taps, Wg, optimize=True).reshape(*taps.shape[:2], -1)
    if "b" in node.params:
        y = y + f32(node.params["b"])
    return [y]


def quantize(node: Node, g_in: list[TensorQ], g_out: list[TensorQ], bits: LayerBits) -> dict:
    return gemm_params(node.params["W"], node.params.get("b"), g_in[0], g_out[0], bits)


def forward_int(node: Node, qp: dict, qs: list[np.ndarray], g_in: list[TensorQ], g_out: list[TensorQ]
                ) -> list[np.ndarray]:
    kernel, stride, dilation, groups, _ = _attrs(node)
    q_W = qp["q_W"]
    c_out, c_g = q_W.shape[:2]
    bound = kernel * c_g * int(np.abs(qs[0]).max(initial=0) + abs(g_in[0].zp)) * int(np.abs(q_W).max(initial=0))
    if bound >= EXACT_FLOAT:  # beyond float64's exact integers: the windows in int64
        taps = _taps(node, np.asarray(qs[0], np.int64), g_in[0].zp)  # [N, T', groups, K]
        Wg = _by_group(q_W, groups)
        acc = np.concatenate([matmul(taps[:, :, g], Wg[g]) for g in range(groups)], axis=-1)
    else:  # a tap at a time, through BLAS: every partial sum is an exact integer below 2^53
        x = np.pad(np.asarray(qs[0], np.float64), ((0, 0), _pads(node, qs[0].shape[1]), (0, 0)),
                   constant_values=g_in[0].zp)
        span = (kernel - 1) * dilation + 1
        if x.shape[1] < span:
            raise fail(node, f"{x.shape[1]} steps (after padding) are fewer than the window's {span}")
        t_out = (x.shape[1] - span) // stride + 1
        W, per = q_W.astype(np.float64), c_out // groups
        acc = np.zeros((x.shape[0], t_out, c_out))
        for j in range(kernel):
            xs = x[:, j * dilation: j * dilation + (t_out - 1) * stride + 1: stride]  # [N, T', C_in]
            if c_g == 1:  # depthwise: each output channel reads one input channel
                acc += np.repeat(xs, per, axis=-1) * W[:, 0, j]
                continue
            for g in range(groups):
                acc[..., g * per:(g + 1) * per] += xs[..., g * c_g:(g + 1) * c_g] @ W[g * per:(g + 1) * per, :, j].T
        acc = acc.astype(np.int64)
    return [rescale(acc - qp["W_sum_mul_x_zp"] + qp["q_b"], qp["sh_acc"], g_out[0])]


def c_code(node: Node, qp: dict, g_in: list[TensorQ], g_out: list[TensorQ], f: str, widths: list[int]) -> CNode:
    kernel, stride, dilation, groups, padding = _attrs(node)
    cn = gemm_c(f, node.label, qp["q_W"], qp["q_b"] - qp["W_sum_mul_x_zp"], qp["sh_acc"], g_in[0], g_out[0],
                window=True, groups=groups)
    pads = {"valid": (0, 0), "causal": ((kernel - 1) * dilation, 0)}.get(padding, padding)
    cn.window = Window(kernel, stride, dilation, pads, pad_value=True)
    return cn
