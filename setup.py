"""Builds qtool with its CPU kernels compiled: after `build_py` has copied the package, numba
compiles them into the package's own cache (qtool/install/precompile.py), which the wheel carries, so
the first `qtool` command after `pip install .` need not compile. The cache is valid only on a
CPU like the one that built it; elsewhere numba ignores it. QTOOL_PRECOMPILE=0 skips this."""

import os
import subprocess
import sys

from setuptools import find_packages, setup
from setuptools.command.build_py import build_py


class BuildPyWithKernels(build_py):
    def run(self) -> None:
        super().run()
        if getattr(self, "editable_mode", False) or os.environ.get("QTOOL_PRECOMPILE", "1") == "0":
            return
        env = {k: v for k, v in os.environ.items() if k != "NUMBA_CACHE_DIR"}
        # pip's isolated build environment is on PYTHONPATH: keep it, the built package first
        path = [os.path.abspath(self.build_lib)] + [p for p in env.get("PYTHONPATH", "").split(os.pathsep) if p]
        env.update(PYTHONPATH=os.pathsep.join(path), PYTHONDONTWRITEBYTECODE="1")
        print("compiling qtool's CPU kernels (numba, about a minute)", flush=True)
        done = subprocess.run([sys.executable, "-m", "qtool.install.precompile"], env=env, cwd=self.build_lib)
        if done.returncode:  # the package works without the cache: it compiles on first use instead
            print("qtool: precompiling failed; the kernels will be compiled on first use", file=sys.stderr)


# the repository's top level (qtool/, calibrators/, exporters/) installs as one package
PARTS = {"qtool.calibrators": "calibrators", "qtool.exporters": "exporters"}
PACKAGES = find_packages(include=["qtool", "qtool.*"]) + [
    f"{name}{sub[len(folder):]}" for name, folder in PARTS.items()
    for sub in [folder, *(f"{folder}.{p}" for p in find_packages(folder))]]

setup(cmdclass={"build_py": BuildPyWithKernels}, packages=PACKAGES, package_dir=PARTS)
