"""Predictions held against `qtool simulate`'s measurements on GRUs that took no part in choosing
the threshold T (docs/advisor.md): the grid-aware prediction per tensor and at the output, and
the threshold rule at T."""

import math

import numpy as np
import pytest
from conftest import random_model

from qtool.advisor import THRESHOLD_DB, pzero
from qtool.advisor.configs import all_units, bits_config, unit_of
from qtool.advisor.predict import Predictor
from qtool.advisor.search import SINGLE
from qtool.advisor.stats import model_stats, new_estimators
from qtool.calibration.auto import AutoCalibrator
from qtool.core.tensors import BitsConfig, preset_config
from qtool.io.files import open_sequences
from qtool.simulation.run import simulate, tensor_key

# Bounds from the experiment (docs/advisor.md) with a margin: the grid-aware prediction's
# correlation with the measurement and its median absolute error, per tensor.
MIN_PEARSON = 0.9
MAX_MEDIAN_ERROR_DB = 4.0
MAX_OUTPUT_ERROR_DB = 7.0
MIN_RULE_AGREEMENT = 0.8  # decisions where the rule at T and the measurement agree

MODELS = {
    "gauss-1x24": (dict(C=8, H=24, layers=1, seed=11, scale=0.6), "gauss", 16),
    "laplace-bi2x16": (dict(C=6, H=16, layers=2, dirs=2, seed=12, scale=0.8), "laplace", 12),
}


def data(kind: str, n: int, T: int, C: int, seed_value: int) -> np.ndarray:
    rng = np.random.default_rng(seed_value)
    if kind == "gauss":
        return rng.normal(0.0, 1.0, (n, T, C)).astype(np.float32)
    x = rng.laplace(0.0, 1.0, (n, T, C))
    return np.where(rng.random(x.shape) < 1e-3, 20 * x, x).astype(np.float32)


@pytest.fixture(scope="module", params=list(MODELS))
def measured(request, tmp_path_factory):
    kw, kind, T = MODELS[request.param]
    model = random_model(**kw)
    d = tmp_path_factory.mktemp(request.param)
    np.save(d / "calib.npy", data(kind, 96, T, kw["C"], 1))
    np.save(d / "test.npy", data(kind, 64, T, kw["C"], 2))
    calib, test = open_sequences(d / "calib.npy"), open_sequences(d / "test.npy")
    ac = AutoCalibrator(model, calib, 96, extra=[lambda: new_estimators(model)])
    stats = model_stats(model, ac.extra_sets[0])
    pr = Predictor(model, stats, T, ac.all_views.hist)
    out = {"stats": stats, "ac": ac, "model": model, "test": test}
    for preset in ("int8", "int16"):
        qm, choice = ac.quantize(BitsConfig(preset_config(preset)), {})
        out[preset] = (pr.predict(qm.cells), simulate(qm, test, 256, True).results())
        out[f"{preset}_plan"] = choice.plan
    return out


def pairs(pred, res):
    p, m = [], []
    for (l, d, name), g in pred.grid_db.items():
        v = res["tensors"].get(tensor_key(l, d, name), {}).get("snr_db")
        if v is not None and math.isfinite(v) and math.isfinite(g):
            p.append(g)
            m.append(v)
    return np.array(p), np.array(m)


def test_grid_aware_prediction_tracks_the_measurement(measured):
    p, m = [], []
    for preset in ("int8", "int16"):
        a, b = pairs(*measured[preset])
        p.append(a)
        m.append(b)
        pred, res = measured[preset]
        assert abs(pred.output_db - res["output"]["snr_db"]) < MAX_OUTPUT_ERROR_DB
    p, m = np.concatenate(p), np.concatenate(m)
    assert np.corrcoef(p, m)[0, 1] > MIN_PEARSON
    assert np.median(np.abs(p - m)) < MAX_MEDIAN_ERROR_DB


def test_the_threshold_rule_at_T_agrees_with_the_measurement(measured):
    """Each of the rule's decisions measured alone, as in the experiment: its operands (or the
    tensor) at int8, everything else at int16; int8 is safe at 20 dB or more."""
    model, ac = measured["model"], measured["ac"]
    units = frozenset(all_units(model))
    agree = []
    for l in range(model.num_layers):
        for name in (*pzero.PRODUCTS, *SINGLE):
            operands = [pzero.OPERAND_BITS.get(n, n) for n in pzero.PRODUCTS.get(name, (name,))]
            qm = ac.build(bits_config(model, units - {unit_of(l, n) for n in operands}), measured["int8_plan"], {})
            res = simulate(qm, measured["test"], 256, True).results()
            for d, st in enumerate(measured["stats"][l]):
                p = pzero.tensor_snr_db(st, dict.fromkeys([*st, "one_minus_z"], 8), name)
                agree.append((p > THRESHOLD_DB) == (res["tensors"][tensor_key(l, d, name)]["snr_db"] >= 20.0))
    assert np.mean(agree) >= MIN_RULE_AGREEMENT
