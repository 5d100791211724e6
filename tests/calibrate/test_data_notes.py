"""Data mistakes `simulate` says and runs on: time-first data read batch-first (the first axis is
the number of steps the model was calibrated on, the second is not), and inputs scaled unlike the
calibration data (more than 2% of an input's values outside its grid). For a GRU alone and a whole
model alike; with labels that do not fit such data, the refusal names the axes, not the labels."""

import json

import numpy as np
import pytest
from conftest import SAMPLES, has

import qtool


@pytest.fixture(scope="module")
def quantized(tmp_path_factory):
    d = tmp_path_factory.mktemp("notes")
    x = np.load(SAMPLES / "test.npy")  # [597, 8, 8]
    np.save(d / "time_first.npy", np.ascontiguousarray(x.transpose(1, 0, 2)))
    np.save(d / "x100.npy", (x * 100).astype(np.float32))
    np.save(d / "good.npy", x)
    models = {"gru": qtool.calibrate(SAMPLES / "digits_gru.safetensors", SAMPLES / "calib.npy", method="minmax")}
    if has("onnx"):
        models["whole"] = qtool.calibrate(SAMPLES / "digits.onnx", SAMPLES / "calib.npy", method="minmax",
                                                check=False)
    return d, models


def notes(qm, data):
    if isinstance(qm, qtool.api.QGraph):
        return qtool.simulate(qm, data, backend="cpu").notes
    return qtool.simulate(qm, data, backend="cpu").notes


@pytest.mark.parametrize("kind", ["gru", "whole"])
def test_time_first_data_and_scaled_inputs_are_said(quantized, kind):
    d, models = quantized
    if kind not in models:
        pytest.skip("needs onnx")
    qm = models[kind]
    assert notes(qm, d / "good.npy") == []
    (said,) = notes(qm, d / "time_first.npy")
    assert "the data [8, 597, 8] look time-first" in said and "sequences of 8 steps" in said
    assert notes(qm, np.load(d / "good.npy")[:, :5]) == []  # batch-first, fewer steps: nothing wrong
    (said,) = notes(qm, d / "x100.npy")
    assert said.startswith("50.6% of the values of input") and "outside its grid" in said


def test_a_low_output_snr_is_said(tmp_path):
    """Recurrent weights a million times too large (a unit slip in a converter): the output SNR
    falls below 10 dB on data that look right, and simulate says where to look."""
    from safetensors.numpy import load_file, save_file

    weights = load_file(SAMPLES / "digits_gru.safetensors")
    save_file({k: v * 1e6 if "weight_hh" in k else v for k, v in weights.items()}, tmp_path / "big.safetensors")
    res = qtool.simulate(qtool.calibrate(tmp_path / "big.safetensors", SAMPLES / "calib.npy", method="minmax"),
                         SAMPLES / "test.npy")
    assert res.output["snr_db"] < 10
    (said,) = res.notes
    assert said.startswith(f"the output SNR is {res.output['snr_db']:.1f} dB, below 10 dB")


@pytest.mark.skipif(not has("onnx"), reason="needs onnx")
def test_at_the_command_line(cli, quantized, tmp_path):
    d, models = quantized
    qtool.save(models["whole"], tmp_path / "q.h5")
    code, out, err = cli("simulate", tmp_path / "q.h5", d / "time_first.npy", "--json")
    assert code == 0 and "warning: the data [8, 597, 8] look time-first" in err and "--time-first" in err
    (said,) = json.loads(out)["notes"]  # in the command line's words, as on stderr
    assert said.startswith("the data [8, 597, 8] look time-first") and "pass --time-first" in said
    code, out, err = cli("report", tmp_path / "q.h5", d / "time_first.npy", "-o", tmp_path / "r.html", "--json")
    assert code == 0 and "warning: the data [8, 597, 8] look time-first" in err and "--time-first" in err
    (said,) = json.loads(out)["notes"]  # report simulates as simulate does, and says the same
    assert said.startswith("the data [8, 597, 8] look time-first")
    code, out, err = cli("simulate", tmp_path / "q.h5", d / "time_first.npy", "--labels", SAMPLES / "test_labels.npy")
    assert code == 2 and err.count("\n") == 1 and "look time-first" in err and "--time-first" in err
    code, out, err = cli("simulate", tmp_path / "q.h5", d / "time_first.npy", "--time-first",
                         "--labels", SAMPLES / "test_labels.npy")
    assert code == 0 and "warning" not in err, err


