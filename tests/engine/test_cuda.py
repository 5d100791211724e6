"""The numba.cuda engine equals the CPU engine, every element of every tensor of every step.
Runs under numba's CUDA simulator (small shapes) unless QTOOL_TEST_REAL_GPU=1."""

import json
import os
import subprocess
import sys

import numpy as np
import pytest
from conftest import SAMPLES, calibrated, has, random_model
from test_integer_gru import mixed_config

from qtool.engine.backend import select_backend
from qtool.engine.cpu import run_int
from qtool.engine.cuda import run_model_cuda


@pytest.mark.parametrize("preset", ["int8", "w8a16", "int16", "mixed"])
@pytest.mark.parametrize("layers,dirs", [(1, 1), (2, 2)])
def test_cuda_equals_cpu_every_tensor(preset, layers, dirs):
    model = random_model(C=5, H=4, layers=layers, dirs=dirs, seed=layers + dirs)
    rng = np.random.RandomState(11)
    qm = calibrated(model, rng.randn(8, 6, 5).astype(np.float32),
                    "int8" if preset == "mixed" else preset,
                    config=mixed_config() if preset == "mixed" else None)
    x = rng.randn(3, 4, 5).astype(np.float32) * 1.3
    tr_cpu, tr_gpu, f_cpu, f_gpu = [], [], [], []
    y_cpu = run_int(qm, x, tr_cpu, f_cpu)
    y_gpu = run_int(qm, x, tr_gpu, f_gpu, runner=run_model_cuda)
    assert np.array_equal(y_cpu, y_gpu)
    for a, b in zip(f_cpu, f_gpu):
        assert np.array_equal(a, b)
    for l in range(layers):
        for d in range(dirs):
            for key in ("x", "Wx", "cell"):
                mismatches = np.count_nonzero(tr_cpu[l][d][key] != tr_gpu[l][d][key])
                assert mismatches == 0, (l, d, key)


@pytest.mark.skipif(os.environ.get("QTOOL_TEST_REAL_GPU") == "1", reason="a real GPU, not the simulator")
def test_backend_selection_under_simulator():
    runner, label, why = select_backend("auto")
    assert label == "cpu" and "simulator" in why  # auto never picks the simulator
    runner, label, why = select_backend("cuda")
    assert runner is run_model_cuda and label == "cuda" and "simulator" in why


@pytest.mark.skipif(not has("safetensors"), reason="the sample is .safetensors")
def test_cli_simulate_cuda_matches_cpu(cli, tmp_path):
    q = tmp_path / "q.h5"
    code, _, err = cli("calibrate", SAMPLES / "digits_gru.safetensors", SAMPLES / "calib.npy", "-o", q,
                       "--method", "minmax")
    assert code == 0, err
    outs = {}
    for backend in ("cpu", "cuda"):
        code, out, err = cli("simulate", q, SAMPLES / "test.npy", "--limit", "1", "--backend", backend,
                             "--json", "--no-per-tensor", "--save", tmp_path / f"{backend}.h5")
        assert code == 0, err
        outs[backend] = json.loads(out)
    assert outs["cuda"]["backend"].startswith("cuda")
    import h5py

    with h5py.File(tmp_path / "cpu.h5") as a, h5py.File(tmp_path / "cuda.h5") as b:
        assert np.array_equal(a["quant/y_int"][()], b["quant/y_int"][()])


@pytest.mark.skipif(not has("safetensors"), reason="the sample is .safetensors")
def test_cuda_without_gpu_is_a_clear_error(tmp_path):
    env = dict(os.environ, NUMBA_ENABLE_CUDASIM="0")
    res = subprocess.run([sys.executable, "-m", "qtool.cli", "simulate", str(tmp_path / "q.h5"),
                          str(SAMPLES / "test.npy"), "--backend", "cuda"],
                         capture_output=True, text=True, env=env)
    from qtool.engine.cuda import cuda_usable

    if cuda_usable()[0]:
        pytest.skip("a GPU is present")
    assert res.returncode == 2 and "no usable GPU" in res.stderr and "Traceback" not in res.stderr


def test_a_usable_gpu_is_found_without_printing(monkeypatch, capsys):
    """On a real GPU, numba's cuda.detect() printed the device list on stdout, into `simulate
    --json`'s output; the check asks the driver without it."""
    from types import SimpleNamespace

    import qtool.engine.cuda as engine_cuda

    fake = SimpleNamespace(is_available=lambda: True, detect=lambda: print("Found 1 CUDA devices") or True,
                           get_current_device=lambda: SimpleNamespace(name=b"NVIDIA H100 80GB HBM3"))
    monkeypatch.setattr(engine_cuda, "cuda", fake)
    monkeypatch.setattr("numba.config.ENABLE_CUDASIM", False)
    assert engine_cuda.cuda_usable() == (True, "NVIDIA H100 80GB HBM3")
    assert capsys.readouterr().out == ""
