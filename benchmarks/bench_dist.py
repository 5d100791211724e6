"""Distributed speed: the pipelined AllGather + int8 matmul + dequantize against
gather-then-GEMM, and `mpiexec -n R qtool calibrate --method kl` against one process.
A benchmark, not a test; needs the `mpi` extra.

    mpiexec -n 2 python benchmarks/bench_dist.py operator [--repeat 10 --chunk-rows C]
    python benchmarks/bench_dist.py cli [--ranks 2 --runs 3 --N 2048 --T 100 --C 64 --H 256]

operator: for each shape (rows per rank M_i, K, N), the best of --repeat runs (the slowest
rank's time) of the communication alone (one blocking Allgatherv of A), the GEMM + dequant alone
(on the gathered A), both one after the other, and the pipelined operator; overlap efficiency =
(comm + gemm - pipelined) / min(comm, gemm): the share of the shorter one that was hidden.
cli: `qtool calibrate --method kl` and `qtool simulate --save` as one process (its default
threads, and one thread) and as R ranks (one thread each), alternating; the time the command
reports (model loaded to file written) and the wall time of the whole process; the outputs
compared; then (`sizes`, one thread) the rank's warm throughput and the sizes and times of
the merges that the scaling estimates in docs/distributed.md need.
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

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))

from h5compare import h5_contents  # noqa: E402

ONE_THREAD = dict(os.environ,  # a process of one thread: numba, OpenBLAS, OpenMP
                  NUMBA_NUM_THREADS="1", OPENBLAS_NUM_THREADS="1", OMP_NUM_THREADS="1")
SHAPES = ((2048, 4096, 4), (2048, 4096, 16), (2048, 4096, 64), (2048, 4096, 256), (64, 16384, 512))


def slowest(comm, fns: dict, repeat: int) -> dict[str, float]:
    """Per function, the best of `repeat` of the slowest rank's time; the functions take turns,
    so that a busy moment of the machine does not fall on one of them only."""
    from mpi4py import MPI

    best = dict.fromkeys(fns, float("inf"))
    for k in range(repeat + 1):  # the first round warms up (numba cache load)
        for name, fn in fns.items():
            comm.Barrier()
            t0 = time.perf_counter()
            fn()
            t = comm.allreduce(time.perf_counter() - t0, op=MPI.MAX)
            if k:
                best[name] = min(best[name], t)
    return best


def operator(a) -> None:
    from mpi4py import MPI

    from qtool.engine.simd import HAS_VNNI
    from qtool.parallel.matmul import auto_chunk_rows

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
    from qtool.parallel.matmul import allgather_dequant_matmul, prepare

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

    return slowest(comm, {f.__name__: f for f in (comm_only, gemm_only, serial, pipelined)}, a.repeat)


def make_files(d: Path, a) -> tuple[Path, Path]:
    """The README's calibration benchmark case (bench_simulate's: one layer, PyTorch's
    initialisation range), written to files."""
    from bench_simulate import make_case

    from qtool.core.model import open_h5, write_model

    model, x = make_case(a)
    with open_h5(d / "m.h5", "w") as f:
        write_model(f, model)
    np.save(d / "calib.npy", x)
    return d / "m.h5", d / "calib.npy"


def run_cli(cmd: list[str], env: dict) -> tuple[float, dict]:
    t0 = time.perf_counter()
    p = subprocess.run(cmd, capture_output=True, text=True, env=env)
    wall = time.perf_counter() - t0
    if p.returncode:
        sys.exit(p.stderr)
    return wall, json.loads(p.stdout)


def timed(a, args: list[str], out_flag: str, d: Path, tag: str) -> dict[str, list]:
    """(wall, in-command seconds, JSON) of each run: one process with its default threads, one
    process with one thread, and R ranks with one thread each; alternating, --runs times."""
    mpiexec = shutil.which("mpiexec", path=f"{Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}")
    qtool = [sys.executable, "-c", "from qtool.cli.app import main; main()"]
    one = dict(os.environ)
    runs = {"one process": ([*qtool, *args, out_flag, str(d / f"{tag}1.h5")], one),
            "one process, 1 thread": ([*qtool, *args, out_flag, str(d / f"{tag}0.h5")], ONE_THREAD),
            f"mpiexec -n {a.ranks}": ([mpiexec, "-n", str(a.ranks), *qtool, *args, out_flag, str(d / f"{tag}r.h5")],
                                      ONE_THREAD)}
    run_cli(*runs["one process"])  # numba caches
    times: dict[str, list] = {k: [] for k in runs}
    for _ in range(a.runs):
        for label, (cmd, env) in runs.items():
            wall, res = run_cli(cmd, env)
            times[label].append((wall, res["seconds"], res))
    return times


def report(a, what: str, times: dict[str, list], same: bool) -> None:
    print(f"{what}: {a.N} sequences (T={a.T} C={a.C} H={a.H}); load {os.getloadavg()[0]:.1f}")
    for label, ts in times.items():
        walls, inner = [t[0] for t in ts], [t[1] for t in ts]
        print(f"  {label:24s} wall {min(walls):6.2f}-{max(walls):6.2f} s, in-command {min(inner):6.2f}-"
              f"{max(inner):6.2f} s ({a.N / min(inner):.0f} sequences/s at best)")
    for base in ("one process", "one process, 1 thread"):
        ratios = [b[1] / m[1] for b, m in zip(times[base], times[f"mpiexec -n {a.ranks}"])]
        print(f"  speed-up over {base}, run by run: {min(ratios):.2f}-{max(ratios):.2f}x")
    print(f"  outputs identical to one process's (metrics: to one process with one thread): {same}")


def sizes(a) -> None:
    """What the scaling estimates need, on one rank (run it with one thread): the rank's
    throughput once warm, its observer state at the merge (bytes, one pairwise merge, the root's
    final replays) and a chunk's simulation partial (bytes, one fold at the root)."""
    from bench_simulate import best_of

    from qtool import api
    from qtool.calibration.observe import MethodPlan, collect, new_observers, observe_batch
    from qtool.io.files import SequenceData
    from qtool.parallel.calibrate import Logged, finish, map_observers, merge_pair, zip_observers
    from qtool.simulation.fold import chunk_stats, fold
    from qtool.simulation.run import Simulation, simulate

    with tempfile.TemporaryDirectory() as tmp:
        model_path, data_path = make_files(Path(tmp), a)
        m = api.load_model(model_path)
        x = np.load(data_path)
    data = SequenceData(x, False, "bench")
    t_obs = best_of(lambda: collect(m, data, "kl", a.batch), 2)
    qm = api.calibrate(m, x, method="kl", batch_size=a.batch)
    t_sim = best_of(lambda: simulate(qm, data, a.sim_batch), 2)
    print(f"one rank, warm: observes {a.N / t_obs:.0f} sequences/s (kl), simulates {a.N / t_sim:.0f} "
          f"sequences/s (every tensor); T={a.T} C={a.C} H={a.H}")
    clock = [0]
    obs = map_observers(new_observers(m, MethodPlan("kl")), lambda o: Logged(o, clock))
    for k in range(2):
        clock[0] = k
        observe_batch(m, x[k * a.batch:(k + 1) * a.batch], obs)
    state = map_observers(obs, lambda o: (o.inner, o.log))
    size = len(pickle.dumps(state, protocol=pickle.HIGHEST_PROTOCOL))
    t_pair = best_of(lambda: zip_observers(merge_pair, state, state), 3)
    merged = zip_observers(merge_pair, state, state)
    t_finish = best_of(lambda: map_observers(merged, finish), 3)
    print(f"calibration merge: a rank's kl observer state {size / 2**10:.0f} KiB; one pairwise merge "
          f"{t_pair * 1e3:.1f} ms; the root's replays {t_finish * 1e3:.1f} ms; a round's exchange "
          f"{len(pickle.dumps((0, None)))} B per rank")
    sim = Simulation(qm)
    part = chunk_stats(sim, x[:a.sim_batch])[0]
    t_fold = best_of(lambda: fold(sim, part), 20)
    print(f"simulation fold: a chunk's partial statistics {len(pickle.dumps(part)) / 2**10:.0f} KiB, folded "
          f"in {t_fold * 1e3:.2f} ms; --save adds {a.sim_batch * a.T * a.H * 12 / 2**20:.1f} MiB of outputs "
          f"per chunk of {a.sim_batch}")