def test_time_first_given_to_batch_first_data_is_said(quantized):
    d, models = quantized
    (said,) = notes(models["gru"], qtool.as_data(d / "good.npy", time_first=True))
    assert "read time-first are [8, 597, 8]" in said and "drop `time_first`" in said


@pytest.mark.skipif(not has("keras"), reason="needs keras")
def test_calibrate_says_data_that_do_not_fit_the_declared_steps(cli, tmp_path):
    """A file that declares its steps (Keras' Input((8, C)), an ONNX input of fixed T) tells
    calibrate which axis is time before any calibration did, and simulate data of other steps."""
    from conftest import keras_on_torch

    keras = keras_on_torch(3)
    m = keras.Sequential([keras.Input((8, 4)), keras.layers.Dense(6, activation="relu"), keras.layers.GRU(5)])
    m.save(tmp_path / "m.keras")
    x = np.random.default_rng(1).standard_normal((40, 8, 4)).astype(np.float32)
    np.save(tmp_path / "tf.npy", np.ascontiguousarray(x.transpose(1, 0, 2)))
    code, _, err = cli("calibrate", tmp_path / "m.keras", tmp_path / "tf.npy", "-o", tmp_path / "q.h5",
                       "--method", "minmax", "--no-check")
    assert code == 0 and "warning: the data [8, 40, 4] look time-first: the model declares sequences of 8" in err
    assert qtool.load_model(tmp_path / "m.keras", check=False).steps == 8
    np.save(tmp_path / "short.npy", x[:, :3])
    code, _, err = cli("calibrate", tmp_path / "m.keras", tmp_path / "short.npy", "-o", tmp_path / "q.h5",
                       "--method", "minmax", "--no-check", "--force")
    assert code == 0 and "the model declares sequences of 8 steps; the data [40, 3, 4] have 3" in err
    code, _, err = cli("simulate", tmp_path / "q.h5", tmp_path / "short.npy")  # calibrated on them too
    assert code == 0 and "the model declares sequences of 8 steps; the data [40, 3, 4] have 3" in err


def test_advise_says_held_out_data_scaled_unlike_the_calibration_data(quantized):
    d, _ = quantized
    adv = qtool.advise(SAMPLES / "digits_gru.safetensors", SAMPLES / "calib.npy", d / "x100.npy", limit=60)
    (said,) = adv.extra["notes"]
    assert "of the held-out values lie outside the calibration data's range" in said
    assert qtool.advise(SAMPLES / "digits_gru.safetensors", SAMPLES / "calib.npy", d / "good.npy",
                        limit=60).extra["notes"] == []
    # compare scores on held-out data too, and says the same
    cmp = qtool.compare(SAMPLES / "digits_gru.safetensors", SAMPLES / "calib.npy", d / "x100.npy",
                        methods=["minmax"], limit=60)
    (said,) = cmp.notes
    assert "of the held-out values lie outside the calibration data's range" in said


def test_calibrate_says_when_every_candidate_of_auto_scores_poorly(monkeypatch):
    """auto's held-out scores are all the data can say of the bits: below LOW_SNR_DB, a note names
    the wider presets (the sample scores about 29 dB; the bar raised above it here)."""
    pytest.importorskip("onnx")
    import qtool.engine.metrics as metrics

    qg = qtool.calibrate(SAMPLES / "digits.onnx", SAMPLES / "calib.npy", check=False)
    assert not [n for n in qg.info.get("notes", []) if "too coarse" in n]
    monkeypatch.setattr(metrics, "LOW_SNR_DB", 1000.0)
    qg = qtool.calibrate(SAMPLES / "digits.onnx", SAMPLES / "calib.npy", check=False)
    best = max(qg.info["auto"]["output_snr_db"].values())
    assert f"output SNR on the held-out calibration sequences is {best:.1f} dB at best: int8 is too coarse" in \
        " ".join(qg.info["notes"])


