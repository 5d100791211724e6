"""`qtool advise` on GRU cells of other forms (qtool.core.model.CellForm): reset before the
recurrent matmul, hard_sigmoid gates, relu candidates. The units follow the form (rh, no
Rh_add_br or rRh; a relu candidate's g_out takes g_pre's bits), the noise model follows its
propagation and slopes (held against `simulate` with tests/advise/test_advise_predict.py's bar), and the
advised bits file loads, calibrates and reproduces the measured output SNR."""

import math

import numpy as np
import pytest
from qtool.calibrators.sampled import BulkStats

from qtool import api
from qtool.advisor import pzero
from qtool.advisor.configs import all_units, bits_config, unit_of
from qtool.advisor.noise import activation_slope
from qtool.advisor.predict import Predictor
from qtool.advisor.search import single, unit_snr
from qtool.advisor.stats import model_stats, new_estimators
from qtool.calibration.auto import AutoCalibrator
from qtool.core.model import CellForm, GruCell, GruModel, open_h5, write_model
from qtool.core.tensors import BitsConfig, layer_config, load_bits, preset_config
from qtool.io.files import open_sequences
from qtool.simulation.run import simulate, tensor_key

# tests/advise/test_advise_predict.py's bar
MIN_PEARSON = 0.9
MAX_MEDIAN_ERROR_DB = 4.0
MAX_OUTPUT_ERROR_DB = 7.0

RESET_BEFORE = CellForm(reset_after=False)
HARD_RELU = CellForm(reset_after=False, gate="hard_sigmoid", gate_alpha=0.2, gate_beta=0.5, candidate="relu")
C, H, T = 8, 24, 16


def form_model(form: CellForm, C=5, H=6, layers=1, dirs=1, seed=0, scale=0.5) -> GruModel:
    """conftest.random_model's GRU, its cells of `form`."""
    rng = np.random.RandomState(seed)
    cells = []
    for l in range(layers):
        c_in = C if l == 0 else H * dirs
        cells.append([GruCell(rng.randn(3 * H, c_in) * scale, rng.randn(3 * H, H) * scale,
                              rng.randn(3 * H) * 0.3, rng.randn(3 * H) * 0.3, form) for _ in range(dirs)])
    return GruModel(cells)


def gauss(n: int, seed: int, C: int = C) -> np.ndarray:
    return np.random.default_rng(seed).normal(0.0, 1.0, (n, T, C)).astype(np.float32)


def test_the_units_follow_the_form():
    haste, rb, relu = (form_model(f, layers=2) for f in (CellForm(), RESET_BEFORE, HARD_RELU))
    names_haste, names_rb, names_relu = ({n for l, n in all_units(m) if l == 1} for m in (haste, rb, relu))
    assert {"Rh_add_br", "rRh", "g_out"} <= names_haste and "rh" not in names_haste
    assert names_rb == names_haste - {"Rh_add_br", "rRh"} | {"rh"}
    assert names_relu == names_rb - {"g_out"}  # g_out shares g_pre's grid
    assert unit_of(1, "g_out", HARD_RELU) == (1, "g_pre") and unit_of(1, "g_out", RESET_BEFORE) == (1, "g_out")
    assert unit_of(1, "x", HARD_RELU) == (0, "h")
    cfg = bits_config(relu, frozenset({(1, "g_pre")}))
    assert cfg.layers[1]["g_out"].bits == cfg.layers[1]["g_pre"].bits == 16
    assert "g_out" not in bits_config(rb, frozenset({(1, "g_pre")})).layers[1]
    # the reset-before cell's products: rh = r * h_old, and R's g rows multiply rh
    products = pzero.products(RESET_BEFORE)
    assert ("rh", ("r_out", "h")) in products and ("Rh", ("R", "rh")) in products
    assert "rh" not in single(RESET_BEFORE) and "Rh_add_br" not in single(RESET_BEFORE)


def test_the_activations_slopes_against_sampling():
    rng = np.random.default_rng(0)
    for mu, sigma in ((0.0, 1.0), (1.5, 3.0), (-2.0, 0.7)):
        v = rng.normal(mu, sigma, 400_000)
        s = BulkStats(mu, sigma, abs(v).max(), v.min(), v.max(), v.mean(), (v * v).mean(), v.size, v.size)
        linear_part = (v > -0.5 / 0.2) & (v < 0.5 / 0.2)
        assert activation_slope("hard_sigmoid:0.2:0.5", s) == pytest.approx(0.04 * linear_part.mean(), abs=2e-4)
        assert activation_slope("relu", s) == pytest.approx((v > 0).mean(), abs=3e-3)
        assert activation_slope("linear", s) == 1.0


