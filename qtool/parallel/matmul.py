"""The AllGather + int8 matmul + dequantize operator on MPI (docs/distributed.md), with a strict
contract:

    A = allgather(a)                       # every rank's rows [M_i, K], in rank order
    C = A @ b                              # int8 x int8, exact int32 sums
    D = float16(float32(C) * token_scale[m] * channel_scale[n])   # float32, left to right

on every rank; `b` and `channel_scale` are the rank's own (a column shard, in tensor
parallelism), the token scales travel with their rows.

The pipeline is a two-stage workspace: the rows travel in steps of `chunk_rows` rows
per rank; step k gathers rows [k c, (k + 1) c) of every rank (fewer or none where a rank has
fewer) into stage k % 2 with a non-blocking MPI_Iallgatherv, and is started before the GEMM of
step k - 1 runs on the other stage. The GEMM works in row blocks and tests the pending gather
between them, since MPI progresses a non-blocking collective only inside MPI calls. A stage is
refilled only after the GEMM that read it returned, so no step can see a stale stage.

The GEMM is qtool's integer GEMM (qtool.engine.cpu: VNNI where the CPU has it, else int16
multiply-adds, exact either way) or, with backend="cuda", a numba.cuda kernel with the
dequantization fused into its epilogue; MPI runs on the host in both cases.
"""

from __future__ import annotations

import numpy as np

from qtool.engine.cpu import gemm_apply, gemm_plan
from qtool.parallel.half import dequantize_rows
from qtool.parallel.prepared import Prepared, describe

STEPS = 8             # pipeline steps aimed at: the first gather and the last GEMM are not hidden
MIN_STEP_MACS = 1 << 22  # but no step so small that call and message overheads dominate
POLLS = 8             # tests of the pending gather per GEMM step


