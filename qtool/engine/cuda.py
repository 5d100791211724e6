"""The integer GRU on the GPU, with the float reference and the distance statistics: numba.cuda
kernels built from the same scalar functions as the CPU engine (qtool.numerics.intops for the integers,
qtool.engine.float_cell for the float32 reference, qtool.engine.metrics for the statistics; compiled as
device functions), so the two engines cannot drift apart.

- `wx_kernel`: Wx for all time steps at once as one tiled GEMM (both operands staged in shared
  memory), with zero-point compensation and the rescale fused into the epilogue; `fwx_kernel`
  the float W x;
- `step_kernel_*`: one launch per time step of a reset-after cell (haste's, or with other
  activations: its float reference is the form's). A block computes a tile of units for a tile
  of up to TILE_N sequences (fewer where the batch is too small to keep the GPU busy): their
  h_old (integer and float) is staged in shared memory K_CHUNK units at a time and R is read
  transposed, so each coalesced load of R serves every sequence of the tile (the GEMM's reuse:
  without it every sequence would read all of R at every step). Each thread then runs its
  unit's cell for each sequence and adds every tensor's distance terms to its own slot of a
  statistics array (no atomics); the output's per-step terms are summed in the block and added
  to the step's row atomically;
- `gates_kernel_rb_*` and `candidates_kernel_rb_*`: a reset-before cell's step, whose g rows of R
  multiply rh = r * h_old of every unit, as two launches tiled likewise: every unit's gates and
  rh, then every unit's R_g rh and candidate;
- `reduce_kernel`: the per-thread slots summed on the device; a few numbers per layer direction
  and chunk come back to the host.

Every cell form (qtool.core.model.CellForm) runs, with the CPU engine's per-form buffer rows and
measured tensors (qtool.engine.layout.cell_layout). The R GEMMs' sums use the exact arithmetic
type chosen by `layout.gemm_dtype` (float32 where a static bound proves it exact: the `_f32`
kernels; else float64: `_f64`), and every sum runs over k in order, so the float reference's
rounding does not depend on the tiles. Device buffers are allocated once per direction and batch;
nothing is copied per time step.
"""

from __future__ import annotations

import math

import numpy as np
from numba import config, cuda

from qtool.core.model import CellForm
from qtool.engine.float_cell import (
    float_candidate_reset_before,
    float_cell,
    float_cell_form,
    float_gates,
    form_codes,
)
from qtool.engine.layout import (
    H_TENSOR,
    INTS,
    MEASURED,
    N_STATS,
    N_TRACE,
    ROW_TENSOR,
    ROWS,
    WX_TENSOR,
    X_TENSOR,
    ModelRun,
    cell_layout,
    gemm_dtype,
    measured_grids,
    quantize_input,
)
from qtool.engine.metrics import (
    GRID_HI_CLIP,
    GRID_LO_CLIP,
    GRID_SCALE,
    GRID_ZP,
    STAT_COUNT,
    STAT_DOT,
    STAT_ERR2,
    STAT_MAX_ABS,
    STAT_Q2,
    STAT_REF2,
    STAT_SATURATED,
    clipped,
    dequantized,
)
from qtool.errors import QtoolError
from qtool.numerics.intops import gru_candidate_reset_before, gru_cell, gru_gates_reset_before, rescale
from qtool.numerics.rescale import (
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
)

THREADS = 128  # hidden units per block (at most)
TILE_N = 8  # sequences per block at most: each load of R serves them all
THREADS_IN_FLIGHT = 1 << 16  # what the step kernels' launches keep: sequence_tile
K_CHUNK = 64  # columns of h (or rh) staged in shared memory at a time
WX_TILE = 16  # the W x GEMM's output tile per block (WX_TILE^2 threads)
WX_PITCH = 17  # a row of its staged weights, WX_TILE + 1: a warp's column reads hit every bank
assert WX_PITCH == WX_TILE + 1
REDUCE_THREADS = 8 if config.ENABLE_CUDASIM else 128  # the simulator runs every thread in Python
N_MEASURED = len(MEASURED)

# the rows of a reset-before cell's buffers (cell_layout): Wx's three gate rows, then its trace
_RB_LAYOUT = cell_layout(CellForm(reset_after=False))
assert _RB_LAYOUT.trace == ("Rh_z", "Rh_r", "Rh_g", "z_pre", "r_pre", "g_pre", "z_out", "r_out", "g_out",
                            "rh", "old_contrib", "new_contrib", "h")
