"""A model of several inputs (DeepFilterNet's blocks, a streaming model's caches): its data are one
.npz/.h5 file of an array per input, named after it, or a dict of arrays. Held to the model
written out in numpy here, each input's grid to its own data's range, and the command line."""

import json
import shutil
import subprocess

import numpy as np
import pytest
from qtool.exporters.c_target import missing_tools
from test_export_graph_c import _gru, _verify, _w, needs_cc

from qtool import api
from qtool.core.graph import Graph, Node
from qtool.errors import QtoolError
from qtool.graph.simulate import dequantized, run_int
from qtool.layers import run

SCALE_S = 16.0  # the second input's values span 16 times the first's: their grids differ by 4 bits


def two_inputs(seed: int = 3) -> Graph:
    """y = W3 relu(W1 x + W2 s + b): two sequences, each through its own dense layer, added."""
    rng = np.random.RandomState(seed)
    nodes = [Node("fx", "dense", ["x"], ["a"], {}, {"W": _w(rng, 6, 3) * 2}),
             Node("fs", "dense", ["s"], ["b"], {}, {"W": _w(rng, 6, 4) / SCALE_S, "b": _w(rng, 6, scale=0.1)}),
             Node("sum", "add", ["a", "b"], ["c"]),
             Node("act", "activation", ["c"], ["r"], {"kind": "relu"}),
             Node("out", "dense", ["r"], ["y"], {}, {"W": _w(rng, 2, 6) * 2})]
    return Graph(nodes, {"x": (None, 3), "s": (None, 4)}, ["y"], name="two_inputs")


def two_outputs() -> Graph:
    """two_inputs with a second output: z = W4 relu(W1 x + W2 s + b)."""
    g = two_inputs()
    side = Node("side", "dense", ["r"], ["z"], {}, {"W": _w(np.random.RandomState(2), 3, 6) / 8})
    return Graph([*g.nodes, side], dict(g.inputs), ["y", "z"], name="two_outputs")


def numpy_model(g: Graph, x: np.ndarray, s: np.ndarray) -> np.ndarray:
    p = {n.name: n.params for n in g.nodes}
    c = x @ p["fx"]["W"].T + s @ p["fs"]["W"].T + p["fs"]["b"]
    return np.maximum(c, 0) @ p["out"]["W"].T


def data(n: int, seed: int) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(seed)
    return {"x": rng.standard_normal((n, 12, 3)).astype(np.float32),
            "s": (rng.standard_normal((n, 12, 4)) * SCALE_S).astype(np.float32)}


def test_each_input_takes_its_own_array_and_grid(tmp_path):
    g = two_inputs()
    calib, test = data(24, 0), data(10, 1)
    np.testing.assert_allclose(run(g, test)["y"], numpy_model(g, test["x"], test["s"]), rtol=1e-5, atol=1e-6)
    qg = api.calibrate(g, calib, method="minmax", check=False)
    for e in ("x", "s"):  # a minmax grid just holds its input's largest magnitude
        peak = float(np.abs(calib[e]).max())
        step = 2.0 ** -int(qg.grids[e].exp2_inv)
        assert 127 * step >= peak > 63.5 * step, e
    assert int(qg.grids["x"].exp2_inv) - int(qg.grids["s"].exp2_inv) == 4
    # the file's arrays are found by name, in any order in the file
    np.savez(tmp_path / "calib.npz", s=calib["s"], x=calib["x"])
    assert api.calibrate(g, tmp_path / "calib.npz", method="minmax", check=False).fingerprint() == qg.fingerprint()
    res = api.simulate(qg, test)
    want = numpy_model(g, test["x"], test["s"]).astype(np.float64)
    got = dequantized(qg, run_int(qg, test))["y"].astype(np.float64)
    snr = 10 * np.log10(np.sum(want ** 2) / np.sum((got - want) ** 2))
    assert res.output["snr_db"] == pytest.approx(snr, abs=1e-3) and snr > 25
    # the inputs' own integers: each on its own grid
    for e in ("x", "s"):
        t = qg.grids[e]
        q = np.clip(np.floor(test[e] * 2.0 ** int(t.exp2_inv) + 0.5) + t.zp, -128, 127)
        np.testing.assert_array_equal(run_int(qg, test)[e], q)


def test_auto_and_a_gru_after_the_inputs():
    rng = np.random.RandomState(5)
    g = two_inputs()
    g.nodes[-1:] = [_gru(rng, "gru", "r", "h", 6, 5), Node("out", "dense", ["h"], ["y"], {}, {"W": _w(rng, 2, 5)})]
    g = Graph(g.nodes, dict(g.inputs), ["y"], name="two_inputs_gru")
    qg = api.calibrate(g, data(30, 2), check=False)  # auto: its held-out part is both inputs' last sequences
    assert qg.info["auto"]["held_out"] == 6
    assert api.simulate(qg, data(8, 3)).output["snr_db"] > 15


