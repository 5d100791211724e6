"""Every CUDA kernel compiles for real GPUs. numba's simulator runs kernels that a GPU's compiler
refuses, so the argument types of every kernel launch of the CUDA engine's runs (every cell form,
the int8, w8a16, int16 and mixed grids, integers with traces and the float reference with every
statistic) and of the distributed GEMM are recorded under the simulator, and numba-cuda compiles
each kernel for each to PTX for sm_90 and sm_75 in a process without the simulator
(tests/cuda_ptx.py; no GPU needed)."""

import importlib.util
import json
import os
import subprocess
import sys

import numpy as np
import pytest
from conftest import ROOT, calibrated, random_model
from test_integer_gru import mixed_config

import qtool.engine.cuda as engine_cuda
import qtool.parallel.matmul_cuda as matmul_cuda
from qtool.core.model import CellForm, GruCell, GruModel
from qtool.engine.layout import EVERY_TENSOR, INTS

MODULES = (engine_cuda, matmul_cuda)
FORMS = [CellForm(), CellForm(reset_after=False), CellForm(gate="hard_sigmoid", gate_alpha=0.2, gate_beta=0.5,
                                                           candidate="linear")]

pytestmark = pytest.mark.skipif(os.environ.get("QTOOL_TEST_REAL_GPU") == "1", reason="records under the simulator")


def kernels(module) -> dict:
    """The module's kernels (not its device functions), by name."""
    return {k: v for k, v in vars(module).items() if hasattr(v, "py_func") and not getattr(v, "_device", True)}


def arg_type(a) -> list:
    a = getattr(a, "_ary", a)  # the simulator's device array holds a numpy array
    if isinstance(a, np.ndarray):
        layout = "C" if a.flags.c_contiguous else "F" if a.flags.f_contiguous else "A"
        return ["array", a.dtype.str, a.ndim, layout]
    if isinstance(a, (bool, np.bool_)):
        return ["scalar", "boolean"]
    if isinstance(a, (int, np.integer)):
        return ["scalar", "int64" if isinstance(a, int) else np.dtype(type(a)).name]
    if isinstance(a, (float, np.floating)):
        return ["scalar", "float64" if isinstance(a, float) else np.dtype(type(a)).name]
    raise TypeError(f"a launch argument of type {type(a).__name__}")


class Recorder:
    """Stands in for a kernel: records each launch's argument types, then launches it."""

    def __init__(self, module, name, kernel, seen: set):
        self.module, self.name, self.kernel, self.seen = module.__name__, name, kernel, seen

    def __getitem__(self, config):
        launch = self.kernel[config]

        def run(*args):
            self.seen.add(json.dumps([self.module, self.name, [arg_type(a) for a in args]]))
            return launch(*args)

        return run


def _launches(monkeypatch) -> list:
    seen: set = set()
    for module in MODULES:
        for name, kernel in kernels(module).items():
            monkeypatch.setattr(module, name, Recorder(module, name, kernel, seen))
    rng = np.random.RandomState(0)
    for form in FORMS:
        base = random_model(C=3, H=3, layers=1, dirs=1, seed=1)
        model = GruModel([[GruCell(c.W, c.R, c.bx, c.br, form) for c in cells] for cells in base.layers])
        for preset in ("int8", "w8a16", "int16", "mixed"):
            qm = calibrated(model, rng.randn(4, 3, 3).astype(np.float32), "int8" if preset == "mixed" else preset,
                            config=mixed_config() if preset == "mixed" else None)
            x = rng.randn(2, 2, 3).astype(np.float32)
            engine_cuda.run_model_cuda(qm, x, INTS, traces=[])
            engine_cuda.run_model_cuda(qm, x, EVERY_TENSOR)
    gemm = matmul_cuda.CudaGemm(rng.randint(-127, 128, (5, 4)).astype(np.int8), np.ones(4, np.float32))
    gemm(rng.randint(-127, 128, (3, 5)).astype(np.int8), np.ones(3, np.float32))
    return [json.loads(s) for s in sorted(seen)]


@pytest.mark.skipif(importlib.util.find_spec("numba_cuda") is None,
                    reason='numba-cuda is not installed (pip install "qtool[cuda]")')
def test_every_kernel_launch_compiles_for_real_gpus(monkeypatch, tmp_path):
    launches = _launches(monkeypatch)
    launched = {(m, n) for m, n, _ in launches}
    for module in MODULES:
        for name in kernels(module):
            assert (module.__name__, name) in launched, f"{name} was never launched"
    path = tmp_path / "launches.json"
    path.write_text(json.dumps(launches))
    env = {k: v for k, v in os.environ.items() if k != "NUMBA_ENABLE_CUDASIM"}
    env["PYTHONPATH"] = os.pathsep.join([str(ROOT), *filter(None, [env.get("PYTHONPATH")])])  # this qtool
    done = subprocess.run([sys.executable, str(ROOT / "tests" / "cuda_ptx.py"), str(path)], cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=900)
    lines = done.stdout.splitlines()
    assert done.returncode == 0 and len(lines) == 2 * len(launches), done.stdout[-4000:] + done.stderr[-3000:]