(RB_ROW_RH_Z, RB_ROW_RH_R, RB_ROW_RH_G, RB_ROW_Z_PRE, RB_ROW_R_PRE, RB_ROW_G_PRE, RB_ROW_Z, RB_ROW_R, RB_ROW_G,
 RB_ROW_RH, RB_ROW_OLD, RB_ROW_NEW, RB_ROW_H) = range(3, _RB_LAYOUT.rows)
assert cell_layout(CellForm(gate="hard_sigmoid", gate_alpha=0.2, gate_beta=0.5)).rows == ROWS  # step_kernel's


def cuda_usable() -> tuple[bool, str]:
    """(usable, why) for a real GPU; the numba CUDA simulator counts as not usable for `auto`."""
    from numba import config

    if config.ENABLE_CUDASIM:
        return False, "the numba CUDA simulator is enabled (NUMBA_ENABLE_CUDASIM=1)"
    try:  # not cuda.detect(): it prints the device list on stdout, into `--json`'s output
        if not cuda.is_available():
            return False, "no CUDA driver or GPU found"
        name = cuda.get_current_device().name
    except Exception as e:  # the driver raises several types
        return False, f"CUDA is not usable ({str(e).splitlines()[0]})"
    return True, name.decode() if isinstance(name, bytes) else str(name)


@cuda.jit(device=True)
def tiled_dot(X, W, xs, ws, zero):
    """sum_k X[m, k] W[c, k] of this thread's output (m, c) of the block's WX_TILE x WX_TILE tile
    (threadIdx.x: c, so that a warp writes a row's consecutive columns), both operands staged in
    shared memory WX_TILE columns at a time; the sum runs over k in order, in the type of `zero`
    (a typed zero: xs[0, 0] * 0 would read shared memory before it is written, and numba types a
    float32 times an integer as float64). Block (m tile, c tile): N T tiles on the grid's x, which
    has no practical limit."""
    tx, ty = cuda.threadIdx.x, cuda.threadIdx.y
    m0, c0 = cuda.blockIdx.x * WX_TILE, cuda.blockIdx.y * WX_TILE
    M, K = X.shape
    s = zero
    for k0 in range(0, K, WX_TILE):
        if m0 + ty < M and k0 + tx < K:
            xs[ty, tx] = X[m0 + ty, k0 + tx]
        else:
            xs[ty, tx] = 0
        if c0 + ty < W.shape[0] and k0 + tx < K:
            ws[ty, tx] = W[c0 + ty, k0 + tx]
        else:
            ws[ty, tx] = 0
        cuda.syncthreads()
        for kk in range(WX_TILE):
            s += xs[ty, kk] * ws[tx, kk]
        cuda.syncthreads()
    return s


@cuda.jit
def wx_kernel(qx, qW, P, CH, zp_wx, lo_wx, hi_wx, out):
    """q_Wx[m, c] = rescale(sum_k qW[c, k] qx[m, k] - W_sum_mul_x_zp[c]): the fused epilogue; the
    sums in float64, exact below 2^53 (_direction refuses a GEMM that could pass it).
    zp_wx, lo_wx, hi_wx: the indices of Wx's zero point and range in P (the cell form's order)."""
    xs = cuda.shared.array((WX_TILE, WX_TILE), np.float64)
    ws = cuda.shared.array((WX_TILE, WX_PITCH), np.float64)
    s = tiled_dot(qx, qW, xs, ws, np.float64(0.0))
    m = cuda.blockIdx.x * WX_TILE + cuda.threadIdx.y
    c = cuda.blockIdx.y * WX_TILE + cuda.threadIdx.x
    if m < qx.shape[0] and c < qW.shape[0]:
        out[m, c] = rescale(np.int64(s) - CH[CH_W_SUM_MUL_X_ZP, c], CH[CH_SH_W, c], P[zp_wx], P[lo_wx], P[hi_wx])


@cuda.jit
def fwx_kernel(x, W, out):
    """The float reference's W x for all steps, float32 sums over k in order."""
    xs = cuda.shared.array((WX_TILE, WX_TILE), np.float32)
    ws = cuda.shared.array((WX_TILE, WX_PITCH), np.float32)
    s = tiled_dot(x, W, xs, ws, np.float32(0.0))
    m = cuda.blockIdx.x * WX_TILE + cuda.threadIdx.y
    c = cuda.blockIdx.y * WX_TILE + cuda.threadIdx.x
    if m < x.shape[0] and c < W.shape[0]:
        out[m, c] = s


@cuda.jit(device=True)
def stage_chunk(src, n0, na, k0, stage):
    """stage[a, k] = src[n0 + a, k0 + k] for the block's `na` sequences and K_CHUNK columns, 0
    past the row (every thread of the block takes a share; a barrier must follow)."""
    H = src.shape[1]
    for i in range(cuda.threadIdx.x, na * K_CHUNK, cuda.blockDim.x):
        a = i // K_CHUNK
        k = i % K_CHUNK
        if k0 + k < H:
            stage[a, k] = src[n0 + a, k0 + k]
        else:
            stage[a, k] = 0


