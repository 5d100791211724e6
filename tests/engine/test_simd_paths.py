"""Every SIMD path of the CPU engine (generic, AVX2, AVX-512, AVX-512 VNNI), proven on this
machine: the engine's exactness and float-reference tests rerun in a process that numba compiles
for each path below this CPU's own (qtool.engine.simd.path_env); this CPU runs them all. The
path this CPU takes is the main run's."""

import os
import subprocess
import sys

import pytest
from conftest import ROOT

from qtool.engine.simd import PATHS, path_env, simd_path

# the engine's integers against independent references (rational arithmetic, golden files), its
# float reference against numpy's, its int32 lanes against its int64 ones, its fused statistics
ENGINE_TESTS = ["test_float_reference.py", "test_integer_gru.py", "test_integer_gru_forms.py",
                "test_lanes.py", "test_fused_metrics.py"]


@pytest.mark.parametrize("path", [p for p in PATHS if p != simd_path()])
def test_engine_on_path(path):
    env = path_env(path)
    if env is None or list(PATHS).index(path) > list(PATHS).index(simd_path()):
        pytest.skip(f"this CPU cannot run the {path} path")
    env = {**os.environ, **env, "QTOOL_SIMD_PATH": path, "PYTHONDONTWRITEBYTECODE": "1"}
    done = subprocess.run([sys.executable, "-m", "pytest", "-q", "-x", "-n", "0", "-p", "no:cacheprovider",
                           *(str(ROOT / "tests" / "engine" / f) for f in ENGINE_TESTS)],
                          cwd=ROOT, env=env, capture_output=True, text=True, timeout=1200)
    assert done.returncode == 0, f"on the {path} path:\n{done.stdout[-3000:]}{done.stderr[-2000:]}"
