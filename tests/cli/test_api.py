"""The Python API is the pipeline the CLI runs: the same numbers from arrays as from files."""

import json

import numpy as np
import pytest
from conftest import SAMPLES, has, random_model

import qtool
from qtool.errors import QtoolError
from qtool.graph.simulate import dequantized, run_int


def test_pipeline_on_arrays_equals_the_cli(cli, tmp_path):
    model = random_model(C=5, H=8, layers=2, dirs=2, seed=4)
    rng = np.random.default_rng(4)
    calib = rng.standard_normal((32, 10, 5)).astype(np.float32)
    test = rng.standard_normal((9, 12, 5)).astype(np.float32)
    seen = []
    qm = qtool.calibrate(model, calib, bits="w8a16", method="mse", progress=lambda d, n: seen.append((d, n)))
    assert seen[-1] == (32, 32) and qm.info["method"] == "mse" and qm.info["samples"] == 32
    res = qtool.simulate(qm, test, backend="cpu")
    assert res.samples == 9 and len(res.per_step_snr_db) == 12 and res.output["cosine"] > 0.99
    assert {k.split(".")[1] for k in res.tensors} == {"fwd", "bwd"}
    path = qtool.save(qm, tmp_path / "q.h5")
    assert qtool.load(path).fingerprint() == qm.fingerprint()
    np.save(tmp_path / "test.npy", test)
    code, out, err = cli("simulate", path, tmp_path / "test.npy", "--json")
    assert code == 0, err
    assert json.loads(out)["output"] == json.loads(json.dumps(res.output))
    exp = qtool.export_c(qm, tmp_path / "c", name="m")
    assert {"m.c", "m.h", "m_params.h", "qgru.c", "qgru.h"} <= set(exp.files)
    ver = qtool.verify(qm, tmp_path / "c", test)
    assert ver.output_mismatches == ver.state_mismatches == 0 and ver.name == "m"


@pytest.mark.skipif(not has("safetensors"), reason="the sample is .safetensors")
def test_compare_and_provenance():
    cmp = qtool.compare(SAMPLES / "digits_gru.safetensors", SAMPLES / "calib.npy", SAMPLES / "test.npy",
                        ["minmax", "mse"], limit=100)
    assert [r["method"] for r in cmp.rows] == ["minmax", "mse"] and cmp.best in (0, 1)
    info = cmp.models[0].info
    assert info["samples"] == 100 and len(info["data_sha256"]) == 64 and len(info["source_sha256"]) == 64
    assert info["created"].endswith("+00:00") and json.loads(info["bits_config"])["h"]["bits"] == 8


def test_api_errors_are_qtool_errors():
    model = random_model()
    with pytest.raises(QtoolError, match="must be 3-D"):
        qtool.calibrate(model, np.zeros((4, 5)))
    with pytest.raises(QtoolError, match="feature size"):
        qtool.calibrate(model, np.zeros((4, 3, 7), np.float32))
    with pytest.raises(QtoolError, match="unknown method"):
        qtool.calibrate(model, np.zeros((4, 3, 5), np.float32), method="magic")
    with pytest.raises(AttributeError):
        getattr(qtool, "no_such_function")  # noqa: B009