@cuda.jit(device=True)
def tile_fma(RT, k, c, stage, kk, sums, g, na):
    """sums[g, a] += RT[k, c] stage[a, kk] for the block's `na` sequences: one load of R serves
    them all (a loop of constant length, so that the sums can live in registers)."""
    r = RT[k, c]
    for a in range(TILE_N):
        if a < na:
            sums[g, a] += r * stage[a, kk]


@cuda.jit(device=True)
def gate_sums(qRT, fRT, q_src, f_src, n0, na, j, g0, rows, level, q_stage, f_stage, q_sums, f_sums):
    """q_sums[g, a] = sum_k qRT[k, j + (g0 + g) H] q_src[n0 + a, k] for gate rows g < `rows` and
    the block's `na` sequences, summed over k in order, q_src staged in shared memory K_CHUNK
    columns at a time (q_stage); with `level`, the float reference's f_sums from f_src likewise.
    Every thread of the block calls it (it has barriers); a thread past the units (j >= H) stages."""
    H = qRT.shape[0]
    for g in range(rows):
        for a in range(TILE_N):
            q_sums[g, a] = 0
            f_sums[g, a] = 0
    for k0 in range(0, H, K_CHUNK):
        stage_chunk(q_src, n0, na, k0, q_stage)
        if level:
            stage_chunk(f_src, n0, na, k0, f_stage)
        cuda.syncthreads()
        if j < H:
            for kk in range(min(K_CHUNK, H - k0)):
                for g in range(rows):
                    c = j + (g0 + g) * H
                    tile_fma(qRT, k0 + kk, c, q_stage, kk, q_sums, g, na)
                    if level:
                        tile_fma(fRT, k0 + kk, c, f_stage, kk, f_sums, g, na)
        cuda.syncthreads()


@cuda.jit(device=True)
def add_terms(slot, q, f, grid):
    """Add one value's distance terms to a statistics row `slot` (STATS columns)."""
    qd = dequantized(q, grid[GRID_ZP], grid[GRID_SCALE])
    r = np.float64(f)
    e = qd - r
    slot[STAT_REF2] += r * r
    slot[STAT_ERR2] += e * e
    slot[STAT_DOT] += qd * r
    slot[STAT_Q2] += qd * qd
    slot[STAT_MAX_ABS] = max(slot[STAT_MAX_ABS], abs(e))
    slot[STAT_COUNT] += 1.0
    slot[STAT_SATURATED] += clipped(r, grid[GRID_LO_CLIP], grid[GRID_HI_CLIP])


@cuda.jit(device=True)
def add_row_terms(slot, row, q, f, grids, row_tensor):
    """add_terms of buffer row `row`'s value to its tensor's statistics row of `slot`."""
    tensor = row_tensor[row]
    add_terms(slot[tensor], q, f, grids[tensor])


@cuda.jit(device=True)
def block_step_terms(part, tid, t, step_stats):
    """The block's per-thread step terms `part` summed (max for STAT_MAX_ABS) by thread 0 and
    added to the step's row atomically; after a barrier."""
    cuda.syncthreads()
    if tid == 0:
        for c in range(N_STATS):
            v = part[0, c]
            for i in range(1, cuda.blockDim.x):
                v = max(v, part[i, c]) if c == STAT_MAX_ABS else v + part[i, c]
            if c == STAT_MAX_ABS:
                cuda.atomic.max(step_stats, (t, c), v)
            else:
                cuda.atomic.add(step_stats, (t, c), v)


@cuda.jit(device=True)
def x_terms(acc, n0, na, j, t, qx, xf, grids):
    """The layer input's distance terms of the block's sequences at step t, strided over every
    thread of the launch (j: this thread's slot)."""
    for a in range(na):
        n = n0 + a
        for k in range(j, qx.shape[2], cuda.gridDim.x * cuda.blockDim.x):
            add_terms(acc[n, j, X_TENSOR], qx[n, t, k], xf[n, t, k], grids[X_TENSOR])


