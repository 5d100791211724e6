"""`qtool inspect FILE --graph`: the whole model of a framework file, a row a layer, checked
against the framework; a weights-only file says why it has no graph."""

import json
import re

import h5py
import numpy as np
import pytest
from conftest import SAMPLES, has, keras_on_torch

import qtool
from qtool.layers import run


@pytest.fixture(scope="module")
def keras_file(tmp_path_factory):
    keras = keras_on_torch(5)
    L = keras.layers
    m = keras.Sequential([keras.Input((None, 6)), L.Dense(8, activation="relu", name="front"),
                          L.GRU(12, return_sequences=False, name="gru"), L.Dense(3, activation="softmax", name="head")])
    path = tmp_path_factory.mktemp("graph") / "kws.keras"
    m.save(path)
    return m, path


def test_inspect_graph_lists_every_layer_and_the_check(cli, keras_file):
    m, path = keras_file
    code, out, err = cli("inspect", path, "--graph")
    assert code == 0, err
    for row in ("front", "relu", "gru", "head", "softmax"):
        assert row in out, row
    assert "matches Keras" in out
    code, out, err = cli("inspect", path, "--graph", "--json", "--no-check")
    doc = json.loads(out)
    assert [r["op"] for r in doc["layers"]] == ["dense", "activation", "gru", "dense", "softmax"]
    assert doc["layers"][2]["shape"] == [12] and doc["check"] is None
    x = np.random.default_rng(2).standard_normal((4, 9, 6)).astype(np.float32)  # held out, another length
    graph = qtool.load_model(path, check=False)
    assert np.abs(run(graph, x)[graph.outputs[0]] - m.predict(x, verbose=0)).max() < 1e-5


def test_a_weights_only_file_is_the_graph_of_its_gru(cli):
    """A state dict holds a GRU's weights and no graph: its whole model is one gru node, what the
    import checked and what it left out said (never part of a model without a word)."""
    code, out, _ = cli("inspect", SAMPLES / "digits_gru.safetensors", "--graph")
    assert code == 0 and ": 1 layer\n" in out and "gru, 2 layers" in out
    checked = "matches PyTorch nn.GRU" if has("torch") else "not checked against the source framework"
    assert checked in out and "left out, not quantized: head (2 tensors)" in out


def test_graph_refusals_are_one_true_line(cli, tmp_path, keras_file):
    onnx = pytest.importorskip("onnx")
    pytest.importorskip("onnxruntime")
    from onnx import TensorProto, helper

    _, path = keras_file
    code, _, err = cli("inspect", path, "--graph", "--name", "gru")
    assert code == 2 and "--name picks one GRU of a file; --graph shows the whole model" in err
    np.save(tmp_path / "x.npy", np.zeros((2, 4, 6), np.float32))
    cli("import", path, "-o", tmp_path / "gru.h5", "--no-check", "--name", "gru")  # the GRU alone
    code, out, _ = cli("inspect", tmp_path / "gru.h5", "--graph")  # its graph: one gru node
    assert code == 0 and ": 1 layer\n" in out and "qtool's own GRU file" in out
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, ["n", "t", 4])
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, None)
    model = helper.make_model(helper.make_graph([helper.make_node("Relu", ["x"], ["y"])], "g", [x], [y]),
                              opset_imports=[helper.make_opsetid("", 99)])
    onnx.save(model, str(tmp_path / "op99.onnx"))
    code, _, err = cli("inspect", tmp_path / "op99.onnx", "--graph")  # ONNX Runtime's reason, not where it failed
    assert code == 2 and "Opset 99" in err and "onnxruntime_src" not in err and err.count("\n") == 1


# ---- whole models in integers from the command line ---------------------------------------------

@pytest.fixture(scope="module")
def digits_whole(tmp_path_factory):
    """The bundled whole classifier calibrated to int8 through the command line."""
    from qtool.cli.app import main

    d = tmp_path_factory.mktemp("whole")
    with pytest.raises(SystemExit) as e:
        main([str(a) for a in ("calibrate", SAMPLES / "digits.onnx", SAMPLES / "calib.npy", "-o", d / "q.h5",
                               "--json", "--no-check")])
    assert e.value.code in (0, None)
    return d


