"""The float reference's own exp and floor (qtool.engine.float_cell): written out because numba.cuda has
neither the C library's expf nor np.floor on the device."""

import numpy as np
from numba import njit

from qtool.engine.float_cell import exp32, floor32


@njit(cache=False)
def _apply_floor(x, out):
    for i in range(x.size):
        out[i] = floor32(x[i])


@njit(cache=False)
def _apply_exp(x, out):
    for i in range(x.size):
        out[i] = exp32(x[i])


def test_floor32_equals_numpy_floor():
    """Integers, halves, the float32 neighbours of integers, both signs, over int32's range."""
    ints = np.arange(-300, 301, dtype=np.float32)
    near = np.concatenate([np.nextafter(ints, np.float32(np.inf)), np.nextafter(ints, np.float32(-np.inf))])
    rng = np.random.default_rng(0)
    wide = (rng.standard_normal(100_000) * 10.0 ** rng.uniform(-8, 9, 100_000)).clip(-2e9, 2e9).astype(np.float32)
    x = np.concatenate([ints, ints + np.float32(0.5), near, wide, np.float32([0.0, -0.0, 2**24, -(2**24), 1e9, -1e9])])
    out = np.empty_like(x)
    _apply_floor(x, out)
    assert np.array_equal(out, np.floor(x))


def test_exp32_within_two_ulp_of_exp():
    x = np.linspace(-87, 88, 200_001, dtype=np.float32)
    out = np.empty_like(x)
    _apply_exp(x, out)
    exact = np.exp(x.astype(np.float64))
    ulp = np.spacing(exact.astype(np.float32)).astype(np.float64)
    assert np.max(np.abs(out - exact) / ulp) <= 2.0