def _step_kernel(acc_t):
    """The reset-after step kernel whose integer R h sums run in `acc_t` (float32 where
    layout.gemm_dtype proves the sums exact in it, else float64)."""

    @cuda.jit
    def step_kernel(t, s, tile, qx, xf, q_Wx, f_Wx, qRT, fRT, P, CH, lut_z, lut_r, lut_g, bx, br, form, alpha_beta,
                    out_q, out_f, col, h_i, h_f, level, grids, acc, step_stats, trace):
        """Step s of the run, at time index t, of a reset-after cell: block (unit tile, sequence
        tile); thread j computes unit j of the block's `tile` sequences (sequence_tile, at most
        TILE_N). Their h_old is staged in shared memory K_CHUNK units at a time (integers exactly
        in acc_t, and the float reference's float32; gate_sums); R is read transposed,
        `qRT[k, j]`, so a warp's loads are contiguous, and each load serves every sequence of the
        block. `form[0]` -1: the haste cell's float reference, else the form's activations."""
        tid = cuda.threadIdx.x
        j = cuda.blockIdx.x * cuda.blockDim.x + tid
        n0 = cuda.blockIdx.y * tile
        na = min(tile, h_i.shape[1] - n0)  # the block's sequences
        H = qRT.shape[0]
        jr, jg = j + H, j + 2 * H
        q_stage = cuda.shared.array((TILE_N, K_CHUNK), acc_t)
        f_stage = cuda.shared.array((TILE_N, K_CHUNK), np.float32)
        part = cuda.shared.array((THREADS, N_STATS), np.float64)
        q_sums = cuda.local.array((3, TILE_N), acc_t)  # R_z h, R_r h, R_g h of each sequence
        f_sums = cuda.local.array((3, TILE_N), np.float32)
        for c in range(N_STATS):
            part[tid, c] = 0.0
        gate_sums(qRT, fRT, h_i[s % 2], h_f[s % 2], n0, na, j, 0, 3, level, q_stage, f_stage, q_sums, f_sums)
        for a in range(TILE_N):
            n = n0 + a
            if j < H and a < na:
                wz, wr, wg = q_Wx[n, t, j], q_Wx[n, t, jr], q_Wx[n, t, jg]
                res = gru_cell(np.int64(wz), np.int64(wr), np.int64(wg), np.int64(q_sums[0, a]),
                               np.int64(q_sums[1, a]), np.int64(q_sums[2, a]), np.int64(h_i[s % 2, n, j]), j, jr,
                               jg, P, CH, lut_z, lut_r, lut_g)
                q_h = res[N_TRACE - 1]
                out_q[n, t, col + j] = q_h
                h_i[(s + 1) % 2, n, j] = q_h
                if trace.shape[0]:
                    trace[n, t, 0, j] = wz
                    trace[n, t, 1, j] = wr
                    trace[n, t, 2, j] = wg
                    for k in range(N_TRACE):
                        trace[n, t, 3 + k, j] = res[k]
                if level:
                    fx_z, fx_r, fx_g = f_Wx[n, t, j], f_Wx[n, t, jr], f_Wx[n, t, jg]
                    h_old = h_f[s % 2, n, j]
                    f_z, f_r, f_g = f_sums[0, a], f_sums[1, a], f_sums[2, a]
                    if form[0] == -1:
                        fres = float_cell(fx_z, fx_r, fx_g, f_z, f_r, f_g, h_old, bx[j], bx[jr], bx[jg], br[j],
                                          br[jr], br[jg])
                    else:
                        fres = float_cell_form(fx_z, fx_r, fx_g, f_z, f_r, f_g, h_old, bx[j], bx[jr], bx[jg], br[j],
                                               br[jr], br[jg], form, alpha_beta)
                    f_h = fres[N_TRACE - 1]
                    out_f[n, t, col + j] = f_h
                    h_f[(s + 1) % 2, n, j] = f_h
                    add_terms(part[tid], q_h, f_h, grids[H_TENSOR])  # the step's terms, on a zeroed row
                    add_terms(acc[n, j, H_TENSOR], q_h, f_h, grids[H_TENSOR])
                    if level == 2:
                        for g in range(3):
                            add_terms(acc[n, j, WX_TENSOR], (wz, wr, wg)[g], (fx_z, fx_r, fx_g)[g],
                                      grids[WX_TENSOR])
                        for k in range(N_TRACE - 1):  # Rh's three gate rows, then one row per tensor
                            tr = ROW_TENSOR[3 + k]
                            add_terms(acc[n, j, tr], res[k], fres[k], grids[tr])
        if level == 2:
            x_terms(acc, n0, na, j, t, qx, xf, grids)
        if level:
            block_step_terms(part, tid, t, step_stats)

    return step_kernel


