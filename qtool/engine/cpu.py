"""The integer GRU on the CPU, with the float reference and the distance statistics fused into
the same loops: numba kernels around the scalar functions of qtool.numerics.intops (the integers) and
qtool.engine.float_cell (the float32 reference).

One kernel call runs one layer direction over all time steps of a slice of sequences, in blocks
of `simd.MB` sequences: per step, the W x and R h GEMMs of the block (`simd.gemm_rows`: the
rows of the block share every weight load), then the integer cell of every unit, then (when
asked) the float GEMMs and cell and the statistics of every tensor against its float value,
from buffers reused at every step: memory does not grow with the number of sequences or steps.
Sequences are independent, so each thread of a small pool runs every layer of its own slice,
with no barrier per step (`run_model`).

Integer GEMMs are exact: the arithmetic is chosen from the static bound of the GEMM's result,
`max_c sum_k |q_W[c, k]| * max |q_in|` (`gemm_plan`, docs/numerics.md "GEMM arithmetic").
"""

from __future__ import annotations

import os
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass

import numpy as np
from numba import config, njit
from numba.extending import register_jitable

from qtool.core.model import GruCell
from qtool.core.qmodel import CellQuant, QuantModel
from qtool.engine.float_cell import (
    float_candidate_reset_before,
    float_cell,
    float_cell_form,
    float_gates,
    form_codes,
)
from qtool.engine.layout import (
    EVERY_TENSOR,
    INTS,
    N_STATS,
    X_TENSOR,
    ModelRun,
    cell_layout,
    gemm_bound,
    measured_grids,
    quantize_input,
)
from qtool.engine.metrics import STAT_MAX_ABS, STATS, add_row
from qtool.engine.simd import HAS_VNNI, KINDS, MB, gemm_rows, pack, padded, prefer_wide_vectors
from qtool.numerics.intops import gru_candidate_reset_before, gru_cell, gru_gates_reset_before, rescale
from qtool.numerics.lane_bounds import cell_lane_type, fold_bias_shifts
from qtool.numerics.rescale import (
    CH_R_SUM_MUL_H_ZP,
    CH_SH_W,
    CH_W_SUM_MUL_X_ZP,
    HI_WX,
    LO_WX,
    RB_HI_WX,
    RB_LO_WX,
    RB_ZP_H,
    RB_ZP_WX,
    ZP_H,
    ZP_WX,
    sum_mul_zp,
)

U8_SHIFT = 128  # 8-bit inputs seen as uint8 q + 128 (zero point zp + 128) by vpdpbusd


@dataclass
class Gemm:
    """One integer GEMM as the micro-kernel runs it: sum_k W[c, k] (q_in[k] + shift), exact.

    kind: the micro-kernel's arithmetic (simd.KINDS); w: the packed weights; Kp: padded input
    width; half: 0, or for int16 weights split into 8-bit halves hi and lo (W = 256 hi + lo)
    the offset of lo's channels (the sum is 256 * out[c] + out[c + half]); comp: the zero-point
    compensation of the input view, (zp + shift) * sum_k W[c, k].
    """

    kind: str
    w: np.ndarray
    Kp: int
    width: int
    shift: int
    half: int
    comp: np.ndarray


