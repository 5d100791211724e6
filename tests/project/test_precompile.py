"""An installed qtool (`pip install .`, not editable) carries its CPU kernels compiled for the
machine that built it (setup.py runs qtool/install/precompile.py): the README's commands compile nothing."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import SAMPLES


def _env() -> dict:
    return {k: v for k, v in os.environ.items() if k not in ("NUMBA_CACHE_DIR", "PYTHONPATH", "NUMBA_ENABLE_CUDASIM")}


def _installed() -> dict:
    """The installed distribution as a process outside the source tree sees it (inside, the
    tree's own qtool and egg-info come first)."""
    probe = ("import importlib.metadata as m, json\n"
             "try:\n d = m.distribution('qtool')\n"
             "except m.PackageNotFoundError:\n print('{}'); raise SystemExit\n"
             "url = json.loads(d.read_text('direct_url.json') or '{}')\n"
             "print(json.dumps({'editable': url.get('dir_info', {}).get('editable', False),"
             " 'files': [str(f) for f in d.files or []]}))")
    out = subprocess.run([sys.executable, "-c", probe], cwd="/", env=_env(), capture_output=True, text=True)
    return json.loads(out.stdout or "{}")


INSTALLED = _installed()
FILES = INSTALLED.get("files", [])
pytestmark = pytest.mark.skipif(
    not FILES or INSTALLED.get("editable") or os.environ.get("QTOOL_PRECOMPILE") == "0",
    reason="qtool is not installed from a wheel here (an editable install compiles on first use)")


def _run_installed(args: list[str], cwd: Path) -> subprocess.CompletedProcess:
    """The installed console script, outside the source tree, numba saying what it caches."""
    env = {**_env(), "NUMBA_DEBUG_CACHE": "1"}
    qtool = Path(sys.executable).with_name("qtool")
    return subprocess.run([str(qtool), *args], cwd=cwd, env=env, capture_output=True, text=True, timeout=300)


def test_the_wheel_carries_numba_caches():
    assert any(f.endswith(".nbi") for f in FILES if f.startswith("qtool/engine/__pycache__/"))
    assert any(f.endswith(".nbc") for f in FILES if f.startswith("qtool/calibrators/__pycache__/"))


def test_one_package_and_no_generic_top_level_names():
    """calibrators/ and exporters/ install inside qtool; nothing else lands at the top of site-packages."""
    tops = {f.split("/")[0] for f in FILES if "/" in f and not f.split("/")[0].endswith((".dist-info", ".egg-info"))}
    assert tops == {"qtool"} or tops <= {"qtool", ".."}, tops  # ".." : the console script in bin/
    assert any(f.startswith("qtool/exporters/c_runtime/") and f.endswith(".h") for f in FILES)
    probe = "import importlib.util as u; print(u.find_spec('calibrators'), u.find_spec('exporters'))"
    out = subprocess.run([sys.executable, "-c", probe], cwd="/", env=_env(), capture_output=True, text=True)
    assert out.stdout.split() == ["None", "None"], out.stdout + out.stderr


def test_the_readme_commands_compile_nothing_after_install(tmp_path):
    q = tmp_path / "q.h5"
    cal = _run_installed(["calibrate", str(SAMPLES / "digits_gru.safetensors"), str(SAMPLES / "calib.npy"),
                          "-o", str(q), "--limit", "64"], tmp_path)
    assert cal.returncode == 0, cal.stderr
    sim = _run_installed(["simulate", str(q), str(SAMPLES / "test.npy"), "--limit", "64", "--mode", "both"],
                         tmp_path)
    assert sim.returncode == 0, sim.stderr
    for run in (cal, sim):
        log = run.stdout + run.stderr
        assert "data loaded from" in log  # the cache is read ...
        assert "data saved to" not in log, [ln for ln in log.splitlines() if "saved" in ln]  # ... not written
        assert "first run: compiling" not in log
