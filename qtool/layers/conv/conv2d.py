"""conv2d: a 2-D convolution over time x frequency (PyTorch's Conv2d, ONNX's Conv over two axes,
Keras' Conv2D), time staying the streaming axis.

A feature map `[T, F, C]` travels as qtool's sequence edge `[T, F * C]`: each frame holds the
map's F frequencies of C channels flattened in the order the model keeps them (`order` "cf":
channel c at frequency f is element c * F + f, as PyTorch's `[N, C, T, F]` reshaped after a
transpose; "fc": f * C + c, as TensorFlow's `[N, T, F, C]`); the output's, `out_order`, is the
order the model reads it in.

    y[t, f, o] = b[o] + sum_{j, k, c} W[o, c, j, k] * xp[t * s_t + j * d_t, f * s_f + k * d_f, g(o) * C_in/groups + c]

with `xp` the map padded with zeros: along time as conv1d's `padding` (valid, same, causal or
(left, right)), along frequency by `freq_pads` (before, after); `g(o) = o // (C_out / groups)`.
With `freq_up` u > 1 the input's frequencies are first spread u apart, u - 1 zeros between each
two: a transposed convolution of stride u along frequency is this conv2d of its flipped kernel.

Integers: conv1d's, per output channel weights over the channel's kt * kf * C_in/groups taps,
on the map padded with its zero point (a padded tap adds exactly nothing).

`in_shifts` k (one per input channel of the frame; the model's input with a grid per channel,
qtool.graph.calibrate.scale_input_channels): the layer reads its input divided by 2^k, exact in
float. Its kernel is shared by every frequency, so the shifts cannot go into its weights; the
integers instead bring every tap onto the finest grid first, v = (q_x - zp_x) * 2^(K - k) with
K = max k, and convolve v (zero point 0, exponent exp2_inv_x + K): exact too.
"""

from __future__ import annotations

import numpy as np

from qtool.core.edges import channels, sequence
from qtool.core.graph import Node
from qtool.core.node_args import MAX_STEPS, attr_padding, fail, only, param, want_inputs, window_pads
from qtool.core.qmodel import TensorQ
from qtool.layers.c import (
    CNode,
    Window,
    ctype,
    int_bits,
    lit,
    max_abs,
    rescale_bits,
    rescale_expr,
    shift_table,
    table_type,
)
from qtool.layers.integer import (
    GEMM_CHUNK_BYTES,
    LayerBits,
    abs_max,
    dequantized_weights,
    gemm_dtype,
    gemm_params,
    gemm_rescale,
)

OP = "conv2d"
ATTRS = ("kernel", "stride", "dilation", "groups", "padding", "freq", "freq_pads", "freq_up", "order", "out_order",
         "in_shifts")
ORDERS = ("cf", "fc")
MAX_IN_SHIFT = 30


def _pair(node: Node, name: str, default, low: int) -> tuple[int, int]:
    v = node.attrs.get(name, default)
    ok = isinstance(v, (tuple, list)) and len(v) == 2 and all(
        isinstance(p, (int, np.integer)) and not isinstance(p, bool) and low <= p <= MAX_STEPS for p in v)
    if not ok:
        raise fail(node, f"attribute '{name}' must be two integers (time, frequency) in {low}..{MAX_STEPS}, "
                         f"got {v!r:.40}")
    return int(v[0]), int(v[1])


def _geometry(node: Node) -> dict:
    order = node.attrs.get("order", "cf")
    out_order = node.attrs.get("out_order", order)
    for name, v in (("order", order), ("out_order", out_order)):
        if v not in ORDERS:
            raise fail(node, f"attribute '{name}' must be one of {', '.join(ORDERS)}, got {v!r:.40}")
    groups, freq, up = node.attrs.get("groups", 1), node.attrs.get("freq"), node.attrs.get("freq_up", 1)
    for name, v in (("groups", groups), ("freq", freq), ("freq_up", up)):
        if not isinstance(v, (int, np.integer)) or isinstance(v, bool) or not 1 <= v <= MAX_STEPS:
            raise fail(node, f"attribute '{name}' must be an integer in 1..{MAX_STEPS}, got {v!r:.40}")
    return dict(kernel=_pair(node, "kernel", None, 1), stride=_pair(node, "stride", (1, 1), 1),
                dilation=_pair(node, "dilation", (1, 1), 1), groups=int(groups), freq=int(freq), up=int(up),
                pads_f=_pair(node, "freq_pads", (0, 0), 0), padding=attr_padding(node, ("valid", "same", "causal")),
                order=order, out_order=out_order)