def test_simulate_hands_back_the_outputs_without_a_file(tmp_path):
    """outputs=True: y_int is what the independent rational reference computes, y_quant its
    dequantization, y_float the float GRU's; the same arrays as save= writes."""
    import h5py
    from reference_int_gru import cell_forward

    from qtool.engine.layout import quantize_input
    from qtool.numerics.float_gru import run_float
    from qtool.numerics.qparams import dequantize

    model = random_model(C=5, H=4, seed=3)
    rng = np.random.default_rng(11)
    qm = qtool.calibrate(model, rng.standard_normal((16, 6, 5)).astype(np.float32), method="minmax")
    test = rng.standard_normal((7, 5, 5)).astype(np.float32) * 1.3  # held out, partly beyond the range
    res = qtool.simulate(qm, test, backend="cpu", batch_size=3, outputs=True, save=tmp_path / "s.h5")
    assert res.y_int.shape == res.y_quant.shape == res.y_float.shape == (7, 5, 4) and res.y_int.dtype == np.int32
    qx = quantize_input(qm, test).transpose(1, 0, 2).tolist()  # [T, N, C]
    want = np.array(cell_forward(qm.cells[0][0], qx)).transpose(1, 0, 2)  # [N, T, H]
    assert np.array_equal(res.y_int, want)
    h = qm.cells[0][0].spec["h"]
    assert np.array_equal(res.y_quant, dequantize(res.y_int, h.exp2_inv, h.zp).astype(np.float32))
    assert np.allclose(res.y_float, run_float(model, test), atol=1e-6)
    with h5py.File(tmp_path / "s.h5") as f:
        for key, got in (("float/y", res.y_float), ("quant/y", res.y_quant), ("quant/y_int", res.y_int)):
            assert np.array_equal(f[key][()], got), key
    assert qtool.simulate(qm, test, backend="cpu").y_int is None  # only when asked for


def test_api_errors_name_parameters_and_the_cli_names_flags(cli, tmp_path):
    """One convention: the API's messages name its parameters in backticks, and the command line
    maps each to its flag in one place (qtool.cli.console.FLAGS)."""
    from qtool.cli.app import as_flags

    model = random_model()
    x = np.zeros((4, 3, 5), np.float32)
    with pytest.raises(QtoolError, match="`batch_size` must be at least 1"):
        qtool.calibrate(model, x, batch_size=0)
    with pytest.raises(QtoolError, match="`methods` takes single methods"):
        qtool.observe(model, x, methods=("auto", "mse"))
    assert as_flags("`batch_size` must be; use `force`; `test` and `methods`; (`check=False`); `fmt`") == \
        "--batch-size must be; use --force; --eval and --compare; (--no-check); --format"
    np.save(tmp_path / "x.npy", x)
    qtool.save(model, tmp_path / "m.h5")
    code, _, err = cli("calibrate", tmp_path / "m.h5", tmp_path / "x.npy", "-o", tmp_path / "q.h5",
                       "--percentile", "20", "--method", "percentile")
    assert code == 2 and "--percentile must be in (50, 100]" in err and "`" not in err


def test_options_of_the_other_kind_of_model_are_refused_in_one_line():
    """One table says what only a GRU alone or only a whole model takes (qtool.api.ONLY_FOR); an
    array given where the other kind takes nothing is refused too, not compared."""
    qm = qtool.calibrate(SAMPLES / "digits_gru.safetensors", SAMPLES / "calib.npy", method="minmax", limit=40)
    with pytest.raises(QtoolError, match="`labels` applies to a whole model; simulate was given a GRU alone"):
        qtool.simulate(qm, SAMPLES / "test.npy", labels=np.zeros(597, int))
    g = qtool.load_model(SAMPLES / "digits.onnx", check=False)
    with pytest.raises(QtoolError, match="a whole model: observe takes a GRU alone"):
        qtool.observe(g, SAMPLES / "calib.npy")
    with pytest.raises(QtoolError, match="unknown `method_weights` 'l1'"):
        qtool.calibrate(g, SAMPLES / "calib.npy", method_weights="l1")


