"""Every cell form on trained models: Keras GRUs with the reset gate before the recurrent GEMM,
hard_sigmoid gates (both reset forms) and a relu candidate, and an ONNX GRU with
linear_before_reset=0, each trained on a task this test makes, saved by its framework, imported
with the check on (float = framework to 1e-4), then calibrated and simulated on held-out data:
the output's cosine to the float model >= 0.99 (int8), 0.999 (w8a16), 0.9999 (int16); the int8
C export computes the simulator's integers exactly on the host and on an emulated Cortex-M4."""

import shutil

import numpy as np
import pytest
from conftest import keras_on_torch
from qtool.exporters import c_target

from qtool import api
from qtool.importers import import_model

COSINE = {"int8": 0.99, "w8a16": 0.999, "int16": 0.9999}
TOL = 1e-4
CASES = {  # name: the Keras GRU's settings
    "reset_before": dict(reset_after=False),
    "hard_sigmoid": dict(recurrent_activation="hard_sigmoid"),
    "hard_sigmoid_reset_before": dict(recurrent_activation="hard_sigmoid", reset_after=False),
    "relu": dict(activation="relu"),
}
C, H, T = 4, 12, 24


def task(n: int, seed: int) -> tuple[np.ndarray, np.ndarray]:
    """A memory task: per step the running mean of the first two channels, and the sign of the
    input three steps back (needs the state), as H targets by a fixed mix."""
    rng = np.random.RandomState(seed)
    x = rng.randn(n, T, C).astype(np.float32)
    mean = np.cumsum(x[:, :, :2], axis=1) / np.arange(1, T + 1)[None, :, None]
    lag = np.sign(np.roll(x[:, :, 2:], 3, axis=1))
    lag[:, :3] = 0
    feats = np.concatenate([mean, lag], axis=2)  # [n, T, 4]
    mix = np.random.RandomState(99).randn(4, H).astype(np.float32) * 0.5
    return x, np.tanh(feats @ mix).astype(np.float32)


@pytest.fixture(scope="module")
def trained(tmp_path_factory):
    """name: (Keras model, its .keras file); each a 2-layer GRU stack trained on `task`."""
    keras = keras_on_torch(7)
    x, y = task(384, 0)
    root, out = tmp_path_factory.mktemp("forms"), {}
    for name, kw in CASES.items():
        m = keras.Sequential([keras.Input((None, C)), keras.layers.GRU(H, return_sequences=True, **kw),
                              keras.layers.GRU(H, return_sequences=True, **kw)])
        m.compile(optimizer=keras.optimizers.Adam(1e-2), loss="mse")
        loss = m.fit(x, y, epochs=6, batch_size=32, verbose=0).history["loss"]
        assert loss[-1] < 0.95 * loss[0], (name, loss)  # it learned
        m.save(root / f"{name}.keras")
        out[name] = (m, root / f"{name}.keras")
    return out


def _bar(model, x_test) -> dict:
    """Each preset's quantized model, its output's cosine held to COSINE."""
    x_cal, _ = task(256, 1)
    got = {}
    for bits, floor in COSINE.items():
        qm = api.calibrate(model, x_cal, bits=bits)
        res = api.simulate(qm, x_test, per_tensor=False).to_dict()["output"]
        print(f"{bits}: cosine {res['cosine']:.6f}, SNR {res['snr_db']:.2f} dB")  # pytest -s
        assert res["cosine"] >= floor, (bits, res)
        got[bits] = qm
    return got


def _c_exact(qm, x_test, tmp_path) -> None:
    """The int8 export verified with 0 mismatches on the host and (where the toolchain is) on
    an emulated Cortex-M4."""
    if shutil.which("cc") is None:
        pytest.skip("no C compiler")
    api.export_c(qm, tmp_path / "c", name="m")
    targets = ["host"] + ([] if c_target.missing_tools() else ["cortex-m4"])
    for target in targets:
        res = api.verify(qm, tmp_path / "c", x_test[:4 if target == "host" else 2], name="m", target=target)
        assert res.output_values and res.mismatches == 0, (target, res.to_dict())


@pytest.mark.parametrize("name", list(CASES))
def test_trained_keras_forms_meet_the_bar(trained, name, tmp_path):
    m, path = trained[name]
    model = import_model(path)
    assert model.extra["check"]["checked"] and model.extra["check"]["max_abs_diff"] <= TOL
    x_test, _ = task(128, 2)  # held out
    _c_exact(_bar(model, x_test)["int8"], x_test, tmp_path)


def test_trained_onnx_linear_before_reset_0_meets_the_bar(trained, tmp_path):
    """The trained Keras reset_after=False weights written as an ONNX GRU node with
    linear_before_reset=0 (the ONNX default, what TensorFlow converters write), r | z | h gates."""
    onnx = pytest.importorskip("onnx")
    pytest.importorskip("onnxruntime")
    from onnx import TensorProto, helper, numpy_helper

    m, _ = trained["reset_before"]
    nodes, inits, inp = [], [], "X"
    for i, layer in enumerate(m.layers):
        kernel, recurrent, bias = (np.asarray(v) for v in layer.get_weights())  # z | r | h columns
        W, R = kernel.T[None], recurrent.T[None]  # Keras' z | r | h columns are ONNX's z | r | h rows
        B = np.concatenate([bias.reshape(-1), np.zeros(3 * H, np.float32)])[None]
        inits += [numpy_helper.from_array(a.astype(np.float32), f"{k}{i}") for k, a in (("W", W), ("R", R), ("B", B))]
        nodes += [helper.make_node("GRU", [inp, f"W{i}", f"R{i}", f"B{i}"], [f"Y{i}"], hidden_size=H,
                                   linear_before_reset=0),
                  helper.make_node("Squeeze", [f"Y{i}", "axis1"], [f"S{i}"])]
        inp = f"S{i}"
    inits.append(numpy_helper.from_array(np.array([1], np.int64), "axis1"))
    graph = helper.make_graph(nodes, "gru", [helper.make_tensor_value_info("X", TensorProto.FLOAT, ["T", "N", C])],
                              [helper.make_tensor_value_info(inp, TensorProto.FLOAT, ["T", "N", H])], inits)
    path = tmp_path / "gru.onnx"
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 14)]), path)
    model = import_model(path)
    assert model.extra["check"]["checked"] and model.extra["check"]["max_abs_diff"] <= TOL
    assert not model.layers[0][0].form.reset_after
    x_test, _ = task(128, 2)
    y_onnx = __import__("onnxruntime").InferenceSession(str(path)).run(None, {"X": x_test.transpose(1, 0, 2)})[0]
    assert np.abs(y_onnx.transpose(1, 0, 2) - m.predict(x_test, verbose=0)).max() <= TOL  # the same network
    _c_exact(_bar(model, x_test)["int8"], x_test, tmp_path)
