"""Calibration: observers, ties between tensors, bits configs, the quantized model file."""

import json

import numpy as np
import pytest
from conftest import calibrated, random_model
from qtool.calibrators import EmaObserver, MinMaxObserver

from qtool.calibration.observe import GATES, new_observers, observe_batch, saturation_bound
from qtool.core.model import open_h5
from qtool.core.tensors import load_bits
from qtool.errors import QtoolError
from qtool.io.qmodel_file import load_qmodel, write_qmodel
from qtool.numerics.float_gru import run_float


def test_minmax_merge_is_exact_and_order_free():
    rng = np.random.RandomState(0)
    parts = [rng.randn(5, 3, 4) * s for s in (1, 3, 0.2)]
    whole = MinMaxObserver()
    whole.observe(np.concatenate(parts, axis=1))
    obs = []
    for p in parts:
        o = MinMaxObserver()
        o.observe(p)
        obs.append(o)
    assert obs[0].merge(obs[1]).merge(obs[2]).range() == whole.range()
    assert obs[2].merge(obs[0]).merge(obs[1]).range() == whole.range()


def test_ema_follows_the_seed_formula():
    o = EmaObserver()
    steps = np.array([[-1.0, 2.0], [-3.0, 1.0], [0.0, 5.0]])[:, :, None]  # [T=3, 2, 1]
    o.observe(steps)
    lo, hi = -1.0, 2.0
    for lo_cur, hi_cur in ((-3.0, 1.0), (0.0, 5.0)):
        lo, hi = 0.9 * lo + 0.1 * lo_cur, 0.9 * hi + 0.1 * hi_cur
    assert o.range() == pytest.approx((lo, hi))


def test_tensor_ranges_are_the_float_tensors_ranges():
    model = random_model(C=3, H=5, layers=2, dirs=2, seed=1)
    x = np.random.RandomState(1).randn(6, 7, 3).astype(np.float32)
    qm = calibrated(model, x)
    traces = []
    run_float(model, x, traces)
    for l in range(2):
        for d in range(2):
            s = qm.cells[l][d].spec
            for name in ("Wx", "Rh", "rRh", "new_contrib"):
                assert s[name].lo == pytest.approx(traces[l][d][name].min())
                assert s[name].hi == pytest.approx(traces[l][d][name].max())
            for name, func, out in (("z_pre", "sigmoid", "z_out"), ("g_pre", "tanh", "g_out")):
                b_lo, b_hi = saturation_bound(func, s[out], 8)  # observed range cut at saturation
                assert s[name].lo == pytest.approx(max(traces[l][d][name].min(), b_lo))
                assert s[name].hi == pytest.approx(min(traces[l][d][name].max(), b_hi))
            # z_out also covers 1 - z; h is shared by directions; x of l > 0 is h of l - 1
            z = traces[l][d]["z_out"]
            assert s["z_out"].lo <= 1 - z.max() + 1e-7 and s["z_out"].hi >= 1 - z.min() - 1e-7
            h_all = np.concatenate([traces[l][k]["h"].ravel() for k in range(2)])
            assert s["h"].hi == pytest.approx(h_all.max())
            if l > 0:
                prev = qm.cells[l - 1][0].spec["h"]
                assert (s["x"].exp2_inv, s["x"].zp, s["x"].bits) == (prev.exp2_inv, prev.zp, prev.bits)


@pytest.mark.parametrize("preset", ["int8", "int16"])
def test_saturation_bound_is_free(preset):
    """Beyond the bound every input already gives the output integer of f(+-inf), so clipping the
    pre-activation grid there changes no output; inside it, the cut costs nothing either."""
    from qtool.numerics.lut import exact_outputs
    from qtool.numerics.qparams import quantize

    model = random_model(C=4, H=6, seed=3, scale=1.5)
    x = np.random.RandomState(3).randn(8, 10, 4).astype(np.float32) * 2
    qm = calibrated(model, x, preset)
    s = qm.cells[0][0].spec
    for lut, func, src, dst in GATES:
        a, b = s[src], s[dst]
        lo, hi = saturation_bound(func, b, a.bits)
        assert (a.lo, a.hi) == pytest.approx((lo, hi))  # the data reach past the bound: it cuts
        v = np.concatenate([np.linspace(hi, hi + 50, 200), np.linspace(lo - 50, lo, 200)])
        q_in = quantize(v, a.exp2_inv, a.zp, a.bits)  # clamped onto the (cut) grid
        got = exact_outputs(func, q_in, a.exp2_inv, a.zp, b.bits, b.exp2_inv, b.zp)
        ideal = np.clip(np.floor(np.ldexp({"sigmoid": 1 / (1 + np.exp(-v)), "tanh": np.tanh(v)}[func],
                                          b.exp2_inv) + 0.5) + b.zp, -(1 << (b.bits - 1)), (1 << (b.bits - 1)) - 1)
        assert np.array_equal(got, ideal), lut