def test_method_weights_of_a_whole_model_sets_each_channels_weight_grid(tmp_path):
    """`method_weights="mse"` on a whole model: each output channel of a layer's weights takes
    the power-of-two grid of least squared error (found here by trying every grid), and its GRU
    the very W and R a GRU alone gets with the same option on the same input."""
    g = qtool.load_model(SAMPLES / "digits.onnx", check=False)
    qg = qtool.calibrate(g, SAMPLES / "calib.npy", method="minmax", method_weights="mse", limit=40)
    W = np.asarray(qg.node("/head/Gemm").params["W"], np.float64)
    e = qg.qparams["/head/Gemm"]["exp2_inv_W"]

    def error(row, k):
        return ((np.clip(np.round(row * 2.0 ** k), -128, 127) * 2.0 ** -k - row) ** 2).sum()

    best = [min(range(-4, 24), key=lambda k, r=r: (error(r, k), k)) for r in W]
    assert list(e) == best and qg.info["method_weights"] == "mse"
    assert any(error(r, k) < error(r, k - 1) for r, k in zip(W, e))  # somewhere finer than min-max
    qtool.save(qg, tmp_path / "q.h5")  # the file keeps the method: a reader derives the same integers
    assert list(qtool.load(tmp_path / "q.h5").qparams["/head/Gemm"]["exp2_inv_W"]) == best
    minmax = qtool.calibrate(g, SAMPLES / "calib.npy", method="minmax", limit=40)
    alone = qtool.calibrate(qtool.load_model(SAMPLES / "digits.onnx", check=False, whole=False),
                            SAMPLES / "calib.npy", method="minmax", method_weights="mse", limit=40)
    gru = qg.qparams["/gru/GRU"]["qm"]
    for name in ("W", "R"):
        e_W = gru.cells[0][0].spec[name].exp2_inv
        assert np.array_equal(e_W, alone.cells[0][0].spec[name].exp2_inv)
        assert not np.array_equal(e_W, minmax.qparams["/gru/GRU"]["qm"].cells[0][0].spec[name].exp2_inv)


def test_compare_scores_a_whole_models_methods_at_its_output():
    """`compare` of a whole model: from one float pass, each method's model has the integers that
    `calibrate` with that method gives, and its row is the integer logits against ONNX Runtime's
    on the held-out digits (SNR, cosine, top-1 agreement); the best has the highest SNR."""
    import onnxruntime as ort

    g = qtool.load_model(SAMPLES / "digits.onnx", check=False)
    methods = ["minmax", "kl", "per-edge"]
    res = qtool.compare(g, SAMPLES / "calib.npy", SAMPLES / "test.npy", methods, limit=60)
    x = np.load(SAMPLES / "test.npy")[:60]  # `limit` bounds the scoring as it bounds the calibration
    y = ort.InferenceSession(str(SAMPLES / "digits.onnx")).run(None, {"rows": x})[0].astype(np.float64)
    for qg, row, method in zip(res.models, res.rows, methods):
        alone = qtool.calibrate(g, SAMPLES / "calib.npy", method=method, limit=60)
        assert row["method"] == method and qg.grids == alone.grids
        assert qg.qparams["/gru/GRU"]["qm"].fingerprint() == alone.qparams["/gru/GRU"]["qm"].fingerprint()
        assert all(np.array_equal(v, alone.qparams["/head/Gemm"][k]) for k, v in qg.qparams["/head/Gemm"].items())
        got = dequantized(qg, run_int(qg, x))["logits"].astype(np.float64)
        assert row["snr_db"] == pytest.approx(10 * np.log10((y ** 2).sum() / ((got - y) ** 2).sum()), abs=0.01)
        assert row["cosine"] == pytest.approx((got * y).sum() / np.linalg.norm(got) / np.linalg.norm(y), abs=1e-5)
        assert row["top1_agreement"] == pytest.approx((got.argmax(1) == y.argmax(1)).mean())
    assert res.best == int(np.argmax([r["snr_db"] for r in res.rows])) and res.rows[res.best]["snr_db"] > 25


def test_export_takes_test_vectors_from_a_file(tmp_path):
    """`test_vectors` is data like every data argument: a path is read, not taken for numbers."""
    qm = qtool.calibrate(SAMPLES / "digits_gru.safetensors", SAMPLES / "calib.npy", method="minmax", limit=40)
    np.save(tmp_path / "v.npy", np.load(SAMPLES / "test.npy")[:3])
    res = qtool.export_c(qm, tmp_path / "c", name="m", test_vectors=tmp_path / "v.npy")
    assert "m_test_vectors.h" in res.files and "m_test_main.c" in res.files
    if has("onnx"):
        qg = qtool.calibrate(SAMPLES / "digits.onnx", SAMPLES / "calib.npy", method="minmax", limit=40, check=False)
        res = qtool.export_c(qg, tmp_path / "g", name="g", test_vectors=tmp_path / "v.npy")
        assert any(f.endswith("test_vectors.h") for f in res.files)


