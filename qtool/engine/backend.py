"""Which engine runs a simulation (--backend auto|cpu|cuda). Only a GPU run imports numba.cuda:
`auto` looks for a CUDA driver library first and stays on the CPU without one."""

from __future__ import annotations

import ctypes.util
import os

from qtool.errors import QtoolError


def _no_gpu() -> str | None:
    """Why there is surely no GPU to use, found without importing numba.cuda; None when there may be."""
    if os.environ.get("NUMBA_ENABLE_CUDASIM", "0") not in ("", "0"):
        return "the numba CUDA simulator is enabled (NUMBA_ENABLE_CUDASIM=1)"
    if not (os.environ.get("NUMBA_CUDA_DRIVER") or ctypes.util.find_library("cuda")):
        return "no CUDA driver or GPU found"
    return None


def select_backend(backend: str):
    """(runner, backend, why) for --backend auto|cpu|cuda: the engine's run_model, its name
    ("cpu" or "cuda") and why it was chosen (the GPU's name, or why there is none)."""
    from qtool.engine.cpu import run_model

    if backend == "cpu":
        return run_model, "cpu", "asked for"
    if backend not in ("auto", "cuda"):
        raise QtoolError(f"unknown backend '{backend}' (use auto, cpu or cuda)")
    if backend == "auto" and (why := _no_gpu()):
        return run_model, "cpu", why
    from numba import config

    from qtool.engine.cuda import cuda_usable, run_model_cuda

    usable, why = cuda_usable()
    if backend == "cuda":
        if usable or config.ENABLE_CUDASIM:  # the simulator runs the real kernels, slowly
            return run_model_cuda, "cuda", why if usable else "numba CUDA simulator"
        raise QtoolError(f"`backend` cuda: no usable GPU: {why}")
    return (run_model_cuda, "cuda", why) if usable else (run_model, "cpu", why)
