"""The README's sample command as a new user runs it: a fresh clone, a fresh virtual environment,
`pip install ".[safetensors]"`, then the first `qtool calibrate` and `qtool simulate` (numba
compiles the kernels: its cache is empty) and the same two commands again (from the cache).

    python benchmarks/bench_cold_start.py [--repeat 3] [--repo .] [--no-precompile]

The install compiles the CPU kernels into the package (setup.py, qtool/install/precompile.py);
`--no-precompile` installs with QTOOL_PRECOMPILE=0, so the first commands compile them.

Every step runs in its own process; the table gives the median (range) of wall and CPU time
(user + system of the step's processes) over the repeats, and the load average of the machine
before each repeat (on a shared machine the CPU time says more than the wall time).
Needs network access (or pip's cache) for the install, as the README's command does.
"""

from __future__ import annotations

import argparse
import os
import resource
import statistics
import subprocess
import tempfile
import time
from pathlib import Path

CALIBRATE = "qtool calibrate samples/digits_gru.safetensors samples/calib.npy -o out/digits_int8.h5 --force"
SIMULATE = "qtool simulate out/digits_int8.h5 samples/test.npy"
STEPS = [("pip install", 'pip install -q ".[safetensors]"'), ("first calibrate", CALIBRATE),
         ("first simulate", SIMULATE), ("calibrate again", CALIBRATE), ("simulate again", SIMULATE)]


def timed(cmd: str, cwd: Path) -> tuple[float, float]:
    """Wall and CPU seconds of one shell command run in the clone's virtual environment."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    t0 = time.perf_counter()
    subprocess.run(f". .venv/bin/activate && {cmd}", shell=True, cwd=cwd, check=True,
                   stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, executable="/bin/bash")
    wall = time.perf_counter() - t0
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    return wall, (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)


def one_run(repo: Path, precompile: bool) -> dict[str, tuple[float, float]]:
    with tempfile.TemporaryDirectory() as tmp:
        clone = Path(tmp) / "qtool"
        subprocess.run(["git", "clone", "-q", str(repo), str(clone)], check=True)
        env_free = {k: v for k, v in os.environ.items() if k not in ("NUMBA_CACHE_DIR", "VIRTUAL_ENV")}
        subprocess.run(["python3", "-m", "venv", ".venv"], cwd=clone, check=True, env=env_free)
        os.environ.pop("NUMBA_CACHE_DIR", None)  # numba caches in the installed package
        os.environ["QTOOL_PRECOMPILE"] = "1" if precompile else "0"
        return {name: timed(cmd, clone) for name, cmd in STEPS}


def summary(v: list[float]) -> str:
    return f"{statistics.median(v):6.1f} ({min(v):.1f}-{max(v):.1f})"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--repo", type=Path, default=Path(__file__).resolve().parents[1])
    ap.add_argument("--no-precompile", action="store_true", help="install without compiling the kernels")
    a = ap.parse_args()
    runs, loads = [], []
    for _ in range(a.repeat):
        loads.append(os.getloadavg()[0])
        runs.append(one_run(a.repo, not a.no_precompile))
    print(f"README sample command, fresh clone and venv{', no precompile' if a.no_precompile else ''}; "
          f"{os.cpu_count()} CPUs; load average before "
          f"each repeat: {', '.join(f'{x:.1f}' for x in loads)}; median (range) of {a.repeat}")
    print(f"{'step':<18} {'wall s':>20} {'CPU s':>20}")
    for name, _ in STEPS:
        print(f"{name:<18} {summary([r[name][0] for r in runs]):>20} {summary([r[name][1] for r in runs]):>20}")


if __name__ == "__main__":
    main()
