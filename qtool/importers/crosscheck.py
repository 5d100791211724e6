"""After an import: run a few random sequences through the source framework's own GRU and through
qtool's float reference, and refuse the model if they disagree (a wrong import must never pass
silently).

The framework runs the file as it reads it (its own parameter names, gate order, activations and
layer order), so the check is independent of how qtool interpreted the file.
"""

from __future__ import annotations

import time

import numpy as np

from qtool.core.model import GruModel
from qtool.errors import QtoolError
from qtool.importers.checks import framework_run, reason, rounding_spread, wrong_import
from qtool.numerics.float_gru import run_float

SEQUENCES, STEPS = 3, 8
# float32 GEMMs of different libraries round differently; a misread file differs by 1e-1..1
TOLERANCE = 1e-4


def cross_check(model: GruModel, stack, where: str) -> dict:
    """Compare `model` with `stack.run_source`; returns what was checked, raises when they differ."""
    if stack.run_source is None:
        return {"checked": False, "reason": "weights only: no framework to check against"}
    x = np.random.default_rng(0).standard_normal((SEQUENCES, STEPS, model.input_size)).astype(np.float32)
    t0 = time.perf_counter()
    try:
        with framework_run():
            want = np.asarray(stack.run_source(x), np.float32)
    except ImportError as e:
        missing = f"no module {e.name!r}" if e.name else str(e)
        return {"checked": False, "reason": f"{stack.framework} cannot be imported ({missing})"}
    except QtoolError:
        raise
    except Exception as e:  # the framework refused the file qtool accepted: say so, in one line
        raise QtoolError(f"{where}: {stack.framework} cannot run this GRU ({reason(e)})") from None
    got = run_float(model, x)
    if want.shape != got.shape:
        raise QtoolError(f"{where}: {stack.framework} gives outputs of shape {want.shape}, qtool's "
                         f"import {got.shape}; the file was not read as the framework reads it")
    diff = float(np.abs(want - got).max())
    if not diff <= TOLERANCE:
        raise wrong_import(f"{where}: the imported GRU differs from {stack.framework} by up to {diff:.3g} "
                           f"on random inputs (tolerance {TOLERANCE:g})", TOLERANCE,
                           rounding_spread(lambda v: {"y": run_float(model, v["x"])}, {"x": x}))
    return {"checked": True, "framework": stack.framework, "max_abs_diff": diff,
            "sequences": SEQUENCES, "steps": STEPS, "seconds": round(time.perf_counter() - t0, 3)}


def describe(check: dict | None) -> str:
    """One line for the `import` command: what the model was checked against and how closely."""
    if check is None:
        return "not checked against the source framework (`check=False`)"
    if not check["checked"]:
        return f"not checked against the source framework: {check['reason']}"
    note = f"; note: {check['note']}" if check.get("note") else ""
    if check.get("fake_quant_pairs"):
        note += (f"; its {check['fake_quant_pairs']} fake quantizer(s) on the data run as their float functions "
                 "(the identity, or a relu where one clips at 0)")
    n = check['sequences']
    if check.get("frame_by_frame"):
        note = f" (the file run a call at a time, its caches fed back){note}"
    return (f"matches {check['framework']} on {n} random sequence{'s' if n != 1 else ''} x {check['steps']} steps: "
            f"max abs difference {check['max_abs_diff']:.2g} ({check['seconds']:.2f} s){note}")