def test_a_whole_classifier_calibrates_and_simulates_with_its_accuracy(cli, digits_whole):
    ort = pytest.importorskip("onnxruntime")
    import h5py

    d = digits_whole
    code, out, err = cli("simulate", d / "q.h5", SAMPLES / "test.npy", "--labels", SAMPLES / "test_labels.npy",
                         "--save", d / "y.h5", "--json")
    assert code == 0, err
    res = json.loads(out)
    x, labels = np.load(SAMPLES / "test.npy"), np.load(SAMPLES / "test_labels.npy")
    with h5py.File(d / "y.h5") as f:
        y_float, y_quant, y_int = f["float/y"][()], f["quant/y"][()], f["quant/y_int"][()]
    assert y_float.shape == y_quant.shape == y_int.shape == (len(x), 10)
    # the float graph is ONNX Runtime's model; the integer classes are the saved logits' argmax
    sess = ort.InferenceSession(str(SAMPLES / "digits.onnx"))
    assert np.abs(sess.run(None, {"rows": x})[0] - y_float).max() < 1e-4
    top_q = y_int.argmax(1)
    assert (top_q == y_quant.argmax(1)).all()
    assert res["accuracy_quant"] == pytest.approx((top_q == labels).mean())
    assert res["accuracy_float"] == pytest.approx((y_float.argmax(1) == labels).mean())
    assert res["top1_agreement"] == pytest.approx((top_q == y_float.argmax(1)).mean()) and res["top1_agreement"] >= 0.98
    assert res["accuracy_quant"] >= 0.97 and res["outputs"]["logits"]["cosine"] >= 0.99
    assert [r["op"] for r in res["edges"]] == ["input", "gru", "last_step", "dense"]


def test_calibrate_compare_of_a_whole_model_writes_the_best(cli, tmp_path):
    """`calibrate --compare --eval` takes a whole model as it takes a GRU alone: a row per method
    scored at the output on the held-out data (with the classifier's top-1), the best written,
    and that file simulates to its row's figures."""
    code, out, err = cli("calibrate", SAMPLES / "digits.onnx", SAMPLES / "calib.npy", "--compare", "minmax,mse",
                         "--eval", SAMPLES / "test.npy", "--limit", "60", "--no-check", "-o", tmp_path / "b.h5",
                         "--json")
    assert code == 0, err
    res = json.loads(out)
    rows = {r["method"]: r for r in res["methods"]}
    assert set(rows) == {"minmax", "mse"} and res["best"] == max(rows, key=lambda m: rows[m]["snr_db"])
    code, out, err = cli("simulate", tmp_path / "b.h5", SAMPLES / "test.npy", "--limit", "60", "--json")
    assert code == 0, err
    sim = json.loads(out)
    assert sim["core_outputs"]["logits"]["snr_db"] == pytest.approx(rows[res["best"]]["snr_db"])
    assert sim["top1_agreement"] == pytest.approx(rows[res["best"]]["top1_agreement"])
    code, out, err = cli("calibrate", SAMPLES / "digits.onnx", SAMPLES / "calib.npy", "--compare", "minmax,kl",
                         "--eval", SAMPLES / "test.npy", "--limit", "60", "--no-check", "--method-weights", "mse")
    assert code == 0 and "top-1" in out and "kl" in out and "minmax" in out, err


