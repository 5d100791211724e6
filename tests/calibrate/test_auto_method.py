"""`--method auto`: per tensor, the method with the least error on held-out calibration data,
checked at the output against every single method; the default of `qtool calibrate`."""

import json

import numpy as np
import pytest
from conftest import SAMPLES, has, random_model

from qtool.calibration.auto import AUTO_METHODS, AutoCalibrator, fold_bounds
from qtool.calibration.observe import build_quant_model, collect, model_config
from qtool.core.tensors import BitsConfig, preset_config
from qtool.io.files import open_sequences
from qtool.numerics.float_gru import run_float
from qtool.numerics.qparams import dequantize, quantize
from qtool.simulation.run import simulate


@pytest.fixture(scope="module")
def setup(tmp_path_factory):
    d = tmp_path_factory.mktemp("auto")
    rng = np.random.default_rng(1)
    x = rng.standard_t(2.5, (60, 10, 5)).astype(np.float32)
    np.save(d / "calib.npy", x)
    model = random_model(C=5, H=10, layers=2, seed=2, scale=0.8)
    data = open_sequences(d / "calib.npy")
    return model, data, AutoCalibrator(model, data, 60, chunk=16)


def grids(qm):
    return [(n, np.asarray(t.exp2_inv).tolist(), t.zp) for row in qm.cells for c in row for n, t in c.spec.items()]


@pytest.mark.parametrize("method", AUTO_METHODS)
def test_views_of_one_histogram_pass_equal_each_method_run_alone(setup, method):
    """The fitting and held-out parts merge exactly: each method built from the shared
    histograms has the grids of a plain one-pass calibration with that method."""
    model, data, ac = setup
    cfg = BitsConfig(preset_config("int8"))
    alone = build_quant_model(model, collect(model, data, method, chunk=7), cfg, {}, method)
    assert grids(ac.build(cfg, ac.fixed_plan(cfg, method), {})) == grids(alone)


def test_each_tensor_gets_its_least_held_out_error(setup):
    """The held-out error of every method's grids, computed from the held-out folds'
    histograms, equals the exact squared error of the held-out values under the grids fitted
    without them, summed over the folds; the choice is the least of them."""
    model, data, ac = setup
    cfg = BitsConfig(preset_config("int8"))
    choice, errors = ac._per_tensor(cfg)
    assert set(choice) == {(l, n) for l, n in errors} and errors
    cfgs = model_config(cfg, 2)
    exact: dict = {}
    for i, (lo, hi) in enumerate(ac.folds):
        traces = []
        run_float(model, data.chunk(lo, hi), traces)
        for m in AUTO_METHODS:
            qm = ac.build(cfg, ac.fixed_plan(cfg, m), {}, fold=i)
            for (l, name) in errors:
                t = qm.cells[l][0].spec[name]
                v = np.concatenate([traces[l][d][name].ravel() for d in range(len(traces[l]))]).astype(np.float64)
                e = np.sum((dequantize(quantize(v, t.exp2_inv, t.zp, cfgs[l][name].bits), t.exp2_inv, t.zp) - v) ** 2)
                exact.setdefault((l, name), {}).setdefault(m, 0.0)
                exact[(l, name)][m] += float(e)
    for (l, name), errs in errors.items():
        assert choice[(l, name)] == min(AUTO_METHODS, key=lambda m: errs[m])
        if name in ("z_pre", "r_pre", "g_pre", "x"):
            continue  # LUT inputs count clipping beyond saturation as free; x: the histogram's bins
        ex = exact[(l, name)]
        for m in AUTO_METHODS:
            assert errs[m] == pytest.approx(ex[m], rel=0.05, abs=1e-3 * max(ex.values()))


def test_the_winner_is_the_best_candidate_on_the_held_out_sequences(setup):
    model, data, ac = setup
    for preset in ("int8", "int16"):
        choice = ac.choose(BitsConfig(preset_config(preset)))
        assert choice.held_snr_db[choice.winner] == max(choice.held_snr_db.values())
        assert set(choice.held_snr_db) == {"per-tensor", *AUTO_METHODS}
    assert fold_bounds(60) == [(0, 12), (12, 24), (24, 36), (36, 48), (48, 60)]
    assert (fold_bounds(3), fold_bounds(1)) == ([(0, 1), (1, 2), (2, 3)], [])


