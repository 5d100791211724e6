"""The integer GRU on the CPU: numba kernels around the scalar functions of qtool.intops.

Integer GEMMs: every product and sum is an integer. When the static bound of a GEMM's result
(sum_k |q_W[c, k]| * max |q_x|) is below 2^31: int8 weights and 8-bit inputs go to the VNNI dot
product where the CPU has one (qtool.simd), other operands that fit int16 to int32 sums of int16
products (the CPU's int16 multiply-add); else below 2^24 (2^53) float32 (float64), else int64.
The choice never changes a result. BLAS is not used: its spinning threads fight numba's on
small machines.
"""

from __future__ import annotations

import numpy as np
from numba import njit, prange, types
from numba.extending import overload, register_jitable

from qtool.intops import gru_cell, rescale
from qtool.qmodel import CellQuant, QuantModel
from qtool.qparams import quantize
from qtool.rescale import CH_R_SUM_MUL_H_ZP, CH_SH_W, CH_W_SUM_MUL_X_ZP, HI_WX, LO_WX, ZP_H, ZP_WX, sum_mul_zp
from qtool.simd import BLOCK, HAS_VNNI, dot_u8s8

N_TRACE = 14  # gru_cell's outputs: Rh_z, Rh_r, Rh_g, z_pre, r_pre, g_pre, z, r, g, ..., h


def gemm_bound(q_w: np.ndarray, bits_in: int) -> int:
    """Largest |sum_k q_w[c, k] * q_in[k]| for any input on `bits_in` signed bits."""
    return int(np.abs(q_w).sum(axis=1).max(initial=0)) * (1 << (bits_in - 1))


def gemm_dtype(q_w: np.ndarray, bits_in: int):
    """The narrowest arithmetic type in which this GEMM is exact for every input."""
    bound = gemm_bound(q_w, bits_in)
    if bound < 2**24:
        return np.float32
    if bound < 2**53:
        return np.float64
    return np.int64


U8_SHIFT = 128  # 8-bit inputs seen as uint8 q + 128 (zero point zp + 128) by the VNNI path


def gemm_types(q_w: np.ndarray, bits_in: int, vnni: bool | None = None) -> tuple[type, type, type]:
    """(input dtype, weight dtype, sum dtype) of the CPU GEMMs: uint8 inputs (q + 128) and int8
    weights on VNNI (default: where the CPU has it), int16 inputs and int8/int16 weights with
    int32 sums, or `gemm_dtype`."""
    vnni = HAS_VNNI if vnni is None else vnni
    lo, hi = int(q_w.min(initial=0)), int(q_w.max(initial=0))
    w_int8 = -2**7 <= lo and hi < 2**7
    bound_1 = gemm_bound(q_w, 1)  # max_c sum_k |q_w[c, k]|
    if vnni and bits_in <= 8 and w_int8 and bound_1 * 255 < 2**31:  # uint8 inputs up to 255
        return np.uint8, np.int8, np.int32
    if bits_in <= 16 and -2**15 <= lo and hi < 2**15 and bound_1 << (bits_in - 1) < 2**31:
        return np.int16, np.int8 if w_int8 else np.int16, np.int32
    dt = gemm_dtype(q_w, bits_in)
    return dt, dt, dt


