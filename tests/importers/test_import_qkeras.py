"""QKeras QGRU import, against golden files QKeras itself wrote (tests/golden/make_qkeras.py):
the weights QKeras' quantizers give, the auto_po2 grids it found, and its forward pass."""

import json
import shutil
import zipfile

import numpy as np
import pytest
from conftest import has

from qtool.numerics.qparams import dequantize

GOLDEN = "tests/golden/qkeras_gru.keras"


@pytest.fixture(scope="module")
def golden():
    return np.load("tests/golden/qkeras_gru_io.npz")


@pytest.fixture(scope="module")
def model():
    from qtool.importers import import_model

    # with qkeras installed, the import is checked against QKeras' own QGRU (states left float)
    return import_model(GOLDEN, check=has("qkeras"))


@pytest.mark.parametrize("path", [GOLDEN, GOLDEN.replace(".keras", ".h5")])
def test_weights_and_grids_are_qkeras_own(path, golden):
    from qtool.calibration.from_file import fixed_spec
    from qtool.core.tensors import preset_config
    from qtool.importers import import_model, read_imported

    model = import_model(path, check=has("qkeras"))
    assert model.num_layers == 2
    if has("qkeras"):
        assert model.extra["check"]["checked"] and model.extra["check"]["max_abs_diff"] < 1e-5
    for l in range(2):
        c = model.layers[l][0]
        assert np.array_equal(c.W, golden[f"Wq{l}"].T) and np.array_equal(c.R, golden[f"Rq{l}"].T)
        assert np.array_equal(np.stack([c.bx, c.br]), golden[f"bq{l}"])
    imported = read_imported(path, model)
    assert imported.kind == "QKeras" and {k[2] for k in imported.ranges} == {"W", "R", "h"}
    fixed, rows = fixed_spec(imported, model, preset_config("int8"))
    for l in range(2):
        for name in ("W", "R"):
            # QKeras keeps its auto_po2 scale times 2^(bits - 1): the step is scale / 128
            e = fixed[l][0][name].exp2_inv
            assert np.array_equal(2.0 ** -e, golden[f"{name}_scale{l}"] / 128)
            levels = getattr(model.layers[l][0], name) * 2.0 ** e[:, None]
            assert np.array_equal(levels, np.round(levels)) and np.abs(levels).max() <= 127
        h = fixed[l][0]["h"]
        assert (h.exp2_inv, h.zp) == (7, 0)  # quantized_bits(8, 0, alpha=1): [-1, 127/128]
    assert all(r["moved_db"] == 0.0 and not r["clips"] for r in rows)
    assert fixed[1][0]["x"] is fixed[0][0]["h"]  # layer 1 reads layer 0's quantized state


def _qkeras_forward(model, spec, x):
    """QKeras' QGRU step in numpy (Keras GRU, reset_after=True), each step's incoming state on
    the state quantizer's grid (QKeras rounds half to even)."""
    y = x.astype(np.float64)
    for l, cells in enumerate(model.layers):
        c, s = cells[0], spec[l][0]["h"]
        H = c.R.shape[1]
        h = np.zeros((len(y), H))
        out = []
        for t in range(y.shape[1]):
            hq = (np.clip(np.round(h * 2.0**s.exp2_inv) + s.zp, -128, 127) - s.zp) * 2.0**-s.exp2_inv
            gx, gh = y[:, t] @ c.W.T + c.bx, hq @ c.R.T + c.br
            z = 1 / (1 + np.exp(-(gx[:, :H] + gh[:, :H])))
            r = 1 / (1 + np.exp(-(gx[:, H:2 * H] + gh[:, H:2 * H])))
            h = z * hq + (1 - z) * np.tanh(gx[:, 2 * H:] + r * gh[:, 2 * H:])
            out.append(h)
        y = np.stack(out, 1)
    return y


def test_forward_is_qkeras_and_the_integer_gru_follows(model, golden, tmp_path, cli):
    from qtool.engine.cpu import run_int
    from qtool.io.qmodel_file import load_qmodel

    np.save(tmp_path / "calib.npy", np.random.RandomState(1).randn(64, 9, 3).astype(np.float32))
    code, out, err = cli("calibrate", GOLDEN, "-o", tmp_path / "none.h5")
    # QKeras quantizes no input: x of layer 0 and the 12 inner tensors of each cell are missing
    assert code == 2 and "QKeras file holds no range for 25 tensors (in layer0.fwd: x; in every cell: Wx," in err
    code, out, err = cli("calibrate", GOLDEN, tmp_path / "calib.npy", "-o", tmp_path / "q.h5", "--json")
    assert code == 0, err
    res = json.loads(out)
    assert "QKeras" in res["method"] and {r["tensor"] for r in res["imported"]} == {"W", "R", "h"}
    qm = load_qmodel(tmp_path / "q.h5")
    spec = [[cq.spec for cq in cells] for cells in qm.cells]
    # the imported weights and state grid are everything QKeras computes
    np.testing.assert_allclose(_qkeras_forward(model, spec, golden["x"]), golden["y"], atol=2e-5)
    s = spec[-1][0]["h"]
    y = dequantize(run_int(qm, golden["x"]), s.exp2_inv, s.zp)
    snr = 10 * np.log10(np.sum(golden["y"] ** 2) / np.sum((y - golden["y"]) ** 2))
    assert snr > 27.0, snr  # 30.9 dB measured: int8 activations and tables on top of QKeras' grids