def test_every_sequence_is_held_out_once_by_grids_fitted_without_it(setup, tmp_path):
    """Each candidate's held-out output SNR pools five folds: each fold simulated with the grids
    a plain one-pass calibration gives on the other folds' sequences (their histograms merged,
    not re-observed), against the float GRU."""
    model, data, ac = setup
    cfg = BitsConfig(preset_config("int8"))
    choice = ac.choose(cfg)
    x = data.chunk(0, data.num_sequences)
    assert [i for lo, hi in ac.folds for i in range(lo, hi)] == list(range(len(x)))
    for m in AUTO_METHODS:
        ref2 = err2 = 0.0
        for lo, hi in ac.folds:
            np.save(tmp_path / "fit.npy", np.concatenate([x[:lo], x[hi:]]))
            np.save(tmp_path / "held.npy", x[lo:hi])
            fit = open_sequences(tmp_path / "fit.npy")
            qm = build_quant_model(model, collect(model, fit, m, chunk=7), cfg, {}, m)
            out = simulate(qm, open_sequences(tmp_path / "held.npy"), per_tensor=False).output
            ref2, err2 = ref2 + out.ref2, err2 + out.err2
        assert choice.held_snr_db[m] == pytest.approx(10 * np.log10(ref2 / err2), abs=1e-9)


def test_one_sequence_cannot_hold_any_out(tmp_path):
    np.save(tmp_path / "one.npy", np.random.default_rng(0).normal(size=(1, 6, 3)).astype(np.float32))
    model = random_model(C=3, H=4)
    ac = AutoCalibrator(model, open_sequences(tmp_path / "one.npy"), 1)
    qm, choice = ac.quantize(BitsConfig(preset_config("int8")), {})
    assert choice.winner == "minmax" and "2 or more" in choice.note


@pytest.mark.skipif(not has("safetensors"), reason="the sample is .safetensors")
def test_calibrate_defaults_to_auto_and_is_no_worse_than_any_single_method(cli, tmp_path):
    """On the sample's held-out test data: auto against minmax, percentile, mse and kl."""
    model = SAMPLES / "digits_gru.safetensors"
    code, out, err = cli("calibrate", model, SAMPLES / "calib.npy", "-o", tmp_path / "a.h5", "--json")
    assert code == 0, err
    res = json.loads(out)
    assert res["method"].startswith("auto") and res["auto"]["winner"] and res["auto"]["tensors"]
    code, out, err = cli("simulate", tmp_path / "a.h5", SAMPLES / "test.npy", "--json", "--no-per-tensor")
    auto_snr = json.loads(out)["output"]["snr_db"]
    code, out, err = cli("calibrate", model, SAMPLES / "calib.npy", "--compare", ",".join(AUTO_METHODS),
                         "--eval", SAMPLES / "test.npy", "--json")
    assert code == 0, err
    singles = {r["method"]: r["snr_db"] for r in json.loads(out)["methods"]}
    assert auto_snr >= max(singles.values()) - 0.05, (auto_snr, singles)
    code, out, err = cli("calibrate", model, SAMPLES / "calib.npy", "--compare", "mse,auto", "--eval",
                         SAMPLES / "test.npy", "--json")  # auto beside single methods: each as calibrated alone
    assert code == 0, err
    rows = json.loads(out)["methods"]
    assert [r["method"][:4] for r in rows] == ["mse", "auto"]
    assert rows[0]["snr_db"] == singles["mse"] and rows[1]["snr_db"] == pytest.approx(auto_snr, abs=1e-9)


def test_one_sequence_title_says_sequence(tmp_path, cli):
    from qtool.core.model import open_h5, write_model

    np.save(tmp_path / "one.npy", np.random.default_rng(0).normal(size=(1, 6, 3)).astype(np.float32))
    with open_h5(tmp_path / "m.h5", "w") as f:
        write_model(f, random_model(C=3, H=4))
    code, out, err = cli("calibrate", tmp_path / "m.h5", tmp_path / "one.npy", "-o", tmp_path / "q.h5")
    assert code == 0 and "over 1 sequence" in out and "1 sequences" not in out + err