def test_weights_per_channel_and_compensation():
    model = random_model(C=4, H=3, seed=2)
    qm = calibrated(model, np.random.RandomState(2).randn(4, 5, 4).astype(np.float32))
    cq = qm.cells[0][0]
    W = model.layers[0][0].W
    assert np.asarray(cq.spec["W"].exp2_inv).shape == (9,)
    assert np.all(np.abs(cq.qW) <= 127)
    assert np.all(np.abs(cq.qW).max(axis=1) >= 64)  # every row uses the top bit: finest scale
    deq = cq.qW * np.ldexp(1.0, -np.asarray(cq.spec["W"].exp2_inv))[:, None]
    assert np.all(np.abs(deq - W) <= np.ldexp(0.5, -np.asarray(cq.spec["W"].exp2_inv))[:, None])
    from qtool.numerics.rescale import CHANNEL_ROWS

    want = cq.spec["x"].zp * cq.qW.sum(axis=1)  # W_sum_mul_x_zp = Z_x * sum_k q_W[c, k]
    assert np.array_equal(cq.CH[CHANNEL_ROWS.index("W_sum_mul_x_zp")], want)


def test_qmodel_file_round_trip(tmp_path):
    model = random_model(C=3, H=4, layers=2, dirs=2, seed=3)
    qm = calibrated(model, np.random.RandomState(3).randn(5, 6, 3).astype(np.float32), "w8a16")
    qm.info = {"method": "minmax", "bits": "w8a16", "samples": 5}
    with open_h5(tmp_path / "q.h5", "w") as f:
        write_qmodel(f, qm)
    back = load_qmodel(tmp_path / "q.h5")
    assert back.info["bits"] == "w8a16" and back.info["qtool_version"]
    for a_row, b_row in zip(qm.cells, back.cells):
        for a, b in zip(a_row, b_row):
            assert np.array_equal(a.P, b.P) and np.array_equal(a.CH, b.CH)
            assert np.array_equal(a.qW, b.qW) and np.array_equal(a.luts["lut_g"], b.luts["lut_g"])
            assert a.spec["g_pre"].exp2_inv == b.spec["g_pre"].exp2_inv


def test_bits_config_files(tmp_path):
    (tmp_path / "b.json").write_text(json.dumps(
        {"preset": "int8", "tensors": {"h": {"bits": 16}, "g_out": {"symmetric": False}}}))
    label, cfg = load_bits(str(tmp_path / "b.json"))
    assert cfg["h"].bits == 16 and cfg["W"].bits == 8 and not cfg["g_out"].symmetric
    (tmp_path / "b.toml").write_text('preset = "int16"\n[tensors.W]\nbits = 8\n')
    _, cfg = load_bits(str(tmp_path / "b.toml"))
    assert cfg["W"].bits == 8 and cfg["z_pre"].bits == 16
    for bad, msg in (({"tensors": {"nope": {"bits": 8}}}, "unknown tensor"),
                     ({"tensors": {"W": {"symmetric": False}}}, "must stay symmetric"),
                     ({"tensors": {"h": {"bits": 40}}}, r"\[2, 16\]"),
                     ({"preset": "int4"}, "unknown bits preset")):
        (tmp_path / "bad.json").write_text(json.dumps(bad))
        with pytest.raises(QtoolError, match=msg):
            load_bits(str(tmp_path / "bad.json"))


def test_calibration_streams_in_chunks_like_one_batch():
    model = random_model(C=3, H=4, seed=4)
    x = np.random.RandomState(4).randn(10, 5, 3).astype(np.float32)
    one, two = new_observers(model, "minmax"), new_observers(model, "minmax")
    observe_batch(model, x, one)
    observe_batch(model, x[:4], two)
    observe_batch(model, x[4:], two)
    for name in one[0][0]:
        assert one[0][0][name].range() == two[0][0][name].range()


def _observe_part(args):
    model, x, method = args
    obs = new_observers(model, method)
    observe_batch(model, x, obs)
    return obs  # pickled back to the parent


@pytest.mark.parametrize("method", ["minmax", "percentile", "mse", "kl"])
def test_observers_from_other_processes_merge_like_one_pass(method):
    """Calibration split over processes: each observes a part, the parent merges the pickled
    observers; the parameters equal those of one pass over everything."""
    import multiprocessing

    from qtool.calibration.observe import build_quant_model, merge_observers
    from qtool.core.tensors import preset_config

    model = random_model(C=3, H=5, layers=2, dirs=2, seed=5)
    x = np.random.RandomState(5).randn(12, 6, 3).astype(np.float32)
    with multiprocessing.get_context("spawn").Pool(2) as pool:
        parts = pool.map(_observe_part, [(model, x[:5], method), (model, x[5:], method)])
    whole = new_observers(model, method)
    observe_batch(model, x, whole)
    qa = build_quant_model(model, merge_observers(*parts), preset_config("int8"), {}, method)
    qb = build_quant_model(model, whole, preset_config("int8"), {}, method)
    for ca, cb in zip(sum(qa.cells, []), sum(qb.cells, [])):
        for name, t in ca.spec.items():
            assert (np.array_equal(t.exp2_inv, cb.spec[name].exp2_inv) and t.zp == cb.spec[name].zp), name