def test_export_test_vectors_count_and_notes(tmp_path):
    """`vectors` takes the first sequences of the data (or that many random ones); the notes say
    when the data hold fewer, and which share of their values lies outside the input's grid."""
    qm = qtool.calibrate(SAMPLES / "digits_gru.safetensors", SAMPLES / "calib.npy", method="minmax", limit=40)
    x = np.load(SAMPLES / "test.npy")[:5]
    res = qtool.export_c(qm, tmp_path / "a", name="m", test_vectors=x, vectors=3)
    assert "#define M_TEST_SEQUENCES 3" in (tmp_path / "a" / "m_test_vectors.h").read_text() and res.notes == []
    res = qtool.export_c(qm, tmp_path / "b", name="m", test_vectors=True, vectors=2)
    assert "#define M_TEST_SEQUENCES 2" in (tmp_path / "b" / "m_test_vectors.h").read_text() and res.notes == []
    g = qm.cells[0][0].spec["x"]
    loud = x * 100
    share = np.mean((loud < g.lo) | (loud > g.hi))
    assert share > 0.02
    res = qtool.export_c(qm, tmp_path / "c", name="m", test_vectors=loud, vectors=9)
    assert res.notes == ["9 test vectors asked for: array holds 5 sequences; the test vectors are all 5",
                         f"{share:.1%} of the test vectors' values of input 'x' lie outside its grid (saturated): "
                         "are the data scaled as the calibration data were?"]
    with pytest.raises(QtoolError, match="`vectors` must be a positive integer"):
        qtool.export_c(qm, tmp_path / "d", test_vectors=True, vectors=0)
    with pytest.raises(QtoolError, match="go with `test_vectors`"):
        qtool.export_c(qm, tmp_path / "d", vectors=2)


def test_advise_says_which_held_out_sequences_are_calibration_data():
    """Held-out data built from the calibration data (rows reordered, some new) is found
    sequence by sequence, not by comparing files."""
    rng = np.random.default_rng(7)
    calib = rng.standard_normal((12, 6, 5)).astype(np.float32)
    test = np.concatenate([calib[[9, 2]], rng.standard_normal((4, 6, 5)).astype(np.float32)])
    adv = qtool.advise(random_model(C=5, H=8, seed=7), calib, test, repeats=1)
    assert "2 of the 6 held-out sequences are also in the calibration data" in " ".join(adv.extra["notes"])
    adv = qtool.advise(random_model(C=5, H=8, seed=7), calib, test[2:], repeats=1)
    assert not any("held-out sequences" in n for n in adv.extra["notes"])


def test_export_says_how_large_its_test_vectors_are(tmp_path, monkeypatch):
    import qtool.api.export as export

    qm = qtool.calibrate(SAMPLES / "digits_gru.safetensors", SAMPLES / "calib.npy", method="minmax", limit=40)
    x = np.load(SAMPLES / "test.npy")[:3]
    monkeypatch.setattr(export, "LARGE_VECTORS", x[:2].size)
    res = qtool.export_c(qm, tmp_path / "a", name="m", test_vectors=x)
    assert res.notes == [f"the test vectors are {x.size:,} input values (3 sequences x {x.shape[1]} steps x "
                         f"{x.shape[2]} channels), written with their outputs into the test header; `vectors` "
                         "takes fewer"]
    assert qtool.export_c(qm, tmp_path / "b", name="m", test_vectors=x, vectors=2).notes == []
    res = qtool.export_c(qm, tmp_path / "c", name="m", test_vectors=True, vectors=200)
    assert res.notes and res.notes[0].startswith("the test vectors are")
