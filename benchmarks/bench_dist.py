"""Distributed speed: the seed's pipelined AllGather + int8 matmul + dequantize against
gather-then-GEMM, and `mpiexec -n R qtool calibrate --method kl` against one process.
A benchmark, not a test; needs the `mpi` extra.

    mpiexec -n 2 python benchmarks/bench_dist.py operator [--repeat 5]
    python benchmarks/bench_dist.py calibrate [--ranks 2 --runs 3 --N 512 --T 100 --C 64 --H 256]

operator: for each shape (rows per rank M_i, K, N), the best of --repeat runs (the slowest
rank's time) of the communication alone (one blocking Allgatherv of A), the GEMM + dequant alone
(on the gathered A), both one after the other, and the pipelined operator; overlap efficiency =
(comm + gemm - pipelined) / min(comm, gemm): the share of the shorter one that was hidden.
calibrate: end-to-end wall time of the CLI, one process (default threads) against R ranks (one
thread each), alternating, with the files compared; and the sizes the scaling model needs.
"""

from __future__ import annotations

import argparse
import json
import os
import pickle
import platform
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

SHAPES = ((2048, 4096, 16), (2048, 4096, 64), (2048, 4096, 256), (64, 16384, 512))


def slowest(comm, fn, repeat: int) -> float:
    """Best of `repeat` of the slowest rank's time (each run starts together)."""
    from mpi4py import MPI

    fn()  # warm-up (numba cache load)
    best = float("inf")
    for _ in range(repeat):
        comm.Barrier()
        t0 = time.perf_counter()
        fn()
        best = min(best, comm.allreduce(time.perf_counter() - t0, op=MPI.MAX))
    return best


def operator(a) -> None:
    from mpi4py import MPI

    from qtool.dist.matmul import auto_chunk_rows
    from qtool.simd import HAS_VNNI

    comm = MPI.COMM_WORLD
    R, me = comm.Get_size(), comm.Get_rank()
    if me == 0:
        print(f"{platform.processor() or platform.machine()}, {os.cpu_count()} cores, {R} ranks, "
              f"VNNI {'yes' if HAS_VNNI else 'no'}, numba threads {os.environ.get('NUMBA_NUM_THREADS', 'default')}")
        print(f"{'M_i x K x N':>20} {'chunk':>6} {'A/rank MiB':>10} {'comm':>8} {'gemm':>8} {'serial':>8} "
              f"{'pipelined':>9} {'speed-up':>8} {'overlap':>8}")
    for m, K, N in SHAPES:
        t = one_shape(comm, m, K, N, a)
        hidden = (t["comm_only"] + t["gemm_only"] - t["pipelined"]) / min(t["comm_only"], t["gemm_only"])
        if me == 0:
            chunk = a.chunk_rows or auto_chunk_rows(m, K, N, R)
            print(f"{f'{m} x {K} x {N}':>20} {chunk:>6} {m * K / 2**20:>10.2f} {t['comm_only'] * 1e3:>6.2f}ms "
                  f"{t['gemm_only'] * 1e3:>6.2f}ms {t['serial'] * 1e3:>6.2f}ms {t['pipelined'] * 1e3:>7.2f}ms "
                  f"{t['serial'] / t['pipelined']:>7.2f}x {100 * hidden:>7.0f}%")


def one_shape(comm, m: int, K: int, N: int, a) -> dict[str, float]:
    """The four timings of one shape (every rank its own random A_i and b)."""
    from qtool.dist.matmul import allgather_dequant_matmul, prepare

    R = comm.Get_size()
    rng = np.random.default_rng(comm.Get_rank())
    x = rng.integers(-128, 128, (m, K), dtype=np.int8)
    b = rng.integers(-128, 128, (K, N), dtype=np.int8)
    ts, cs = rng.random(m, np.float32), rng.random(N, np.float32)
    A = np.empty((R * m, K), np.int8)
    ts_all = np.empty(R * m, np.float32)
    gemm = prepare(b, cs)  # b laid out once, as a layer's weights would be

    def comm_only():
        comm.Allgather(x, A)

    def gemm_only():
        gemm(A, ts_all)

    def serial():
        comm.Allgather(x, A)
        comm.Allgather(ts, ts_all)
        gemm(A, ts_all)

    def pipelined():
        allgather_dequant_matmul(comm, x, gemm, ts, None, chunk_rows=a.chunk_rows)

    return {f.__name__: slowest(comm, f, a.repeat) for f in (comm_only, gemm_only, serial, pipelined)}


def make_files(d: Path, a) -> tuple[Path, Path]:
    """The README's calibration benchmark case: one layer, PyTorch's initialisation range."""
    from qtool.model import GruCell, GruModel, open_h5, write_model

    rng = np.random.RandomState(0)
    s = 1 / np.sqrt(a.H)
    cell = GruCell(rng.uniform(-s, s, (3 * a.H, a.C)), rng.uniform(-s, s, (3 * a.H, a.H)),
                   rng.uniform(-s, s, 3 * a.H), rng.uniform(-s, s, 3 * a.H))
    with open_h5(d / "m.h5", "w") as f:
        write_model(f, GruModel([[cell]]))
    np.save(d / "calib.npy", rng.randn(a.N, a.T, a.C).astype(np.float32))
    return d / "m.h5", d / "calib.npy"


