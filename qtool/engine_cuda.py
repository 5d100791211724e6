"""The integer GRU on the GPU: numba.cuda kernels built from the same scalar functions as the CPU
engine (qtool.intops, compiled as device functions), so the two cannot drift apart.

- `_wx_kernel`: Wx for all time steps at once, with zero-point compensation and the rescale fused
  into the epilogue (one thread per output element);
- `_step_kernel`: one launch per time step; a block holds one sequence's h in shared memory, each
  thread computes its hidden unit's three R h sums and the pointwise cell.

GEMM sums use the exact arithmetic type chosen by `engine_cpu.gemm_dtype` (float32 where a static
bound proves it exact). Device buffers are allocated once per direction and batch; the host
copies happen once per batch and layer, never per time step.
"""

from __future__ import annotations

import math

import numpy as np
from numba import cuda

from qtool.engine_cpu import N_TRACE, gemm_dtype
from qtool.errors import QtoolError
from qtool.intops import gru_cell, rescale
from qtool.qmodel import CellQuant
from qtool.rescale import CH_SH_W, CH_W_SUM_MUL_X_ZP, HI_WX, LO_WX, ZP_H, ZP_WX

MAX_SHARED_H = 2048  # hidden units one block keeps in shared memory
THREADS = 128


def cuda_usable() -> tuple[bool, str]:
    """(usable, why) for a real GPU; the numba CUDA simulator counts as not usable for `auto`."""
    from numba import config

    if config.ENABLE_CUDASIM:
        return False, "the numba CUDA simulator is enabled (NUMBA_ENABLE_CUDASIM=1)"
    try:
        if not cuda.is_available():
            return False, "no CUDA driver or GPU found"
        cuda.detect()
    except Exception as e:  # the driver raises several types
        return False, f"CUDA is not usable ({str(e).splitlines()[0]})"
    name = cuda.get_current_device().name
    return True, name.decode() if isinstance(name, bytes) else str(name)


@cuda.jit
def wx_kernel(qx, qW, P, CH, out):
    """q_Wx[m, c] = rescale(sum_k qW[c, k] qx[m, k] - W_sum_mul_x_zp[c]): the fused epilogue."""
    m, c = cuda.grid(2)
    M, K = qx.shape
    if m < M and c < qW.shape[0]:
        s = qW[c, 0] * 0
        for k in range(K):
            s += qW[c, k] * qx[m, k]
        out[m, c] = rescale(np.int64(s) - CH[CH_W_SUM_MUL_X_ZP, c], CH[CH_SH_W, c], P[ZP_WX],
                            P[LO_WX], P[HI_WX])


@cuda.jit
def step_kernel(t, q_Wx, qR, P, CH, lut_z, lut_r, lut_g, out, h_f, trace, do_trace):
    """Time step t: block (unit tile, sequence n); h_old of sequence n in shared memory."""
    n = cuda.blockIdx.y
    j = cuda.blockIdx.x * cuda.blockDim.x + cuda.threadIdx.x
    H = out.shape[2]
    h_s = cuda.shared.array(MAX_SHARED_H, np.float64)
    for k in range(cuda.threadIdx.x, H, cuda.blockDim.x):
        h_s[k] = h_f[t % 2, n, k]
    cuda.syncthreads()
    if j < H:
        jr = j + H
        jg = j + 2 * H
        s_z = qR[j, 0] * 0
        s_r = s_z
        s_g = s_z
        for k in range(H):
            v = h_s[k]
            s_z += qR[j, k] * v
            s_r += qR[jr, k] * v
            s_g += qR[jg, k] * v
        res = gru_cell(np.int64(q_Wx[t, n, j]), np.int64(q_Wx[t, n, jr]),
                       np.int64(q_Wx[t, n, jg]), np.int64(s_z), np.int64(s_r), np.int64(s_g),
                       np.int64(out[t, n, j]), j, jr, jg, P, CH, lut_z, lut_r, lut_g)
        out[t + 1, n, j] = res[13]
        h_f[(t + 1) % 2, n, j] = res[13]
        if do_trace:
            for k in range(N_TRACE):
                trace[t, n, k, j] = res[k]


