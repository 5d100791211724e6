"""Whole models end to end, as a user meets them: a small model built in PyTorch or Keras, trained
briefly on a synthetic task (seeded), saved with the framework's own exporter or saver, then
imported with the check on (its float graph equal to the framework on held-out data), calibrated
on a calibration split and simulated in integers on a separate held-out split with each preset
(int8, w8a16, int16), where the output must stay close to float."""

import os
import warnings

import numpy as np
import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("onnx")
ort = pytest.importorskip("onnxruntime")

import qtool.layers as L  # noqa: E402
from qtool import api  # noqa: E402

# the output's cosine to float each preset must reach on held-out data
COSINE = {"int8": 0.99, "w8a16": 0.999, "int16": 0.9999}
TOLERANCE = 1e-4  # float graph against the framework (relative where the output exceeds 1)


@pytest.fixture(autouse=True)
def one_thread():
    """Train and run the frameworks on one thread: these models are too small to gain from more,
    and on a busy machine the threads' spinning would cost far more than it gains."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


def _close_to(got: np.ndarray, want: np.ndarray) -> float:
    """The largest difference, relative where the reference exceeds 1."""
    assert got.shape == want.shape
    return float(np.abs(got - want).max()) / max(1.0, float(np.abs(want).max()))


def _export(module, path, x: np.ndarray) -> None:
    """torch.onnx.export, TorchScript exporter, batch and time left free."""
    with warnings.catch_warnings(), torch.no_grad():
        warnings.simplefilter("ignore")
        torch.onnx.export(module.eval(), (torch.from_numpy(x[:2]),), str(path), input_names=["x"],
                          output_names=["y"], dynamo=False,
                          dynamic_axes={"x": {0: "batch", 1: "time"}, "y": {0: "batch"}})


def _ort(path, x: np.ndarray) -> np.ndarray:
    opts = ort.SessionOptions()
    opts.intra_op_num_threads = 1
    sess = ort.InferenceSession(str(path), opts, providers=["CPUExecutionProvider"])
    return sess.run(["y"], {"x": x})[0]


def _train_torch(module, x: np.ndarray, y: np.ndarray, loss_fn, epochs: int, lr: float = 1e-2,
                 batch: int = 32) -> None:
    torch.manual_seed(0)
    opt = torch.optim.Adam(module.parameters(), lr=lr)
    xt, yt = torch.from_numpy(x), torch.from_numpy(y)
    order = np.random.default_rng(0)
    module.train()
    for _ in range(epochs):
        perm = torch.from_numpy(order.permutation(len(x)))
        for k in range(0, len(x), batch):
            idx = perm[k:k + batch]
            opt.zero_grad()
            loss_fn(module(xt[idx]), yt[idx]).backward()
            opt.step()
    module.eval()


def _imported(path, x_test: np.ndarray, want: np.ndarray):
    """The file imported with its check on; its float graph held to the framework's `want` on `x_test`."""
    g = api.load_model(path, check=True)
    check = g.check_result
    assert check["checked"] is True, check
    assert check["max_abs_diff"] <= TOLERANCE, check
    diff = _close_to(L.run(g, x_test)[g.outputs[0]], want)
    assert diff <= TOLERANCE, diff
    return g, check["max_abs_diff"], diff


def _quantized(g, x_calib: np.ndarray, x_test: np.ndarray, labels=None) -> dict:
    """Each preset: calibrated on `x_calib`, simulated on `x_test`; the output's cosine held to COSINE."""
    results = {}
    for bits, floor in COSINE.items():
        qg = api.calibrate(g, x_calib, bits=bits)
        res = api.simulate(qg, x_test, labels=labels).to_dict()
        assert res["samples"] == len(x_test)
        (out,) = res["outputs"].values()
        assert out["count"] == len(x_test) * int(np.prod(L.run(g, x_test[:1])[g.outputs[0]].shape[1:]))
        print(f"{bits}: cosine {out['cosine']:.7f}, SNR {out['snr_db']:.2f} dB, top-1 {res.get('top1_agreement')}, "
              f"auto {qg.info['auto']['chosen']}")  # the measured numbers, with pytest -s
        assert out["cosine"] >= floor, (bits, out)
        results[bits] = (qg, res)
    return results