def test_a_whole_model_file_is_inspected_and_its_labels_checked(cli, digits_whole, tmp_path):
    d = digits_whole
    code, out, err = cli("inspect", d / "q.h5")
    assert code == 0 and "stack_grus" in out and "/head/Gemm" in out, err
    with h5py.File(d / "q.h5") as f:  # its provenance, as a GRU alone's
        stamp = f.attrs["fingerprint"]
    assert stamp in out and "data_sha256" in out and "created" in out
    code, out, err = cli("inspect", d / "q.h5", "--json")
    assert json.loads(out)["fingerprint"] == stamp, err
    np.save(tmp_path / "short.npy", np.zeros(3, np.int64))
    np.save(tmp_path / "long.npy", np.zeros(600, np.int64))
    np.save(tmp_path / "float.npy", np.zeros(597))
    np.save(tmp_path / "class10.npy", np.full(597, 10))
    (tmp_path / "text.npy").write_text("1 2 3")
    (tmp_path / "empty.npy").write_bytes(b"")
    (tmp_path / "cut.npy").write_bytes((tmp_path / "long.npy").read_bytes()[:100])
    for labels, says in ((tmp_path / "short.npy", "labels must be one integer class index per sequence, [597]"),
                         (tmp_path / "long.npy", "labels must be one integer class index per sequence, [597]"),
                         (tmp_path / "float.npy", "got shape [597] of float64"),
                         (SAMPLES / "calib.npy", "labels must be"),
                         (tmp_path / "class10.npy", "label 10 (sequence 0) is not a class of the model's 10 outputs"),
                         (tmp_path / "text.npy", "not a readable .npy file of numbers"),
                         (tmp_path / "none.npy", "labels: file not found"),
                         (tmp_path / "empty.npy", "the file is empty"),  # not read as a Ctrl-D
                         (tmp_path / "cut.npy", "not a readable .npy file of numbers"),
                         (tmp_path, "is a directory, not a .npy file of class indexes")):
        code, _, err = cli("simulate", d / "q.h5", SAMPLES / "test.npy", "--labels", labels,
                           "--save", tmp_path / "y.h5")
        assert code == 2 and says in err and err.count("\n") == 1, err
        assert not (tmp_path / "y.h5").exists()
    labels = np.load(SAMPLES / "test_labels.npy")
    np.save(tmp_path / "first.npy", labels[:100])  # one per sequence used: as good as one per sequence
    outs = [cli("simulate", d / "q.h5", SAMPLES / "test.npy", "--limit", 100, "--labels", f, "--json")[1]
            for f in (tmp_path / "first.npy", SAMPLES / "test_labels.npy")]
    assert json.loads(outs[0])["accuracy_quant"] == json.loads(outs[1])["accuracy_quant"] > 0.9
    code, _, err = cli("simulate", d / "q.h5", SAMPLES / "test.npy", "--limit", 100, "--labels", tmp_path / "short.npy")
    assert code == 2 and "[597 (one per sequence of the data) or 100 (one per sequence used)]" in err
    code, _, err = cli("inspect", d / "q.h5", "--name", "nosuch")
    assert code == 2 and "is qtool's whole-model file" in err
    code, _, err = cli("simulate", d / "q.h5", SAMPLES / "test.npy", "--save", tmp_path / "r.h5")
    assert code == 0, err
    for args in (["inspect", tmp_path / "r.h5"], ["calibrate", tmp_path / "r.h5", SAMPLES / "calib.npy"]):
        code, _, err = cli(*args)
        assert code == 2 and "a results file (qtool simulate --save)" in err, err
    code, _, err = cli("simulate", d / "q.h5", SAMPLES / "test.npy", "--tensors", "all")
    assert code == 2 and "a whole model always measures and shows every edge" in err
    code, _, err = cli("simulate", d / "q.h5", SAMPLES / "test.npy", "--save", d / "q.h5", "--force")
    assert code == 2 and "is also an input" in err
    code, _, err = cli("simulate", tmp_path / "none.h5", SAMPLES / "test.npy", "--labels", SAMPLES / "test_labels.npy")
    assert code == 2 and "not found" in err
    code, _, err = cli("simulate", SAMPLES / "digits_gru.safetensors", SAMPLES / "test.npy", "--labels",
                       SAMPLES / "test_labels.npy")
    assert code == 2 and err.count("\n") == 1


def test_import_writes_the_whole_graph_and_name_takes_the_gru_alone(cli, keras_file, tmp_path):
    _, path = keras_file
    code, out, err = cli("import", path, "-o", tmp_path / "whole.h5", "--no-check")
    assert code == 0 and "imported the whole model" in out, err
    g = qtool.load_model(tmp_path / "whole.h5")
    assert [n.op for n in g.nodes] == ["dense", "activation", "gru", "dense", "softmax"]
    code, out, err = cli("import", path, "-o", tmp_path / "gru.h5", "--no-check", "--name", "gru")
    assert code == 0 and "left out" in " ".join(out.split()), err
    x = np.random.default_rng(0).standard_normal((40, 7, 6)).astype(np.float32)
    np.save(tmp_path / "cal.npy", x)
    code, out, err = cli("calibrate", tmp_path / "whole.h5", tmp_path / "cal.npy", "-o", tmp_path / "q.h5",
                         "--method", "minmax")
    assert code == 0 and "partition: 4 integer node(s), float tail: head/activation" in " ".join(out.split()), err


