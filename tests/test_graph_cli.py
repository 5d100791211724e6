"""`qtool inspect FILE --graph`: the whole model of a framework file, a row a layer, checked
against the framework; a weights-only file says why it has no graph."""

import json

import numpy as np
import pytest
from conftest import SAMPLES, keras_on_torch

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
    graph = qtool.load_graph(path, check=False)
    assert np.abs(run(graph, x)[graph.outputs[0]] - m.predict(x, verbose=0)).max() < 1e-5


def test_a_weights_only_file_has_no_graph(cli):
    code, _, err = cli("inspect", SAMPLES / "digits_gru.safetensors", "--graph")
    assert code == 2 and "holds weights only" in err and err.count("\n") == 1


def test_graph_refusals_are_one_true_line(cli, tmp_path, keras_file):
    onnx = pytest.importorskip("onnx")
    pytest.importorskip("onnxruntime")
    from onnx import TensorProto, helper

    _, path = keras_file
    code, _, err = cli("inspect", path, "--graph", "--name", "gru")
    assert code == 2 and "--name picks one GRU of a file; --graph shows the whole model" in err
    np.save(tmp_path / "x.npy", np.zeros((2, 4, 6), np.float32))
    cli("import", path, "-o", tmp_path / "gru.h5", "--no-check", "--name", "gru")  # the GRU alone
    code, _, err = cli("inspect", tmp_path / "gru.h5", "--graph")
    assert code == 2 and "a qtool model file holds a GRU, not a whole model" in err
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, ["n", "t", 4])
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, None)
    model = helper.make_model(helper.make_graph([helper.make_node("Relu", ["x"], ["y"])], "g", [x], [y]),
                              opset_imports=[helper.make_opsetid("", 99)])
    onnx.save(model, str(tmp_path / "op99.onnx"))
    code, _, err = cli("inspect", tmp_path / "op99.onnx", "--graph")  # ONNX Runtime's reason, not where it failed
    assert code == 2 and "Opset 99" in err and "onnxruntime_src" not in err and err.count("\n") == 1