def run_cli(cmd: list[str], env: dict) -> tuple[float, dict]:
    t0 = time.perf_counter()
    p = subprocess.run(cmd, capture_output=True, text=True, env=env)
    wall = time.perf_counter() - t0
    if p.returncode:
        sys.exit(p.stderr)
    return wall, json.loads(p.stdout)


def state_sizes(model: Path, data: Path, a) -> None:
    """What the scaling model needs: the bytes a rank's observer state has at the merge, the
    time of one pairwise merge (a tree level) and of the root's final replays."""
    from qtool import api
    from qtool.calibration import MethodPlan, new_observers, observe_batch
    from qtool.dist.calibrate import Logged, _map, _zip, finish, merge_pair

    m = api.load_model(model)
    x = np.load(data, mmap_mode="r")
    clock = [0]
    obs = _map(new_observers(m, MethodPlan("kl")), lambda o: Logged(o, clock))
    for k in range(2):
        clock[0] = k
        observe_batch(m, np.asarray(x[k * a.batch:(k + 1) * a.batch]), obs)
    state = _map(obs, lambda o: (o.inner, o.log))
    size = len(pickle.dumps(state, protocol=pickle.HIGHEST_PROTOCOL))
    t0 = time.perf_counter()
    merged = _zip(merge_pair, state, state)
    t_pair = time.perf_counter() - t0
    t0 = time.perf_counter()
    _map(merged, finish)
    t_finish = time.perf_counter() - t0
    print(f"merge: a rank's kl observer state is {size / 2**10:.0f} KiB ({a.H} hidden units); one pairwise "
          f"merge {t_pair * 1e3:.1f} ms, the root's final replays {t_finish * 1e3:.1f} ms; a round's exchange "
          f"carries {len(pickle.dumps((0, None)))} B per rank")


def calibrate(a) -> None:
    mpiexec = shutil.which("mpiexec", path=f"{Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}")
    qtool = [sys.executable, "-c", "from qtool.cli import main; main()"]
    with tempfile.TemporaryDirectory() as tmp:
        d = Path(tmp)
        model, data = make_files(d, a)
        args = ["calibrate", str(model), str(data), "--method", "kl", "--batch-size", str(a.batch), "--json"]
        one_env = dict(os.environ)
        rank_env = dict(os.environ, NUMBA_NUM_THREADS="1", OPENBLAS_NUM_THREADS="1", OMP_NUM_THREADS="1")
        runs = {"one process": ([*qtool, *args, "-o", str(d / "q1.h5"), "--force"], one_env),
                "one process, 1 thread": ([*qtool, *args, "-o", str(d / "q0.h5"), "--force"], rank_env),
                f"mpiexec -n {a.ranks}": ([mpiexec, "-n", str(a.ranks), *qtool, *args, "-o", str(d / "qr.h5"),
                                           "--force"], rank_env)}
        times: dict[str, list] = {k: [] for k in runs}
        run_cli(*runs["one process"])  # numba caches
        for _ in range(a.runs):
            for label, (cmd, env) in runs.items():
                wall, res = run_cli(cmd, env)
                times[label].append((wall, res["seconds"]))
        print(f"{platform.processor() or platform.machine()}, {os.cpu_count()} cores; kl calibration of "
              f"{a.N} sequences (T={a.T} C={a.C} H={a.H}), chunks of {a.batch}; load {os.getloadavg()[0]:.1f}")
        for label, ts in times.items():
            walls, inner = [t[0] for t in ts], [t[1] for t in ts]
            print(f"  {label:24s} wall {min(walls):6.2f}-{max(walls):6.2f} s, in-command {min(inner):6.2f}-"
                  f"{max(inner):6.2f} s")
        base = times["one process"]
        mpi = times[f"mpiexec -n {a.ranks}"]
        ratios = [b[1] / m[1] for b, m in zip(base, mpi)]
        print(f"  speed-up per run (in-command): {min(ratios):.2f}-{max(ratios):.2f}x; "
              f"files identical to one process's: {compare(d)}")
        state_sizes(model, data, a)


def compare(d: Path) -> bool:
    """The quantized models match, dataset for dataset and attribute for attribute."""
    import h5py

    def contents(path):
        out = {}
        with h5py.File(path) as f:
            def visit(name, obj):
                out.update({f"{name}@{k}": v for k, v in obj.attrs.items() if k != "created"})
                if isinstance(obj, h5py.Dataset):
                    out[name] = obj[()]
            visit("/", f)
            f.visititems(visit)
        return out

    one = contents(d / "q1.h5")
    others = [contents(d / f) for f in ("q0.h5", "qr.h5")]
    return all(o.keys() == one.keys() and all(np.array_equal(np.asarray(one[k]), np.asarray(o[k])) for k in one)
               for o in others)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("what", choices=("operator", "calibrate"))
    for k, v in (("repeat", 5), ("runs", 3), ("ranks", 2), ("N", 512), ("T", 100), ("C", 64), ("H", 256),
                 ("batch", 64)):
        ap.add_argument(f"--{k}", type=int, default=v)
    ap.add_argument("--chunk-rows", type=int, default=None)
    a = ap.parse_args()
    operator(a) if a.what == "operator" else calibrate(a)


if __name__ == "__main__":
    main()