def test_export_json_and_h5_of_a_whole_model_hold_its_integers(cli, digits_whole, tmp_path):
    """`export json|h5` of a whole model: every core edge's grid and every integer layer's
    integers, in order; the dense head recomputed from the JSON alone (q_y = clamp(((q_x W^T + q_b
    - W_sum_mul_x_zp) + 2^(sh - 1)) >> sh + zp_y)) equals the simulator's integers, and the HDF5
    file holds the same numbers."""
    import h5py

    from qtool.graph.simulate import run_int

    d = digits_whole
    for kind in ("json", "h5"):
        code, out, err = cli("export", kind, d / "q.h5", "-o", tmp_path / f"p.{kind}")
        assert code == 0 and "parameter tables" in out, err
    t = json.loads((tmp_path / "p.json").read_text())
    qg = qtool.load(d / "q.h5")
    assert t["format"] == "qtool-graph-params" and [n["op"] for n in t["nodes"]] == ["gru", "last_step", "dense"]
    head = t["nodes"][-1]
    ints, g_x, g_y = head["integers"], t["edges"][head["inputs"][0]], t["edges"][head["outputs"][0]]
    assert g_y["exp2_inv"] == int(qg.grids[head["outputs"][0]].exp2_inv) and len(t["nodes"][0]["cells"]) == 2
    x = np.load(SAMPLES / "test.npy")[:50]
    q = run_int(qg, x)
    acc = q[head["inputs"][0]] @ np.array(ints["q_W"]).T + np.array(ints["q_b"]) - np.array(ints["W_sum_mul_x_zp"])
    sh = np.array(ints["sh_acc"])
    y = np.clip(((acc + (1 << (sh - 1))) >> sh) + g_y["zp"], -(1 << (g_y["bits"] - 1)), (1 << (g_y["bits"] - 1)) - 1)
    assert np.array_equal(y, q[head["outputs"][0]]) and g_x["bits"] == 8
    with h5py.File(tmp_path / "p.h5") as f:
        assert f.attrs["format"] == "qtool-graph-params" and f.attrs["fingerprint"] == t["fingerprint"]
        k = len(t["nodes"]) - 1
        assert f[f"nodes/{k}"].attrs["name"] == head["name"]
        assert np.array_equal(f[f"nodes/{k}/integers/q_W"][()], ints["q_W"])
        assert "layer1/fwd/shifts" in f["nodes/0"]
        edge0 = f["edges/0"].attrs
        assert edge0["name"] == t["inputs"][0] == next(iter(t["edges"]))  # the graph's order, the input first
        assert [edge0["lo"], edge0["hi"]] == t["edges"][t["inputs"][0]]["range"]
        assert json.loads(f.attrs["calibration"])["samples"] == t["calibration"]["samples"]


def test_report_draws_a_whole_model_with_each_edges_error(cli, digits_whole, tmp_path):
    d = digits_whole
    code, out, err = cli("report", d / "q.h5", SAMPLES / "test.npy", "-o", tmp_path / "r.html", "--json")
    assert code == 0, err
    res = json.loads(out)
    page = (tmp_path / "r.html").read_text()
    sim = qtool.simulate(qtool.load(d / "q.h5"), SAMPLES / "test.npy").to_dict()
    assert res["metrics"]["cosine"] == sim["outputs"]["logits"]["cosine"]
    drawn = re.sub(r"<script>.*?</script>", "", page, flags=re.S)  # plotly.js, for the GRU's histograms
    assert drawn.count("<svg") == 1 and "Written by qtool" in page
    assert "GRU /gru/GRU: its tensors" in page  # its two layers' histograms and channels, with plotly
    assert page.count("Plotly.newPlot(") == (2 * 2 if has("plotly") else 0)
    for edge, m in sim["edges"].items():  # every edge drawn with its SNR, and in the table
        label = "exact" if m["exact"] else f"{m['snr_db']:.1f} dB"
        assert f"<title>{edge}</title>" in page or edge == "logits", edge
        assert label in page, (edge, label)
    code, _, err = cli("report", d / "q.h5", SAMPLES / "test.npy", "-o", tmp_path / "t.html", "--units", 2)
    assert code == 2 and "--units sets the output traces of a GRU alone's page; a whole model's page draws none" \
        in err and not (tmp_path / "t.html").exists()
    code, _, err = cli("advise", SAMPLES / "digits.onnx", SAMPLES / "calib.npy", "-v")  # nothing more to show
    assert code == 2 and "--verbose shows a GRU alone's estimator statistics" in err, err
    (tmp_path / "mine.html").write_text("<p>my page</p>")
    code, _, err = cli("report", d / "q.h5", SAMPLES / "test.npy", "-o", tmp_path / "mine.html", "--force")
    assert code == 2 and "was not written by qtool" in err
    assert (tmp_path / "mine.html").read_text() == "<p>my page</p>"


