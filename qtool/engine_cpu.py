"""The integer GRU on the CPU: numba kernels around the scalar functions of qtool.intops.

Integer GEMMs: every product and sum is an integer. When the static bound of a GEMM's result
(sum_k |q_W[c, k]| * max |q_x|) is below 2^24 (2^53), float32 (float64) BLAS computes it
exactly and fast; otherwise a numba int64 loop does. The choice never changes a result.
"""

from __future__ import annotations

import numpy as np
from numba import njit, prange

from qtool.intops import gru_cell, rescale
from qtool.qmodel import CellQuant, QuantModel
from qtool.qparams import quantize
from qtool.rescale import CH_SH_W, CH_W_SUM_MUL_X_ZP, HI_WX, LO_WX, ZP_H, ZP_WX

N_TRACE = 14  # gru_cell's outputs: Rh_z, Rh_r, Rh_g, z_pre, r_pre, g_pre, z, r, g, ..., h


def gemm_bound(q_w: np.ndarray, bits_in: int) -> int:
    """Largest |sum_k q_w[c, k] * q_in[k]| for any input on `bits_in` signed bits."""
    return int(np.abs(q_w).sum(axis=1).max(initial=0)) * (1 << (bits_in - 1))


def gemm_dtype(q_w: np.ndarray, bits_in: int):
    bound = gemm_bound(q_w, bits_in)
    if bound < 2**24:
        return np.float32
    if bound < 2**53:
        return np.float64
    return np.int64


@njit(parallel=True, cache=True)
def _int_gemm(a, wT):
    """Exact int64 GEMM a [M, K] @ wT [K, N], for bounds no float type holds."""
    M, K = a.shape
    N = wT.shape[1]
    out = np.zeros((M, N), np.int64)
    for m in prange(M):
        for k in range(K):
            v = np.int64(a[m, k])
            if v != 0:
                for n in range(N):
                    out[m, n] += v * wT[k, n]
    return out


class IntGemm:
    """q_in [M, K] @ q_w.T, exact, with the weights prepared once."""

    def __init__(self, q_w: np.ndarray, bits_in: int):
        self.dtype = gemm_dtype(q_w, bits_in)
        self.wT = np.ascontiguousarray(q_w.T.astype(self.dtype))

    def __call__(self, q_in: np.ndarray) -> np.ndarray:
        if self.dtype is np.int64:
            return _int_gemm(np.ascontiguousarray(q_in, np.int64), self.wT)
        return q_in.astype(self.dtype) @ self.wT


@njit(parallel=True, cache=True)
def _rescale_wx(acc, P, CH, out):
    """q_Wx[c] = S_W[c] S_x / S_Wx (acc[c] - W_sum_mul_x_zp[c]) + Z_Wx, saturated."""
    M, C3 = acc.shape
    for m in prange(M):
        for c in range(C3):
            out[m, c] = rescale(np.int64(acc[m, c]) - CH[CH_W_SUM_MUL_X_ZP, c], CH[CH_SH_W, c],
                                P[ZP_WX], P[LO_WX], P[HI_WX])


@njit(parallel=True, cache=True)
def _step(q_Wx_t, acc_Rh, h_old, h_new, P, CH, lut_z, lut_r, lut_g, trace_t, do_trace):
    """One time step for every sequence n and hidden unit j."""
    N, H = h_old.shape
    for n in prange(N):
        for j in range(H):
            res = gru_cell(np.int64(q_Wx_t[n, j]), np.int64(q_Wx_t[n, j + H]),
                           np.int64(q_Wx_t[n, j + 2 * H]), np.int64(acc_Rh[n, j]),
                           np.int64(acc_Rh[n, j + H]), np.int64(acc_Rh[n, j + 2 * H]),
                           np.int64(h_old[n, j]), j, j + H, j + 2 * H, P, CH, lut_z, lut_r, lut_g)
            h_new[n, j] = res[13]
            if do_trace:
                for k in range(N_TRACE):
                    trace_t[n, k, j] = res[k]


def run_cell(cq: CellQuant, qx: np.ndarray, trace: dict | None = None) -> np.ndarray:
    """Run one direction over time-first integers `qx [T, N, C]`; returns `q_h [T, N, H]`.

    With `trace`, stores the integer Wx `[T, N, 3H]` and the cell outputs `[T, N, 14, H]`.
    """
    T, N, C = qx.shape
    H = cq.hidden_size
    bits_x, bits_h = cq.spec["x"].bits, cq.spec["h"].bits
    acc_Wx = IntGemm(cq.qW, bits_x)(qx.reshape(T * N, C))  # Step 1: Wx for all time steps
    q_Wx = np.empty((T * N, 3 * H), np.int32)
    _rescale_wx(acc_Wx, cq.P, cq.CH, q_Wx)
    q_Wx = q_Wx.reshape(T, N, 3 * H)
    gemm_R = IntGemm(cq.qR, bits_h)
    luts = cq.luts["lut_z"], cq.luts["lut_r"], cq.luts["lut_g"]
    out = np.empty((T + 1, N, H), np.int32)
    out[0] = cq.P[ZP_H]  # h0 = 0 exactly
    cell_trace = np.empty((T, N, N_TRACE, H) if trace is not None else (1, 1, N_TRACE, 1), np.int32)
    for t in range(T):  # Step 3: Rh per step, then the pointwise kernel
        acc_Rh = gemm_R(out[t])
        _step(q_Wx[t], acc_Rh, out[t], out[t + 1], cq.P, cq.CH, *luts,
              cell_trace[t if trace is not None else 0], trace is not None)
    if trace is not None:
        trace["Wx"], trace["cell"] = q_Wx, cell_trace
    return out[1:]


def quantize_input(qm: QuantModel, x: np.ndarray) -> np.ndarray:
    s = qm.cells[0][0].spec["x"]
    return quantize(x, s.exp2_inv, s.zp, s.bits).astype(np.int32)


def run_int(qm: QuantModel, x: np.ndarray, traces: list | None = None,
            runner=run_cell) -> np.ndarray:
    """Integer GRU on batch-first float `x [N, T, C]`; returns the last layer's integer output
    `[N, T, H * directions]`. `traces[l][d]` receives each direction's integer trace."""
    seq = np.ascontiguousarray(quantize_input(qm, x).transpose(1, 0, 2))  # [T, N, C]
    for cells in qm.cells:
        outs, row = [], []
        for d, cq in enumerate(cells):
            tr = {} if traces is not None else None
            inp = seq if d == 0 else np.ascontiguousarray(seq[::-1])
            qh = runner(cq, inp, tr)
            outs.append(qh if d == 0 else qh[::-1])
            if tr is not None:
                tr["x"] = inp
                row.append(tr)
        if traces is not None:
            traces.append(row)
        seq = np.concatenate(outs, axis=2) if len(outs) > 1 else outs[0]
    return np.ascontiguousarray(seq.transpose(1, 0, 2))


def output_spec(qm: QuantModel):
    return qm.cells[-1][0].spec["h"]