def split_halves(q_w: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """W = 256 hi + lo with lo in [-128, 127] and hi in [-128, 128] (for 16-bit W)."""
    q_w = np.asarray(q_w, np.int64)
    lo = ((q_w + 128) & 255) - 128
    return (q_w - lo) >> 8, lo


def gemm_plan(q_w: np.ndarray, bits_in: int, zp_in: int, vnni: bool | None = None) -> Gemm:
    """The fastest exact arithmetic for `q_w @ q_in` with inputs on `bits_in` signed bits:
    - uint8 view q + 128 x int8 weights on VNNI, while max_c sum_k |W| * 255 < 2^31;
    - int16 inputs x int16 weights (int8 weights widened), while max_c sum_k |W| * 2^(bits-1)
      < 2^31 (pairs of products summed in int32 lanes);
    - int16 weights as two 8-bit halves, each under the same bound, combined in int64;
    - else float64 below 2^53 (every partial sum an exact integer), else int64."""
    vnni = HAS_VNNI if vnni is None else vnni
    q_w = np.asarray(q_w, np.int64)
    c_out = q_w.shape[0]
    lo, hi = int(q_w.min(initial=0)), int(q_w.max(initial=0))

    def plan(kind, w, shift=0, half=0):
        packed, Kp = pack(w, kind)
        width = padded(w.shape[0], kind)
        return Gemm(kind, packed, Kp, width, shift, width // 2 if half else 0,
                    sum_mul_zp(q_w, zp_in + shift))

    if vnni and bits_in <= 8 and -128 <= lo and hi < 128 and gemm_bound(q_w, 1) * 255 < 2**31:
        return plan("u8s8", q_w, U8_SHIFT)
    if bits_in <= 16 and -2**15 <= lo and hi < 2**15:
        if gemm_bound(q_w, bits_in) < 2**31:
            return plan("s16", q_w)
        w_hi, w_lo = split_halves(q_w)
        if max(gemm_bound(w_hi, bits_in), gemm_bound(w_lo, bits_in)) < 2**31:
            half = padded(c_out, "s16")
            both = np.zeros((2 * half, q_w.shape[1]), np.int64)
            both[:c_out], both[half:half + c_out] = w_hi, w_lo
            return plan("s16", both, half=1)
    return plan("f64" if gemm_bound(q_w, bits_in) < 2**53 else "i64", q_w)


def float_gemm(w: np.ndarray) -> Gemm:
    """The float32 reference's GEMM `w @ x`: its packed weights and the width of its output
    buffer, which must be the packed width (the micro-kernel writes whole tiles)."""
    packed, Kp = pack(np.asarray(w, np.float32), "f32")
    return Gemm("f32", packed, Kp, padded(w.shape[0], "f32"), 0, 0, np.zeros(w.shape[0]))


@njit(nogil=True, cache=True)
def _gemm_all(q_in, shift, w, half, a, acc, out):
    for m0 in range(0, q_in.shape[0], MB):
        for i in range(min(MB, q_in.shape[0] - m0)):
            for k in range(q_in.shape[1]):
                a[i, k] = q_in[m0 + i, k] + shift
        gemm_rows(a, w, acc)
        for i in range(min(MB, q_in.shape[0] - m0)):
            for c in range(out.shape[1]):
                out[m0 + i, c] = _gemm_sum(acc, i, c, half)


def gemm_apply(g: Gemm, q_in: np.ndarray, c_out: int) -> np.ndarray:
    """sum_k W[c, k] (q_in[m, k] - zp) for integer rows `q_in [M, K]`, as the engine computes
    it (the micro-kernel's sums minus the compensation), in int64. The rows go in as they come
    (int8 in the distributed operator): an int64 copy of them took longer than the GEMM."""
    out = np.empty((q_in.shape[0], c_out), np.int64)
    in_t, _, sum_t, _, _ = KINDS[g.kind]
    _gemm_all(np.ascontiguousarray(q_in), g.shift, g.w, g.half, np.zeros((MB, g.Kp), in_t),
              np.zeros((MB, g.width), sum_t), out)
    return out - g.comp[None, :]


@dataclass
class DirectionPlan:
    """Everything one layer direction's kernel reads: its GEMMs, the spec's constants (P, CH
    and the tables, in the cell's lane type: qtool.numerics.lanes), the float GEMMs (`fx` W x,
    `fh` R h, `fg` R_g rh; each sizes its own output buffer), the grids of the measured tensors
    and the cell's form. A reset-before cell's `gh` holds R's z and r rows only and `gg` the
    g rows, which read rh = r * h_old; for a haste cell `gg` is `gh` and `fg` is `fh` (the
    kernel then never runs them)."""

    cq: CellQuant
    gx: Gemm
    gh: Gemm
    gg: Gemm
    P: np.ndarray
    CH: np.ndarray
    luts: tuple
    fx: Gemm
    fh: Gemm
    fg: Gemm
    bx: np.ndarray
    br: np.ndarray
    grids: np.ndarray
    form: np.ndarray  # [reset_before, gate, candidate] (float_cell.form_codes; -1 for the haste form)
    alpha_beta: np.ndarray  # a hard_sigmoid gate's (alpha, beta), float32
    rows: int
    row_tensor: np.ndarray


def plan_direction(cq: CellQuant, cell: GruCell) -> DirectionPlan:
    x, h = cq.spec["x"], cq.spec["h"]
    H = cq.hidden_size
    gx = gemm_plan(cq.qW, x.bits, x.zp)
    CH = fold_bias_shifts(cq.CH)
    reset_before = not cq.form.reset_after
    if reset_before:
        rh = cq.spec["rh"]
        gh = gemm_plan(cq.qR[:2 * H], h.bits, h.zp)
        gg = gemm_plan(cq.qR[2 * H:], rh.bits, rh.zp)
        comp_R = np.concatenate([gh.comp, gg.comp])
        fh, fg = float_gemm(cell.R[:2 * H]), float_gemm(cell.R[2 * H:])
    else:
        gh = gg = gemm_plan(cq.qR, h.bits, h.zp)
        comp_R = gh.comp
        fh = fg = float_gemm(cell.R)
    CH[CH_W_SUM_MUL_X_ZP], CH[CH_R_SUM_MUL_H_ZP] = gx.comp, comp_R  # the GEMMs' own views
    luts = [cq.luts[k] for k in ("lut_z", "lut_r", "lut_g")]
    lane_t = cell_lane_type(cq, CH, luts)
    gate, alpha, beta, candidate = form_codes(cq.form)
    form = np.array([-1, 0, 0] if cq.form.haste else [int(reset_before), gate, candidate], np.int64)
    layout = cell_layout(cq.form)
    return DirectionPlan(cq, gx, gh, gg, cq.P.astype(lane_t), CH.astype(lane_t),
                         tuple(t.astype(lane_t) for t in luts), float_gemm(cell.W), fh, fg, cell.bx, cell.br,
                         measured_grids(cq), form, np.array([alpha, beta], np.float32), layout.rows, layout.row_tensor)


def plan_model(qm: QuantModel) -> list[list[DirectionPlan]]:
    return [[plan_direction(cq, qm.model.layers[l][d]) for d, cq in enumerate(cells)]
            for l, cells in enumerate(qm.cells)]


@register_jitable
def _gemm_sum(acc, i, c, half):
    """The GEMM's integer sum for channel c: out[c], or 256 hi + lo for split weights
    (branch-free: half = 0 reads out[c] twice and keeps the first)."""
    v = np.int64(acc[i, c])
    lo = np.int64(acc[i, c + half])
    return v + (v * 255 + lo) * (half > 0)


@njit(nogil=True, cache=True, noalias=True, error_model="numpy")
def _run_direction(xq, xf, n0, n1, rev, out_q, out_f, col,
                   gx_w, gx_shift, gx_half, ax, accx, gh_w, gh_shift, gh_half, ah, acch,
                   gg_w, gg_shift, gg_half, arh, accg,
                   P, CH, lut_z, lut_r, lut_g,
                   level, fW, fR, fRg, fax, fah, ffx, ffh, frh, ffg, bx, br, form, alpha_beta, ib, fb,
                   grids, row_tensor, stats, step_stats, trace, tmp):
    """Layer direction over all T steps of sequences [n0, n1) of batch-first `xq [N, T, C]`
    (integers; `xf` the float inputs), backwards in time when `rev`; writes h's integers (and
    floats) to columns [col, col + H) of `out_q` (`out_f`). `level`: INTS, OUTPUT or EVERY_TENSOR.
    Block b of MB sequences accumulates its statistics into `stats[b]` and `step_stats[b]`.
    `form` (DirectionPlan.form): a reset-before cell runs its gates, the g rows' GEMM on rh
    (`gg_*`, `fRg`), then its candidates. No two array arguments may share memory (noalias:
    what lets LLVM vectorise the cells).
    """
    prefer_wide_vectors()
    T, C = xq.shape[1], xq.shape[2]
    H = ib.shape[2]
    last = ib.shape[1] - 1
    reset_before = form[0] == 1
    zp_h = P[RB_ZP_H] if reset_before else P[ZP_H]
    for b0 in range(n0, n1, MB):
        nb = min(MB, n1 - b0)
        blk = b0 // MB  # the block's own rows of statistics
        for i in range(MB):  # h0 = 0 exactly: q_h = zp_h
            for j in range(H):
                ah[i, j] = zp_h + gh_shift
                fah[i, j] = 0.0
        for s in range(T):
            t = T - 1 - s if rev else s
            for i in range(nb):
                for k in range(C):
                    ax[i, k] = xq[b0 + i, t, k] + gx_shift
            gemm_rows(ax, gx_w, accx)
            gemm_rows(ah, gh_w, acch)
            if reset_before:
                for i in range(nb):
                    _int_gates_rb(i, accx, acch, ah, arh, gx_half, gh_half, gh_shift, gg_shift, H, P, CH,
                                  lut_z, lut_r, ib)
                gemm_rows(arh, gg_w, accg)
                for i in range(nb):
                    _int_candidates_rb(i, accg, ah, gg_half, gh_shift, H, P, CH, lut_g, ib)
            else:
                for i in range(nb):
                    _int_cells(i, accx, acch, ah, gx_half, gh_half, gh_shift, H, P, CH, lut_z, lut_r, lut_g, ib)
            for i in range(nb):
                for j in range(H):
                    out_q[b0 + i, t, col + j] = ib[i, last, j]
            if trace.shape[0]:
                for i in range(nb):  # element by element: a slice copy compiles error formatting
                    for r in range(last + 1):
                        for j in range(H):
                            trace[b0 + i, t, r, j] = ib[i, r, j]
            if level == 0:
                continue
            for i in range(nb):
                for k in range(C):
                    fax[i, k] = xf[b0 + i, t, k]
            gemm_rows(fax, fW, ffx)
            gemm_rows(fah, fR, ffh)
            if reset_before:
                for i in range(nb):
                    _float_gates_rb(i, ffx, ffh, fah, frh, bx, br, H, form, alpha_beta, fb)
                gemm_rows(frh, fRg, ffg)
                for i in range(nb):
                    _float_candidates_rb(i, ffx, ffg, fah, bx, br, H, form, fb)
            elif form[0] == 0:
                for i in range(nb):
                    _float_cells_form(i, ffx, ffh, fah, bx, br, H, form, alpha_beta, fb)
            else:
                for i in range(nb):
                    _float_cells(i, ffx, ffh, fah, bx, br, H, fb)
            for i in range(nb):
                for j in range(H):
                    out_f[b0 + i, t, col + j] = fb[i, last, j]
                _measure(xq[b0 + i, t], xf[b0 + i, t], ib, fb, i, level, grids, row_tensor, stats[blk],
                         step_stats[blk, t], tmp)


@register_jitable
def _wx(accx, i, c, half, P, CH):
    """Step 1's rescale (docs/numerics.md, "Integer cell"), the W x GEMM's epilogue:
    q_Wx[c] = S_W[c] S_x / S_Wx (sum - W_sum_mul_x_zp[c]) + Z_Wx, saturated."""
    return rescale(_gemm_sum(accx, i, c, half) - CH[CH_W_SUM_MUL_X_ZP, c], CH[CH_SH_W, c],
                   P[ZP_WX], P[LO_WX], P[HI_WX])


@register_jitable
def _wx_rb(accx, i, c, half, P, CH):
    """`_wx` of a reset-before cell: its P has its own order (rescale.RB_*)."""
    return rescale(_gemm_sum(accx, i, c, half) - CH[CH_W_SUM_MUL_X_ZP, c], CH[CH_SH_W, c],
                   P[RB_ZP_WX], P[RB_LO_WX], P[RB_HI_WX])


@register_jitable
def _store_rows(buf, i, j, v):
    """buf[i, r, j] = v[r] for the 17 values of one haste unit, written out so that no store
    indexes the tuple at run time (which the vectoriser cannot follow)."""
    buf[i, 0, j], buf[i, 1, j], buf[i, 2, j], buf[i, 3, j], buf[i, 4, j], buf[i, 5, j] = v[:6]
    buf[i, 6, j], buf[i, 7, j], buf[i, 8, j], buf[i, 9, j], buf[i, 10, j], buf[i, 11, j] = v[6:12]
    buf[i, 12, j], buf[i, 13, j], buf[i, 14, j], buf[i, 15, j], buf[i, 16, j] = v[12:]


@register_jitable
def _int_cell(accx, acch, ah, i, j, H, gx_half, gh_half, gh_shift, P, CH, lut_z, lut_r, lut_g):
    """Wx's rescale (the W x GEMM's epilogue) and gru_cell for unit j of block row i: the
    tuple (Wx_z, Wx_r, Wx_g, gru_cell's outputs)."""
    jr, jg = j + H, j + 2 * H
    wx_z, wx_r, wx_g = _wx(accx, i, j, gx_half, P, CH), _wx(accx, i, jr, gx_half, P, CH), \
        _wx(accx, i, jg, gx_half, P, CH)
    return (wx_z, wx_r, wx_g) + gru_cell(
        wx_z, wx_r, wx_g, _gemm_sum(acch, i, j, gh_half), _gemm_sum(acch, i, jr, gh_half),
        _gemm_sum(acch, i, jg, gh_half), np.int64(ah[i, j]) - gh_shift, j, jr, jg, P, CH, lut_z,
        lut_r, lut_g)


@register_jitable
def _int_cells(i, accx, acch, ah, gx_half, gh_half, gh_shift, H, P, CH, lut_z, lut_r, lut_g, ib):
    """The integer cell of every unit of block row i: `ah` receives the next step's GEMM input
    (h + shift), the rows of `ib` Wx and every output of gru_cell."""
    for j in range(H):
        v = _int_cell(accx, acch, ah, i, j, H, gx_half, gh_half, gh_shift, P, CH, lut_z, lut_r, lut_g)
        _store_rows(ib, i, j, v)
        ah[i, j] = v[-1] + gh_shift  # a literal index: the tuple mixes int32 and int64


@register_jitable
def _int_gates_rb(i, accx, acch, ah, arh, gx_half, gh_half, gh_shift, gg_shift, H, P, CH, lut_z, lut_r, ib):
    """The first pass of a reset-before cell over block row i: Wx, z, r and rh = r * h_old of every
    unit into the rows of `ib` (cell_layout's order), and rh + shift into `arh`, the g rows' GEMM input."""
    for j in range(H):
        jr, jg = j + H, j + 2 * H
        wx_z, wx_r, wx_g = _wx_rb(accx, i, j, gx_half, P, CH), _wx_rb(accx, i, jr, gx_half, P, CH), \
            _wx_rb(accx, i, jg, gx_half, P, CH)
        Rh_z, Rh_r, z_pre, r_pre, z, r, rh = gru_gates_reset_before(
            wx_z, wx_r, _gemm_sum(acch, i, j, gh_half), _gemm_sum(acch, i, jr, gh_half),
            np.int64(ah[i, j]) - gh_shift, j, jr, P, CH, lut_z, lut_r)
        ib[i, 0, j], ib[i, 1, j], ib[i, 2, j], ib[i, 3, j], ib[i, 4, j] = wx_z, wx_r, wx_g, Rh_z, Rh_r
        ib[i, 6, j], ib[i, 7, j], ib[i, 9, j], ib[i, 10, j], ib[i, 12, j] = z_pre, r_pre, z, r, rh
        arh[i, j] = rh + gg_shift


@register_jitable
def _int_candidates_rb(i, accg, ah, gg_half, gh_shift, H, P, CH, lut_g, ib):
    """The second pass of a reset-before cell over block row i, once `accg` holds R_g rh: g and
    h_new of every unit; `ah` receives the next step's GEMM input (h + shift)."""
    for j in range(H):
        Rh_g, g_pre, g, old, new, h = gru_candidate_reset_before(
            np.int64(ib[i, 2, j]), _gemm_sum(accg, i, j, gg_half), np.int64(ah[i, j]) - gh_shift,
            np.int64(ib[i, 9, j]), j + 2 * H, P, CH, lut_g)
        ib[i, 5, j], ib[i, 8, j], ib[i, 11, j], ib[i, 13, j], ib[i, 14, j], ib[i, 15, j] = \
            Rh_g, g_pre, g, old, new, h
        ah[i, j] = h + gh_shift


@register_jitable
def _float_gates_rb(i, ffx, ffh, fah, frh, bx, br, H, form, alpha_beta, fb):
    """The float32 first pass of a reset-before cell (as `_int_gates_rb`): r * h_old into `frh`."""
    for j in range(H):
        jr, jg = j + H, j + 2 * H
        z_pre, r_pre, z, r = float_gates(ffx[i, j], ffx[i, jr], ffh[i, j], ffh[i, jr], bx[j], bx[jr],
                                         br[j], br[jr], form[1], alpha_beta[0], alpha_beta[1])
        rh = r * fah[i, j]
        fb[i, 0, j], fb[i, 1, j], fb[i, 2, j], fb[i, 3, j], fb[i, 4, j] = \
            ffx[i, j], ffx[i, jr], ffx[i, jg], ffh[i, j], ffh[i, jr]
        fb[i, 6, j], fb[i, 7, j], fb[i, 9, j], fb[i, 10, j], fb[i, 12, j] = z_pre, r_pre, z, r, rh
        frh[i, j] = rh


@register_jitable
def _float_candidates_rb(i, ffx, ffg, fah, bx, br, H, form, fb):
    """The float32 second pass of a reset-before cell, once `ffg` holds R_g (r * h_old)."""
    for j in range(H):
        jg = j + 2 * H
        g_pre, g, old, new, h = float_candidate_reset_before(ffx[i, jg], ffg[i, j], fah[i, j], fb[i, 9, j],
                                                             bx[jg], br[jg], form[2])
        fb[i, 5, j], fb[i, 8, j], fb[i, 11, j], fb[i, 13, j], fb[i, 14, j], fb[i, 15, j] = \
            ffg[i, j], g_pre, g, old, new, h
        fah[i, j] = h


@register_jitable
def _float_cells_form(i, ffx, ffh, fah, bx, br, H, form, alpha_beta, fb):
    """`_float_cells` for a reset-after cell with other activations (hard_sigmoid gates, a relu
    or linear candidate): the same rows, each activation the form's."""
    for j in range(H):
        jr, jg = j + H, j + 2 * H
        res = float_cell_form(ffx[i, j], ffx[i, jr], ffx[i, jg], ffh[i, j], ffh[i, jr], ffh[i, jg], fah[i, j],
                              bx[j], bx[jr], bx[jg], br[j], br[jr], br[jg], form, alpha_beta)
        _store_rows(fb, i, j, (ffx[i, j], ffx[i, jr], ffx[i, jg]) + res)
        fah[i, j] = res[-1]


@register_jitable
def _float_cells(i, ffx, ffh, fah, bx, br, H, fb):
    """The float32 cell of every unit of block row i, into the rows of `fb` (as `_int_cells`)."""
    for j in range(H):
        jr, jg = j + H, j + 2 * H
        res = float_cell(ffx[i, j], ffx[i, jr], ffx[i, jg], ffh[i, j], ffh[i, jr], ffh[i, jg],
                         fah[i, j], bx[j], bx[jr], bx[jg], br[j], br[jr], br[jg])
        _store_rows(fb, i, j, (ffx[i, j], ffx[i, jr], ffx[i, jg]) + res)
        fah[i, j] = res[-1]


@register_jitable
def _measure(x_q, x_f, ib, fb, i, level, grids, row_tensor, stats, step_row, tmp):
    """Distances of block row i's tensors at one step: h always (also into the step's row),
    the others at level EVERY_TENSOR."""
    h = ib.shape[1] - 1  # h is the last row and the last measured tensor
    h_tensor = stats.shape[0] - 1
    tmp[:] = 0.0
    add_row(ib[i, h], 0, fb[i, h], grids[h_tensor], tmp)
    for c in range(N_STATS):
        if c == STAT_MAX_ABS:
            stats[h_tensor, c] = max(stats[h_tensor, c], tmp[c])
            step_row[c] = max(step_row[c], tmp[c])
        else:
            stats[h_tensor, c] += tmp[c]
            step_row[c] += tmp[c]
    if level < EVERY_TENSOR:
        return
    add_row(x_q, 0, x_f, grids[X_TENSOR], stats[X_TENSOR])
    for r in range(h):
        tr = row_tensor[r]
        add_row(ib[i, r], 0, fb[i, r], grids[tr], stats[tr])


def needs_compile() -> bool:
    """Whether the engine's kernel is neither loaded nor in numba's on-disk cache for this CPU:
    the first run compiles it (numba caches it next to this file, or in the user's cache
    directory where that is not writable; `pip install .` fills the cache, qtool/install/precompile.py)."""
    if _run_direction.signatures:
        return False
    try:  # the index is empty when numba, the source or the cache's CPU differ from this one
        index = _run_direction._cache._cache_file._load_index()
        magic = _run_direction.targetctx.codegen().magic_tuple()
        return not any(key[1] == magic for key in index)
    except Exception:  # numba's cache internals moved: say nothing rather than guess
        return False


def threads() -> int:
    return max(1, min(config.NUMBA_NUM_THREADS, len(os.sched_getaffinity(0))))


def slices(N: int, parts: int) -> list[tuple[int, int]]:
    """Contiguous slices of N sequences in whole blocks of MB, as even as possible."""
    blocks = -(-N // MB)
    parts = max(1, min(parts, blocks))
    edges = [min(N, MB * (blocks * p // parts)) for p in range(parts + 1)]
    return [(a, b) for a, b in zip(edges, edges[1:]) if b > a]


def run_direction(dp: DirectionPlan, xq, xf, n0: int, n1: int, rev: bool, out_q, out_f, col: int,
                  level: int, stats, step_stats, trace) -> None:
    """One kernel call (see _run_direction) with fresh per-thread buffers."""
    cq, gx, gh, gg = dp.cq, dp.gx, dp.gh, dp.gg
    H, C = cq.hidden_size, xq.shape[2]

    def z(cols, dtype):
        return np.zeros((MB, cols), dtype)

    _run_direction(xq, xf, n0, n1, rev, out_q, out_f, col,
                   gx.w, gx.shift, gx.half, z(gx.Kp, KINDS[gx.kind][0]), z(gx.width, KINDS[gx.kind][2]),
                   gh.w, gh.shift, gh.half, z(gh.Kp, KINDS[gh.kind][0]), z(gh.width, KINDS[gh.kind][2]),
                   gg.w, gg.shift, gg.half, z(gg.Kp, KINDS[gg.kind][0]), z(gg.width, KINDS[gg.kind][2]),
                   dp.P, dp.CH, *dp.luts,
                   level, dp.fx.w, dp.fh.w, dp.fg.w, z(C, np.float32), z(H, np.float32), z(dp.fx.width, np.float32),
                   z(dp.fh.width, np.float32), z(H, np.float32), z(dp.fg.width, np.float32), dp.bx, dp.br,
                   dp.form, dp.alpha_beta, np.zeros((MB, dp.rows, H), np.int32),
                   np.zeros((MB, dp.rows, H), np.float32), dp.grids, dp.row_tensor, stats, step_stats, trace,
                   np.zeros(len(STATS)))


def _stats_rows(rows: int, N: int = 1) -> np.ndarray:
    """Statistics rows for each block of MB of N sequences: `[blocks, rows, STATS]`."""
    return np.zeros((-(-N // MB), rows, len(STATS)))


def fold_blocks(parts: np.ndarray) -> np.ndarray:
    """Every block's statistics `[blocks, rows, STATS]` summed in block order: a chunk's
    statistics do not depend on how many threads computed its blocks (so that a process, and
    ranks of one thread each, give the same bits; qtool.parallel)."""
    out = parts.sum(axis=0)
    out[:, STAT_MAX_ABS] = parts[:, :, STAT_MAX_ABS].max(axis=0, initial=0.0)
    return out


def run_model(qm: QuantModel, x: np.ndarray | None, level: int = INTS, plans=None,
              traces: list | None = None, xq: np.ndarray | None = None) -> ModelRun:
    """The whole model on batch-first float `x [N, T, C]`: every layer and direction, each
    thread on its own slice of sequences. `traces` (tests) receives per layer and direction
    the integers of every step, `[N, T, rows, H]` (Wx's three gate rows, then the cell's outputs:
    qtool.engine.layout.cell_layout).
    `xq`: the input's integers on x's grid instead (`x` None; integers only)."""
    plans = plans or plan_model(qm)
    if xq is None:
        x = np.ascontiguousarray(x, np.float32)
        xq = np.ascontiguousarray(quantize_input(qm, x))
    else:
        assert level == INTS, "a run from integers has no float reference"
        xq = np.ascontiguousarray(xq, np.int32)
        x = np.zeros((0, 0, 0), np.float32)
    N, T, _ = xq.shape
    layers = []  # per layer: (out_q, out_f, [trace per direction])
    for row in plans:
        H = row[0].cq.hidden_size
        D = len(row)
        out_q = np.empty((N, T, H * D), np.int32)
        out_f = np.empty((N, T, H * D) if level else (0, 0, 0), np.float32)
        tr = [np.zeros((N, T, dp.rows, H) if traces is not None else (0, 0, dp.rows, H), np.int32)
              for dp in row]
        layers.append((out_q, out_f, tr))
    parts = slices(N, threads())
    stats = [[_stats_rows(len(dp.grids), N) for dp in row] for row in plans]
    step, scratch = _stats_rows(T, N), _stats_rows(T, N)  # the last layer's h per step; the others'

    def work(n0, n1):
        inq, inf = xq, x if level else np.zeros((0, 0, 0), np.float32)
        for l, row in enumerate(plans):
            out_q, out_f, tr = layers[l]
            last = l == len(plans) - 1
            for d, dp in enumerate(row):
                run_direction(dp, inq, inf, n0, n1, d == 1, out_q, out_f, d * dp.cq.hidden_size, level,
                              stats[l][d], step if last else scratch, tr[d])
            inq, inf = out_q, out_f

    if len(parts) == 1:
        work(*parts[0])
    else:
        with ThreadPoolExecutor(len(parts)) as pool:
            list(pool.map(lambda p: work(*p), parts))
    if traces is not None:
        traces.extend([tr for _, _, tr in layers])
    out_q, out_f, _ = layers[-1]
    return ModelRun(out_q, out_f if level else None,
                    [[fold_blocks(st) for st in row] for row in stats] if level else None,
                    fold_blocks(step) if level else None, [q for q, _, _ in layers])


def legacy_trace(tr: np.ndarray) -> dict:
    """A trace `[N, T, rows, H]` as time-first Wx `[T, N, 3H]` and cell outputs `[T, N, rows - 3, H]`."""
    t = tr.transpose(1, 0, 2, 3)
    return {"Wx": np.concatenate([t[:, :, g] for g in range(3)], axis=2), "cell": t[:, :, 3:]}


def run_int(qm: QuantModel, x: np.ndarray, traces: list | None = None,
            finals: list | None = None, runner=None) -> np.ndarray:
    """Integer GRU on batch-first float `x [N, T, C]`; returns the last layer's integer output
    `[N, T, H * directions]`. `traces[l][d]` receives each direction's integers of every step
    in the order the direction runs (`legacy_trace`, plus its input `x` time-first); `finals`
    each layer's and direction's final state `[N, H]`, in order. `runner`: another engine's `run_model` (CUDA)."""
    raw: list | None = [] if traces is not None else None
    run = (runner or run_model)(qm, x, INTS, traces=raw)
    if finals is not None:
        for out, cells in zip(run.outputs, qm.cells):
            H = cells[0].hidden_size
            for d in range(len(cells)):
                finals.append(np.ascontiguousarray(out[:, -1 if d == 0 else 0, d * H:(d + 1) * H]))
    if traces is not None:
        traces.extend(time_first_traces(qm, x, run, raw))
    return run.y_int


def time_first_traces(qm: QuantModel, x: np.ndarray, run: ModelRun, raw: list) -> list:
    """The traces `raw` that `run_model(qm, x, traces=raw)` filled, per layer and direction
    in the order the direction runs (`legacy_trace`, plus its integer input `x`, time-first)."""
    out = []
    for l, row in enumerate(raw):
        inp = quantize_input(qm, x) if l == 0 else run.outputs[l - 1]
        out.append([{**legacy_trace(tr[:, ::-1] if d else tr), "x": np.ascontiguousarray(
            (inp if d == 0 else inp[:, ::-1]).transpose(1, 0, 2))} for d, tr in enumerate(row)])
    return out


def run_cell(cq: CellQuant, qx: np.ndarray) -> np.ndarray:
    """One layer direction on time-first integers `qx [T, N, C]`; returns `q_h [T, N, H]`."""
    T, N, C = qx.shape
    H = cq.hidden_size
    dp = plan_direction(cq, GruCell(np.zeros((3 * H, C)), np.zeros((3 * H, H)), np.zeros(3 * H),
                                    np.zeros(3 * H), cq.form))
    xq = np.ascontiguousarray(np.asarray(qx, np.int32).transpose(1, 0, 2))
    out = np.empty((N, T, H), np.int32)
    run_direction(dp, xq, np.zeros((0, 0, 0), np.float32), 0, N, False, out,
                  np.zeros((0, 0, 0), np.float32), 0, INTS, _stats_rows(len(dp.grids), N),
                  _stats_rows(T, N), np.zeros((0, 0, dp.rows, H), np.int32))
    return out.transpose(1, 0, 2)
