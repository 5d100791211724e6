"""The GEMM and dequantization epilogue of qtool.parallel.matmul on the GPU (numba.cuda); the
gather stays on the host. One thread per output element sums its K products exactly (the
caller proved |C| < 2^31), stores C and then D = float32(C) * token_scale[m] * channel_scale[n]
rounded to float16 on the store (round to nearest even, as numpy's astype)."""

from __future__ import annotations

import numpy as np
from numba import cuda

from qtool.parallel.prepared import Prepared

THREADS = (16, 16)


@cuda.jit
def gemm_dequant_kernel(a, b, token_scale, channel_scale, acc, d):
    m, n = cuda.grid(2)
    if m < a.shape[0] and n < b.shape[1]:
        s = np.int32(0)
        for k in range(a.shape[1]):
            s += np.int32(a[m, k]) * np.int32(b[k, n])
        acc[m, n] = s
        d[m, n] = np.float32(s) * token_scale[m] * channel_scale[n]


class CudaGemm(Prepared):
    """Holds b and the channel scales on the device; each call copies one stage of rows in."""

    backend = "cuda"

    def __init__(self, b: np.ndarray, channel_scale: np.ndarray):
        super().__init__(b, channel_scale)
        del self.wide
        self.b = cuda.to_device(np.ascontiguousarray(b))
        self.device_scale = cuda.to_device(self.channel_scale)

    def __call__(self, rows: np.ndarray, token_scale: np.ndarray, poll=None) -> tuple[np.ndarray, np.ndarray]:
        M, N = rows.shape[0], self.N
        acc = cuda.device_array((M, N), np.int32)
        d = cuda.device_array((M, N), np.float16)
        grid = (-(-M // THREADS[0]), -(-N // THREADS[1]))
        gemm_dequant_kernel[grid, THREADS](cuda.to_device(np.ascontiguousarray(rows)), self.b,
                                           cuda.to_device(np.ascontiguousarray(token_scale)),
                                           self.device_scale, acc, d)
        done = cuda.event()
        done.record()
        # the launch returns at once: the host lets MPI progress the next gather until the
        # kernel or the gather is done (numba's simulator runs kernels at once, has no query)
        while poll is not None and hasattr(done, "query") and not done.query():
            if poll():
                break
        return acc.copy_to_host(), d.copy_to_host()
