"""On a machine with an NVIDIA GPU: the CUDA engine against the CPU engine, every integer of every
tensor of every step, for every cell form and grid, stacked and bidirectional, with the float
reference and the statistics; then its speed against cuDNN. A check to run, not a test: copy its
tables into the README with the machine they came from.

    python benchmarks/gpu_check.py [--quick] [--tile 8] [--chunk 64]

Exactness: per case the integers compared (outputs, final states and every traced tensor), the
mismatches, and the largest difference between the engines of the float reference's output and of
any tensor's SNR (dB).
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from qtool.calibration.observe import build_quant_model, new_observers, observe_batch  # noqa: E402
from qtool.core.model import CellForm, GruCell, GruModel  # noqa: E402
from qtool.core.tensors import preset_config  # noqa: E402
from qtool.engine.cpu import run_int, run_model  # noqa: E402
from qtool.engine.layout import EVERY_TENSOR  # noqa: E402
from qtool.engine.metrics import STAT_ERR2, STAT_REF2  # noqa: E402

FORMS = {
    "haste": CellForm(),
    "reset_before": CellForm(reset_after=False),
    "hard_sigmoid_linear": CellForm(gate="hard_sigmoid", gate_alpha=0.2, gate_beta=0.5, candidate="linear"),
    "reset_before_hard_relu": CellForm(reset_after=False, gate="hard_sigmoid", gate_alpha=1 / 6, gate_beta=0.5,
                                       candidate="relu"),
}


def model(form: CellForm, C: int, H: int, layers: int, dirs: int, seed: int = 0) -> GruModel:
    """PyTorch's initialisation range, every cell of `form`."""
    rng = np.random.RandomState(seed)
    s = 1 / np.sqrt(H)
    cells = [[GruCell(rng.uniform(-s, s, (3 * H, C if l == 0 else H * dirs)), rng.uniform(-s, s, (3 * H, H)),
                      rng.uniform(-s, s, 3 * H), rng.uniform(-s, s, 3 * H), form) for _ in range(dirs)]
             for l in range(layers)]
    return GruModel(cells)


def quantized(m: GruModel, x: np.ndarray, preset: str):
    obs = new_observers(m, "minmax")
    observe_batch(m, x[:64], obs)
    return build_quant_model(m, obs, preset_config(preset), {})


def snr_db(stats: np.ndarray) -> np.ndarray:
    """Every measured tensor's SNR from its statistics rows; NaN where it is exact."""
    with np.errstate(divide="ignore", invalid="ignore"):
        v = 10 * np.log10(stats[:, STAT_REF2] / stats[:, STAT_ERR2])
    return np.where(np.isfinite(v), v, np.nan)


def exactness(quick: bool) -> None:
    from qtool.engine.cuda import run_model_cuda

    # (C, H, layers, dirs, T, N): stacked bidirectional; partial tiles of sequences, of staged h and of
    # units (H 200, N 13); a wide layer; the speed table's sizes
    shapes = [(40, 64, 2, 2, 20, 64), (24, 200, 1, 2, 10, 13), (40, 512, 1, 1, 20, 32),
              (128, 256, 1, 1, 100, 256)] if not quick else [(3, 4, 1, 2, 2, 2)]
    print(f"{'form':<24} {'preset':<6} {'C,H,layers,dirs,T,N':<20} {'integers':>12} {'mismatches':>10} "
          f"{'float out':>9} {'SNR dB':>9}")
    total = bad = 0
    for name, form in FORMS.items():
        for preset in ("int8", "w8a16", "int16")[:1 if quick else 3]:
            for C, H, layers, dirs, T, N in shapes:
                m = model(form, C, H, layers, dirs)
                x = np.random.RandomState(1).randn(N + 64, T, C).astype(np.float32)
                qm = quantized(m, x[N:], preset)
                x = x[:N]
                tr_c, tr_g, f_c, f_g = [], [], [], []
                y_c = run_int(qm, x, tr_c, f_c)
                y_g = run_int(qm, x, tr_g, f_g, runner=run_model_cuda)
                pairs = [(y_c, y_g)] + list(zip(f_c, f_g)) + [
                    (a[k], b[k]) for ra, rb in zip(tr_c, tr_g) for a, b in zip(ra, rb) for k in ("x", "Wx", "cell")]
                n = sum(a.size for a, _ in pairs)
                mism = sum(int(np.count_nonzero(a != b)) for a, b in pairs)
                run_c, run_g = run_model(qm, x, EVERY_TENSOR), run_model_cuda(qm, x, EVERY_TENSOR)
                dfloat = float(np.abs(run_c.y_float - run_g.y_float).max())
                dstat = max(float(np.nanmax(np.abs(snr_db(a) - snr_db(b))))
                            for ra, rb in zip(run_c.stats, run_g.stats) for a, b in zip(ra, rb))
                total += n
                bad += mism
                print(f"{name:<24} {preset:<6} {f'{C},{H},{layers},{dirs},{T},{N}':<20} {n:>12,} {mism:>10} "
                      f"{dfloat:9.2e} {dstat:9.2e}", flush=True)
    print(f"exactness: {bad} mismatches in {total:,} integers")