def _c_verified(qg, x: np.ndarray, tmp_path, streams: bool) -> None:
    """The int8 model exported to C and run on held-out sequences, on the host and (where the
    toolchain is) the emulated Cortex-M4: every edge's integers, the frames NAME_step gives one
    input frame at a time, and the dequantized outputs equal the simulator's."""
    import shutil

    from qtool.exporters.c_target import missing_tools

    if shutil.which("cc") is None:
        return
    res = api.export_c(qg, tmp_path / "c", name="m")
    assert res.footprint.streaming == streams, res.footprint.streaming_refusal
    for target in ["host"] + ([] if missing_tools() else ["cortex-m4"]):
        v = api.verify(qg, tmp_path / "c", x[:8 if target == "host" else 3], target=target)
        assert v.edge_values > 0 and v.edge_mismatches == 0, (target, v.edges)
        assert v.dequantized_mismatches == 0
        assert v.streaming == streams and v.stream_mismatches == 0 and (v.stream_values > 0) == streams


# 1. PyTorch classifier: Linear -> ReLU -> 2-layer GRU -> Linear on the last step, through ONNX

C1, H1, T1, K1 = 8, 24, 30, 5


class Classifier(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.front, self.head = torch.nn.Linear(C1, 16), torch.nn.Linear(H1, K1)
        self.gru = torch.nn.GRU(16, H1, num_layers=2, batch_first=True)

    def forward(self, x):
        return self.head(self.gru(torch.relu(self.front(x)))[0][:, -1])


def _classes(n: int, seed: int) -> tuple[np.ndarray, np.ndarray]:
    """Noisy sequences whose class is the channel carrying a small offset: only the whole sequence's
    mean tells it, so the GRU has to accumulate."""
    rng = np.random.default_rng(seed)
    labels = rng.integers(0, K1, n)
    x = rng.standard_normal((n, T1, C1)).astype(np.float32)
    x[np.arange(n), :, labels] += 0.8
    return x, labels


def test_torch_gru_classifier(tmp_path):
    torch.manual_seed(0)
    model = Classifier()
    x_train, y_train = _classes(600, 0)
    _train_torch(model, x_train, y_train.astype(np.int64), torch.nn.functional.cross_entropy, epochs=20)
    x_calib, _ = _classes(200, 1)
    x_test, y_test = _classes(300, 2)
    with torch.no_grad():
        want = model(torch.from_numpy(x_test)).numpy()
    assert (want.argmax(-1) == y_test).mean() > 0.9  # the model learnt the task
    path = tmp_path / "classifier.onnx"
    _export(model, path, x_test)
    assert _close_to(_ort(path, x_test), want) <= TOLERANCE
    g, _, _ = _imported(path, x_test, want)

    results = _quantized(g, x_calib, x_test, labels=y_test)
    acc_float = float((want.argmax(-1) == y_test).mean())
    for bits, (_, res) in results.items():
        assert res["accuracy_float"] == pytest.approx(acc_float)
        assert abs(res["accuracy_quant"] - res["accuracy_float"]) <= 0.02, (bits, res)
    assert results["int8"][1]["top1_agreement"] >= 0.98
    assert results["int16"][1]["top1_agreement"] >= 0.995

    # a saved quantized graph simulates exactly as the one it was saved from
    qg, res = results["int8"]
    api.save(qg, tmp_path / "q.h5")
    again = api.simulate(api.load(tmp_path / "q.h5"), x_test, labels=y_test).to_dict()
    assert again | {"seconds": 0} == res | {"seconds": 0}
    _c_verified(qg, x_test, tmp_path, streams=True)


# 2. Keras: Conv1D (causal) -> BatchNormalization -> ReLU -> ZeroPadding1D -> AveragePooling1D ->
#    GRU (sequences) -> Dense, compiled with a custom loss, saved as .keras and .h5

C2, H2, T2, K2 = 8, 20, 32, 3


def _seq_task(n: int, seed: int) -> tuple[np.ndarray, np.ndarray]:
    """Inputs with channel means and scales far from 0 and 1 (so BatchNormalization learns
    something); the target at each pooled step is the running mean of three channels so far."""
    rng = np.random.default_rng(seed)
    x = rng.standard_normal((n, T2, C2)) * np.linspace(0.5, 2.0, C2) + np.linspace(-1.0, 2.0, C2)
    x = x.astype(np.float32)
    centred = x[..., :K2] - np.linspace(-1.0, 2.0, C2)[:K2]
    running = np.cumsum(centred, axis=1) / np.arange(1, T2 + 1)[:, None]
    padded = np.concatenate([np.zeros_like(running[:, :1]), running, np.zeros_like(running[:, :1])], 1)
    y = np.tanh(padded.reshape(n, (T2 + 2) // 2, 2, K2).mean(2))
    return x, y.astype(np.float32)


def custom_loss(y_true, y_pred):
    import keras

    err = y_true - y_pred
    return keras.ops.mean(keras.ops.square(err)) + 0.1 * keras.ops.mean(keras.ops.abs(err))


def test_keras_conv_gru(tmp_path):
    os.environ.setdefault("KERAS_BACKEND", "torch")
    keras = pytest.importorskip("keras")
    keras.utils.set_random_seed(0)
    m = keras.Sequential([
        keras.Input((None, C2)),
        keras.layers.Conv1D(12, 3, padding="causal", name="conv"),
        keras.layers.BatchNormalization(momentum=0.9, name="bn"),
        keras.layers.ReLU(name="relu"),
        keras.layers.ZeroPadding1D(1, name="pad"),
        keras.layers.AveragePooling1D(2, name="pool"),
        keras.layers.GRU(H2, return_sequences=True, name="gru"),
        keras.layers.Dense(K2, name="head"),
    ])
    m.compile(optimizer=keras.optimizers.Adam(1e-2), loss=custom_loss)
    x_train, y_train = _seq_task(400, 0)
    hist = m.fit(x_train, y_train, epochs=6, batch_size=32, verbose=0, shuffle=False)
    assert hist.history["loss"][-1] < 0.5 * hist.history["loss"][0]
    bn = m.get_layer("bn")
    assert np.abs(keras.ops.convert_to_numpy(bn.moving_mean)).max() > 0.1
    assert np.abs(keras.ops.convert_to_numpy(bn.moving_variance) - 1).max() > 0.1
    x_calib, _ = _seq_task(200, 1)
    x_test, _ = _seq_task(200, 2)
    want = keras.ops.convert_to_numpy(m(x_test, training=False))
    m.save(tmp_path / "m.keras")
    m.save(tmp_path / "m.h5")
    _imported(tmp_path / "m.h5", x_test, want)  # the legacy file reads as the same model
    g, _, _ = _imported(tmp_path / "m.keras", x_test, want)

    results = _quantized(g, x_calib, x_test)
    for qg, _ in results.values():
        passes = dict(qg.passes)
        assert "bn into conv" in passes["fold_batchnorm"], qg.passes
        assert not any(n.op == "batchnorm" for n in qg.graph.nodes)
    # ZeroPadding1D's padding becomes the pool's; its padding after the end is NAME_finish's
    _c_verified(results["int8"][0], x_test, tmp_path, streams=True)


# 3. PyTorch block with a skip: y = x + sigmoid(Linear(GRU(Linear(x)))), through ONNX

C3, H3, T3 = 12, 24, 30


class SkipBlock(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.front, self.back = torch.nn.Linear(C3, 16), torch.nn.Linear(H3, C3)
        self.gru = torch.nn.GRU(16, H3, batch_first=True)

    def forward(self, x):
        return x + torch.sigmoid(self.back(self.gru(self.front(x))[0]))


def _skip_task(n: int, seed: int) -> tuple[np.ndarray, np.ndarray]:
    """The target adds to the input a gate that follows the input's running mean per channel."""
    rng = np.random.default_rng(seed)
    x = rng.standard_normal((n, T3, C3)).astype(np.float32)
    running = np.cumsum(x, axis=1) / np.sqrt(np.arange(1, T3 + 1))[:, None]
    return x, (x + 1 / (1 + np.exp(-running))).astype(np.float32)


def test_torch_skip_block(tmp_path):
    torch.manual_seed(0)
    model = SkipBlock()
    x_train, y_train = _skip_task(400, 0)
    _train_torch(model, x_train, y_train, torch.nn.functional.mse_loss, epochs=8)
    x_calib, _ = _skip_task(200, 1)
    x_test, y_test = _skip_task(200, 2)
    with torch.no_grad():
        want = model(torch.from_numpy(x_test)).numpy()
    assert float(np.mean((want - y_test) ** 2)) < 0.02  # the model learnt the task
    path = tmp_path / "skip.onnx"
    _export(model, path, x_test)
    assert _close_to(_ort(path, x_test), want) <= TOLERANCE
    g, _, _ = _imported(path, x_test, want)
    assert [n.op for n in g.nodes].count("add") == 1

    results = _quantized(g, x_calib, x_test)
    _c_verified(results["int8"][0], x_test, tmp_path, streams=True)


def test_gru_chains_take_the_previous_h_and_cuda_equals_cpu(tmp_path):
    """A bidirectional GRU feeding a one-way GRU, and a GRU read by another GRU and an Add: the
    second GRU's x is the first's h (any method may set either), and the integers of every edge
    are the same whether the GRUs run on the CPU or the CUDA engine (numba's simulator here)."""
    torch = pytest.importorskip("torch")
    pytest.importorskip("onnxruntime")
    from qtool import api
    from qtool.engine.cuda import run_model_cuda
    from qtool.graph.simulate import run_int

    class BiUni(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.a = torch.nn.GRU(4, 8, batch_first=True, bidirectional=True)
            self.b = torch.nn.GRU(16, 8, batch_first=True)

        def forward(self, x):
            return self.b(self.a(x)[0])[0]

    class Tap(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.a = torch.nn.GRU(4, 8, batch_first=True)
            self.b = torch.nn.GRU(8, 8, batch_first=True)

        def forward(self, x):
            h = self.a(x)[0]
            return h + self.b(h)[0]

    x = np.random.default_rng(0).standard_normal((64, 20, 4)).astype(np.float32)
    for cls in (BiUni, Tap):
        torch.manual_seed(0)
        path = tmp_path / f"{cls.__name__}.onnx"
        with warnings.catch_warnings(), torch.no_grad():
            warnings.simplefilter("ignore")
            torch.onnx.export(cls().eval(), (torch.from_numpy(x[:2]),), str(path), input_names=["x"],
                              output_names=["y"], dynamo=False, dynamic_axes={"x": {0: "b", 1: "t"}})
        for bits in ("int8", "int16"):
            qg = api.calibrate(api.load_model(path, whole=True), x[:48], bits=bits)
            grus = [qg.node(n) for n in qg.core if qg.node(n).op == "gru"]
            assert len(grus) == 2
            first, second = (qg.qparams[n.name]["qm"] for n in grus)
            assert first.cells[-1][0].spec["h"] == second.cells[0][0].spec["x"]
            sim = api.simulate(qg, x[48:])
            assert sim.outputs["y"].cosine >= (0.99 if bits == "int8" else 0.9999), (cls.__name__, bits)
            x_small = x[48:51, :6]
            cpu, gpu = run_int(qg, x_small), run_int(qg, x_small, run_model_cuda)
            assert all(np.array_equal(cpu[e], gpu[e]) for e in cpu)


@pytest.mark.parametrize("dynamo", [False, True])
def test_a_denoiser_of_four_outputs_exports_and_verifies(dynamo, tmp_path):
    """RNNoise's layout, as its PyTorch port exports it: per-band gains, voice activity and both GRUs'
    final states, four outputs. Imported whole (checked against ONNX Runtime), every output
    simulated, exported to C each with its own grid, and the C verified against the simulator."""
    import shutil

    if not (shutil.which("cc") or shutil.which("gcc")):
        pytest.skip("no C compiler")

    class Denoiser(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.fc = torch.nn.Linear(10, 12)
            self.vad_gru = torch.nn.GRU(12, 8, batch_first=True)
            self.vad = torch.nn.Linear(8, 1)
            self.gru = torch.nn.GRU(20, 16, batch_first=True)
            self.gains = torch.nn.Linear(16, 10)

        def forward(self, x):
            a = torch.tanh(self.fc(x))
            v, hv = self.vad_gru(a)
            d, hd = self.gru(torch.cat([a, v], -1))
            return torch.sigmoid(self.gains(d)), torch.sigmoid(self.vad(v)), hv, hd

    torch.manual_seed(0)
    rng = np.random.default_rng(0)
    calib, held = (rng.standard_normal((n, 24, 10)).astype(np.float32) for n in (48, 6))
    names = ["gains", "vad", "hv", "hd"]
    with warnings.catch_warnings(), torch.no_grad():
        warnings.simplefilter("ignore")
        kw = ({"dynamic_shapes": ({0: torch.export.Dim("n"), 1: torch.export.Dim("t")},)} if dynamo else
              {"dynamic_axes": {"x": {0: "n", 1: "t"}}})
        torch.onnx.export(Denoiser().eval(), (torch.from_numpy(calib[:2]),), str(tmp_path / "d.onnx"),
                          input_names=["x"], output_names=names, dynamo=dynamo, **kw)
    graph = api.load_model(tmp_path / "d.onnx")
    assert graph.check_result["checked"] and len(graph.outputs) == 4
    qg = api.calibrate(graph, calib)
    sim = api.simulate(qg, held)
    assert all(sim.outputs[e].cosine > 0.98 for e in sim.outputs), {e: d.cosine for e, d in sim.outputs.items()}
    res = api.export_c(qg, tmp_path / "c", name="den")
    assert "#define DEN_OUTPUT3_SIZE (16)" in (tmp_path / "c" / "den.h").read_text() and res.footprint.streaming
    ver = api.verify(qg, tmp_path / "c", held)
    assert ver.mismatches == 0