@pytest.fixture(scope="module", params=["reset_before", "hard_relu"])
def predicted(request, tmp_path_factory):
    """Predictions and measurements at int8, w8a16 and int16 of a one-layer GRU of each form
    (the relu candidate's weights smaller: its state is not bounded by a tanh)."""
    form, scale = (RESET_BEFORE, 0.6) if request.param == "reset_before" else (HARD_RELU, 0.3)
    model = form_model(form, C=C, H=H, seed=11, scale=scale)
    d = tmp_path_factory.mktemp(request.param)
    np.save(d / "calib.npy", gauss(96, 1))
    np.save(d / "test.npy", gauss(64, 2))
    calib, test = open_sequences(d / "calib.npy"), open_sequences(d / "test.npy")
    ac = AutoCalibrator(model, calib, 96, extra=[lambda: new_estimators(model)])
    stats = model_stats(model, ac.extra_sets[0])
    pr = Predictor(model, stats, T, ac.all_views.hist)
    out = {"form": form, "stats": stats, "model": model}
    for preset in ("int8", "w8a16", "int16"):
        qm, _ = ac.quantize(BitsConfig(preset_config(preset)), {})
        out[preset] = (pr.predict(qm.cells), simulate(qm, test, 256, True).results())
    return out


def test_the_prediction_tracks_the_measurement(predicted):
    p, m = [], []
    for preset in ("int8", "w8a16", "int16"):
        pred, res = predicted[preset]
        measured = res["output"]["snr_db"]
        print(f"{predicted['form'].describe() or 'haste'} {preset}: output SNR predicted "
              f"{pred.output_db:.2f} dB, measured {measured:.2f} dB")
        if preset != "int16":
            assert abs(pred.output_db - measured) < MAX_OUTPUT_ERROR_DB
        for (l, d, name), g in pred.grid_db.items():
            v = res["tensors"].get(tensor_key(l, d, name), {}).get("snr_db")
            if v is not None and math.isfinite(v) and math.isfinite(g):
                p.append(g)
                m.append(v)
    names = {n for (_, _, n) in predicted["int8"][0].grid_db}
    assert "rh" in names and not {"Rh_add_br", "rRh"} & names
    p, m = np.array(p), np.array(m)
    assert np.corrcoef(p, m)[0, 1] > MIN_PEARSON
    assert np.median(np.abs(p - m)) < MAX_MEDIAN_ERROR_DB


def test_the_rule_decides_the_forms_units(predicted):
    units = set(all_units(predicted["model"]))
    assert set(unit_snr(predicted["stats"], predicted["model"])) == units


@pytest.fixture(scope="module")
def files(tmp_path_factory):
    d = tmp_path_factory.mktemp("advise_forms")
    for name, form in (("rb", RESET_BEFORE), ("relu", HARD_RELU)):
        with open_h5(d / f"{name}.h5", "w") as f:
            write_model(f, form_model(form, C=5, H=10, layers=2, seed=3, scale=0.4))
    np.save(d / "calib.npy", gauss(64, 3, 5))
    np.save(d / "test.npy", gauss(48, 4, 5))
    return d


@pytest.mark.parametrize("name", ["rb", "relu"])
def test_the_advised_bits_file_calibrates_to_the_measured_snr(files, name):
    """A target between all-int8's and all-int16's measured SNR: the file the search writes
    loads, calibrates and simulates to the output SNR the advisor measured."""
    model, calib, test = files / f"{name}.h5", files / "calib.npy", files / "test.npy"
    rule = api.advise(model, calib, test)
    low, high = rule.presets["int8"]["snr_db"], rule.presets["int16"]["snr_db"]
    assert high > low + 6.0
    out = files / f"{name}.toml"
    adv = api.advise(model, calib, test, target_snr=round((low + high) / 2, 1), output=out, force=True)
    assert 0 < len(adv.chosen.promoted) < len(all_units(adv.chosen.qm.model))
    _, cfg = load_bits(str(out))
    qm = api.calibrate(model, calib, bits=str(out))
    for l, cells in enumerate(qm.cells):
        spec = cells[0].spec
        assert "rh" in spec and "rRh" not in spec
        file_bits = layer_config(cfg, l)
        if name == "relu":  # g_out takes g_pre's grid, and the file says so
            assert spec["g_out"].bits == spec["g_pre"].bits == file_bits["g_out"].bits == file_bits["g_pre"].bits
        assert {n: t.bits for n, t in spec.items()} == {n: t.bits for n, t in adv.chosen.qm.cells[l][0].spec.items()}
    res = api.simulate(qm, test)
    assert res.output["snr_db"] == pytest.approx(adv.chosen.snr_db, abs=1e-9)
    assert adv.chosen.snr_db >= adv.target_db
    rows = [r for r in adv.rows if r["layer"] == 0 and r["direction"] == "fwd"]
    assert [r["tensor"] for r in rows][-1] == "rh" and len(rows) == 17


def test_advise_at_the_command_line(cli, files):
    code, out, err = cli("advise", files / "rb.h5", files / "calib.npy")
    assert code == 0, err
    assert "SNR per tensor" in out and " rh " in out and "rRh" not in out and "chosen:" in out
