"""`precompile`: the CPU kernels compiled into numba's cache (what `pip install` does)."""

from __future__ import annotations

from collections.abc import Callable

import numpy as np

from qtool.api.advice import advise
from qtool.api.calibration import calibrate
from qtool.api.simulation import simulate
from qtool.core.model import GruModel


def needs_compile() -> bool:
    """Whether the CPU engine's kernels are not in numba's cache yet (the first run compiles them)."""
    from qtool.engine.cpu import needs_compile as missing

    return missing()


PRESETS = ("int8", "w8a16", "int16")  # what precompile compiles for (qtool/install/precompile.py)


def _precompile_model(layers: int, dirs: int, seed: int):
    from qtool.core.model import GruCell

    rng = np.random.default_rng(seed)
    C, H = 4, 8
    cells = [[GruCell(rng.normal(0, 0.5, (3 * H, C if l == 0 else H * dirs)), rng.normal(0, 0.5, (3 * H, H)),
                      rng.normal(0, 0.3, 3 * H), rng.normal(0, 0.3, 3 * H)) for _ in range(dirs)]
             for l in range(layers)]
    return GruModel(cells, name=f"precompile-{layers}x{dirs}")


def precompile(presets: tuple[str, ...] = PRESETS, say: Callable[[str], None] = lambda s: None) -> float:
    """Compile the CPU kernels into numba's cache (qtool/install/precompile.py says why): run
    calibrate (auto, every method) and simulate (integer and fake-quant) once per preset on a
    stacked and a bidirectional random GRU, and with every preset the advisor's table; returns
    the seconds it took."""
    import time

    presets = tuple(dict.fromkeys(presets))  # `--preset int8 --preset int8`: once
    t0 = time.perf_counter()
    x = np.random.default_rng(0).normal(0, 1, (16, 6, 4)).astype(np.float32)
    for preset in presets:
        t = time.perf_counter()
        for layers, dirs in ((2, 1), (1, 2)):
            qm = calibrate(_precompile_model(layers, dirs, seed=layers), x, bits=preset, method="auto")
            simulate(qm, x, backend="cpu", mode="both")
        say(f"{preset}: {time.perf_counter() - t:.1f} s")
    if set(presets) == set(PRESETS):  # the advisor's noise model and observers; a search's mixed
        t = time.perf_counter()      # 8/16-bit candidates (W int8 with R int16, ...) compile when met
        advise(_precompile_model(2, 1, seed=2), x, x)
        say(f"advise: {time.perf_counter() - t:.1f} s")
    return time.perf_counter() - t0
