"""Throughput of qtool's integer engine against PyTorch's float nn.GRU on the same machine and
shapes, in the same run, with the time split of `qtool simulate`'s work and the VNNI limit of
the machine. A benchmark, not a test: run it and copy the tables into the README.

    python benchmarks/bench_simulate.py [--T 100 --N 64 --C 64 --H 256 --repeat 10]
    python benchmarks/bench_simulate.py --process [--N 256 --repeat 10]   # whole processes
    python benchmarks/bench_simulate.py --cold out/digits_int8.h5 samples/test.npy   # first run
    python benchmarks/bench_simulate.py --cuda --T 100 --N 256 --C 256 --H 512   # GPU vs cuDNN
    NUMBA_NUM_THREADS=1 python benchmarks/bench_simulate.py --cpu-time   # one thread each, CPU time

--cpu-time measures the process's CPU time with one thread for every engine (PyTorch too): on a
machine shared with other work, wall time mostly measures the scheduler, CPU time much less so.

Each repeat runs every engine once, in turn, so that the machine's drift hits all alike; the
tables give the median and the range over the repeats.
"""

from __future__ import annotations

import argparse
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np
from numba import njit

from qtool.calibration.observe import build_quant_model, new_observers, observe_batch
from qtool.core.model import GruCell, GruModel
from qtool.core.tensors import preset_config
from qtool.engine.cpu import plan_model, run_int, run_model, slices, threads
from qtool.engine.layout import EVERY_TENSOR, OUTPUT
from qtool.engine.simd import HAS_VNNI, KINDS, MB, gemm_rows, pack, padded

CLOCK = time.perf_counter


def timed(fn) -> float:
    t0 = CLOCK()
    fn()
    return CLOCK() - t0


def best_of(fn, repeat: int) -> float:
    """The least time of `repeat` runs after a first one (compilation, caches)."""
    fn()
    times = []
    for _ in range(repeat):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return min(times)


def summary(times: list[float]) -> str:
    return f"{statistics.median(times):8.4f} ({min(times):.4f}-{max(times):.4f})"


def make_case(a):
    """A random one-layer GRU with PyTorch's initialisation range, and random inputs."""
    rng = np.random.RandomState(0)
    s = 1 / np.sqrt(a.H)
    cell = GruCell(rng.uniform(-s, s, (3 * a.H, a.C)), rng.uniform(-s, s, (3 * a.H, a.H)),
                   rng.uniform(-s, s, 3 * a.H), rng.uniform(-s, s, 3 * a.H))
    return GruModel([[cell]]), rng.randn(a.N, a.T, a.C).astype(np.float32)


def quantized(model, x, preset: str):
    """Calibrate on (up to) the first 32 sequences with min/max."""
    obs = new_observers(model, "minmax")
    observe_batch(model, x[:32], obs)
    return build_quant_model(model, obs, preset_config(preset), {})


@njit(nogil=True)
def _gemms(n_blocks, T, ax, wx, accx, ah, wh, acch):
    for _ in range(n_blocks * T):
        gemm_rows(ax, wx, accx)
        gemm_rows(ah, wh, acch)


