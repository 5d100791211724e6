"""What a layer module's `c_code` returns, and the pieces they share: the C of one node of a
whole model's export (qtool.exporters.c_graph assembles them, docs/embedded.md "Whole models").

A node's C is one function computing one output frame, in one of four forms (`CNode.kind`):

    frame   f(const tx0 *x0[, const tx1 *x1, ...], ty *y): one frame of each input -> one frame
    window  f(const tx *const *rows, int32_t n_real, ty *y): the window's `taps` input frames
            (a padded tap: the zero-point row for conv1d, NULL for pooling) -> one frame
    reduce  f_add(acc_t *acc, const tx *x) per frame, f_out(const acc_t *acc, int32_t count, ty *y)
    gru     the GRU's own export (qtool.exporters.c_export), called by the assembler

Every integer the node's simulator computes in int64 is computed here in int32_t where the
bound (`acc_type`) proves it fits, in int64_t elsewhere.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from qtool.core.qmodel import TensorQ
from qtool.errors import QtoolError
from qtool.numerics.qparams import qrange

INT31 = 1 << 31
INT62 = 1 << 62


@dataclass
class Window:
    """How the assembler feeds a window op: `taps` frames `dilation` apart every `stride`, after
    `pads` (left, right; or "same", computed from the steps at run time) padded steps. `pad_value`:
    a padded tap is the zero point (conv1d) rather than absent (pooling)."""

    taps: int
    stride: int
    dilation: int
    pads: tuple[int, int] | str
    pad_value: bool

    @property
    def span(self) -> int:
        return (self.taps - 1) * self.dilation + 1


@dataclass
class CNode:
    kind: str  # frame, window, reduce, gru
    code: str = ""  # static C functions named with the node's prefix
    tables: list[tuple[str, str, np.ndarray]] = field(default_factory=list)  # (C type, name, values)
    macs: int = 0  # multiply-accumulates per output frame
    window: Window | None = None
    acc_t: str = ""  # reduce: its accumulator's type
    max_steps: int = 0  # reduce: the most steps its sums are proved for (0: no limit)


def ctype(g: TensorQ) -> str:
    """The storage of an edge's integers."""
    if g.bits > 16:
        raise QtoolError(f"an edge of {g.bits} bits has no C export (at most 16)")
    return "int8_t" if g.bits <= 8 else "int16_t"


def int_bits(bound: int) -> int:
    """32 when every value of magnitude <= bound (and the rounding's half) fits int32_t, else 64."""
    if bound >= INT62:
        raise QtoolError(f"a layer's sums reach 2^{bound.bit_length()}, beyond what C's int64_t holds exactly")
    return 32 if bound < INT31 else 64


def lit(v: int) -> str:
    return f"({int(v)})" if v < 0 else str(int(v))


def table_type(values: np.ndarray) -> str:
    v = np.asarray(values)
    lo, hi = int(v.min(initial=0)), int(v.max(initial=0))
    for t, b in (("int8_t", 8), ("int16_t", 16), ("int32_t", 32)):
        if -(1 << (b - 1)) <= lo and hi < (1 << (b - 1)):
            return t
    return "int64_t"


def rescale_expr(v: str, n: int, shifts: np.ndarray | None, f: str, g_out: TensorQ, bits: int) -> str:
    """qtool.layers.integer.rescale of `v` (a C expression of `bits` bits) by its channel c's
    shift: a literal where every channel's is the same (`shifts` None: `n`), else `f`_sh[c]."""
    sat = f"QGRU_SAT{bits}"
    if shifts is None or int(np.min(shifts)) == int(np.max(shifts)):
        n = int(n if shifts is None else shifts.ravel()[0])
        if n >= bits - 1:  # rshift_round's half and shift at this width: in int64
            return f"QGRU_SAT64(qgru_rshift_round64((int64_t)({v}), {min(n, 63)}) + {lit(g_out.zp)}, {g_out.bits})"
        return f"{sat}(qgru_rshift_round{bits}({v}, {lit(n)}) + {lit(g_out.zp)}, {g_out.bits})"
    how = "right" if int(np.min(shifts)) >= 1 else "round"
    return f"{sat}(qgru_rshift_{how}{bits}({v}, {f}_sh[c]) + {lit(g_out.zp)}, {g_out.bits})"


def rescale_bits(bound: int, shifts) -> int:
    """The width of a rescale of values up to `bound` by `shifts` (a left shift grows them; a
    right shift by 31 or more, or its half, needs 64 bits)."""
    s = np.asarray(shifts).ravel()
    grown = bound << max(0, -int(s.min())) if len(s) else bound
    half = 1 << max(0, int(s.max()) - 1) if len(s) else 0
    bits = int_bits(grown + half)
    if bits == 32 and len(s) and int(s.max()) >= 31 and int(s.min()) != int(s.max()):
        bits = 64
    return bits


