"""Compiles qtool's CUDA kernels to PTX for real GPUs with numba-cuda, no GPU needed:
`python cuda_ptx.py SIGNATURES.json` (tests/engine/test_cuda_compile.py writes it: per launch, the
kernel's module and name and its argument types). Prints one line per kernel, signature and
target; exits 1 if any fails to compile. Run without NUMBA_ENABLE_CUDASIM."""

import importlib
import json
import sys
from types import SimpleNamespace

import numpy as np
from numba import cuda, from_dtype, types

TARGETS = [(9, 0), (7, 5)]  # Hopper, and Turing: the oldest target of CUDA 13


def numba_type(spec):
    if spec[0] == "array":
        _, dtype, ndim, layout = spec
        return types.Array(from_dtype(np.dtype(dtype)), ndim, layout)
    return getattr(types, spec[1])


def main(path: str) -> int:
    import numba.cuda.dispatcher as dispatcher

    failed = 0
    for module, name, args in json.load(open(path)):
        kernel = getattr(importlib.import_module(module), name)
        sig = tuple(numba_type(a) for a in args)
        for cc in TARGETS:
            # device functions compile for the current device's compute capability: this one
            dispatcher.get_current_device = lambda cc=cc: SimpleNamespace(compute_capability=cc)
            try:
                ptx, _ = cuda.compile_ptx(kernel.py_func, sig, cc=cc)
                ok = f".target sm_{cc[0]}{cc[1]}" in ptx
            except Exception as e:  # numba's typing and lowering errors: report them all
                ok, ptx = False, " ".join(str(e).split())[:2000]
            failed += not ok
            print(f"{'ok' if ok else 'FAILED'} {name} sm_{cc[0]}{cc[1]} {sig}" + ("" if ok else f": {ptx}"))
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1]))