def test_calibrate_says_when_auto_scores_a_gru_alone_poorly(monkeypatch):
    """The same note for a GRU alone: its auto's held-out output SNR, in the choice's note."""
    import qtool.engine.metrics as metrics

    def choice():
        return qtool.observe(SAMPLES / "digits_gru.safetensors", SAMPLES / "calib.npy", methods=["auto"],
                             limit=60).auto[1]
    assert choice().note == ""
    monkeypatch.setattr(metrics, "LOW_SNR_DB", 1000.0)
    got = choice()
    assert f"output SNR on the held-out sequences is {got.held_snr_db[got.winner]:.1f} dB at best: these bits " \
           "are too coarse for this model" in got.note


def test_a_value_beyond_every_grid_is_refused_naming_the_gru_layer_it_reaches(cli, tmp_path):
    """One value of 1e30 in the data: no 8-bit power-of-two grid holds it. A whole model's GRU
    names its tensors as the GRU does (x, h ...), so the refusal says which layer's."""
    pytest.importorskip("onnx")
    x = np.load(SAMPLES / "calib.npy")[:32].copy()
    x[3, 2, 1] = 1e30
    np.save(tmp_path / "huge.npy", x)
    code, _, err = cli("calibrate", SAMPLES / "digits.onnx", tmp_path / "huge.npy", "-o", tmp_path / "q.h5",
                       "--method", "minmax", "--no-check")
    assert code == 2 and "Traceback" not in err and not (tmp_path / "q.h5").exists()
    assert err.strip().splitlines()[-1].startswith("error: layer '/gru/GRU' (gru): x: range [0, 1e+30] is wider")


def test_calibration_data_that_never_vary_are_noted():
    """An input that holds one value throughout the calibration data (zeros, a fill value) gets a
    note: its grid is fitted to no variation."""
    pytest.importorskip("onnx")
    x = np.zeros((16, 8, 8), np.float32)
    qg = qtool.calibrate(SAMPLES / "digits.onnx", x, method="minmax", check=False)
    assert any("is 0 throughout the calibration data" in n for n in qg.info["notes"])
    qg = qtool.calibrate(SAMPLES / "digits.onnx", np.load(SAMPLES / "calib.npy")[:16], method="minmax", check=False)
    assert not any("throughout" in n for n in qg.info["notes"])


@pytest.mark.skipif(not has("safetensors"), reason="the sample GRU is .safetensors")
def test_a_gru_alones_calibration_data_that_never_vary_are_noted(cli, tmp_path):
    """The same note for a GRU alone: on `calibrate`'s stderr and in its --json, for one method,
    auto and --compare; none for data that vary."""
    gru = SAMPLES / "digits_gru.safetensors"
    np.save(tmp_path / "constant.npy", np.full((16, 8, 8), 0.5, np.float32))
    said = "input 'x' is 0.5 throughout the calibration data"
    for method in ("minmax", "auto"):
        cal = qtool.observe(gru, tmp_path / "constant.npy", methods=[method])
        assert any(said in n for n in cal.notes), method
    code, out, err = cli("calibrate", gru, tmp_path / "constant.npy", "-o", tmp_path / "q.h5", "--method", "minmax")
    assert code == 0 and said in err
    code, out, err = cli("calibrate", gru, tmp_path / "constant.npy", "-o", tmp_path / "q.h5", "--method", "minmax",
                         "--json", "--force")
    assert code == 0 and any(said in n for n in json.loads(out)["notes"])
    code, out, err = cli("calibrate", gru, tmp_path / "constant.npy", "--compare", "minmax,mse", "--eval",
                         SAMPLES / "test.npy")
    assert code == 0 and said in err
    assert not qtool.observe(gru, SAMPLES / "calib.npy", methods=["minmax"]).notes