def test_data_that_do_not_fit_the_inputs_say_so(tmp_path):
    g = two_inputs()
    calib = data(8, 0)
    with pytest.raises(QtoolError, match=r"the model has 2 inputs \(x, s\): give its data as a dict of arrays"):
        api.calibrate(g, calib["x"], check=False)
    with pytest.raises(QtoolError, match=r"the model has 2 inputs \(x, s\); the data lack s \(they hold x, t\)"):
        api.calibrate(g, {"x": calib["x"], "t": calib["s"]}, check=False)
    with pytest.raises(QtoolError, match=r"a dict \{input: array\}; got a tuple"):
        api.calibrate(g, (calib["x"], calib["s"]), check=False)
    with pytest.raises(QtoolError, match=r"sequences of different lengths \(x: 12 steps, s: 6 steps\)"):
        api.calibrate(g, {"x": calib["x"], "s": calib["s"][:, :6]}, check=False)
    extra = api.calibrate(g, {**calib, "labels": np.zeros(8)}, method="minmax", check=False)  # as in a file
    assert extra.fingerprint() == api.calibrate(g, calib, method="minmax", check=False).fingerprint()
    with pytest.raises(QtoolError, match=r"different numbers of sequences \(x: 8, s: 5\)"):
        api.calibrate(g, {"x": calib["x"], "s": calib["s"][:5]}, check=False)
    with pytest.raises(QtoolError, match=r"'s': feature size 3 does not match the model's input size 4"):
        api.calibrate(g, {"x": calib["x"], "s": calib["x"]}, check=False)
    np.save(tmp_path / "x.npy", calib["x"])
    with pytest.raises(QtoolError, match=r"x.npy: the model has 2 inputs \(x, s\); give their data as one .npz"):
        api.calibrate(g, tmp_path / "x.npy", check=False)
    np.savez(tmp_path / "part.npz", x=calib["x"], extra=calib["s"])
    with pytest.raises(QtoolError, match=r"no array 's' \(has: x, extra\): the model has 2 inputs \(x, s\)"):
        api.calibrate(g, tmp_path / "part.npz", check=False)
    with pytest.raises(QtoolError, match="`dataset` picks one array of a model of one input"):
        api.calibrate(g, tmp_path / "part.npz", dataset="x", check=False)
    qg = api.calibrate(g, calib, method="minmax", check=False)
    with pytest.raises(QtoolError, match=r"the data lack s \(they hold x\)"):
        api.export_c(qg, tmp_path / "c", test_vectors={"x": calib["x"]})
    assert not (tmp_path / "c").exists()


def test_the_command_line_reads_an_input_per_array(tmp_path, cli):
    g = two_inputs()
    api.save(g, tmp_path / "m.qtool")
    np.savez(tmp_path / "calib.npz", **data(24, 0))
    np.savez(tmp_path / "test.npz", **data(10, 1))
    code, out, err = cli("calibrate", tmp_path / "m.qtool", tmp_path / "calib.npz", "--method", "minmax",
                         "-o", tmp_path / "q.qtool")
    assert code == 0, err
    code, out, err = cli("simulate", tmp_path / "q.qtool", tmp_path / "test.npz", "--json")
    assert code == 0, err
    qg = api.load(tmp_path / "q.qtool")
    test = data(10, 1)
    want = numpy_model(g, test["x"], test["s"]).astype(np.float64)
    got = dequantized(qg, run_int(qg, test))["y"].astype(np.float64)
    assert json.loads(out)["output"]["snr_db"] == pytest.approx(10 * np.log10(np.sum(want ** 2) /
                                                                            np.sum((got - want) ** 2)), abs=1e-3)
    np.save(tmp_path / "x.npy", test["x"])
    code, out, err = cli("simulate", tmp_path / "q.qtool", tmp_path / "x.npy")
    assert code == 2 and "the model has 2 inputs (x, s); give their data as one .npz or .h5" in err
    assert "Traceback" not in err