def timings(quick: bool, repeat: int) -> None:
    import torch
    from numba import cuda

    print(f"GPU {cuda.get_current_device().name}; torch {torch.__version__}")
    shapes = [(100, 256, 256, 512), (50, 16384, 40, 128), (100, 64, 128, 128)] if not quick else [(10, 8, 8, 16)]
    print(f"{'T, N, C, H':<20} {'cuDNN fp32 ms':>13} {'int8 ms':>9} {'int16 ms':>9} {'int8 + float, stats ms':>23} "
          f"{'int8 vs cuDNN':>13}")
    for T, N, C, H in shapes:
        row = time_shape(T, N, C, H, repeat)
        print(f"{f'{T}, {N}, {C}, {H}':<20} {row['cudnn'] * 1e3:13.2f} {row['int8'] * 1e3:9.1f} "
              f"{row['int16'] * 1e3:9.1f} {row['every'] * 1e3:23.1f} {row['cudnn'] / row['int8']:12.3f}x", flush=True)


def time_shape(T: int, N: int, C: int, H: int, repeat: int) -> dict:
    """Median seconds of: the integers only (int8, int16), int8 with the float reference and every
    tensor's statistics, and cuDNN's float32 nn.GRU, on one haste GRU layer."""
    import torch

    from qtool.engine.cuda import run_model_cuda

    m = model(CellForm(), C, H, 1, 1)
    x = np.random.RandomState(0).randn(N, T, C).astype(np.float32)
    q8, q16 = quantized(m, x, "int8"), quantized(m, x, "int16")
    gru = torch.nn.GRU(C, H, batch_first=True).cuda()
    xt = torch.from_numpy(x).cuda()

    def cudnn():
        with torch.no_grad():
            gru(xt)
        torch.cuda.synchronize()

    return {"int8": med(lambda: run_int(q8, x, runner=run_model_cuda), repeat),
            "int16": med(lambda: run_int(q16, x, runner=run_model_cuda), repeat),
            "every": med(lambda: run_model_cuda(q8, x, EVERY_TENSOR), repeat), "cudnn": med(cudnn, repeat)}


def med(fn, repeat: int) -> float:
    """The median seconds of `repeat` runs of `fn` after a first one (compilation, caches)."""
    fn()
    return statistics.median(seconds(fn) for _ in range(repeat))


def seconds(fn) -> float:
    t0 = time.perf_counter()
    fn()
    return time.perf_counter() - t0


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--quick", action="store_true", help="tiny shapes, int8 only (numba's CUDA simulator)")
    ap.add_argument("--repeat", type=int, default=5)
    ap.add_argument("--skip-timings", action="store_true")
    ap.add_argument("--tile", type=int, help="sequences per block of the step kernels at every size (default: "
                    "the engine's sequence_tile, up to TILE_N)")
    ap.add_argument("--chunk", type=int, help="units of h staged in shared memory at a time (default: K_CHUNK)")
    a = ap.parse_args()
    import qtool.engine.cuda as engine_cuda

    # numba freezes a module's globals when it compiles a kernel: set before the first launch
    if a.tile:
        engine_cuda.TILE_N, engine_cuda.THREADS_IN_FLIGHT = a.tile, 1
    engine_cuda.K_CHUNK = a.chunk or engine_cuda.K_CHUNK
    # the f64 kernels' staged h (8 B) and float h (4 B), beside 7 KiB of statistics, in 48 KiB of shared memory
    if not (1 <= engine_cuda.TILE_N <= 32 and 1 <= engine_cuda.K_CHUNK and engine_cuda.TILE_N * engine_cuda.K_CHUNK * 12
            <= 40 * 1024):
        ap.error("--tile in 1..32 and --chunk at least 1, with tile x chunk at most 3413 (48 KiB of shared memory)")
    print(f"step kernels: {a.tile or f'up to {engine_cuda.TILE_N}'} sequences a block, h staged "
          f"{engine_cuda.K_CHUNK} units at a time")
    exactness(a.quick)
    if not a.skip_timings:
        timings(a.quick, a.repeat)


if __name__ == "__main__":
    main()