def _gates_kernel_rb(acc_t):
    """The reset-before cell's first kernel of a step, its integer sums in `acc_t` (as _step_kernel)."""

    @cuda.jit
    def gates_kernel_rb(t, s, tile, q_Wx, f_Wx, qRT, fRT, P, CH, lut_z, lut_r, bx, br, form, alpha_beta, h_i, h_f,
                        z_i, z_f, rh_i, rh_f, level, grids, row_tensor, acc, trace):
        """Step s of a reset-before cell, at time index t, first half: block (unit tile, sequence
        tile) as step_kernel; unit j's R_z h and R_r h sums, its gates
        (intops.gru_gates_reset_before), z into `z_i` and rh = r * h_old into `rh_i` (the float
        reference's into `z_f`, `rh_f`), for candidates_kernel_rb, launched after it, to read
        every unit's rh."""
        tid = cuda.threadIdx.x
        j = cuda.blockIdx.x * cuda.blockDim.x + tid
        n0 = cuda.blockIdx.y * tile
        na = min(tile, h_i.shape[1] - n0)  # the block's sequences
        H = qRT.shape[0]
        jr = j + H
        q_stage = cuda.shared.array((TILE_N, K_CHUNK), acc_t)
        f_stage = cuda.shared.array((TILE_N, K_CHUNK), np.float32)
        q_sums = cuda.local.array((2, TILE_N), acc_t)  # R_z h, R_r h of each sequence
        f_sums = cuda.local.array((2, TILE_N), np.float32)
        gate_sums(qRT, fRT, h_i[s % 2], h_f[s % 2], n0, na, j, 0, 2, level, q_stage, f_stage, q_sums, f_sums)
        for a in range(TILE_N):
            n = n0 + a
            if j < H and a < na:
                wz, wr, wg = q_Wx[n, t, j], q_Wx[n, t, jr], q_Wx[n, t, j + 2 * H]
                Rh_z, Rh_r, z_pre, r_pre, z, r, rh = gru_gates_reset_before(
                    np.int64(wz), np.int64(wr), np.int64(q_sums[0, a]), np.int64(q_sums[1, a]),
                    np.int64(h_i[s % 2, n, j]), j, jr, P, CH, lut_z, lut_r)
                rh_i[n, j] = rh
                z_i[n, j] = z
                if trace.shape[0]:
                    trace[n, t, 0, j] = wz
                    trace[n, t, 1, j] = wr
                    trace[n, t, 2, j] = wg
                    trace[n, t, RB_ROW_RH_Z, j] = Rh_z
                    trace[n, t, RB_ROW_RH_R, j] = Rh_r
                    trace[n, t, RB_ROW_Z_PRE, j] = z_pre
                    trace[n, t, RB_ROW_R_PRE, j] = r_pre
                    trace[n, t, RB_ROW_Z, j] = z
                    trace[n, t, RB_ROW_R, j] = r
                    trace[n, t, RB_ROW_RH, j] = rh
                if level:
                    fx_z, fx_r = f_Wx[n, t, j], f_Wx[n, t, jr]
                    f_z, f_r = f_sums[0, a], f_sums[1, a]
                    fz_pre, fr_pre, fz, fr = float_gates(fx_z, fx_r, f_z, f_r, bx[j], bx[jr], br[j], br[jr], form[1],
                                                         alpha_beta[0], alpha_beta[1])
                    frh = fr * h_f[s % 2, n, j]
                    rh_f[n, j] = frh
                    z_f[n, j] = fz
                    if level == 2:
                        slot = acc[n, j]
                        add_row_terms(slot, 0, wz, fx_z, grids, row_tensor)
                        add_row_terms(slot, 1, wr, fx_r, grids, row_tensor)
                        add_row_terms(slot, 2, wg, f_Wx[n, t, j + 2 * H], grids, row_tensor)
                        add_row_terms(slot, RB_ROW_RH_Z, Rh_z, f_z, grids, row_tensor)
                        add_row_terms(slot, RB_ROW_RH_R, Rh_r, f_r, grids, row_tensor)
                        add_row_terms(slot, RB_ROW_Z_PRE, z_pre, fz_pre, grids, row_tensor)
                        add_row_terms(slot, RB_ROW_R_PRE, r_pre, fr_pre, grids, row_tensor)
                        add_row_terms(slot, RB_ROW_Z, z, fz, grids, row_tensor)
                        add_row_terms(slot, RB_ROW_R, r, fr, grids, row_tensor)
                        add_row_terms(slot, RB_ROW_RH, rh, frh, grids, row_tensor)

    return gates_kernel_rb


