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

from qtool.core.edges import channels, sequence
from qtool.core.graph import Node
from qtool.core.node_args import attr_int, attr_padding, f32, fail, only, param, want_inputs, window_pads, windows
from qtool.core.qmodel import TensorQ
from qtool.layers.c import CNode, Window, gemm_c
from qtool.layers.integer import (
    GEMM_CHUNK_BYTES,
    LayerBits,
    abs_max,
    dequantized_weights,
    fold_output_affine,
    gemm_dtype,
    gemm_params,
    gemm_rescale,
    rescale_into,
)

OP = "conv1d"
ATTRS = ("kernel", "stride", "dilation", "groups", "padding")
IM2COL_BYTES = 1 << 26  # the most one sequence's windows may take as GEMM rows; beyond, a tap at a time


def _attrs(node: Node) -> tuple[int, int, int, int, str | tuple[int, int]]:
    return (attr_int(node, "kernel"), attr_int(node, "stride", 1), attr_int(node, "dilation", 1),
            attr_int(node, "groups", 1), attr_padding(node, ("valid", "same", "causal")))


def out_shape(node: Node, shapes: list[tuple]) -> list[tuple]:
    only(node, ATTRS, params=("W",), optional=("b",))
    want_inputs(node, shapes, seq=True)
    kernel, _, _, groups, _ = _attrs(node)
    c_in = channels(shapes[0])
    if c_in % groups:
        raise fail(node, f"groups {groups} does not divide the input's {c_in} channels")
    W = param(node, "W", (None, c_in // groups, kernel))
    if W.shape[0] % groups:
        raise fail(node, f"groups {groups} does not divide the {W.shape[0]} output channels of W")
    param(node, "b", (W.shape[0],), optional=True)
    return [sequence(W.shape[0])]


def _pads(node: Node, steps: int) -> tuple[int, int]:
    kernel, stride, dilation, _, padding = _attrs(node)
    return window_pads(padding, steps, kernel, stride, dilation)


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


def scale_input(node: Node, shifts: np.ndarray) -> None:
    """The same layer on its input's channels times 2^shifts: each output channel's taps on input
    channel c (of its group) divided by 2^shifts[c] (exact)."""
    W = f32(node.params["W"])
    c_out, c_g, _ = W.shape
    groups = _attrs(node)[3]
    per_out = shifts.reshape(groups, 1, c_g).repeat(c_out // groups, axis=1).reshape(c_out, c_g)
    node.params["W"] = np.ldexp(W, -per_out[:, :, None]).astype(np.float32)


fold_affine = fold_output_affine  # a batchnorm after it folds into W and b


def quantize(node: Node, g_in: list[TensorQ], g_out: list[TensorQ], bits: LayerBits) -> dict:
    return gemm_params(node.params["W"], node.params.get("b"), g_in[0], g_out[0], bits)


def gemm_path(node: Node, qp: dict, q_x: np.ndarray, g_in: TensorQ) -> tuple[type, str, int]:
    """How forward_int computes: (the GEMM's dtype, "im2col" or "taps", the bound on its partial
    sums). The windows read q_x padded with its zero point, so the bound is
    kernel * C_in/groups * max(|q_x|, |zp| where padded) * max|q_W| (gemm_dtype). "im2col": one
    GEMM per group over the windows, a chunk of sequences at a time, where one sequence's windows
    fit in IM2COL_BYTES and a window has more than one channel; otherwise "taps": a tap at a time
    (depthwise: elementwise)."""
    kernel, stride, dilation, _, _ = _attrs(node)
    q_W = qp["q_W"]
    c_g = q_W.shape[1]
    max_x = max(abs_max(q_x), abs(g_in.zp) if any(_pads(node, q_x.shape[1])) else 0)
    bound = kernel * c_g * max_x * abs_max(q_W)
    dt = gemm_dtype(bound)
    t_out = max(0, (q_x.shape[1] + sum(_pads(node, q_x.shape[1])) - (kernel - 1) * dilation - 1) // stride + 1)
    fits = t_out * kernel * c_g * np.dtype(dt).itemsize <= IM2COL_BYTES
    return dt, "im2col" if fits and c_g > 1 else "taps", bound


def _tap_sum(taps: np.ndarray, W: np.ndarray, groups: int) -> np.ndarray:
    """sum_j taps[:, :, j] (by group) @ W[:, :, j].T, a tap at a time: [n, T', C_out] in W's dtype."""
    c_out, c_g, kernel = W.shape
    per = c_out // groups
    acc = np.zeros((*taps.shape[:2], c_out), W.dtype)
    for j in range(kernel):
        xs = taps[:, :, j]  # [n, T', C_in]
        if c_g == 1:  # depthwise: each output channel reads one input channel
            acc += (np.repeat(xs, per, axis=-1) if per > 1 else xs) * W[:, 0, j]
            continue
        for g in range(groups):
            acc[..., g * per:(g + 1) * per] += xs[..., g * c_g:(g + 1) * c_g] @ W[g * per:(g + 1) * per, :, j].T
    return acc


def forward_fq(node: Node, qp: dict, g_in: list[TensorQ], g_out: list[TensorQ], xs: list[np.ndarray]
               ) -> list[np.ndarray]:
    """The fake-quant layer (simulate --mode fakequant): the float layer on its dequantized weights."""
    return forward(dequantized_weights(node, qp, g_in[0]), xs)


def forward_int(node: Node, qp: dict, qs: list[np.ndarray], g_in: list[TensorQ], g_out: list[TensorQ]
                ) -> list[np.ndarray]:
    """Exact integers in the cheapest exact dtype (gemm_path): the input padded with its zero point
    in that dtype, its windows a strided view, then per group one GEMM over a chunk of sequences'
    windows (im2col, copied a chunk at a time) or a tap at a time, each chunk rescaled in place."""
    kernel, stride, dilation, groups, _ = _attrs(node)
    q_W, x, zp = qp["q_W"], np.asarray(qs[0]), g_in[0].zp
    c_out, c_g = q_W.shape[:2]
    per = c_out // groups
    dt, path, bound = gemm_path(node, qp, x, g_in[0])
    left, right = _pads(node, x.shape[1])
    xp = np.empty((x.shape[0], left + x.shape[1] + right, x.shape[2]), dt)
    xp[:, :left] = zp
    xp[:, left + x.shape[1]:] = zp
    xp[:, left:left + x.shape[1]] = x
    taps = windows(node, xp, kernel, stride, dilation)  # [N, T', kernel, C_in], a view
    out = np.empty((*taps.shape[:2], c_out), np.int64)
    add, sh = qp["q_b"] - qp["W_sum_mul_x_zp"], np.broadcast_to(np.asarray(qp["sh_acc"], np.int64), (c_out,))
    if path == "im2col":
        Wg = _by_group(q_W, groups).astype(dt)  # [groups, C_out / groups, kernel * C_in / groups]
        for g in range(groups):
            cs = slice(g * per, (g + 1) * per)
            gemm_rescale(taps[..., g * c_g:(g + 1) * c_g], Wg[g], add[cs], sh[cs], g_out[0], out[..., cs], bound)
    else:
        W = q_W.astype(dt)
        rows = max(1, GEMM_CHUNK_BYTES // (taps.shape[1] * c_out * (W.itemsize + 8) or 1))
        for i in range(0, len(taps), rows):
            rescale_into(out[i:i + rows], _tap_sum(taps[i:i + rows], W, groups), add, sh, g_out[0], bound)
    return [out]


def c_code(node: Node, qp: dict, g_in: list[TensorQ], g_out: list[TensorQ], f: str, widths: list[int]) -> CNode:
    kernel, stride, dilation, groups, padding = _attrs(node)
    cn = gemm_c(f, node.label, qp["q_W"], qp["q_b"] - qp["W_sum_mul_x_zp"], qp["sh_acc"], g_in[0], g_out[0],
                window=True, groups=groups)
    pads = {"valid": (0, 0), "causal": ((kernel - 1) * dilation, 0)}.get(padding, padding)
    cn.window = Window(kernel, stride, dilation, pads, pad_value=True)
    return cn
