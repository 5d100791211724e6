"""Every benchmark script runs, in a small smoke mode, so that none can rot unseen (the README
quotes their figures): each is started as a user starts it, with tiny sizes, and must end with exit
code 0. Scripts whose tools are missing here (PyTorch, Keras, the Cortex-M toolchain, mpiexec)
are skipped. The figures themselves are measured by running the scripts, not by these tests."""

import os
import shutil
import subprocess
import sys

import pytest
from conftest import ROOT, has

TINY = ["--T", "4", "--N", "8", "--C", "4", "--H", "8"]
# script, arguments, what it needs
SMOKE = [
    ("bench_simulate.py", [*TINY, "--repeat", "1"], ["torch"]),
    ("bench_calibrate.py", [*TINY, "--batches", "2", "--repeat", "1", "--calib_N", "16", "--bins", "512"], ["torch"]),
    ("bench_graph.py", ["--N", "8", "--T", "4", "--C", "4", "--F", "8", "--H", "8", "--repeat", "1"], []),
    ("bench_import.py", ["--C", "4", "--H", "8", "--layers", "1", "--repeat", "1"], ["torch", "keras", "onnx"]),
    ("bench_c.py", ["--model", "sample", "--steps", "4"], ["gcc"]),
    ("bench_c.py", ["--model", "whole-sample", "--steps", "4"], ["gcc", "onnx", "arm-none-eabi-gcc"]),
    ("bench_dist.py", ["cli", "--ranks", "2", "--runs", "1", "--N", "16", "--T", "4", "--C", "4", "--H", "8"],
     ["mpiexec"]),
    ("gpu_check.py", ["--quick", "--skip-timings"], []),
    ("auto_vs_single.py", ["--models", "digits (sample)", "--presets", "int8", "--json", "{tmp}/a.json"],
     ["safetensors"]),
    ("bench_advise.py", ["--models", "digits (sample)", "--repeat", "1", "--targets", "30", "--limit", "64", "--json",
                         "{tmp}/b.json"], ["safetensors"]),
    ("advise_threshold.py", ["--models", "digits (sample)", "--json", "{tmp}/t.json"], ["safetensors"]),
    ("advise_models.py", ["--out", "{tmp}/models", "--models", "rand-1x32-gauss,trained-3x64-laplace"], ["torch"]),
    ("bench_cold_start.py", ["--repeat", "1", "--no-precompile"], ["git", "safetensors"]),
]


def available(need: str) -> bool:
    return shutil.which(need) is not None if need in ("gcc", "arm-none-eabi-gcc", "mpiexec", "git") else has(need)


@pytest.mark.parametrize("script, args, needs", SMOKE, ids=[f"{s}:{a[1] if len(a) > 1 else ''}" for s, a, _ in SMOKE])
def test_benchmark_runs(script, args, needs, tmp_path):
    missing = [n for n in needs if not available(n)]
    if missing:
        pytest.skip(f"needs {', '.join(missing)}")
    env = {**os.environ, "KERAS_BACKEND": "torch", "NUMBA_ENABLE_CUDASIM": "1", "PYTHONPATH": str(ROOT)}
    done = subprocess.run([sys.executable, str(ROOT / "benchmarks" / script), *(a.format(tmp=tmp_path) for a in args)],
                          cwd=tmp_path, env=env, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, f"{script}: {done.stdout[-2000:]}{done.stderr[-3000:]}"
