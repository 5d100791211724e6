"""Compile the CPU kernels ahead of the first run and leave them in numba's cache.

numba compiles a kernel the first time it is called with new argument types (about 25 s for
everything `calibrate` and `simulate` use, on a 2-core machine). The wheel build runs this
module on the freshly built package (setup.py's `build_py`), so that an installed qtool starts
from a warm cache, and `qtool precompile` does the same for an existing installation (an
editable one, a Docker image). numba keys the cache by numba's version, the CPU and the source
files' contents (their modification times in older numba, which an install changes): where any
differs, numba ignores it and compiles as before.

The kernels are compiled by running the pipeline itself on small random models, so exactly the
type signatures the commands use are compiled: calibration by every method, the integer and
the float engines, the fake-quant view, in the lane types each preset leads to. Other mixes
of 8- and 16-bit tensors (bits files, the advisor's search) compile on first use.
"""

from __future__ import annotations

from qtool.api import PRESETS, precompile

__all__ = ["PRESETS", "precompile"]

if __name__ == "__main__":
    print(f"precompiled in {precompile(say=print):.1f} s")
