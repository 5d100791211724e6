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

import time
from collections.abc import Callable

import numpy as np

PRESETS = ("int8", "w8a16", "int16")


def _model(layers: int, dirs: int, seed: int):
    from qtool.model import GruCell, GruModel

    rng = np.random.default_rng(seed)
    C, H = 4, 8
    cells = [[GruCell(rng.normal(0, 0.5, (3 * H, C if l == 0 else H * dirs)), rng.normal(0, 0.5, (3 * H, H)),
                      rng.normal(0, 0.3, 3 * H), rng.normal(0, 0.3, 3 * H)) for _ in range(dirs)]
             for l in range(layers)]
    return GruModel(cells, name=f"precompile-{layers}x{dirs}")


def precompile(presets: tuple[str, ...] = PRESETS, say: Callable[[str], None] = lambda s: None) -> float:
    """Run calibrate (auto, every method) and simulate (integer and fake-quant) once per preset on
    a stacked and a bidirectional random GRU, and with every preset the advisor's table; returns
    the seconds it took."""
    import qtool

    presets = tuple(dict.fromkeys(presets))  # `--preset int8 --preset int8`: once
    t0 = time.perf_counter()
    x = np.random.default_rng(0).normal(0, 1, (16, 6, 4)).astype(np.float32)
    for preset in presets:
        t = time.perf_counter()
        for layers, dirs in ((2, 1), (1, 2)):
            qm = qtool.calibrate(_model(layers, dirs, seed=layers), x, bits=preset, method="auto")
            qtool.simulate(qm, x, backend="cpu", mode="both")
        say(f"{preset}: {time.perf_counter() - t:.1f} s")
    if set(presets) == set(PRESETS):  # the advisor's noise model and observers; a search's mixed
        t = time.perf_counter()      # 8/16-bit candidates (W int8 with R int16, ...) compile when met
        qtool.advise(_model(2, 1, seed=2), x, x)
        say(f"advise: {time.perf_counter() - t:.1f} s")
    return time.perf_counter() - t0


if __name__ == "__main__":
    print(f"precompiled in {precompile(say=print):.1f} s")
