"""The bounds that choose int32 or int64 for each statement of the exported cell: every interval
operation is exact (against exhaustive evaluation of intops), and the bounds contain every
value the simulator produces."""

import itertools

import numpy as np
import pytest
from conftest import calibrated, random_model
from test_integer_gru import mixed_config

from qtool.engine.cpu import run_int
from qtool.numerics.interval import Iv, Statement, cell_statements, clamp, gemm_span, rshift_round
from qtool.numerics.intops import rshift_round as int_rshift_round


@pytest.mark.parametrize("n", range(-4, 7))
def test_rshift_round_interval_is_exact(n):
    for lo, hi in ((-37, 41), (0, 9), (-64, -3), (5, 5)):
        st = Statement()
        got = rshift_round(st, Iv(lo, hi), n)
        values = [int_rshift_round(v, n) for v in range(lo, hi + 1)]
        assert (got.lo, got.hi) == (min(values), max(values))
        l, r = max(-n, 0), max(n, 0)
        pre = [(v << l) + ((1 << r) >> 1) for v in range(lo, hi + 1)]  # before the right shift
        assert st.span.lo <= min(pre) and st.span.hi >= max(pre) and st.shift == max(l, r)


def test_interval_arithmetic_matches_brute_force():
    a, b = Iv(-3, 5), Iv(-7, -2)
    pairs = [(x, y) for x in range(-3, 6) for y in range(-7, -1)]
    for op in ("__add__", "__sub__", "__mul__"):
        vals = [getattr(x, op)(y) for x, y in pairs]
        got = getattr(a, op)(b)
        assert (got.lo, got.hi) == (min(vals), max(vals))
    st = Statement()
    assert clamp(st, Iv(-300, 40), -128, 127) == Iv(-128, 40) and st.span == Iv(-300, 40)


def test_gemm_span_is_the_exact_range_of_every_partial_sum():
    assert [int(v) for v in gemm_span(np.array([[1, -2, 3]]), Iv(-128, 127))[0]] == [-128 - 254 - 384]
    rng = np.random.default_rng(0)
    w = rng.integers(-4, 5, (3, 4))
    lo, hi = gemm_span(w, Iv(-3, 2))
    for c in range(3):
        sums = [np.dot(w[c, :k], v[:k]) for v in itertools.product(range(-3, 3), repeat=4)
                for k in range(5)]
        assert (lo[c], hi[c]) == (min(sums), max(sums))


def test_int32_exactly_when_the_bound_fits():
    st = Statement()
    st.note(Iv(-(2**31), 2**31 - 1))
    assert st.bits == 32
    st.note(Iv(0, 2**31))
    assert st.bits == 64
    st = Statement()
    rshift_round(st, Iv(-5, 5), 32)  # a shift by 32 is undefined on int32
    assert st.bits == 64


# gru_cell's trace order: which statement produced each traced tensor
TRACED = {0: "Rh", 1: "Rh", 2: "Rh", 3: "z_pre", 4: "r_pre", 5: "g_pre", 9: "Rh_add_br", 10: "rRh",
          11: "old_contrib", 12: "new_contrib", 13: "h"}


@pytest.mark.parametrize("preset", ["int8", "w8a16", "int16", "mixed"])
@pytest.mark.parametrize("offset", [False, True])
def test_bounds_contain_every_simulated_value(preset, offset):
    model = random_model(C=5, H=6, layers=2, seed=4)
    rng = np.random.RandomState(4)
    qm = calibrated(model, rng.randn(12, 9, 5).astype(np.float32), "int8" if preset == "mixed" else preset,
                    config=mixed_config() if preset == "mixed" else None)
    x = np.concatenate([rng.randn(8, 10, 5) * 3, np.sign(rng.randn(8, 10, 5)) * 1e3]).astype(np.float32)
    traces: list = []
    run_int(qm, x, traces=traces)
    for l, cells in enumerate(qm.cells):
        st = cell_statements(cells[0], offset)
        tr = traces[l][0]
        wx = st["Wx"].span
        assert wx.lo <= tr["Wx"].min() and tr["Wx"].max() <= wx.hi
        for k, name in TRACED.items():
            v = tr["cell"][:, :, k]
            assert st[name].span.lo <= v.min() and v.max() <= st[name].span.hi, name


def test_int16_gemm_bound_is_the_row_sum_formula():
    """Table compensation, int16: the Wx sums reach max_c sum_k |q_W[c, k]| * 2^15 (inputs at
    -2^15 against the positive weights): int64 exactly when that passes 2^31."""
    model = random_model(C=5, H=6, seed=5)
    rng = np.random.RandomState(5)
    cq = calibrated(model, rng.randn(12, 9, 5).astype(np.float32), "int16").cells[0][0]
    lo, hi = gemm_span(cq.qW, Iv(-(2**15), 2**15 - 1))
    worst = int(np.abs(cq.qW.astype(np.int64)).sum(axis=1).max()) * 2**15
    assert max(-int(min(lo)), int(max(hi))) <= worst
    assert (cell_statements(cq, False)["Wx"].bits == 64) == (max(-int(min(lo)), int(max(hi))) >= 2**31)
