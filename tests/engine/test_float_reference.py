"""The CPU engine's float32 reference against numpy's float GRU (qtool.numerics.float_gru), for
every cell form, at hidden sizes on both sides of every SIMD path's tile width (16 lanes, 96 on
AVX-512), stacked and bidirectional; and the SNR that `simulate` reports against the same SNR
computed from its saved outputs. tests/engine/test_simd_paths.py reruns this file on every SIMD path."""

import numpy as np
import pytest
from conftest import calibrated, random_model

import qtool
from qtool.core.model import CellForm, GruCell, GruModel
from qtool.engine.cpu import run_model
from qtool.engine.layout import EVERY_TENSOR, OUTPUT
from qtool.numerics.float_gru import run_float
from qtool.numerics.qparams import dequantize

FORMS = {
    "haste": CellForm(),
    "reset_before": CellForm(reset_after=False),
    "hard_sigmoid": CellForm(gate="hard_sigmoid", gate_alpha=0.2, gate_beta=0.5),
    "relu": CellForm(candidate="relu"),
    "precise": CellForm(reset_after=False, gate="hard_sigmoid", gate_alpha=0.2, gate_beta=0.5, candidate="linear"),
    "rb_relu": CellForm(reset_after=False, gate="hard_sigmoid", gate_alpha=1 / 6, gate_beta=0.5, candidate="relu"),
}


def form_model(form: CellForm, H: int, layers: int, dirs: int, seed: int = 0) -> GruModel:
    # weights scaled by 1/sqrt(fan-in): the trained range, where relu and linear candidates stay bounded
    m = random_model(C=7, H=H, layers=layers, dirs=dirs, seed=seed, scale=1.0)
    return GruModel([[GruCell(c.W / np.sqrt(c.W.shape[1]), c.R / np.sqrt(H), c.bx, c.br, form) for c in cells]
                     for cells in m.layers])


@pytest.mark.parametrize("name", list(FORMS))
@pytest.mark.parametrize("H,layers,dirs", [(5, 2, 2), (12, 2, 2), (33, 2, 2), (64, 1, 2), (96, 2, 1), (512, 1, 1)])
def test_engine_float_reference_equals_numpy(name, H, layers, dirs):
    model = form_model(FORMS[name], H, layers, dirs)
    rng = np.random.RandomState(H)
    qm = calibrated(model, rng.randn(6, 8, 7).astype(np.float32))
    x = rng.randn(7, 9, 7).astype(np.float32)  # held out; 7 sequences: a partial block of 4
    want = run_float(model, x)
    tol = 1e-5 * max(1.0, float(np.abs(want).max()))
    for level in (OUTPUT, EVERY_TENSOR):
        run = run_model(qm, x, level)
        err = float(np.abs(run.y_float - want).max())
        assert err <= tol, f"level {level}: the engine's float reference is {err:.3g} from numpy's"


@pytest.mark.parametrize("name", ["haste", "reset_before", "precise"])
def test_reported_snr_is_what_the_integers_reach(name, tmp_path):
    model = form_model(FORMS[name], 40, 2, 2, seed=4)
    rng = np.random.RandomState(5)
    qm = calibrated(model, rng.randn(32, 20, 7).astype(np.float32))
    x = rng.randn(24, 20, 7).astype(np.float32)
    res = qtool.simulate(qm, x, backend="cpu", outputs=True)
    h = qm.cells[-1][0].spec["h"]
    y = dequantize(res.y_int, h.exp2_inv, h.zp)
    ref = run_float(model, x)
    snr = 10 * np.log10(np.sum(ref.astype(np.float64) ** 2) / np.sum((y - ref) ** 2))
    assert 15 < snr < 60
    assert abs(res.output["snr_db"] - snr) < 0.1, (res.output["snr_db"], snr)