def auto_chunk_rows(max_rows: int, K: int, N: int, ranks: int) -> int:
    """Rows per rank per step: about STEPS steps, each at least MIN_STEP_MACS multiply-adds."""
    rows = max(-(-max_rows // STEPS), -(-MIN_STEP_MACS // max(ranks * K * N, 1)))
    return max(1, min(rows, max_rows))


def dequantize(acc: np.ndarray, token_scale: np.ndarray, channel_scale: np.ndarray) -> np.ndarray:
    """float16(float32(acc) * token_scale[m] * channel_scale[n]), each product rounded to float32;
    beyond float16's range the result is inf, as the cast defines."""
    with np.errstate(over="ignore"):
        return (acc.astype(np.float32) * token_scale[:, None] * channel_scale[None, :]).astype(np.float16)


class CpuGemm(Prepared):
    """C = rows @ b with qtool's exact integer GEMM (engine_cpu), then the dequantization."""

    backend = "cpu"

    def __init__(self, b: np.ndarray, channel_scale: np.ndarray):
        super().__init__(b, channel_scale)
        # the engine's GEMM of w [N, K] with 8-bit rows of zero point 0 (VNNI where the CPU has it)
        self.gemm = gemm_plan(self.wide, 8, 0)
        del self.wide

    def __call__(self, rows: np.ndarray, token_scale: np.ndarray, poll=None) -> tuple[np.ndarray, np.ndarray]:
        acc = np.empty((rows.shape[0], self.N), np.int32)
        d = np.empty(acc.shape, np.float16)
        block = max(-(-rows.shape[0] // POLLS), 8)
        for i in range(0, rows.shape[0], block):
            # gemm_apply's sums are exact (its input view's compensation subtracted)
            dequantize_rows(gemm_apply(self.gemm, rows[i:i + block], self.N), token_scale[i:i + block],
                            self.channel_scale, acc[i:i + block], d[i:i + block].view(np.uint16))
            if poll is not None:
                poll()
        return acc, d


def prepare(b: np.ndarray, channel_scale: np.ndarray, backend: str = "cpu") -> Prepared:
    """b and its channel scales laid out for the GEMM once (transposed, padded, compensated;
    on the GPU for backend="cuda"), for repeated calls with the same b."""
    if backend == "cuda":
        from qtool.parallel.matmul_cuda import CudaGemm

        return CudaGemm(b, channel_scale)
    if backend != "cpu":
        raise ValueError(f"backend must be 'cpu' or 'cuda', got {backend!r}")
    return CpuGemm(b, channel_scale)


def _local(a, b, token_scale, channel_scale, chunk_rows, backend: str) -> tuple[Prepared | None, str | None]:
    """This rank's GEMM, or what is wrong with its arguments."""
    if not (isinstance(a, np.ndarray) and a.dtype == np.int8 and a.ndim == 2):
        return None, f"a must be an int8 array [M_i, K], got {describe(a)}"
    if not (isinstance(token_scale, np.ndarray) and token_scale.dtype == np.float32
            and token_scale.shape == (a.shape[0],)):
        return None, f"token_scale must be float32 [{a.shape[0]}], got {describe(token_scale)}"
    if chunk_rows is not None and (isinstance(chunk_rows, bool) or not isinstance(chunk_rows, (int, np.integer))
                                   or chunk_rows < 1):
        return None, f"chunk_rows must be a positive integer, got {chunk_rows!r}"
    try:
        if isinstance(b, Prepared):
            if channel_scale is not None:
                return None, "with a prepared b, channel_scale is the prepared one: pass None"
            gemm = b
        else:
            gemm = prepare(b, channel_scale, backend)
    except Exception as e:  # a bad b, or no usable GPU
        return None, str(e) if isinstance(e, ValueError) else f"backend {backend}: {type(e).__name__}: {e}"
    if gemm.K != a.shape[1]:
        return None, f"a has K = {a.shape[1]} columns but b has {gemm.K} rows"
    return gemm, None


def allgather_dequant_matmul(comm, a: np.ndarray, b, token_scale: np.ndarray,
                             channel_scale: np.ndarray | None, return_int32: bool = False, *,
                             chunk_rows: int | None = None, backend: str = "cpu"):
    """float16 D [sum M_i, N] (and with return_int32 the int32 C) on every rank of `comm` (an
    mpi4py communicator). a: int8 [M_i, K], this rank's rows (M_i may differ, 0 too); b: int8
    [K, N], or `prepare(b, channel_scale, backend)` with channel_scale None; token_scale:
    float32 [M_i]; channel_scale: float32 [N]. chunk_rows: rows per rank per pipeline step
    (default: auto_chunk_rows). backend: "cpu" or "cuda" (the GEMM and the epilogue on the
    GPU). A bad argument on any rank raises ValueError on every rank."""
    from mpi4py import MPI

    gemm, problem = _local(a, b, token_scale, channel_scale, chunk_rows, backend)
    shapes = comm.allgather((problem, None if problem else a.shape))
    for r, (p, _) in enumerate(shapes):
        if p:
            raise ValueError(f"allgather_dequant_matmul, rank {r}: {p}")
    if len({shape[1] for _, shape in shapes}) > 1:
        raise ValueError(f"allgather_dequant_matmul: the ranks' a differ in K: {[s[1] for _, s in shapes]}")
    counts = [shape[0] for _, shape in shapes]
    displs = np.concatenate([[0], np.cumsum(counts)]).astype(np.int64)
    M, K, N = int(displs[-1]), a.shape[1], gemm.N
    ts_all = np.empty(M, np.float32)
    comm.Allgatherv(np.ascontiguousarray(token_scale), [ts_all, (counts, displs[:-1]), MPI.FLOAT])
    if M and K and N:
        acc, d = np.empty((M, N), np.int32), np.empty((M, N), np.float16)
        rows = chunk_rows or auto_chunk_rows(max(counts), K, N, comm.Get_size())
        _pipeline(comm, np.ascontiguousarray(a), counts, displs, int(rows), gemm, ts_all, acc, d, MPI)
    else:  # nothing to gather or to sum: C is all zeros
        acc = np.zeros((M, N), np.int32)
        d = dequantize(acc, ts_all, gemm.channel_scale)
    return (d, acc) if return_int32 else d


def _pipeline(comm, a, counts, displs, c, gemm, ts_all, acc, d, MPI) -> None:
    """The double-buffered gather + GEMM loop; fills acc and d (rows in global order)."""
    R, me, K = comm.Get_size(), comm.Get_rank(), a.shape[1]
    stage = np.empty((2, R * c, K), np.int8)  # 2 stages of R * c rows: every rank's rows of one step
    row = MPI.SIGNED_CHAR.Create_contiguous(K).Commit()  # counts in rows: no 2^31-element limit

    def start(k: int):
        cnt = [min(max(m - k * c, 0), c) for m in counts]
        off = np.concatenate([[0], np.cumsum(cnt)[:-1]]).astype(np.int64)
        req = comm.Iallgatherv([a[k * c:k * c + cnt[me]], cnt[me], row], [stage[k % 2], (cnt, off), row])
        rows_at = np.concatenate([np.arange(displs[r] + k * c, displs[r] + k * c + cnt[r]) for r in range(R)])
        return req, rows_at

    try:
        steps = -(-max(counts) // c)
        pending = start(0)
        for k in range(steps):
            req, rows_at = pending
            req.Wait()
            pending = start(k + 1) if k + 1 < steps else None
            acc[rows_at], d[rows_at] = gemm(stage[k % 2, :rows_at.size], ts_all[rows_at],
                                            pending[0].Test if pending is not None else None)
    finally:
        row.Free()
