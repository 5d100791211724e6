"""Histogram calibration speed: qtool's kl and percentile against ONNX Runtime's
HistogramCollector (entropy, percentile) and PyTorch's HistogramObserver, on the same
activations (every traced tensor of a GRU over the same batches), collection plus threshold
search. Then a full kl calibration against one float forward pass over the same data.
A benchmark, not a test; ONNX Runtime and torch are needed here only.

    python benchmarks/bench_calibrate.py [--T 100 --N 64 --C 64 --H 256 --batches 8 --calib_N 512]
"""

from __future__ import annotations

import argparse
import contextlib
import io
import os
import platform

import numpy as np
from bench_simulate import best_of, make_case
from qtool.calibrators import KlObserver, PercentileObserver

from qtool.calibration.observe import build_quant_model, collect
from qtool.core.tensors import preset_config
from qtool.io.files import SequenceData
from qtool.numerics.float_gru import run_float


def activations(model, x, batches: int) -> dict[str, list[np.ndarray]]:
    """Every traced tensor of the float GRU, batch by batch (float32, as the engines see them)."""
    out: dict[str, list[np.ndarray]] = {}
    for xb in np.array_split(x, batches):
        traces: list = []
        run_float(model, xb, traces)
        for name, v in traces[0][0].items():
            out.setdefault(name, []).append(np.ascontiguousarray(v, np.float32))
    return out


def qtool_run(acts, cls, **kw):
    def run():
        for batches in acts.values():
            o = cls(**kw)
            for b in batches:
                o.observe(b)
            o.compute_params(8, False)
    return run


def ort_run(acts, method: str, bins: int):
    from onnxruntime.quantization.calibrate import HistogramCollector

    def run():
        c = HistogramCollector(method, False, bins, 255, 99.99, "same")
        with contextlib.redirect_stdout(io.StringIO()):  # it prints per call
            for k in range(len(next(iter(acts.values())))):
                c.collect({n: [b[k]] for n, b in acts.items()})
            c.compute_collection_result()
    return run


def torch_run(acts, bins: int):
    import torch
    from torch.ao.quantization.observer import HistogramObserver

    def run():
        for batches in acts.values():
            o = HistogramObserver(bins=bins, dtype=torch.quint8)
            for b in batches:
                o(torch.from_numpy(b))
            o.calculate_qparams()
    return run


def main() -> None:
    ap = argparse.ArgumentParser()
    for k, v in (("T", 100), ("N", 64), ("C", 64), ("H", 256), ("batches", 8), ("repeat", 3), ("calib_N", 512)):
        ap.add_argument(f"--{k}", type=int, default=v)
    ap.add_argument("--bins", type=int, default=2048, help="the peers' histogram bins (ONNX Runtime, PyTorch)")
    a = ap.parse_args()
    model, x = make_case(a)
    acts = activations(model, x, a.batches)
    values = sum(b.size for bs in acts.values() for b in bs)
    print(f"{platform.processor() or platform.machine()}, {os.cpu_count()} cores; {len(acts)} tensors, "
          f"{values / 1e6:.1f} M values in {a.batches} batches (T={a.T} N={a.N} C={a.C} H={a.H})")
    rows = [("qtool kl (8192 bins, asymmetric int8 search)", qtool_run(acts, KlObserver)),
            ("qtool percentile 99.99", qtool_run(acts, PercentileObserver, percentile=99.99))]
    try:
        rows += [(f"ONNX Runtime entropy ({a.bins} bins)", ort_run(acts, "entropy", a.bins)),
                 (f"ONNX Runtime percentile ({a.bins} bins)", ort_run(acts, "percentile", a.bins))]
    except ImportError:
        print("onnxruntime not installed: skipped")
    try:
        rows.append((f"PyTorch HistogramObserver ({a.bins} bins)", torch_run(acts, a.bins)))
    except ImportError:
        print("torch not installed: skipped")
    times = {}
    for label, fn in rows:
        times[label] = best_of(fn, a.repeat)
        print(f"{label:48s} {times[label]:8.3f} s")
    kl, pct = times[rows[0][0]], times[rows[1][0]]
    for label, t in times.items():
        if not label.startswith("qtool"):
            ref = kl if "entropy" in label or "PyTorch" in label else pct
            print(f"  qtool is {t / ref:6.1f}x faster than {label}")

    a.N = a.calib_N
    model, x = make_case(a)
    data = SequenceData(x, False, "bench")
    t_float = best_of(lambda: [run_float(model, xb) for _, xb in data.chunks(64)], a.repeat)
    t_kl = best_of(lambda: build_quant_model(model, collect(model, data, "kl"), preset_config("int8"), {},
                                             "kl"), a.repeat)
    print(f"{a.N} sequences: one float forward pass {t_float:.3f} s; full kl calibration (observe "
          f"every tensor, search, build the model) {t_kl:.3f} s = {t_kl / t_float:.2f}x the float pass")


if __name__ == "__main__":
    main()