@pytest.mark.skipif(not has("qkeras"), reason="needs qkeras-v3")
def test_quantized_bits_port_is_qkeras():
    import keras
    import qkeras
    from keras.saving import serialize_keras_object
    from qkeras import quantized_bits

    from qtool.importers.keras.quantizers import quantize, quantizer_config

    rng = np.random.RandomState(0)
    kinds = [dict(bits=8, integer=0, alpha="auto_po2"), dict(bits=4, integer=0, alpha="auto_po2"),
             dict(bits=8, integer=2, alpha="auto_po2"), dict(bits=8, integer=0),
             dict(bits=6, integer=1, symmetric=1, alpha=0.5), dict(bits=8, integer=0, alpha=1)]
    for i in range(60):
        x = (rng.randn(*[(3, 12), (16, 48), (2, 48), (48,)][i % 4]) * rng.choice([0.05, 0.3, 3])).astype(np.float32)
        q = quantized_bits(**kinds[i % len(kinds)])
        want = keras.ops.convert_to_numpy(q(x))
        assert np.array_equal(quantize(quantizer_config("t", "bias_quantizer", serialize_keras_object(q)), x),
                              want), kinds[i % 6]
    # QGRUCell makes its kernels' alpha=None quantizers auto_po2, also when it loads a config
    cell = qkeras.QGRU(4, kernel_quantizer=quantized_bits(8, 0), reset_after=True).cell
    cfg = serialize_keras_object(cell.kernel_quantizer_internal)
    cfg["config"]["alpha"] = None
    x = (rng.randn(3, 12) * 0.3).astype(np.float32)
    want = keras.ops.convert_to_numpy(qkeras.QGRU.from_config(
        {**qkeras.QGRU(4, reset_after=True).get_config(), "kernel_quantizer": cfg}).cell.kernel_quantizer_internal(x))
    assert np.array_equal(quantize(quantizer_config("t", "kernel_quantizer", cfg), x), want)


def _edited(tmp_path, edit):
    """The golden archive with its first QGRU's config edited."""
    out = tmp_path / "e.keras"
    shutil.copy(GOLDEN, out)
    with zipfile.ZipFile(GOLDEN) as z:
        config = json.loads(z.read("config.json"))
        weights = z.read("model.weights.h5")
        meta = z.read("metadata.json")
    edit(config["config"]["layers"][1]["config"])
    with zipfile.ZipFile(out, "w") as z:
        z.writestr("config.json", json.dumps(config))
        z.writestr("model.weights.h5", weights)
        z.writestr("metadata.json", meta)
    return out


@pytest.mark.parametrize("edit, match", [
    (lambda c: c.update(recurrent_activation="hard_sigmoid"), "recurrent_activation='hard_sigmoid'"),
    (lambda c: c.update(reset_after=False), "reset_after=False"),
    (lambda c: c["kernel_quantizer"].update(class_name="quantized_po2"), "'quantized_po2' is not supported"),
    (lambda c: c["kernel_quantizer"]["config"].update(alpha="auto"), "alpha='auto'"),
    (lambda c: c["state_quantizer"]["config"].update(use_stochastic_rounding=True), "use_stochastic_rounding"),
    (lambda c: c["state_quantizer"]["config"].update(alpha="auto_po2"), "each step's own state"),
    # QGRU's default activation, as QKeras serializes it: named, not dumped as a dict
    (lambda c: c.update(activation={"module": "qkeras.quantizers", "class_name": "quantized_tanh",
                                    "config": {"bits": 8}, "shared_object_id": 1}),
     "e.keras: GRU 'qgru' has activation='quantized_tanh'; qtool's GRU needs 'tanh'"),
    (lambda c: c["kernel_quantizer"].update(class_name="binary"), "e.keras: QGRU 'qgru': kernel_quantizer"),
])
def test_what_qtool_does_not_compute_is_refused(tmp_path, cli, edit, match):
    code, out, err = cli("import", _edited(tmp_path, edit), "--no-check", "-o", tmp_path / "m.h5")
    assert code != 0 and match in err, err
    assert not (tmp_path / "m.h5").exists()


@pytest.mark.skipif(not has("qkeras"), reason="needs qkeras-v3")
def test_bidirectional_qgru_is_checked_against_qkeras(tmp_path):
    import sys

    import keras

    from qtool.importers import import_model, read_imported

    sys.path.insert(0, "tests/golden")
    from make_qkeras import qgru

    keras.utils.set_random_seed(1)
    m = keras.Sequential([keras.Input((9, 3)), keras.layers.Bidirectional(qgru(5))])
    m.save(tmp_path / "b.keras")
    model = import_model(tmp_path / "b.keras")
    assert model.bidirectional and model.extra["check"]["checked"]
    assert model.extra["check"]["max_abs_diff"] < 1e-5
    imported = read_imported(tmp_path / "b.keras", model)
    assert {k for k in imported.ranges if k[2] != "h"} == {(0, d, n) for d in (0, 1) for n in ("W", "R")}
    assert (0, 0, "h") in imported.ranges  # both directions' state quantizers: one h
