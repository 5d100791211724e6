"""Run under `mpiexec -n R python tests/mpi_operator.py`: the strict test of
qtool.parallel.allgather_dequant_matmul (docs/distributed.md). Every rank holds a different A_i
(drawn from a random seed of its own), and every rank computes the single-process reference from
all ranks' inputs (regenerated from their seeds) with numpy's int64 matmul: C must equal it exactly,
D bit for bit. Each case runs on MPI_COMM_WORLD, on halves of it and on COMM_SELF, so one
launch of R processes covers R, about R / 2 and 1 ranks. Prints one line per rank; exits 1 on
any rank when any check failed on any rank."""

import os
import sys

import numpy as np
from mpi4py import MPI

from qtool.parallel import allgather_dequant_matmul, prepare


def extremes(x: np.ndarray, rng) -> np.ndarray:
    """Put -128 and 127 where the sums are largest: whole rows and scattered entries."""
    if x.size:
        x.flat[rng.integers(0, x.size, max(1, x.size // 10))] = -128
        x.flat[rng.integers(0, x.size, max(1, x.size // 10))] = 127
        x[0] = -128
    return x


def case_inputs(case: dict, r: int, R: int):
    """Rank r's (a, b, token_scale, channel_scale) of a case on R ranks."""
    rng = np.random.default_rng([case["seed"], R, r])
    K, N = case["K"], case["N"]
    m = case["rows"](r, R)
    if case.get("permuted"):  # the same rows on every rank, in a rank-seeded order
        base = np.random.default_rng([case["seed"], R]).integers(-128, 128, (m, K), dtype=np.int8)
        a = base[rng.permutation(m)]
    else:
        a = extremes(rng.integers(-128, 128, (m, K), dtype=np.int8), rng)
    b = extremes(rng.integers(-128, 128, (K, N), dtype=np.int8), rng)  # every rank its own b
    ts = (rng.random(m, np.float32) * 2.0**rng.integers(-12, 2, m)).astype(np.float32)
    cs = (rng.random(N, np.float32) * 2.0**rng.integers(-14, 0, N)).astype(np.float32)
    return a, b, ts, cs


def reference(a_all: list, b: np.ndarray, ts_all: list, cs: np.ndarray):
    A = np.concatenate(a_all) if a_all else np.zeros((0, b.shape[0]), np.int8)
    acc = A.astype(np.int64) @ b.astype(np.int64)
    assert np.abs(acc).max(initial=0) < 2**31
    acc = acc.astype(np.int32)
    ts = np.concatenate(ts_all).astype(np.float32)
    with np.errstate(over="ignore"):  # beyond float16's range: inf, as the cast defines
        return acc, (acc.astype(np.float32) * ts[:, None] * cs[None, :]).astype(np.float16)


CASES = [
    # uneven rows, the last rank none, chunks that do not divide them, K not a multiple of 64
    dict(name="uneven", seed=1, K=70, N=9, chunk=4, rows=lambda r, R: [13, 6, 0][r % 3] if R > 1 else 11),
    # every rank the same rows in its own order: a wrong rank order or a stale stage shows
    dict(name="permuted", seed=2, K=64, N=5, chunk=3, rows=lambda r, R: 17, permuted=True),
    # the automatic chunk size, wider shapes
    dict(name="auto", seed=3, K=130, N=33, chunk=None, rows=lambda r, R: 150 + 7 * r),
    # one row per step
    dict(name="single-rows", seed=4, K=1, N=3, chunk=1, rows=lambda r, R: 3 - r % 2),
    # nothing anywhere
    dict(name="empty", seed=5, K=8, N=4, chunk=2, rows=lambda r, R: 0),
    # the GEMM and epilogue on the GPU (numba's simulator in CI)
    dict(name="cuda", seed=6, K=70, N=6, chunk=2, rows=lambda r, R: [5, 0, 3][r % 3], backend="cuda"),
]


def run_case(comm, case: dict) -> list[str]:
    R, r = comm.Get_size(), comm.Get_rank()
    inputs = [case_inputs(case, q, R) for q in range(R)]
    a, b, ts, cs = inputs[r]
    d, acc = allgather_dequant_matmul(comm, a, b, ts, cs, return_int32=True, chunk_rows=case["chunk"],
                                      backend=case.get("backend", "cpu"))
    ref_acc, ref_d = reference([x[0] for x in inputs], b, [x[2] for x in inputs], cs)
    where = f"{case['name']} on {R} rank(s), rank {r}"
    bad = []
    if acc.dtype != np.int32 or acc.shape != ref_acc.shape or not np.array_equal(acc, ref_acc):
        bad.append(f"{where}: int32 C differs from the reference")
    if d.dtype != np.float16 or d.shape != ref_d.shape or not np.array_equal(d.view(np.uint16), ref_d.view(np.uint16)):
        bad.append(f"{where}: float16 D is not bit-identical to the reference")
    if case.get("permuted") and R > 1:  # the check can see a wrong rank order
        swapped, _ = reference([x[0] for x in inputs[::-1]], b, [x[2] for x in inputs[::-1]], cs)
        if np.array_equal(swapped, ref_acc):
            bad.append(f"{where}: the permuted inputs do not tell rank orders apart")
    prepared = prepare(b, cs, case.get("backend", "cpu"))  # b laid out once, used twice
    for _ in range(2):
        d_only = allgather_dequant_matmul(comm, a, prepared, ts, None, chunk_rows=case["chunk"])
        if not np.array_equal(d_only.view(np.uint16), ref_d.view(np.uint16)):
            bad.append(f"{where}: float16 D with a prepared b, without return_int32, differs")
    return bad


def bad_arguments(comm) -> list[str]:
    """A wrong argument on one rank raises ValueError on every rank (nobody waits forever)."""
    r, last = comm.Get_rank(), comm.Get_size() - 1
    bad = []
    big = 1 << 17  # 2^17 x 128 x 128 = 2^31: an int32 sum could overflow
    for what, expected, a, K, b in (("dtype", "a must be an int8 array", np.int16, 4, 0),
                                    ("K", "a has K = 4 columns but b has 5 rows", np.int8, 5, 0),
                                    ("bound", "int32 sums could overflow", np.int8, big, -128)):
        k = K if what == "bound" else 4
        try:
            allgather_dequant_matmul(comm, np.zeros((2, k), a if r == last else np.int8),
                                     np.full((K if r == last else k, 3), b if r == last else 0, np.int8),
                                     np.ones(2, np.float32), np.ones(3, np.float32))
            bad.append(f"bad {what}, rank {r}: no error")
        except ValueError as e:
            if f"rank {last}: {expected}" not in str(e):
                bad.append(f"bad {what}, rank {r}: unexpected message: {e}")
    return bad


def main() -> int:
    world = MPI.COMM_WORLD
    halves = world.Split(world.Get_rank() % 2, world.Get_rank())
    bad = []
    for comm in (world, halves, MPI.COMM_SELF):
        for case in CASES:
            bad += run_case(comm, case)
    bad += bad_arguments(world)
    total = world.allreduce(len(bad))
    for line in bad:
        print(line, file=sys.stderr)
    print(f"rank {world.Get_rank()} of {world.Get_size()}: {len(CASES)} cases x 3 communicators, "
          f"{len(bad)} failures here, {total} in all (pid {os.getpid()})")
    return 1 if total else 0


if __name__ == "__main__":
    sys.exit(main())