def same_files(d: Path, tag: str) -> bool:
    ref = h5_contents(d / f"{tag}1.h5")
    return all(c.keys() == ref.keys() and all(np.array_equal(np.asarray(ref[k]), np.asarray(c[k])) for k in ref)
               for c in (h5_contents(d / f"{tag}0.h5"), h5_contents(d / f"{tag}r.h5")))


def cli(a) -> None:
    print(f"{platform.processor() or platform.machine()}, {os.cpu_count()} cores; mpiexec -n {a.ranks}, "
          f"one thread per rank")
    with tempfile.TemporaryDirectory() as tmp:
        d = Path(tmp)
        model, data = make_files(d, a)
        args = ["calibrate", str(model), str(data), "--method", "kl", "--batch-size", str(a.batch), "--json",
                "--force"]
        times = timed(a, args, "-o", d, "q")
        report(a, "kl calibration", times, same_files(d, "q"))
        args = ["simulate", str(d / "q1.h5"), str(data), "--batch-size", str(a.sim_batch), "--json", "--force"]
        times = timed(a, args, "--save", d, "r")
        # the metrics' dot products split over BLAS threads: compare runs of one thread per process
        res = [{k: v for k, v in t[2].items() if k != "seconds"} for label, ts in times.items() for t in ts
               if label != "one process"]
        report(a, "simulate --save", times, same_files(d, "r") and all(r == res[0] for r in res))
    subprocess.run([sys.executable, __file__, "sizes", *(f"--{k.replace('_', '-')}={v}" for k, v in vars(a).items()
                                                        if k not in ("what", "chunk_rows"))],
                   env=ONE_THREAD, check=True)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("what", choices=("operator", "cli", "sizes"))
    for k, v in (("repeat", 10), ("runs", 3), ("ranks", 2), ("N", 2048), ("T", 100), ("C", 64), ("H", 256),
                 ("batch", 64), ("sim_batch", 64)):
        ap.add_argument(f"--{k.replace('_', '-')}", type=int, default=v)
    ap.add_argument("--chunk-rows", type=int, default=None)
    a = ap.parse_args()
    {"operator": operator, "cli": cli, "sizes": sizes}[a.what](a)


if __name__ == "__main__":
    main()
