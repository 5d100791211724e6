"""The dequantization epilogue on the CPU: D = float16(float32(C) * token_scale[m] *
channel_scale[n]) in one numba pass. numba has no float16 on the CPU, so the rounding to
float16 is done on the bits, as numpy's npy_floatbits_to_halfbits does it (round to nearest,
ties to even; overflow to inf; subnormals; NaN stays NaN): the result is bit-identical to
numpy's `.astype(np.float16)`, which the tests check on every exponent and rounding case."""

from __future__ import annotations

import numpy as np
from numba import njit, prange
from numba.extending import register_jitable


@register_jitable(inline="always")
def f32_to_f16_bits(f: np.uint32) -> np.uint16:
    """The float16 bit pattern nearest to the float32 with bit pattern f."""
    f = np.uint32(f)
    h_sgn = (f & np.uint32(0x80000000)) >> np.uint32(16)
    f_exp = f & np.uint32(0x7F800000)
    if f_exp >= np.uint32(0x47800000):  # beyond float16's range, inf or NaN
        f_sig = f & np.uint32(0x007FFFFF)
        if f_exp == np.uint32(0x7F800000) and f_sig != 0:
            h = np.uint32(0x7C00) + (f_sig >> np.uint32(13))
            return np.uint16(h_sgn + (h + np.uint32(1) if h == np.uint32(0x7C00) else h))  # stays NaN
        return np.uint16(h_sgn + np.uint32(0x7C00))
    if f_exp <= np.uint32(0x38000000):  # float16 subnormal or zero
        if f_exp < np.uint32(0x33000000):
            return np.uint16(h_sgn)
        e = f_exp >> np.uint32(23)
        f_sig = (np.uint32(0x00800000) + (f & np.uint32(0x007FFFFF))) >> (np.uint32(113) - e)
        # ties to even; the shift may have dropped up to 11 low bits, so look at them in f
        if (f_sig & np.uint32(0x3FFF)) != np.uint32(0x1000) or (f & np.uint32(0x7FF)) != 0:
            f_sig += np.uint32(0x1000)
        return np.uint16(h_sgn + (f_sig >> np.uint32(13)))
    h_exp = (f_exp - np.uint32(0x38000000)) >> np.uint32(13)
    f_sig = f & np.uint32(0x007FFFFF)
    if (f_sig & np.uint32(0x3FFF)) != np.uint32(0x1000):
        f_sig += np.uint32(0x1000)
    return np.uint16(h_sgn + h_exp + (f_sig >> np.uint32(13)))  # a carry rounds up the exponent


@njit(cache=True)
def halves(x: np.ndarray, out: np.ndarray) -> None:
    """out (uint16) = the float16 bits of float32 x, element by element."""
    bits = x.ravel().view(np.uint32)
    flat = out.ravel()
    for i in range(bits.size):
        flat[i] = f32_to_f16_bits(bits[i])


@njit(parallel=True, cache=True)
def dequantize_rows(acc, token_scale, channel_scale, c_out, d_bits) -> None:
    """c_out[m, n] = acc[m, n] (the exact sums, as int32 C), and d_bits[m, n] = the float16
    bits of float32(C) * token_scale[m] * channel_scale[n] (two float32 products, in order)."""
    M, N = c_out.shape
    for m in prange(M):
        row = np.empty(N, np.float32)
        for n in range(N):
            c = np.int32(acc[m, n])
            c_out[m, n] = c
            row[n] = np.float32(c) * token_scale[m] * channel_scale[n]
        bits = row.view(np.uint32)
        for n in range(N):
            d_bits[m, n] = f32_to_f16_bits(bits[n])
