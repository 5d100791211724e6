"""Throughput of qtool's integer engine and float reference against PyTorch's float nn.GRU on the
same machine and shapes. A benchmark, not a test: run it and copy the table into the README.

    python benchmarks/bench_simulate.py [--T 100 --N 64 --C 64 --H 256 --repeat 5]
    python benchmarks/bench_simulate.py --cuda --T 100 --N 256 --C 256 --H 512   # GPU vs cuDNN
    python benchmarks/bench_simulate.py --cuda --T 100 --N 1 --C 256 --H 512     # streaming
"""

from __future__ import annotations

import argparse
import os
import platform
import time

import numpy as np

from qtool.calibration import build_quant_model, new_observers, observe_batch
from qtool.engine_cpu import run_int
from qtool.float_gru import run_float
from qtool.model import GruCell, GruModel
from qtool.tensors import preset_config


def best_of(fn, repeat: int) -> float:
    fn()  # warm-up (and numba compilation or cache load)
    times = []
    for _ in range(repeat):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return min(times)


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


def main() -> None:
    ap = argparse.ArgumentParser()
    for k, v in (("T", 100), ("N", 64), ("C", 64), ("H", 256), ("repeat", 5)):
        ap.add_argument(f"--{k}", type=int, default=v)
    ap.add_argument("--cuda", action="store_true", help="time the numba.cuda engine against cuDNN")
    a = ap.parse_args()
    if a.cuda:
        return bench_cuda(a)
    model, x = make_case(a)
    steps = a.N * a.T
    print(f"shape T={a.T} N={a.N} C={a.C} H={a.H}; {platform.processor() or platform.machine()}, "
          f"{os.cpu_count()} CPUs; best of {a.repeat}")
    rows = [("qtool float reference (numpy)", best_of(lambda: run_float(model, x), a.repeat))]
    for preset in ("int8", "w8a16", "int16"):
        qm = quantized(model, x, preset)
        rows.append((f"qtool integer engine, {preset}", best_of(lambda qm=qm: run_int(qm, x), a.repeat)))
    try:
        import torch

        gru = torch.nn.GRU(a.C, a.H, batch_first=True)
        xt = torch.from_numpy(x)

        def torch_run():
            with torch.no_grad():
                gru(xt)

        torch_s = best_of(torch_run, a.repeat)
        rows.append((f"PyTorch {torch.__version__} nn.GRU float32 ({torch.get_num_threads()} threads)",
                     torch_s))
    except ImportError:
        torch_s = None
    print(f"{'engine':<52} {'seconds':>9} {'seq*steps/s':>12} {'vs torch':>9}")
    for name, sec in rows:
        ratio = f"{torch_s / sec:.2f}x" if torch_s else "-"
        print(f"{name:<52} {sec:9.4f} {steps / sec:12.0f} {ratio:>9}")


def bench_cuda(a) -> None:
    import torch
    from numba import cuda

    from qtool.engine_cuda import run_cell_cuda

    model, x = make_case(a)
    steps = a.N * a.T
    print(f"shape T={a.T} N={a.N} C={a.C} H={a.H}; GPU {cuda.get_current_device().name}")
    rows = []
    for preset in ("int8", "w8a16", "int16"):
        qm = quantized(model, x, preset)
        rows.append((f"qtool CUDA integer engine, {preset} (incl. copies)",
                     best_of(lambda qm=qm: run_int(qm, x, runner=run_cell_cuda), a.repeat)))
    gru = torch.nn.GRU(a.C, a.H, batch_first=True).cuda()
    xt = torch.from_numpy(x).cuda()

    def torch_run():
        with torch.no_grad():
            gru(xt)
        torch.cuda.synchronize()

    torch_s = best_of(torch_run, a.repeat)
    rows.append((f"PyTorch {torch.__version__} nn.GRU float32 cuDNN", torch_s))
    print(f"{'engine':<52} {'seconds':>9} {'seq*steps/s':>12} {'vs cuDNN':>9}")
    for name, sec in rows:
        print(f"{name:<52} {sec:9.4f} {steps / sec:12.0f} {torch_s / sec:8.2f}x")


if __name__ == "__main__":
    main()
