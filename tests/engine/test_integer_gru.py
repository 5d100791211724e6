"""The integer engine against exact integer expectations: the primitives by hand, and whole runs
against the independent rational reference of the spec's formulas (tests/reference_int_gru.py)."""

import numpy as np
import pytest
from conftest import calibrated, random_model
from reference_int_gru import cell_forward

from qtool.core.tensors import TensorConfig, preset_config
from qtool.engine.cpu import gemm_apply, gemm_plan, run_cell, run_int, split_halves
from qtool.engine.layout import gemm_dtype
from qtool.engine.simd import HAS_VNNI
from qtool.numerics.intops import clamp, lut_eval, rescale, rshift_round


def test_rshift_round_is_half_up_on_both_signs():
    # v / 2 for v = -3..3: -1.5 -> -1, -1 -> -1, -0.5 -> 0, 0, 0.5 -> 1, 1, 1.5 -> 2
    assert [rshift_round(v, 1) for v in range(-3, 4)] == [-1, -1, 0, 0, 1, 1, 2]
    assert rshift_round(-6, 2) == -1  # -1.5 -> -1
    assert rshift_round(-7, 2) == -2  # -1.75 -> -2
    assert rshift_round(5, 0) == 5
    assert rshift_round(5, -3) == 40  # negative shift multiplies


def test_clamp_and_rescale_saturate():
    assert clamp(200, -128, 127) == 127 and clamp(-200, -128, 127) == -128
    assert rescale(1000, 2, 3, -128, 127) == 127  # 250 + 3 saturates
    assert rescale(-21, 2, 3, -128, 127) == -2  # round(-5.25) = -5, + 3


def test_lut_eval_direct_and_interpolated():
    table = np.array([0, 10, 20, 40, 40], np.int64)
    assert [lut_eval(table, u, 0) for u in range(4)] == [0, 10, 20, 40]
    # shift 2: knots every 4 inputs; u = 5 is 1/4 of the way from 10 to 20 -> 12.5 -> 13
    assert lut_eval(table, 5, 2) == 13
    assert lut_eval(table, 6, 2) == 15
    assert lut_eval(table, 8, 2) == 20


def extremes(rng, lo, hi, shape):
    q = rng.choice([lo, hi], size=shape)
    q[0] = lo  # lo * lo summed K times: the largest positive sum
    return q


@pytest.mark.parametrize("K,bits_w,bits_in,vnni,kind,half", [
    (700, 8, 8, True, "u8s8", False), (700, 8, 8, False, "s16", False),
    (500, 8, 16, True, "s16", False), (700, 8, 16, True, "f64", False), (1, 16, 16, True, "s16", False),
    (256, 16, 16, True, "s16", True), (511, 16, 16, False, "s16", True),
    (2, 16, 16, True, "s16", True), (40000, 16, 16, True, "f64", False)])
def test_gemm_exact_at_the_extremes(K, bits_w, bits_in, vnni, kind, half):
    """Each arithmetic at the largest products its bound admits: the sums equal exact
    integer arithmetic, zero-point compensation included."""
    if kind == "u8s8" and not HAS_VNNI:
        pytest.skip("the CPU has no AVX-512 VNNI")
    rng = np.random.RandomState(K)
    q_w = extremes(rng, -(1 << (bits_w - 1)), (1 << (bits_w - 1)) - 1, (9, K))
    q_in = extremes(rng, -(1 << (bits_in - 1)), (1 << (bits_in - 1)) - 1, (6, K))
    zp = 3
    g = gemm_plan(q_w, bits_in, zp, vnni=vnni)
    assert (g.kind, g.half > 0) == (kind, half)
    exact = (q_in.astype(object) - zp) @ q_w.T.astype(object)
    assert np.array_equal(gemm_apply(g, q_in, 9).astype(object), exact)


def test_split_halves():
    w = np.arange(-2**15, 2**15)
    hi, lo = split_halves(w)
    assert np.array_equal(256 * hi + lo, w)
    assert lo.min() == -128 and lo.max() == 127 and hi.min() == -128 and hi.max() == 128


@pytest.mark.skipif(not HAS_VNNI, reason="the CPU has no AVX-512 VNNI")
def test_engine_same_integers_with_and_without_vnni(monkeypatch):
    import qtool.engine.cpu as engine

    model = random_model(C=70, H=20, layers=2, dirs=2, seed=5)
    rng = np.random.RandomState(5)
    qm = calibrated(model, rng.randn(6, 9, 70).astype(np.float32), "int8")
    x = rng.randn(4, 13, 70).astype(np.float32)
    with_vnni = run_int(qm, x)
    monkeypatch.setattr(engine, "HAS_VNNI", False)
    assert gemm_plan(qm.cells[0][0].qW, 8, 0).kind == "s16"
    assert np.array_equal(run_int(qm, x), with_vnni)


def test_gemm_dtype_bounds():
    assert gemm_dtype(np.full((1, 1024), 127), 8) == np.float32  # 127 * 128 * 1024 < 2^24
    assert gemm_dtype(np.full((1, 1040), 127), 8) == np.float64
    assert gemm_dtype(np.full((1, 1), 2**40), 16) == np.int64  # 2^55


def mixed_config():
    cfg = preset_config("int8")
    cfg.update(g_pre=TensorConfig(10, False), Rh=TensorConfig(12, False),
               h=TensorConfig(16, False), z_out=TensorConfig(16, False), g_out=TensorConfig(9, True))
    return cfg


@pytest.mark.parametrize("preset", ["int8", "w8a16", "int16", "mixed"])
def test_engine_equals_rational_reference(preset):
    model = random_model(C=5, H=4, seed=3)
    rng = np.random.RandomState(7)
    x_cal = rng.randn(16, 6, 5).astype(np.float32)
    x_test = rng.randn(3, 5, 5).astype(np.float32) * 1.3  # held out, partly outside the range
    cfg = mixed_config() if preset == "mixed" else None
    qm = calibrated(model, x_cal, preset if preset != "mixed" else "int8", config=cfg)
    cq = qm.cells[0][0]
    from qtool.engine.layout import quantize_input

    qx = quantize_input(qm, x_test).transpose(1, 0, 2)  # [T, N, C]
    got = run_cell(cq, np.ascontiguousarray(qx))
    want = np.array(cell_forward(cq, qx.tolist()))
    assert got.shape == want.shape
    assert np.array_equal(got, want), f"{np.count_nonzero(got != want)} mismatches"


def test_stacked_bidirectional_chain_integers():
    """Layer l + 1 consumes layer l's integers unchanged; the backward direction runs reversed."""
    model = random_model(C=4, H=3, layers=2, dirs=2, seed=5)
    rng = np.random.RandomState(2)
    qm = calibrated(model, rng.randn(8, 5, 4).astype(np.float32))
    x = rng.randn(2, 5, 4).astype(np.float32)
    traces = []
    y = run_int(qm, x, traces)
    from qtool.engine.layout import quantize_input

    seq = quantize_input(qm, x).transpose(1, 0, 2).tolist()
    for cells in qm.cells:
        fwd = np.array(cell_forward(cells[0], seq))
        bwd = np.array(cell_forward(cells[1], seq[::-1]))[::-1]
        seq = np.concatenate([fwd, bwd], axis=2).tolist()
    assert np.array_equal(y, np.array(seq).transpose(1, 0, 2))