def _candidates_kernel_rb(acc_t):
    """The reset-before cell's second kernel of a step, its integer sums in `acc_t` (as _step_kernel)."""

    @cuda.jit
    def candidates_kernel_rb(t, s, tile, qx, xf, q_Wx, f_Wx, qRT, fRT, P, CH, lut_g, bx, br, form, out_q, out_f, col,
                             h_i, h_f, z_i, z_f, rh_i, rh_f, level, grids, row_tensor, acc, step_stats, trace):
        """Step s of a reset-before cell, second half, once gates_kernel_rb has written every
        unit's z and rh: unit j's R_g rh sum (rh staged as step_kernel stages h), its candidate
        and h (intops.gru_candidate_reset_before); the float reference likewise
        (float_cell.float_candidate_reset_before)."""
        tid = cuda.threadIdx.x
        j = cuda.blockIdx.x * cuda.blockDim.x + tid
        n0 = cuda.blockIdx.y * tile
        na = min(tile, h_i.shape[1] - n0)  # the block's sequences
        H = qRT.shape[0]
        jg = j + 2 * H
        q_stage = cuda.shared.array((TILE_N, K_CHUNK), acc_t)
        f_stage = cuda.shared.array((TILE_N, K_CHUNK), np.float32)
        part = cuda.shared.array((THREADS, N_STATS), np.float64)
        q_sums = cuda.local.array((1, TILE_N), acc_t)  # R_g rh of each sequence
        f_sums = cuda.local.array((1, TILE_N), np.float32)
        for c in range(N_STATS):
            part[tid, c] = 0.0
        gate_sums(qRT, fRT, rh_i, rh_f, n0, na, j, 2, 1, level, q_stage, f_stage, q_sums, f_sums)
        h_tensor = row_tensor[RB_ROW_H]
        for a in range(TILE_N):
            n = n0 + a
            if j < H and a < na:
                Rh_g, g_pre, g, old, new, q_h = gru_candidate_reset_before(
                    np.int64(q_Wx[n, t, jg]), np.int64(q_sums[0, a]), np.int64(h_i[s % 2, n, j]),
                    np.int64(z_i[n, j]), jg, P, CH, lut_g)
                out_q[n, t, col + j] = q_h
                h_i[(s + 1) % 2, n, j] = q_h
                if trace.shape[0]:
                    trace[n, t, RB_ROW_RH_G, j] = Rh_g
                    trace[n, t, RB_ROW_G_PRE, j] = g_pre
                    trace[n, t, RB_ROW_G, j] = g
                    trace[n, t, RB_ROW_OLD, j] = old
                    trace[n, t, RB_ROW_NEW, j] = new
                    trace[n, t, RB_ROW_H, j] = q_h
                if level:
                    fg_pre, fg, f_old, f_new, f_h = float_candidate_reset_before(
                        f_Wx[n, t, jg], f_sums[0, a], h_f[s % 2, n, j], z_f[n, j], bx[jg], br[jg], form[2])
                    out_f[n, t, col + j] = f_h
                    h_f[(s + 1) % 2, n, j] = f_h
                    add_terms(part[tid], q_h, f_h, grids[h_tensor])
                    add_terms(acc[n, j, h_tensor], q_h, f_h, grids[h_tensor])
                    if level == 2:
                        slot = acc[n, j]
                        add_row_terms(slot, RB_ROW_RH_G, Rh_g, f_sums[0, a], grids, row_tensor)
                        add_row_terms(slot, RB_ROW_G_PRE, g_pre, fg_pre, grids, row_tensor)
                        add_row_terms(slot, RB_ROW_G, g, fg, grids, row_tensor)
                        add_row_terms(slot, RB_ROW_OLD, old, f_old, grids, row_tensor)
                        add_row_terms(slot, RB_ROW_NEW, new, f_new, grids, row_tensor)
        if level == 2:
            x_terms(acc, n0, na, j, t, qx, xf, grids)
        if level:
            block_step_terms(part, tid, t, step_stats)

    return candidates_kernel_rb


# the kernels for each exact type of the R sums (module names: tests/engine/test_cuda_compile.py
# compiles each kernel it finds here)
step_kernel_f32, step_kernel_f64 = _step_kernel(np.float32), _step_kernel(np.float64)
gates_kernel_rb_f32, gates_kernel_rb_f64 = _gates_kernel_rb(np.float32), _gates_kernel_rb(np.float64)
candidates_kernel_rb_f32 = _candidates_kernel_rb(np.float32)
candidates_kernel_rb_f64 = _candidates_kernel_rb(np.float64)


