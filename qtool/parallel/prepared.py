"""The right-hand operand of qtool.parallel.matmul's GEMM, checked and ready for a backend (the
CPU's in matmul.py, the GPU's in matmul_cuda.py)."""

from __future__ import annotations

import numpy as np

from qtool.engine.layout import gemm_bound


def describe(x) -> str:
    return f"{getattr(x, 'dtype', type(x).__name__)} {list(np.shape(x))}"


class Prepared:
    """b [K, N] and channel_scale [N] ready for the GEMM: `prepare(b, channel_scale)` once, then
    pass it as `b` (and None as channel_scale) to every call that multiplies by the same b."""

    backend = ""

    def __init__(self, b: np.ndarray, channel_scale: np.ndarray):
        if not (isinstance(b, np.ndarray) and b.dtype == np.int8 and b.ndim == 2):
            raise ValueError(f"b must be an int8 array [K, N], got {describe(b)}")
        if not (isinstance(channel_scale, np.ndarray) and channel_scale.dtype == np.float32
                and channel_scale.shape == (b.shape[1],)):
            raise ValueError(f"channel_scale must be float32 [{b.shape[1]}], got {describe(channel_scale)}")
        self.wide = b.T.astype(np.int32)  # [N, K], widened: |-128| must count as 128 in the bounds
        if gemm_bound(self.wide, 8) >= 2**31:
            raise ValueError("int32 sums could overflow: sum_k |b[k, n]| * 128 reaches 2^31 for some column n")
        self.K, self.N = b.shape
        self.channel_scale = np.ascontiguousarray(channel_scale)