def shift_table(f: str, shifts: np.ndarray) -> list[tuple[str, str, np.ndarray]]:
    s = np.minimum(np.asarray(shifts, np.int64), 63)
    return [] if int(s.min()) == int(s.max()) else [("int8_t", f"{f}_sh", s)]


def requantize_expr(v: str, g_in: TensorQ, g_out: TensorQ) -> str:
    """qtool.layers.integer.requantize of one int32 value `v`."""
    if (g_in.bits, g_in.zp, int(g_in.exp2_inv)) == (g_out.bits, g_out.zp, int(g_out.exp2_inv)):
        return f"({ctype(g_out)})({v})"
    n = int(g_in.exp2_inv) - int(g_out.exp2_inv)
    bound = max(abs(q - g_in.zp) for q in qrange(g_in.bits))
    bits = rescale_bits(bound, np.array([n]))
    return f"({ctype(g_out)}){rescale_expr(f'({v}) - {lit(g_in.zp)}', n, None, '', g_out, bits)}"


def max_abs(g: TensorQ) -> int:
    """The largest magnitude of an edge's integers."""
    lo, hi = qrange(g.bits)
    return max(-lo, hi)


def gemm_c(f: str, label: str, q_W: np.ndarray, bias: np.ndarray, sh: np.ndarray, g_x: TensorQ,
           g_y: TensorQ, window: bool = False, groups: int = 1) -> CNode:
    """dense and conv1d: output channel c is the sum over its taps j of W[c, j, :] . (its
    group's slice of input frame j), plus `bias` (the bias less W_sum_mul_x_zp, one table),
    rescaled by sh[c]; q_W [C_out, C_in] (dense) or [C_out, C_in / groups, taps] (conv1d).
    A frame function (dense: the frame x0) or a `window` function (conv1d: tap j is `rows[j]`)."""
    c_out = q_W.shape[0]
    W = np.asarray(q_W, np.int64)
    W = W.reshape(c_out, 1, -1) if W.ndim == 2 else W.transpose(0, 2, 1)  # [C_out, taps, C_g]
    taps = W.shape[1]
    c_g, per = W.shape[2], c_out // groups
    w_t = table_type(W)
    acc_bound = int(np.abs(W).sum(axis=(1, 2)).max(initial=0)) * max_abs(g_x)
    acc = int_bits(acc_bound)
    bits = rescale_bits(acc_bound + int(np.abs(bias).max(initial=0)), sh)
    tables = [(w_t, f"{f}_W", W), (table_type(bias), f"{f}_b", bias), *shift_table(f, sh)]
    y_t, x_t, K = ctype(g_y), ctype(g_x), taps * c_g
    out = f"y[c] = ({y_t}){rescale_expr(f'(int{bits}_t)acc + {f}_b[c]', 0, sh, f, g_y, bits)};"
    row = f"rows[j] + (c / {per}) * {c_g}" if window else "x0"
    args = f"const {x_t} *const *rows, int32_t n_real" if window else f"const {x_t} *x0"
    one = f"""        for (; c < end; c++) {{ /* one channel at a time */
            int{acc}_t acc = 0;
            int32_t j, k;
            for (j = 0; j < {taps}; j++) {{
                const {w_t} *w = {f}_W + c * {K} + j * {c_g};
                const {x_t} *v = {row};
                for (k = 0; k < {c_g}; k++) {{
                    acc += (int{acc}_t)w[k] * v[k];
                }}
            }}
            {out}
        }}"""
    three = ""
    if w_t == "int8_t" and x_t == "int8_t" and acc == 32 and c_g >= 4:
        three = f"""        for (; c + 2 < end; c += 3) {{ /* three channels share each input load (SMLAD) */
            int32_t s0 = 0, s1 = 0, s2 = 0, j, a[3], acc;
            for (j = 0; j < {taps}; j++) {{
                qlayers_dot3_s8({f}_W + c * {K} + j * {c_g}, {K}, {row}, {c_g}, a);
                s0 += a[0];
                s1 += a[1];
                s2 += a[2];
            }}
            acc = s0;
            {out}
            c++;
            acc = s1;
            {out}
            c++;
            acc = s2;
            {out}
            c -= 2;
        }}
"""
    code = f"""/* {label} */
static void {f}({args}, {y_t} *y)
{{
    int32_t c = 0;
{"    (void)n_real;" + chr(10) if window else ""}    while (c < {c_out}) {{ /* a group at a time */
        const int32_t end = c + {per};
{three}{one}
    }}
}}
"""
    return CNode("window" if window else "frame", code, tables, macs=c_out * K)