@pytest.mark.parametrize("dynamo", [False, True])
def test_a_pytorch_model_of_two_inputs_as_torch_onnx_writes_it(dynamo, tmp_path):
    """Two feature streams (DeepFilterNet's encoder reads two): each through its own Linear, added,
    a GRU, a Linear; exported by either torch.onnx exporter, imported whole with the check against
    ONNX Runtime on, calibrated from a .npz of both inputs, held to ONNX Runtime on held-out data."""
    torch = pytest.importorskip("torch")
    ort = pytest.importorskip("onnxruntime")
    pytest.importorskip("onnx")
    import warnings

    class TwoStreams(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.fx, self.fs = torch.nn.Linear(8, 16), torch.nn.Linear(4, 16)
            self.gru, self.out = torch.nn.GRU(16, 12, batch_first=True), torch.nn.Linear(12, 3)

        def forward(self, x, s):
            h, _ = self.gru(torch.relu(self.fx(x) + self.fs(s)))
            return self.out(h)

    torch.manual_seed(0)
    rng = np.random.default_rng(7)
    calib = {"x": rng.standard_normal((40, 20, 8)).astype(np.float32),
             "s": (rng.standard_normal((40, 20, 4)) * 4).astype(np.float32)}
    held = {"x": rng.standard_normal((12, 20, 8)).astype(np.float32),
            "s": (rng.standard_normal((12, 20, 4)) * 4).astype(np.float32)}
    path = tmp_path / "two.onnx"
    with warnings.catch_warnings(), torch.no_grad():
        warnings.simplefilter("ignore")
        dims = {0: torch.export.Dim("n"), 1: torch.export.Dim("t")}
        kw = {"dynamic_shapes": (dims, dims)} if dynamo else {"dynamic_axes": {"x": {0: "n", 1: "t"},
                                                                               "s": {0: "n", 1: "t"}}}
        torch.onnx.export(TwoStreams().eval(), (torch.from_numpy(calib["x"][:2]), torch.from_numpy(calib["s"][:2])),
                          str(path), input_names=["x", "s"], output_names=["y"], dynamo=dynamo, **kw)
    graph = api.load_model(path)
    assert graph.check_result["checked"] and list(graph.inputs) == ["x", "s"]
    want = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"]).run(["y"], held)[0]
    np.testing.assert_allclose(run(graph, held)["y"], want, atol=1e-5)
    np.savez(tmp_path / "calib.npz", **calib)
    qg = api.calibrate(graph, tmp_path / "calib.npz")
    got = dequantized(qg, run_int(qg, held))["y"].ravel().astype(np.float64)
    cosine = got @ want.ravel() / np.linalg.norm(got) / np.linalg.norm(want)
    assert cosine > 0.99
    assert api.simulate(qg, held).outputs["y"].cosine == pytest.approx(cosine, abs=1e-5)


def test_several_outputs_are_measured_together_first_and_inputs_are_named(tmp_path, cli):
    g = two_outputs()
    qg = api.calibrate(g, data(24, 0), method="minmax", check=False)
    api.save(qg, tmp_path / "q.qtool")
    np.savez(tmp_path / "test.npz", **data(10, 1))
    code, out, err = cli("simulate", tmp_path / "q.qtool", tmp_path / "test.npz")
    assert code == 0, err
    res = api.simulate(qg, data(10, 1))
    y, z = res.outputs["y"], res.outputs["z"]
    together = 10 * np.log10((y.ref2 + z.ref2) / (y.err2 + z.err2))
    assert res.output["snr_db"] == pytest.approx(together, abs=1e-6)
    lines = [line for line in out.splitlines() if ": SNR " in line]
    assert lines[0].startswith("the integer core's 2 outputs together: SNR") and f"{together:.2f} dB" in lines[0]
    assert [line.split(":")[0] for line in lines[1:]] == ["output y", "output z"]
    rows = api.qgraph_rows(qg)
    assert [(r["layer"], r["op"]) for r in rows[:2]] == [("x", "input"), ("s", "input")]
    code, out, err = cli("simulate", tmp_path / "test.npz", tmp_path / "q.qtool")  # swapped
    assert code == 2 and "test.npz: data (arrays x, s), not a model's weights: the model comes first" in err


def test_save_writes_every_output(tmp_path, cli):
    g = two_outputs()
    qg = api.calibrate(g, data(24, 0), method="minmax", check=False)
    api.save(qg, tmp_path / "q.qtool")
    test = data(10, 1)
    np.savez(tmp_path / "test.npz", **test)
    code, out, err = cli("simulate", tmp_path / "q.qtool", tmp_path / "test.npz", "--save", tmp_path / "r.h5")
    assert code == 0, err
    import h5py

    q = run_int(qg, test)
    with h5py.File(tmp_path / "r.h5") as f:
        assert list(f.attrs["outputs"]) == ["y", "z"]
        np.testing.assert_array_equal(f["quant/y_int"][()], q["y"])
        np.testing.assert_array_equal(f["quant/y1_int"][()], q["z"])
        np.testing.assert_array_equal(f["quant/y1"][()], dequantized(qg, q)["z"])
        np.testing.assert_allclose(f["float/y1"][()], numpy_model_side(g, test), rtol=1e-5, atol=1e-6)


def numpy_model_side(g: Graph, test: dict) -> np.ndarray:
    p = {n.name: n.params for n in g.nodes}
    c = test["x"] @ p["fx"]["W"].T + test["s"] @ p["fs"]["W"].T + p["fs"]["b"]
    return np.maximum(c, 0) @ p["side"]["W"].T


def streaming_inputs(seed: int = 4) -> Graph:
    """A causal convolution over the second input's frames, a GRU over its sum with the first, and
    the first input read again at the end: a window, a state and a late reader of each input."""
    rng = np.random.RandomState(seed)
    nodes = [Node("fx", "dense", ["x"], ["a"], {}, {"W": _w(rng, 6, 3)}),
             Node("conv", "conv1d", ["s"], ["b"], {"kernel": 3, "padding": (2, 0)}, {"W": _w(rng, 6, 4, 3) / SCALE_S}),
             Node("sum", "add", ["a", "b"], ["c"]),
             _gru(rng, "gru", "c", "h", 6, 5),
             Node("fx2", "dense", ["x"], ["d"], {}, {"W": _w(rng, 5, 3)}),
             Node("out", "add", ["h", "d"], ["y"])]
    return Graph(nodes, {"x": (None, 3), "s": (None, 4)}, ["y"], name="streaming_inputs")


@needs_cc
@pytest.mark.parametrize("bits", ["int8", "w8a16"])
@pytest.mark.parametrize("make", [two_inputs, streaming_inputs])
def test_the_c_of_a_model_of_several_inputs_equals_the_simulator(make, bits, tmp_path):
    """Each input its own array, type and grid in C (x_q, x1_q ...): every edge, whole and frame by
    frame, equals the simulator; the test vectors' own main passes."""
    qg = api.calibrate(make(), data(24, 0), bits=bits, method="minmax", check=False)
    res, ex = _verify(qg, data(5, 1), tmp_path)
    assert res["edge_mismatches"] == 0 and res["dequantized_mismatches"] == 0, res["edges"]
    assert res["streaming"] and res["stream_values"] > 0 and res["stream_mismatches"] == 0
    assert ex.work_bytes({e: 12 for e in ex.edges}) > 0 and ex.inputs == 2
    header = (tmp_path / "m.h").read_text()
    assert "#define M_INPUT1_SIZE (4)" in header and f"#define M_INPUT1_ZP ({qg.grids['s'].zp})" in header
    assert "const m_in_t *x_q, const m_in1_t *x1_q, int32_t T" in header
    api.export_c(qg, tmp_path / "c", test_vectors=data(3, 2))
    exe = tmp_path / "t"
    subprocess.run([shutil.which("cc") or "gcc", "-std=c99", "-O2", "-Wall", "-Wextra", "-Werror", "-pedantic",
                    f"-I{tmp_path / 'c'}", *map(str, (tmp_path / "c").glob("*.c")), "-o", str(exe), "-lm"],
                   check=True)
    run = subprocess.run([str(exe)], capture_output=True, text=True)
    assert run.returncode == 0 and run.stdout.startswith("PASS: 0 mismatches"), run.stdout


@needs_cc
def test_the_command_line_exports_and_verifies_a_model_of_several_inputs(tmp_path, cli):
    qg = api.calibrate(streaming_inputs(), data(24, 0), method="minmax", check=False)
    api.save(qg, tmp_path / "q.qtool")
    np.savez(tmp_path / "test.npz", **data(4, 5))
    code, out, err = cli("export", "c", tmp_path / "q.qtool", "-o", tmp_path / "c", "--test-vectors", "--data",
                         tmp_path / "test.npz")
    assert code == 0, err
    assert "inputs: x (x_q [T][STREAMING_INPUTS_INPUT_SIZE], streaming_inputs_quantize_input), s (x1_q " \
           "[T][STREAMING_INPUTS_INPUT1_SIZE], streaming_inputs_quantize_input1)" in " ".join(out.split())
    code, out, err = cli("verify", tmp_path / "q.qtool", tmp_path / "c", tmp_path / "test.npz")
    assert code == 0 and "PASS" in out and "0 mismatches" in out, (out, err)
    np.save(tmp_path / "x.npy", data(4, 5)["x"])
    code, out, err = cli("verify", tmp_path / "q.qtool", tmp_path / "c", tmp_path / "x.npy")
    assert code != 0 and "give their data as one .npz" in err and "Traceback" not in err


@needs_cc
@pytest.mark.skipif(bool(missing_tools()), reason="no Cortex-M toolchain or QEMU")
def test_the_c_of_a_model_of_several_inputs_on_cortex_m4(tmp_path):
    qg = api.calibrate(streaming_inputs(), data(24, 0), method="minmax", check=False)
    res, _ = _verify(qg, data(3, 6), tmp_path, target="cortex-m4")
    assert res["edge_mismatches"] == 0 and res["dequantized_mismatches"] == 0 and res["stream_mismatches"] == 0
    assert res["stream_values"] > 0