def gemm_only(qm, N: int, T: int):
    """The engine's GEMM work alone (both GEMMs of every block and step, same threads)."""
    dp = plan_model(qm)[0][0]
    gx, gh = dp.gx, dp.gh

    def part(n0, n1):
        z = np.zeros
        _gemms(-(-(n1 - n0) // MB), T, z((MB, gx.Kp), KINDS[gx.kind][0]), gx.w,
               z((MB, gx.width), KINDS[gx.kind][2]), z((MB, gh.Kp), KINDS[gh.kind][0]), gh.w,
               z((MB, gh.width), KINDS[gh.kind][2]))

    parts = slices(N, threads())
    return lambda: list(ThreadPoolExecutor(len(parts)).map(lambda p: part(*p), parts))


def vnni_peak(repeat: int) -> float:
    """vpdpbusd per second per core, measured: the micro-kernel on weights that stay in L1."""
    a = np.ones((MB, 256), np.uint8)
    w, _ = pack(np.ones((padded(1, "u8s8"), 256), np.int64), "u8s8")
    acc = np.zeros((MB, padded(1, "u8s8")), np.int32)
    n = 20000
    _gemms(1, 1, a, w, acc, a, w, acc)
    best = min(timed(lambda: _gemms(n, 1, a, w, acc, a, w, acc)) for _ in range(repeat))
    return 2 * n * MB * padded(1, "u8s8") * 256 / 64 / best


def main() -> None:
    ap = argparse.ArgumentParser()
    for k, v in (("T", 100), ("N", 64), ("C", 64), ("H", 256), ("repeat", 10)):
        ap.add_argument(f"--{k}", type=int, default=v)
    ap.add_argument("--cuda", action="store_true", help="time the numba.cuda engine against cuDNN")
    ap.add_argument("--process", action="store_true", help="time whole `qtool simulate` processes")
    ap.add_argument("--cpu-time", action="store_true", help="CPU time, one thread per engine")
    ap.add_argument("--presets", default="int8,w8a16,int16", help="--process: the presets to run")
    ap.add_argument("--cold", nargs=2, metavar=("QMODEL", "DATA"),
                    help="time `qtool simulate QMODEL DATA` with an empty numba cache, then cached")
    a = ap.parse_args()
    if a.cpu_time:
        global CLOCK
        CLOCK = time.process_time
    if a.cuda:
        return bench_cuda(a)
    if a.process:
        return bench_process(a)
    if a.cold:
        return bench_cold(a)
    model, x = make_case(a)
    steps = a.N * a.T
    print(f"shape T={a.T} N={a.N} C={a.C} H={a.H}; {platform.processor() or platform.machine()}, "
          f"{os.cpu_count()} CPUs, {threads()} engine threads; median (range) of {a.repeat} runs")
    runs = {}
    qms = {p: quantized(model, x, p) for p in ("int8", "w8a16", "int16")}
    plans = {p: plan_model(qm) for p, qm in qms.items()}
    for p, qm in qms.items():
        runs[f"qtool integer engine, {p} ({plans[p][0][0].gh.kind}"
             f"{' split' if plans[p][0][0].gh.half else ''})"] = lambda qm=qm: run_int(qm, x)
    qm8, pl8 = qms["int8"], plans["int8"]
    runs["int8 + float reference (output distance)"] = lambda: run_model(qm8, x, OUTPUT, pl8)
    runs["int8 + float reference + every tensor's distances"] = lambda: run_model(qm8, x, EVERY_TENSOR, pl8)
    runs["int8 GEMMs alone"] = gemm_only(qm8, a.N, a.T)
    try:
        import torch

        if a.cpu_time:
            torch.set_num_threads(1)
        gru = torch.nn.GRU(a.C, a.H, batch_first=True)
        xt = torch.from_numpy(x)

        def torch_run():
            with torch.no_grad():
                gru(xt)

        torch_name = f"PyTorch {torch.__version__} nn.GRU float32 ({torch.get_num_threads()} threads)"
        runs[torch_name] = torch_run
    except ImportError:
        torch_name = None
    times = {k: [] for k in runs}
    for fn in runs.values():
        fn()  # warm-up (and numba compilation or cache load)
    for _ in range(a.repeat):
        for k, fn in runs.items():
            times[k].append(timed(fn))
    med = {k: statistics.median(v) for k, v in times.items()}
    print(f"{'engine':<58} {'seconds: median (range)':>26} {'seq*steps/s':>12} {'vs torch':>9}")
    for k, v in times.items():
        ratio = f"{med[torch_name] / med[k]:.2f}x" if torch_name else "-"
        print(f"{k:<58} {summary(v):>26} {steps / med[k]:12.0f} {ratio:>9}")
    if torch_name:
        per_run = [t / q for t, q in zip(times[torch_name], times[next(iter(times))])]
        print(f"int8 vs PyTorch per run: {min(per_run):.2f}-{max(per_run):.2f}x")
    ints = med[next(iter(times))]
    gemms = med["int8 GEMMs alone"]
    ref = med["int8 + float reference (output distance)"]
    full = med["int8 + float reference + every tensor's distances"]
    print(f"time split of `qtool simulate`'s work (int8, medians): GEMMs {gemms * 1e3:.1f} ms, "
          f"cells and the rest of the integer engine {(ints - gemms) * 1e3:.1f} ms, float reference "
          f"{(ref - ints) * 1e3:.1f} ms, every tensor's distances {(full - ref) * 1e3:.1f} ms")
    macs = a.N * a.T * 3 * a.H * (a.C + a.H)
    if not HAS_VNNI:  # the peak is measured with vpdpbusd, which the target lacks
        print(f"no AVX-512 VNNI on this target: no VNNI limit for {macs / 1e9:.2f} GMAC")
        return
    rate = vnni_peak(5)
    limit = macs / 64 / (rate * threads())
    print(f"VNNI limit: {macs / 1e9:.2f} GMAC = {macs / 64 / 1e6:.1f} M vpdpbusd (64 MAC each); "
          f"measured peak {rate / 1e9:.2f} G vpdpbusd/s per core x {threads()} threads -> "
          f"{limit * 1e3:.1f} ms; int8 engine at {ints / limit:.1f}x the limit")


PROCESS_TORCH = """
import sys, numpy as np, torch
torch.manual_seed(0)
x = torch.from_numpy(np.load(sys.argv[1]))
gru = torch.nn.GRU(x.shape[2], int(sys.argv[2]), batch_first=True)
with torch.no_grad():
    y = gru(x)[0]
print(float(y.abs().mean()))
"""


def run_process(cmd: list[str]) -> tuple[float, float, float]:
    """(wall seconds, peak RSS MiB, CPU seconds) of one child process."""
    t0 = time.perf_counter()
    p = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    _, status, usage = os.wait4(p.pid, 0)
    p.returncode = os.waitstatus_to_exitcode(status)
    if p.returncode:
        raise SystemExit(f"{cmd} failed with exit code {p.returncode}")
    return time.perf_counter() - t0, usage.ru_maxrss / 1024, usage.ru_utime + usage.ru_stime


def bench_process(a) -> None:
    """Whole processes on one data file: `qtool simulate` of each preset with and without the
    per-tensor report, and a Python process that loads PyTorch and runs its float nn.GRU."""
    a.N = a.N if a.N != 64 else 256
    model, x = make_case(a)
    qtool = [sys.executable, "-m", "qtool.cli"]
    with tempfile.TemporaryDirectory() as tmp:
        data = Path(tmp) / "x.npy"
        np.save(data, x)
        from qtool import api

        cmds = {}
        for p in a.presets.split(","):
            q = Path(tmp) / f"{p}.h5"
            api.save(quantized(model, x, p), q)
            cmds[f"qtool simulate {p} (per-tensor report)"] = qtool + ["simulate", str(q), str(data)]
            cmds[f"qtool simulate {p} --no-per-tensor"] = qtool + ["simulate", str(q), str(data), "--no-per-tensor"]
        cmds["python + PyTorch nn.GRU float32"] = [sys.executable, "-c", PROCESS_TORCH, str(data), str(a.H)]
        for cmd in cmds.values():
            run_process(cmd)  # warm-up: numba's cache, the page cache
        res = {k: [] for k in cmds}
        for _ in range(a.repeat):
            for k, cmd in cmds.items():
                res[k].append(run_process(cmd))
    print(f"whole processes, T={a.T} N={a.N} C={a.C} H={a.H} (data {x.nbytes / 2**20:.1f} MiB); "
          f"median (range) of {a.repeat} runs")
    torch_med = statistics.median(r[0] for r in res["python + PyTorch nn.GRU float32"])
    for k, v in res.items():
        t, rss, cpu = [r[0] for r in v], [r[1] for r in v], [r[2] for r in v]
        print(f"{k:<45} {summary(t)} s  peak RSS {statistics.median(rss):6.0f} MiB "
              f"({min(rss):.0f}-{max(rss):.0f})  {statistics.median(t) / torch_med:.2f}x PyTorch's time  "
              f"CPU {summary(cpu)} s")


def bench_cold(a) -> None:
    """`qtool simulate QMODEL DATA` as after a fresh install (numba's cache in a new, empty
    directory: every kernel compiles) and right after it (the cache loads), in turn."""
    cmd = [sys.executable, "-m", "qtool.cli", "simulate", *a.cold]
    res = {"first run (compiles)": [], "next run (cached)": []}
    for _ in range(a.repeat):
        with tempfile.TemporaryDirectory() as cache:
            os.environ["NUMBA_CACHE_DIR"] = cache
            for runs in res.values():
                runs.append(run_process(cmd))
    print(f"qtool simulate {' '.join(a.cold)}: median (range) of {a.repeat} runs")
    for k, v in res.items():
        print(f"{k:<22} wall {summary([r[0] for r in v])} s  CPU {summary([r[2] for r in v])} s")


def bench_cuda(a) -> None:
    import torch
    from numba import cuda

    from qtool.engine.cuda import run_model_cuda

    model, x = make_case(a)
    steps = a.N * a.T
    print(f"shape T={a.T} N={a.N} C={a.C} H={a.H}; GPU {cuda.get_current_device().name}")
    rows = []
    for preset in ("int8", "w8a16", "int16"):
        qm = quantized(model, x, preset)
        run_int(qm, x, runner=run_model_cuda)
        rows.append((f"qtool CUDA integer engine, {preset} (incl. copies)",
                     [timed(lambda qm=qm: run_int(qm, x, runner=run_model_cuda)) for _ in range(a.repeat)]))
    gru = torch.nn.GRU(a.C, a.H, batch_first=True).cuda()
    xt = torch.from_numpy(x).cuda()

    def torch_run():
        with torch.no_grad():
            gru(xt)
        torch.cuda.synchronize()

    torch_run()
    rows.append((f"PyTorch {torch.__version__} nn.GRU float32 cuDNN", [timed(torch_run) for _ in range(a.repeat)]))
    torch_s = statistics.median(rows[-1][1])
    print(f"{'engine':<52} {'seconds: median (range)':>26} {'seq*steps/s':>12} {'vs cuDNN':>9}")
    for name, t in rows:
        m = statistics.median(t)
        print(f"{name:<52} {summary(t):>26} {steps / m:12.0f} {torch_s / m:8.2f}x")


if __name__ == "__main__":
    main()