def test_a_whole_model_with_an_unsupported_layer_is_refused_naming_it(cli, tmp_path):
    keras = keras_on_torch(3)
    L = keras.layers
    m = keras.Sequential([keras.Input((None, 6)), L.Dense(8, name="front"), L.Conv1DTranspose(8, 3, name="upsample"),
                          L.GRU(12, name="gru"), L.Dense(3, name="head")])
    m.save(tmp_path / "ln.keras")
    np.save(tmp_path / "x.npy", np.random.default_rng(0).standard_normal((8, 5, 6)).astype(np.float32))
    for args in (["import", tmp_path / "ln.keras", "-o", tmp_path / "a.h5"],
                 ["calibrate", tmp_path / "ln.keras", tmp_path / "x.npy", "-o", tmp_path / "b.h5"]):
        code, _, err = cli(*args, "--no-check")
        assert code == 2 and "the whole model cannot be taken" in err and "upsample" in err, err
        assert "--name takes one GRU, or the stack of GRU layers it starts, alone" in err and err.count("\n") == 1
    assert sorted(p.name for p in tmp_path.iterdir()) == ["ln.keras", "x.npy"]
    code, out, err = cli("import", tmp_path / "ln.keras", "-o", tmp_path / "a.h5", "--no-check", "--name", "gru")
    assert code == 0 and "left out" in " ".join(out.split()), err


def test_a_classifier_is_measured_at_its_logits(cli, tmp_path):
    """A float softmax flattens the error: calibrate's auto, advise and simulate's headline take the
    integer core's output (the logits), and simulate names both."""
    from test_export_graph_c import _data, causal_graph

    from qtool import api
    from qtool.graph.simulate import output_snr_db

    qg = api.calibrate(causal_graph(), _data(6, 64, 24, 0), bits="int8", method="minmax", check=False)
    test = _data(6, 16, 24, 1)
    sim = api.simulate(qg, test, backend="cpu")
    assert qg.core_outputs == ["logits"] and qg.graph.outputs == ["y"]
    assert output_snr_db(sim, qg) == sim.edges["logits"].snr_db < sim.outputs["y"].snr_db
    api.save(qg, tmp_path / "q.h5")
    np.save(tmp_path / "t.npy", test)
    code, out, err = cli("simulate", tmp_path / "q.h5", tmp_path / "t.npy")
    assert code == 0, err
    text = " ".join(out.split())
    assert f"integer core's output logits: SNR {sim.edges['logits'].snr_db:.2f} dB" in text
    assert "output y (after the float tail): SNR" in text


def test_export_of_a_model_that_cannot_stream_gives_its_work_not_a_step_ram(cli, tmp_path, qgru_file):
    from test_export_graph_c import _data, whole_graph

    from qtool import api

    qg = api.calibrate(whole_graph(), _data(4, 32, 24, 0), bits="int8", method="minmax", check=False)
    api.save(qg, tmp_path / "q.h5")
    code, out, err = cli("export", "c", tmp_path / "q.h5", "-o", tmp_path / "c", "--name", "m")
    assert code == 0, err
    text = " ".join(out.split())
    assert "RAM B" not in text and "no m_step" in text
    code, _, err = cli("verify", qgru_file, tmp_path / "c", SAMPLES / "test.npy")  # its GRU's tables are no export
    assert code == 2 and "holds a whole model's export (m), not a GRU alone's" in err and err.count("\n") == 1, err
    assert "m_sequence_work(T) bytes at 24 steps (the calibration's)" in text and "M_SEQUENCE_WORK_MAX(T)" in text
    assert "#define M_SEQUENCE_WORK_MAX(T)" in (tmp_path / "c" / "m.h").read_text()


def test_export_and_verify_of_a_whole_model_that_is_a_gru_alone(cli, tmp_path):
    """`qtool export c` and `verify` of a quantized whole model of one gru node (a GRU's weights
    read whole): the GRU's own C and its own checks, in one command path with every model."""
    qg = qtool.calibrate(qtool.load_model(SAMPLES / "digits_gru.safetensors", whole=True), SAMPLES / "calib.npy",
                         method="minmax", limit=40)
    qtool.save(qg, tmp_path / "qg.h5")
    code, out, err = cli("export", "c", tmp_path / "qg.h5", "-o", tmp_path / "c", "--name", "d", "--json")
    assert code == 0 and json.loads(out)["macs_per_step"] > 0 and "layers" not in json.loads(out), err
    code, out, err = cli("verify", tmp_path / "qg.h5", tmp_path / "c", SAMPLES / "test.npy", "--limit", "4")
    assert code == 0 and "final-state integers" in out and "PASS" in out, err