def run_cell_cuda(cq: CellQuant, qx: np.ndarray, trace: dict | None = None) -> np.ndarray:
    """Same contract as engine_cpu.run_cell: time-first `qx [T, N, C]` -> `q_h [T, N, H]`."""
    T, N, C = qx.shape
    H = cq.hidden_size
    if H > MAX_SHARED_H:
        raise QtoolError(f"the CUDA engine supports hidden sizes up to {MAX_SHARED_H}, got {H}")
    dt_W = gemm_dtype(cq.qW, cq.spec["x"].bits)
    dt_R = gemm_dtype(cq.qR, cq.spec["h"].bits)
    if dt_R is np.int64 or dt_W is np.int64:
        raise QtoolError("a GEMM of this model can exceed 2^53; the CUDA engine cannot prove it exact "
                         "(use --backend cpu)")
    # exact GEMM operands; the shared h buffer is float64, exact for every 16-bit integer
    d_qx = cuda.to_device(qx.reshape(T * N, C).astype(dt_W))
    d_qW = cuda.to_device(cq.qW.astype(dt_W))
    d_qR = cuda.to_device(cq.qR.astype(dt_R))
    d_P, d_CH = cuda.to_device(cq.P), cuda.to_device(cq.CH)
    d_luts = [cuda.to_device(cq.luts[n]) for n in ("lut_z", "lut_r", "lut_g")]
    d_Wx = cuda.device_array((T * N, 3 * H), np.int32)
    grid = (math.ceil(T * N / 16), math.ceil(3 * H / 16))
    wx_kernel[grid, (16, 16)](d_qx, d_qW, d_P, d_CH, d_Wx)
    out = np.empty((T + 1, N, H), np.int32)
    out[0] = cq.P[ZP_H]  # h0 = 0 exactly
    d_out = cuda.to_device(out)
    h_f = np.zeros((2, N, H), np.float64)
    h_f[0] = cq.P[ZP_H]
    d_hf = cuda.to_device(h_f)
    shape = (T, N, N_TRACE, H) if trace is not None else (1, 1, N_TRACE, 1)
    d_trace = cuda.device_array(shape, np.int32)
    d_Wx3 = d_Wx.reshape(T, N, 3 * H)
    threads = min(THREADS, 32 * math.ceil(H / 32))
    blocks = (math.ceil(H / threads), N)
    for t in range(T):  # launches queue on the stream; nothing is copied per step
        step_kernel[blocks, threads](t, d_Wx3, d_qR, d_P, d_CH, *d_luts, d_out, d_hf, d_trace,
                                   trace is not None)
    result = d_out.copy_to_host()
    if trace is not None:
        trace["Wx"], trace["cell"] = d_Wx3.copy_to_host(), d_trace.copy_to_host()
    return result[1:]


def select_backend(backend: str):
    """(runner, backend, why) for --backend auto|cpu|cuda: the engine to run, its name ("cpu" or
    "cuda") and why it was chosen (the GPU's name, or why there is none)."""
    from qtool.engine_cpu import run_cell

    if backend == "cpu":
        return run_cell, "cpu", "asked for"
    if backend not in ("auto", "cuda"):
        raise QtoolError(f"unknown backend '{backend}' (use auto, cpu or cuda)")
    from numba import config

    usable, why = cuda_usable()
    if backend == "cuda":
        if usable or config.ENABLE_CUDASIM:  # the simulator runs the real kernels, slowly
            return run_cell_cuda, "cuda", why if usable else "numba CUDA simulator"
        raise QtoolError(f"--backend cuda: no usable GPU: {why}")
    return (run_cell_cuda, "cuda", why) if usable else (run_cell, "cpu", why)