def gemm_operands(q_w: np.ndarray, bits_in: int, zp_in: int, vnni: bool | None = None):
    """The GEMM's weights (rows zero-padded to BLOCK for VNNI), input dtype, sum dtype, the
    offset added to the inputs, and the zero-point compensation of that input view."""
    in_t, w_t, sum_t = gemm_types(q_w, bits_in, vnni)
    shift = U8_SHIFT if in_t is np.uint8 else 0
    K = q_w.shape[1]
    w = np.zeros((q_w.shape[0], -(-K // BLOCK) * BLOCK if shift else K), w_t)
    w[:, :K] = q_w
    return w, in_t, sum_t, shift, sum_mul_zp(q_w, zp_in + shift)


def gemm_input(q: np.ndarray, dtype, width: int, shift: int) -> np.ndarray:
    """Rows of q [M, K] as the GEMM reads them: offset, in `dtype`, zero-padded to `width`."""
    out = np.zeros((q.shape[0], width), dtype)
    out[:, :q.shape[1]] = q + shift
    return out


def row_dot(w, c, a, m, zero):
    """sum_k w[c, k] * a[m, k], summed in zero's type. In numba kernels the overload below
    replaces this reference version."""
    return type(zero)(np.dot(w[c].astype(np.int64), a[m].astype(np.int64)))


@overload(row_dot, inline="always")
def _row_dot(w, c, a, m, zero):
    if a.dtype == types.uint8:
        return lambda w, c, a, m, zero: dot_u8s8(a, m, w, c)

    def impl(w, c, a, m, zero):
        s = zero
        for k in range(w.shape[1]):
            s += w[c, k] * a[m, k]
        return s

    return impl


@njit(parallel=True, cache=True, fastmath=True)
def _int_gemm(a, w, out):
    """out[m, c] = sum_k w[c, k] a[m, k], summed in out's dtype.

    fastmath only lets the compiler reorder sums, which are exact integers here.
    """
    for m in prange(a.shape[0]):
        for c in range(w.shape[0]):
            out[m, c] = row_dot(w, c, a, m, out.dtype.type(0))


def int_gemm(a: np.ndarray, w: np.ndarray, sum_dtype=None) -> np.ndarray:
    """a [M, K] @ w [N, K].T, summed in `sum_dtype` (default a's; exact when chosen by
    `gemm_types` or `gemm_dtype`)."""
    out = np.empty((a.shape[0], w.shape[0]), sum_dtype or a.dtype)
    _int_gemm(a, w, out)
    return out


@njit(parallel=True, cache=True, fastmath=True)
def _wx(a, w, zero, P, CH, out):
    """Seed Step 1 with a fused epilogue: q_Wx[m, c] = S_W[c] S_x / S_Wx (sum_k w[c, k] a[m, k]
    - W_sum_mul_x_zp[c]) + Z_Wx, saturated; the sums in zero's type (exact: see gemm_types)."""
    for m in prange(a.shape[0]):
        for c in range(w.shape[0]):
            acc = row_dot(w, c, a, m, zero)
            out[m, c] = rescale(np.int64(acc) - CH[CH_W_SUM_MUL_X_ZP, c], CH[CH_SH_W, c],
                                P[ZP_WX], P[LO_WX], P[HI_WX])


@register_jitable(inline="always")
def _cell_at(q_Wx, acc, out, t, n, j, H, P, CH, lut_z, lut_r, lut_g):
    """gru_cell for unit j of sequence n at step t."""
    return gru_cell(np.int64(q_Wx[t, n, j]), np.int64(q_Wx[t, n, j + H]),
                    np.int64(q_Wx[t, n, j + 2 * H]), np.int64(acc[n, j]),
                    np.int64(acc[n, j + H]), np.int64(acc[n, j + 2 * H]),
                    np.int64(out[t, n, j]), j, j + H, j + 2 * H, P, CH, lut_z, lut_r, lut_g)


@njit(parallel=True, cache=True, fastmath=True)
def _run_steps(q_Wx, qR, P, CH, lut_z, lut_r, lut_g, out, h_buf, h_shift, acc, trace, do_trace):
    """The time loop (seed Step 3): per step and sequence, Rh = R @ (h + h_shift) summed in
    acc's dtype (exact: see gemm_types), then the pointwise cell for every hidden unit.

    fastmath only lets the compiler reorder the float GEMM's sums, which are exact integers.
    Without a trace the cell loop keeps only h, and the compiler vectorises it.
    """
    T, N, H3 = q_Wx.shape
    H = H3 // 3
    for t in range(T):
        for n in prange(N):
            for c in range(H3):
                acc[n, c] = row_dot(qR, c, h_buf, n, acc.dtype.type(0))
            if do_trace:
                for j in range(H):
                    res = _cell_at(q_Wx, acc, out, t, n, j, H, P, CH, lut_z, lut_r, lut_g)
                    out[t + 1, n, j] = res[13]
                    for k in range(N_TRACE):
                        trace[t, n, k, j] = res[k]
            else:
                for j in range(H):
                    out[t + 1, n, j] = _cell_at(q_Wx, acc, out, t, n, j, H, P, CH, lut_z, lut_r,
                                                lut_g)[13]
            for j in range(H):  # the next step's GEMM operand
                h_buf[n, j] = out[t + 1, n, j] + h_shift


def run_cell(cq: CellQuant, qx: np.ndarray, trace: dict | None = None) -> np.ndarray:
    """Run one direction over time-first integers `qx [T, N, C]`; returns `q_h [T, N, H]`.

    With `trace`, stores the integer Wx `[T, N, 3H]` and the cell outputs `[T, N, 14, H]`.
    """
    T, N, C = qx.shape
    H = cq.hidden_size
    x, h = cq.spec["x"], cq.spec["h"]
    W, in_t, sum_t, x_shift, comp_W = gemm_operands(cq.qW, x.bits, x.zp)
    R, h_t, h_sum_t, h_shift, comp_R = gemm_operands(cq.qR, h.bits, h.zp)
    CH = cq.CH.copy()  # the compensation for the inputs as the GEMMs see them
    CH[CH_W_SUM_MUL_X_ZP], CH[CH_R_SUM_MUL_H_ZP] = comp_W, comp_R
    q_Wx = np.empty((T * N, 3 * H), np.int32)
    _wx(gemm_input(qx.reshape(T * N, C), in_t, W.shape[1], x_shift), W, sum_t(0), cq.P, CH, q_Wx)
    out = np.empty((T + 1, N, H), np.int32)
    out[0] = cq.P[ZP_H]  # h0 = 0 exactly
    shape = (T, N, N_TRACE, H) if trace is not None else (1, 1, N_TRACE, 1)
    cell_trace = np.empty(shape, np.int32)
    _run_steps(q_Wx.reshape(T, N, 3 * H), R, cq.P, CH, cq.luts["lut_z"], cq.luts["lut_r"],
               cq.luts["lut_g"], out, gemm_input(out[0], h_t, R.shape[1], h_shift), h_shift,
               np.empty((N, 3 * H), h_sum_t), cell_trace, trace is not None)
    if trace is not None:
        trace["Wx"], trace["cell"] = q_Wx.reshape(T, N, 3 * H), cell_trace
    return out[1:]


def quantize_input(qm: QuantModel, x: np.ndarray) -> np.ndarray:
    s = qm.cells[0][0].spec["x"]
    return quantize(x, s.exp2_inv, s.zp, s.bits).astype(np.int32)


def run_int(qm: QuantModel, x: np.ndarray, traces: list | None = None,
            finals: list | None = None, runner=run_cell) -> np.ndarray:
    """Integer GRU on batch-first float `x [N, T, C]`; returns the last layer's integer output
    `[N, T, H * directions]`. `traces[l][d]` receives each direction's integer trace;
    `finals` receives each layer's and direction's final state `[N, H]`, in order."""
    seq = np.ascontiguousarray(quantize_input(qm, x).transpose(1, 0, 2))  # [T, N, C]
    for cells in qm.cells:
        outs, row = [], []
        for d, cq in enumerate(cells):
            tr = {} if traces is not None else None
            inp = seq if d == 0 else np.ascontiguousarray(seq[::-1])
            qh = runner(cq, inp, tr)
            if finals is not None:
                finals.append(qh[-1])
            outs.append(qh if d == 0 else qh[::-1])
            if tr is not None:
                tr["x"] = inp
                row.append(tr)
        if traces is not None:
            traces.append(row)
        seq = np.concatenate(outs, axis=2) if len(outs) > 1 else outs[0]
    return np.ascontiguousarray(seq.transpose(1, 0, 2))