def freq_spread(g: dict) -> int:
    """The input's frequencies once spread `freq_up` apart."""
    return (g["freq"] - 1) * g["up"] + 1


def freq_out(g: dict) -> int:
    """The output map's frequencies."""
    span = (g["kernel"][1] - 1) * g["dilation"][1] + 1
    return (freq_spread(g) + sum(g["pads_f"]) - span) // g["stride"][1] + 1


def out_shape(node: Node, shapes: list[tuple]) -> list[tuple]:
    only(node, ATTRS, params=("W",), optional=("b",))
    want_inputs(node, shapes, seq=True)
    g = _geometry(node)
    width = channels(shapes[0])
    if width % g["freq"]:
        raise fail(node, f"the input's {width} channels are no map of {g['freq']} frequencies")
    c_in = width // g["freq"]
    if c_in % g["groups"]:
        raise fail(node, f"groups {g['groups']} does not divide the input's {c_in} channels")
    W = param(node, "W", (None, c_in // g["groups"], *g["kernel"]))
    if W.shape[0] % g["groups"]:
        raise fail(node, f"groups {g['groups']} does not divide the {W.shape[0]} output channels of W")
    param(node, "b", (W.shape[0],), optional=True)
    if freq_out(g) < 1:
        raise fail(node, f"its window spans more than the {g['freq']} frequencies (after padding)")
    k = node.attrs.get("in_shifts")
    if k is not None and (not isinstance(k, (tuple, list)) or len(k) != width or not all(
            isinstance(v, (int, np.integer)) and not isinstance(v, bool) and 0 <= v <= MAX_IN_SHIFT for v in k)):
        raise fail(node, f"attribute 'in_shifts' must be one shift in 0..{MAX_IN_SHIFT} per input channel "
                         f"({width}), got {k!r:.40}")
    return [sequence(W.shape[0] * freq_out(g))]


def _in_shifts(node: Node) -> np.ndarray | None:
    k = node.attrs.get("in_shifts")
    return None if k is None else np.asarray(k, np.int64)


def scale_input(node: Node, shifts: np.ndarray) -> None:
    """The same layer on its input's channels times 2^shifts: it divides them back (in_shifts)."""
    old = _in_shifts(node)
    node.attrs["in_shifts"] = tuple(int(v) for v in (shifts if old is None else old + shifts))


def _time_pads(g: dict, steps: int) -> tuple[int, int]:
    (kt, _), (st, _), (dt, _) = g["kernel"], g["stride"], g["dilation"]
    return window_pads(g["padding"], steps, kt, st, dt)


def to_map(x: np.ndarray, freq: int, order: str) -> np.ndarray:
    """A sequence edge `[N, T, F * C]` as its map `[N, T, F, C]` (a view where it can be)."""
    n, t, width = x.shape
    if order == "fc":
        return x.reshape(n, t, freq, width // freq)
    return x.reshape(n, t, width // freq, freq).transpose(0, 1, 3, 2)


def from_map(y: np.ndarray, order: str) -> np.ndarray:
    """A map `[N, T, F, C]` as its sequence edge `[N, T, F * C]`."""
    n, t = y.shape[:2]
    return (y if order == "fc" else y.transpose(0, 1, 3, 2)).reshape(n, t, -1)


def _padded(node: Node, g: dict, x: np.ndarray, zero, dtype) -> np.ndarray:
    m = to_map(np.asarray(x), g["freq"], g["order"])
    (lt, rt), (lf, rf), up = _time_pads(g, m.shape[1]), g["pads_f"], g["up"]
    xp = np.full((m.shape[0], lt + m.shape[1] + rt, lf + freq_spread(g) + rf, m.shape[3]), zero, dtype)
    xp[:, lt:lt + m.shape[1], lf:lf + freq_spread(g):up] = m
    span = (g["kernel"][0] - 1) * g["dilation"][0] + 1
    if xp.shape[1] < span:
        raise fail(node, f"{xp.shape[1]} steps (after padding) are fewer than the window's {span}")
    return xp


def _windows(g: dict, xp: np.ndarray) -> np.ndarray:
    """The windows of a padded map: `[N, T', F', kt, kf, C]`, a read-only view."""
    (kt, kf), (st, sf), (dt, df) = g["kernel"], g["stride"], g["dilation"]
    n, tp, fp, c = xp.shape
    t_out = (tp - (kt - 1) * dt - 1) // st + 1
    s0, s1, s2, s3 = xp.strides
    return np.lib.stride_tricks.as_strided(xp, (n, t_out, freq_out(g), kt, kf, c),
                                           (s0, st * s1, sf * s2, dt * s1, df * s2, s3), writeable=False)


def _rows(W: np.ndarray) -> np.ndarray:
    """W [C_out, C_g, kt, kf] as GEMM rows [C_out, kt * kf * C_g] in the windows' tap order."""
    return W.transpose(0, 2, 3, 1).reshape(len(W), -1)


def _convolve(g: dict, taps: np.ndarray, W: np.ndarray, out: np.ndarray, rescale=None) -> None:
    """out[..., o] = taps (o's group) . W[o] per group, a chunk of sequences at a time; `rescale`
    (cols, W_group_rows, channels, out_part) computes the integers' instead of the float sum."""
    groups, c_g = g["groups"], W.shape[1]
    per = len(W) // groups
    rows = _rows(W)
    for k in range(groups):
        cs = slice(k * per, (k + 1) * per)
        part = taps[..., k * c_g:(k + 1) * c_g]
        if rescale is not None:
            rescale(part, rows[cs], cs, out[..., cs])
            continue
        chunk = max(1, GEMM_CHUNK_BYTES // max(1, part[0].size * 4))
        for i in range(0, len(part), chunk):
            cols = part[i:i + chunk]
            out[i:i + chunk, ..., cs] = (cols.reshape(-1, rows.shape[1]) @ rows[cs].T).reshape(
                *cols.shape[:3], per)


def forward(node: Node, xs: list[np.ndarray]) -> list[np.ndarray]:
    g = _geometry(node)
    # float32 as the frameworks compute; float64 for the fake-quant twin's dequantized weights, whose
    # sums of 16-bit values float32 would round
    dt = np.float64 if np.asarray(node.params["W"]).dtype == np.float64 else np.float32
    W = np.asarray(node.params["W"], dt)
    x = xs[0] if _in_shifts(node) is None else np.ldexp(np.asarray(xs[0], dt), -_in_shifts(node)).astype(dt)
    taps = _windows(g, _padded(node, g, x, 0, dt))
    y = np.empty((*taps.shape[:3], len(W)), dt)
    _convolve(g, taps, W, y)
    if "b" in node.params:
        y += np.asarray(node.params["b"], dt)
    return [from_map(y, g["out_order"])]


def _tap_grid(node: Node, g_x: TensorQ) -> TensorQ:
    """The grid the integers convolve on: the input's, or with in_shifts its finest (zero point 0)."""
    k = _in_shifts(node)
    if k is None:
        return g_x
    return TensorQ(g_x.bits, True, int(g_x.exp2_inv) + int(k.max()), 0, g_x.lo, g_x.hi)


def quantize(node: Node, g_in: list[TensorQ], g_out: list[TensorQ], bits: LayerBits) -> dict:
    qp = gemm_params(node.params["W"], node.params.get("b"), _tap_grid(node, g_in[0]), g_out[0], bits)
    k = _in_shifts(node)
    if k is not None:
        qp["in_sh"] = k.max() - k  # each input channel's left shift onto the finest grid
    return qp


def fold_affine(node: Node, a: np.ndarray, c: np.ndarray) -> bool:
    """Fold a per-channel affine `y * a + c` of the output (one number per edge channel) into W
    and b where it is the same at every frequency of each output channel; False otherwise."""
    g = _geometry(node)
    W = np.asarray(node.params["W"], np.float64)
    per = [to_map(v.reshape(1, 1, -1), freq_out(g), g["out_order"])[0, 0] for v in (a, c)]  # [F', C_out]
    if any(np.any(p != p[:1]) for p in per):
        return False
    a, c = per[0][0], per[1][0]
    b = np.asarray(node.params.get("b", np.zeros(len(W))), np.float64)
    node.params = {"W": (W * a[:, None, None, None]).astype(np.float32), "b": (b * a + c).astype(np.float32)}
    return True


def forward_fq(node: Node, qp: dict, g_in: list[TensorQ], g_out: list[TensorQ], xs: list[np.ndarray]
               ) -> list[np.ndarray]:
    """The fake-quant layer (simulate --mode fakequant): the float layer on its dequantized weights."""
    return forward(dequantized_weights(node, qp, _tap_grid(node, g_in[0])), xs)


def forward_int(node: Node, qp: dict, qs: list[np.ndarray], g_in: list[TensorQ], g_out: list[TensorQ]
                ) -> list[np.ndarray]:
    """Exact integers: the map padded with its zero point, its windows a strided view, then per
    group one GEMM in the cheapest exact dtype over a chunk of sequences' windows (copied a
    chunk at a time), each chunk rescaled in place. Every partial sum is at most
    kt * kf * C_in/groups * max(|q_x|, |zp|) * max|q_W| (gemm_dtype)."""
    g = _geometry(node)
    q_W, x, zp = qp["q_W"], np.asarray(qs[0]), g_in[0].zp
    if "in_sh" in qp:  # every tap on the finest grid: (q - zp) 2^(K - k), zero point 0
        x, zp = np.left_shift(x.astype(np.int64) - zp, qp["in_sh"]), 0
    bound = int(np.prod(q_W.shape[1:])) * max(abs_max(x), abs(zp)) * abs_max(q_W)
    dt = gemm_dtype(bound)
    taps = _windows(g, _padded(node, g, x, zp, dt))
    out = np.empty((*taps.shape[:3], len(q_W)), np.int64)
    add = qp["q_b"] - qp["W_sum_mul_x_zp"]
    sh = np.broadcast_to(np.asarray(qp["sh_acc"], np.int64), (len(q_W),))

    def rescale(cols, rows, cs, part):
        gemm_rescale(cols, rows.astype(dt), add[cs], sh[cs], g_out[0], part, bound)

    _convolve(g, taps, q_W, out, rescale)
    return [from_map(out, g["out_order"])]


def describe(node: Node) -> str:
    g = _geometry(node)
    return (f"{g['kernel'][0]}x{g['kernel'][1]} over {g['freq']} freq, stride {g['stride'][0]}x{g['stride'][1]}"
            + (f", groups {g['groups']}" if g["groups"] > 1 else "")
            + (f", frequencies spread {g['up']} apart (transposed)" if g["up"] > 1 else ""))


def c_code(node: Node, qp: dict, g_in: list[TensorQ], g_out: list[TensorQ], f: str, widths: list[int]) -> CNode:
    """A window function over the kt frames of the map: each output frequency and channel the sum
    over its taps (a tap outside the frequencies reads the zero point; with in_shifts each tap
    is (q - zp) 2^(K - k), a padded one 0), rescaled."""
    g = _geometry(node)
    (kt, kf), (_, sf), (_, df) = g["kernel"], g["stride"], g["dilation"]
    W = np.asarray(qp["q_W"], np.int64).transpose(0, 2, 3, 1)  # [C_out, kt, kf, C_g]
    c_out, c_g = len(W), W.shape[3]
    per, F, F_out, lf, up = c_out // g["groups"], g["freq"], freq_out(g), g["pads_f"][0], g["up"]
    c_in = c_g * g["groups"]
    bias, sh = qp["q_b"] - qp["W_sum_mul_x_zp"], qp["sh_acc"]
    w_t, x_t, y_t = table_type(W), ctype(g_in[0]), ctype(g_out[0])
    in_sh = qp.get("in_sh")
    x_max = max_abs(g_in[0]) if in_sh is None else (max_abs(g_in[0]) + abs(g_in[0].zp)) << int(in_sh.max())
    acc_bound = int(np.abs(W).sum(axis=(1, 2, 3)).max(initial=0)) * x_max
    acc = int_bits(acc_bound)
    bits = rescale_bits(acc_bound + int(np.abs(bias).max(initial=0)), sh)
    src = "fi" if up == 1 else f"(fi / {up})"
    idx = f"{src} * {c_in} + g0 + i" if g["order"] == "fc" else f"(g0 + i) * {F} + {src}"
    x_at = f"v[{idx}]"
    if in_sh is not None:  # onto the finest grid: (q - zp) 2^(K - k), a padded tap 0
        x_at = f"((int{acc}_t)v[{idx}] - {lit(g_in[0].zp)}) * ((int{acc}_t)1 << {f}_xs[{idx}])"
    y_at = f"y[fo * {c_out} + c]" if g["out_order"] == "fc" else f"y[c * {F_out} + fo]"
    zp = 0 if in_sh is not None else g_in[0].zp  # what a padded tap adds: w times the zero point
    outside = f"fi < 0 || fi >= {freq_spread(g)}" + (f" || fi % {up}" if up > 1 else "")
    add_zp = "" if zp == 0 else f"""                        for (i = 0; i < {c_g}; i++) {{
                            acc += (int{acc}_t)w[i] * {lit(zp)};
                        }}
"""
    pad = (f"""                    if ({outside}) {{ /* a padded (or spread) frequency: the zero point */
{add_zp}                        continue;
                    }}
""" if lf or up > 1 or (F_out - 1) * sf + (kf - 1) * df - lf >= freq_spread(g) else "")
    code = f"""/* {node.label} */
static void {f}(const {x_t} *const *rows, int32_t n_real, {y_t} *y)
{{
    int32_t fo, c, j, k, i;
    (void)n_real;
    for (fo = 0; fo < {F_out}; fo++) {{
        for (c = 0; c < {c_out}; c++) {{
            const int32_t g0 = (c / {per}) * {c_g}; /* the group's first input channel */
            int{acc}_t acc = 0;
            for (j = 0; j < {kt}; j++) {{
                for (k = 0; k < {kf}; k++) {{
                    const int32_t fi = fo * {sf} + k * {df} - {lf};
                    const {w_t} *w = {f}_W + ((c * {kt} + j) * {kf} + k) * {c_g};
                    const {x_t} *v = rows[j];
{pad}                    for (i = 0; i < {c_g}; i++) {{
                        acc += (int{acc}_t)w[i] * {x_at};
                    }}
                }}
            }}
            {y_at} = ({y_t}){rescale_expr(f'(int{bits}_t)acc + {f}_b[c]', 0, sh, f, g_out[0], bits)};
        }}
    }}
}}
"""
    tables = [(w_t, f"{f}_W", W), (table_type(bias), f"{f}_b", bias), *shift_table(f, sh)]
    tables += [] if in_sh is None else [("int8_t", f"{f}_xs", np.asarray(in_sh, np.int64))]
    pads = {"valid": (0, 0), "causal": ((kt - 1) * g["dilation"][0], 0)}.get(g["padding"], g["padding"])
    cn = CNode("window", code, tables, macs=F_out * c_out * kt * kf * c_g)
    cn.window = Window(kt, g["stride"][0], g["dilation"][0], pads, pad_value=True)
    return cn