@cuda.jit
def reduce_kernel(acc, out):
    """out[tensor, stat] = the sum (or max) of every thread slot acc[n, j, tensor, stat]: block
    `tensor`, every stat at once (each slot's row is contiguous): a strided sum per thread, then
    a tree in shared memory (one barrier per level for all stats: the simulator's barriers are slow)."""
    tensor = cuda.blockIdx.x
    tid = cuda.threadIdx.x
    buf = cuda.shared.array((REDUCE_THREADS, N_STATS), np.float64)
    N, J = acc.shape[0], acc.shape[1]
    for stat in range(N_STATS):
        v = 0.0
        for i in range(tid, N * J, cuda.blockDim.x):
            w = acc[i // J, i % J, tensor, stat]
            v = max(v, w) if stat == STAT_MAX_ABS else v + w
        buf[tid, stat] = v
    cuda.syncthreads()
    width = cuda.blockDim.x // 2
    while width > 0:
        if tid < width:
            for stat in range(N_STATS):
                a, b = buf[tid, stat], buf[tid + width, stat]
                buf[tid, stat] = max(a, b) if stat == STAT_MAX_ABS else a + b
        cuda.syncthreads()
        width //= 2
    if tid == 0:
        for stat in range(N_STATS):
            out[tensor, stat] = buf[0, stat]


def sequence_tile(N: int, H: int) -> int:
    """Sequences per block of the step kernels: up to TILE_N (each load of R serves them all), as
    long as the launch keeps about THREADS_IN_FLIGHT threads (a thread per unit and block: with
    fewer, too few warps hide the GPU's memory latency)."""
    return max(1, min(TILE_N, N * H // THREADS_IN_FLIGHT))


def _gemm_dtype_R(cq, reset_before: bool):
    """The exact arithmetic of the R GEMMs: R h, and for a reset-before cell R_g rh on rh's bits
    (one copy of R on the device: the wider of the two)."""
    H = cq.hidden_size
    if not reset_before:
        return gemm_dtype(cq.qR, cq.spec["h"].bits)
    types = (gemm_dtype(cq.qR[:2 * H], cq.spec["h"].bits), gemm_dtype(cq.qR[2 * H:], cq.spec["rh"].bits))
    for t in (np.int64, np.float64):
        if t in types:
            return t
    return np.float32


def _direction(cq, cell, d_qx, d_xf, rev, d_out_q, d_out_f, col, level, d_step, trace):
    """One layer direction over all steps; returns its statistics [measured tensors, STATS]
    (cell_layout(form).measured; or None)."""
    N, T, C = d_qx.shape
    H = cq.hidden_size
    reset_before = not cq.form.reset_after
    layout = cell_layout(cq.form)
    n_measured = len(layout.measured)
    dt_W = gemm_dtype(cq.qW, cq.spec["x"].bits)
    dt_R = _gemm_dtype_R(cq, reset_before)
    if dt_R is np.int64 or dt_W is np.int64:
        raise QtoolError("a GEMM of this model can exceed 2^53; the CUDA engine cannot prove it exact "
                         "(use `backend` cpu)")
    d_P, d_CH = cuda.to_device(cq.P), cuda.to_device(cq.CH)
    d_luts = [cuda.to_device(cq.luts[k]) for k in ("lut_z", "lut_r", "lut_g")]
    d_Wx = cuda.device_array((N * T, 3 * H), np.int32)
    grid = (math.ceil(N * T / WX_TILE), math.ceil(3 * H / WX_TILE))
    wx_idx = (RB_ZP_WX, RB_LO_WX, RB_HI_WX) if reset_before else (ZP_WX, LO_WX, HI_WX)  # P's order is the form's
    wx_kernel[grid, (WX_TILE, WX_TILE)](d_qx.reshape(N * T, C), cuda.to_device(cq.qW.astype(dt_W)), d_P, d_CH,
                                        *wx_idx, d_Wx)
    d_fWx = cuda.device_array((N * T, 3 * H) if level else (1, 3 * H), np.float32)
    if level:
        fwx_kernel[grid, (WX_TILE, WX_TILE)](d_xf.reshape(N * T, C), cuda.to_device(cell.W), d_fWx)
    h_i = np.zeros((2, N, H), np.float64)  # integers, exact in float64
    h_i[0] = cq.P[RB_ZP_H if reset_before else ZP_H]  # h0 = 0 exactly
    d_hi, d_hf = cuda.to_device(h_i), cuda.to_device(np.zeros((2, N, H), np.float32))
    threads = min(THREADS, 32 * math.ceil(max(H, C if level == 2 else 1) / 32))
    tile = sequence_tile(N, H)
    blocks = (math.ceil(H / threads), math.ceil(N / tile))
    d_acc = cuda.to_device(np.zeros((N, blocks[0] * threads, n_measured, N_STATS) if level else (1, 1, 1, N_STATS)))
    gate, alpha, beta, candidate = form_codes(cq.form)
    form = np.array([-1, 0, 0] if cq.form.haste else [int(reset_before), gate, candidate], np.int64)
    # R transposed, [H, 3H]: the threads of a warp (consecutive units) read consecutive addresses
    d_qRT = cuda.to_device(np.ascontiguousarray(cq.qR.T.astype(dt_R)))
    d_fRT = cuda.to_device(np.ascontiguousarray(cell.R.T, np.float32))
    q_Wx, f_Wx = d_Wx.reshape(N, T, 3 * H), d_fWx.reshape(N, T, 3 * H) if level else d_fWx.reshape(1, 1, 3 * H)
    d_bx, d_br = cuda.to_device(cell.bx), cuda.to_device(cell.br)
    d_form, d_ab = cuda.to_device(form), cuda.to_device(np.array([alpha, beta], np.float32))
    d_grids = cuda.to_device(measured_grids(cq))
    f64 = dt_R is np.float64
    if reset_before:
        d_rt = cuda.to_device(layout.row_tensor)
        scratch = (cuda.device_array((N, H), np.int32), cuda.device_array((N, H), np.float32),  # z
                   cuda.device_array((N, H), np.int32), cuda.device_array((N, H), np.float32))  # rh
        gates = gates_kernel_rb_f64 if f64 else gates_kernel_rb_f32
        candidates = candidates_kernel_rb_f64 if f64 else candidates_kernel_rb_f32
    else:
        step = step_kernel_f64 if f64 else step_kernel_f32
    for s in range(T):  # launches queue on the stream; nothing is copied per step
        t = T - 1 - s if rev else s
        if reset_before:  # every unit's rh before any unit's R_g rh: two launches
            gates[blocks, threads](t, s, tile, q_Wx, f_Wx, d_qRT, d_fRT, d_P, d_CH, d_luts[0], d_luts[1], d_bx, d_br,
                                   d_form, d_ab, d_hi, d_hf, *scratch, level, d_grids, d_rt, d_acc, trace)
            candidates[blocks, threads](t, s, tile, d_qx, d_xf, q_Wx, f_Wx, d_qRT, d_fRT, d_P, d_CH, d_luts[2], d_bx,
                                        d_br, d_form, d_out_q, d_out_f, col, d_hi, d_hf, *scratch, level, d_grids,
                                        d_rt, d_acc, d_step, trace)
        else:
            step[blocks, threads](t, s, tile, d_qx, d_xf, q_Wx, f_Wx, d_qRT, d_fRT, d_P, d_CH, *d_luts, d_bx, d_br,
                                  d_form, d_ab, d_out_q, d_out_f, col, d_hi, d_hf, level, d_grids, d_acc, d_step,
                                  trace)
    if not level:
        return None
    d_st = cuda.device_array((n_measured, N_STATS), np.float64)
    reduce_kernel[n_measured, REDUCE_THREADS](d_acc, d_st)
    return d_st.copy_to_host()


def run_model_cuda(qm, x: np.ndarray | None, level: int = INTS, plans=None, traces: list | None = None,
                   xq: np.ndarray | None = None) -> ModelRun:
    """Same contract as engine_cpu.run_model, on the GPU, for every cell form: per layer
    direction the buffers' rows and the measured tensors of cell_layout(form)."""
    if xq is None:
        x = np.ascontiguousarray(x, np.float32)
        xq = quantize_input(qm, x)
    else:
        assert level == INTS, "a run from integers has no float reference"
    N, T, _ = xq.shape
    d_qx = cuda.to_device(np.ascontiguousarray(xq, np.int32))
    d_xf = cuda.to_device(x) if level else cuda.device_array((1, 1, 1), np.float32)
    d_step = cuda.to_device(np.zeros((T, N_STATS)))
    stats, outputs = [], []
    for l, cells in enumerate(qm.cells):
        H = cells[0].hidden_size
        D = len(cells)
        d_out_q = cuda.device_array((N, T, H * D), np.int32)
        d_out_f = cuda.device_array((N, T, H * D) if level else (1, 1, 1), np.float32)
        last = l == len(qm.cells) - 1
        row, tr_row = [], []
        for d, cq in enumerate(cells):
            rows = cell_layout(cq.form).rows
            d_tr = cuda.device_array((N, T, rows, H) if traces is not None else (0, 0, rows, H), np.int32)
            step = d_step if last else cuda.to_device(np.zeros((T, N_STATS)))
            row.append(_direction(cq, qm.model.layers[l][d], d_qx, d_xf, d == 1, d_out_q, d_out_f,
                                  d * H, level, step, d_tr))
            tr_row.append(d_tr)
        if traces is not None:
            traces.append([t.copy_to_host() for t in tr_row])
        stats.append(row)
        outputs.append(d_out_q.copy_to_host())
        d_qx, d_xf = d_out_q, d_out_f
    step_stats = d_step.copy_to_host()
    return ModelRun(outputs[-1], d_xf.copy_to_host() if level else None, stats if level else None,
                    step_stats if level else None, outputs)
