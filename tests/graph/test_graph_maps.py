"""Feature maps (qtool.layers.conv.conv2d and the layers around it): a PyTorch CRNN (Conv2d +
BatchNorm2d + PReLU over time x frequency, a dilated depthwise Conv2d, the channels and
frequencies reshaped into a GRU's input, a Linear head) exported with both torch.onnx exporters
imports whole and equals the module on held-out data; its integers equal an independent int64
loop of the formula; its C export verifies with 0 mismatches on the host (whole and frame by
frame) and on the emulated Cortex-M4. Keras' Conv2D CRNN through tf2onnx and TFLite, transposed
convolutions (a U-Net decoder) and GTCRN's attention over frequency likewise."""

import shutil
from pathlib import Path

import numpy as np
import pytest
from conftest import export_map_model

import qtool
from qtool.core.graph import Graph, Node
from qtool.core.qmodel import TensorQ
from qtool.layers import check
from qtool.layers.conv import conv2d
from qtool.layers.integer import LayerBits

torch = pytest.importorskip("torch")
pytest.importorskip("onnxruntime")

F_IN = 10
GOLDEN = Path(__file__).parent.parent / "golden"


class Crnn(torch.nn.Module):
    def __init__(self, c_in: int = 1):
        super().__init__()
        self.conv = torch.nn.Conv2d(c_in, 8, (3, 3), stride=(1, 2), padding=(1, 1))
        self.bn = torch.nn.BatchNorm2d(8)
        self.act = torch.nn.PReLU(8)
        self.dw = torch.nn.Conv2d(8, 8, (3, 3), padding=(2, 1), dilation=(2, 1), groups=8)
        self.gru = torch.nn.GRU(8 * 5, 16, batch_first=True)
        self.fc = torch.nn.Linear(16, 5)

    def forward(self, x):  # [N, C, T, F]
        h = torch.relu(self.dw(self.act(self.bn(self.conv(x)))))
        n, c, t, f = h.shape
        return self.fc(self.gru(h.permute(0, 2, 1, 3).reshape(n, t, c * f))[0])


def crnn(c_in: int = 1) -> Crnn:
    torch.manual_seed(c_in)
    m = Crnn(c_in)
    with torch.no_grad():  # a trained batchnorm's statistics, not the identity
        m.bn.running_mean.uniform_(-0.5, 0.5)
        m.bn.running_var.uniform_(0.5, 2)
        m.bn.weight.uniform_(0.5, 1.5)
        m.act.weight.uniform_(-0.3, 0.6)
    return m.eval()


def maps(n: int, seed: int, c_in: int = 1) -> np.ndarray:
    return np.random.default_rng(seed).standard_normal((n, c_in, 24, F_IN)).astype(np.float32)


def export(m, path, exporter: str, c_in: int = 1):
    return export_map_model(m, maps(2, 0, c_in), path, exporter)


def equals_module(g, m, x: np.ndarray, out: str = "y") -> None:
    """qtool's float graph on PyTorch's maps `x` [N, C, T, F] gives the module's output within
    2e-5 of its peak: a map output as its frames hold it ([N, T, C, F]), a conv1d's [N, C, T] time
    first."""
    with torch.no_grad():
        want = m(torch.from_numpy(x)).numpy()
    got = qtool.layers.run(g, as_data(x))[out]
    if want.ndim == 4:
        want = want.transpose(0, 2, 1, 3).reshape(got.shape)
    elif want.shape != got.shape:
        want = want.transpose(0, 2, 1)
    np.testing.assert_allclose(got, want, atol=2e-5 * np.abs(want).max())


def verified_in_c(g, data: np.ndarray, tmp_path, name: str):
    """g calibrated (minmax) on data[:8], exported to C and verified on the rest: (qg, verify's result)."""
    qg = qtool.calibrate(g, data[:8], method="minmax")
    qtool.export_c(qg, tmp_path / "c", name=name)
    return qg, qtool.verify(qg, tmp_path / "c", data[8:])


def as_data(x: np.ndarray) -> np.ndarray:
    """PyTorch's [N, C, T, F] as qtool's data [N, T, C, F] (a frame: the map as the model holds it)."""
    return np.ascontiguousarray(x.transpose(0, 2, 1, 3))


@pytest.mark.parametrize("exporter", ["torchscript", "dynamo", "unfolded"])
def test_a_pytorch_crnn_imports_whole_from_either_exporter(tmp_path, exporter):
    pytest.importorskip("onnxscript")
    m = crnn()
    g = qtool.load_model(export(m, tmp_path / "crnn.onnx", exporter))
    assert [n.op for n in g.nodes] == ["conv2d", *(["batchnorm"] if exporter == "unfolded" else []),
                                       "prelu", "conv2d", "activation", "gru", "dense"]
    alpha = m.act.weight.detach().numpy()
    assert np.array_equal(g.nodes[-5].params["alpha"], np.repeat(alpha, 5))  # per channel, at each frequency
    assert "input read as [N, C, T, F]" in g.source
    equals_module(g, m, maps(6, 1))  # held out: not what the import check ran
    if exporter == "unfolded":  # calibrate folds the BatchNorm2d into the conv2d before it
        qg = qtool.calibrate(g, as_data(maps(16, 2)), method="minmax")
        assert [n.op for n in qg.graph.nodes][:2] == ["conv2d", "prelu"]
        assert dict(qg.passes)["fold_batchnorm"] == "folded /bn/BatchNormalization into /conv/Conv"


def test_a_map_of_several_channels_reads_its_frames_in_the_models_order(tmp_path):
    """Two input channels (real and imaginary parts, say): data [N, T, C, F], frames c * F + f."""
    m = crnn(2)
    qg = qtool.calibrate(export(m, tmp_path / "crnn2.onnx", "torchscript", 2), as_data(maps(16, 3, 2)),
                         method="minmax")
    x = maps(4, 4, 2)
    equals_module(qg.graph, m, x)
    sim = qtool.simulate(qg, as_data(x))
    assert sim.to_dict()["outputs"]["y"]["cosine"] > 0.99


def _brute(q_x, W, add, sh, g, geo, zp, g_out, in_sh=None):
    """conv2d's integers by the formula, one output at a time in Python ints (with `in_sh`, each
    tap (q - zp) 2^in_sh[channel], a padded one 0)."""
    from qtool.layers.integer import rshift_round

    n, t, _ = q_x.shape
    (kt, kf), (st, sf), (dt, df), groups, F = geo["kernel"], geo["stride"], geo["dilation"], geo["groups"], geo["freq"]
    m = conv2d.to_map(q_x, F, geo["order"])
    c_out, c_g = len(W), W.shape[1]
    lt = (kt - 1) * dt  # causal
    lf = geo["freq_pads"][0]
    t_out = (t + lt - (kt - 1) * dt - 1) // st + 1
    f_out = (F + sum(geo["freq_pads"]) - (kf - 1) * df - 1) // sf + 1
    lo, hi = -(1 << (g_out.bits - 1)), (1 << (g_out.bits - 1)) - 1
    y = np.zeros((n, t_out, f_out, c_out), np.int64)
    for b in range(n):
        for to in range(t_out):
            for fo in range(f_out):
                for o in range(c_out):
                    acc = int(add[o])
                    for j in range(kt):
                        for k in range(kf):
                            ti, fi = to * st + j * dt - lt, fo * sf + k * df - lf
                            for c in range(c_g):
                                ci = (o // (c_out // groups)) * c_g + c
                                v = int(m[b, ti, fi, ci]) if 0 <= ti < t and 0 <= fi < F else zp
                                if in_sh is not None:  # the frame's channel index of (fi, ci), "cf" frames
                                    v = (v - zp) * 2 ** int(in_sh[ci * F + fi]) if 0 <= ti < t and 0 <= fi < F else 0
                                acc += int(W[o, c, j, k]) * v
                    y[b, to, fo, o] = min(max(int(rshift_round(acc, int(sh[o]))) + g_out.zp, lo), hi)
    return conv2d.from_map(y, geo["out_order"])


@pytest.mark.parametrize("bits,shifted", [(8, False), (16, False), (8, True), (16, True)])
def test_the_integers_are_the_formulas(bits, shifted):
    """With in_shifts (a grid per input channel), every tap onto the finest grid first."""
    rng = np.random.default_rng(bits)
    geo = dict(kernel=(3, 3), stride=(2, 2), dilation=(1, 2), groups=2, freq=7, freq_pads=(2, 1), order="cf",
               out_order="fc", padding="causal")
    W = rng.standard_normal((4, 2, 3, 3)).astype(np.float32)
    attrs = dict(geo) | ({"in_shifts": tuple(int(k) for k in rng.integers(0, 6, 28))} if shifted else {})
    nd = Node("c", "conv2d", ["x"], ["y"], attrs, {"W": W, "b": rng.standard_normal(4).astype(np.float32)})
    check(Graph([nd], {"x": (None, 4 * 7)}, ["y"]))
    g_in, g_out = TensorQ(bits, False, 5, 13 if bits == 8 else -300, 0, 0), TensorQ(bits, False, 3, -7, 0, 0)
    qp = conv2d.quantize(nd, [g_in], [g_out], LayerBits(8, 32, bits))
    lo, hi = -(1 << (bits - 1)), (1 << (bits - 1)) - 1
    q_x = rng.integers(lo, hi + 1, (2, 9, 28))
    (got,) = conv2d.forward_int(nd, qp, [q_x], [g_in], [g_out])
    want = _brute(q_x, qp["q_W"], qp["q_b"] - qp["W_sum_mul_x_zp"], np.broadcast_to(qp["sh_acc"], (4,)),
                  None, geo | {"padding": "causal"}, g_in.zp, g_out, qp.get("in_sh"))
    assert np.array_equal(got, want)
    if shifted:  # exponent exp2_inv_x + K for the accumulator: the bias and shifts say so
        assert qp["exp2_inv_W"].tolist() == [int(e) for e in qp["sh_acc"] - 5 - max(attrs["in_shifts"]) + 3]


needs_cc = pytest.mark.skipif(shutil.which("cc") is None and shutil.which("gcc") is None, reason="needs a C compiler")


@needs_cc
def test_the_c_export_verifies_whole_and_frame_by_frame(tmp_path):
    qg = qtool.calibrate(export(crnn(), tmp_path / "crnn.onnx", "torchscript"), as_data(maps(24, 5)),
                         method="minmax")
    qtool.export_c(qg, tmp_path / "c", name="crnn")
    v = qtool.verify(qg, tmp_path / "c", as_data(maps(5, 6)))
    assert v.mismatches == 0 and v.streaming and v.stream_values > 0


def test_the_c_export_verifies_on_the_emulated_cortex_m4(tmp_path):
    from qtool.exporters.c_target import missing_tools

    if missing_tools():
        pytest.skip("no Cortex-M toolchain or QEMU")
    qg = qtool.calibrate(export(crnn(), tmp_path / "crnn.onnx", "torchscript"), as_data(maps(24, 5)),
                         method="minmax")
    qtool.export_c(qg, tmp_path / "c", name="crnn")
    v = qtool.verify(qg, tmp_path / "c", as_data(maps(3, 7)), target="cortex-m4")
    assert v.mismatches == 0 and v.target == "cortex-m4"


@pytest.mark.parametrize("name", ["tf_crnn.onnx", "tf_crnn_lite.tflite"])
def test_a_keras_crnn_through_tf2onnx_and_tflite_imports_whole(name):
    """Keras' Conv2D, BatchNormalization, DepthwiseConv2D on [N, T, 10, 1] (tests/golden/make_tf_loops.py),
    held to TensorFlow's own outputs; the frames are TensorFlow's [F, C]."""
    if name.endswith("tflite"):
        pytest.importorskip("tflite")
    g = qtool.load_model(GOLDEN / name, check=False)
    assert [n.op for n in g.nodes][:4] == ["conv2d", "activation", "conv2d", "activation"]
    assert [n.attrs["out_order"] for n in g.nodes if n.op == "conv2d"][-1] == "fc"
    io = np.load(GOLDEN / f"{Path(name).stem}_io.npz")
    x, want = io["x"], io["y"]
    got = qtool.layers.run(g, x.reshape(*x.shape[:2], -1))[g.outputs[0]]
    assert np.abs(got - want).max() < 1e-5



@needs_cc
def test_a_map_kept_as_tensorflow_keeps_it_verifies_in_c(tmp_path):
    """The frames in TensorFlow's order ("fc") in and out of C: 0 mismatches."""
    g = qtool.load_model(GOLDEN / "tf_crnn.onnx", check=False)
    x = np.load(GOLDEN / "tf_crnn_io.npz")["x"]
    qg = qtool.calibrate(g, x[:10], method="minmax")
    assert {(n.attrs["order"], n.attrs["out_order"]) for n in qg.graph.nodes if n.op == "conv2d"} == \
        {("cf", "cf"), ("cf", "fc")}
    qtool.export_c(qg, tmp_path / "c", name="crnn")
    v = qtool.verify(qg, tmp_path / "c", x[10:])
    assert v.mismatches == 0 and v.stream_values > 0


@needs_cc
def test_every_frame_order_and_padding_verifies_in_c(tmp_path):
    """conv2d from "fc" frames to "cf" and back, "same" along time (sized at run time), strided and
    grouped, padded along frequency: 0 mismatches whole and frame by frame."""
    rng = np.random.default_rng(7)

    def w(*shape):
        return (rng.standard_normal(shape) / np.sqrt(np.prod(shape[1:]))).astype(np.float32)

    nodes = [Node("a", "conv2d", ["x"], ["h"], {"kernel": (3, 2), "stride": (1, 2), "freq": 6, "freq_pads": (1, 0),
                                                "padding": "causal", "order": "fc", "out_order": "cf"},
                  {"W": w(4, 2, 3, 2), "b": w(4)}),
             Node("r", "activation", ["h"], ["z"], {"kind": "relu"}),
             Node("b", "conv2d", ["z"], ["y"], {"kernel": (2, 3), "stride": (2, 1), "dilation": (1, 2), "groups": 2,
                                                "freq": 3, "freq_pads": (2, 2), "padding": "same", "order": "cf",
                                                "out_order": "fc"}, {"W": w(6, 2, 2, 3), "b": w(6)})]
    g = check(Graph(nodes, {"x": (None, 12)}, ["y"]))
    x = rng.standard_normal((12, 15, 6, 2)).astype(np.float32)
    qg = qtool.calibrate(g, x[:8], method="minmax", bits="w8a16")
    qtool.export_c(qg, tmp_path / "c", name="maps")
    v = qtool.verify(qg, tmp_path / "c", x[8:])
    assert v.mismatches == 0 and v.edge_values > 0


def nine(n: int, seed: int = 0) -> np.ndarray:
    """Maps [N, 2, T, 9]: two channels of nine frequencies."""
    return np.random.default_rng(seed).standard_normal((n, 2, 20, 9)).astype(np.float32)


class Decoder(torch.nn.Module):
    """A U-Net enhancer's decoder as GTCRN writes it: a strided Conv2d along frequency, a depthwise
    ConvTranspose2d along time on the causally pre-padded map, a grouped ConvTranspose2d of stride 2
    along frequency, then a ConvTranspose1d over the channels and frequencies."""

    def __init__(self):
        super().__init__()
        self.down = torch.nn.Conv2d(2, 8, (1, 5), stride=(1, 2), padding=(0, 2))
        self.act = torch.nn.PReLU(8)
        self.dw = torch.nn.ConvTranspose2d(8, 8, (3, 3), padding=(2, 1), groups=8)
        self.up = torch.nn.ConvTranspose2d(8, 4, (1, 5), stride=(1, 2), padding=(0, 2), groups=2)
        self.t1 = torch.nn.ConvTranspose1d(4 * 9, 6, 3, padding=2)

    def forward(self, x):  # [N, 2, T, 9]
        h = torch.nn.functional.pad(self.act(self.down(x)), [0, 0, 2, 0])
        h = self.up(torch.tanh(self.dw(h)))  # [N, 4, T, 9]
        n, c, t, f = h.shape
        return self.t1(torch.nn.functional.pad(h.permute(0, 1, 3, 2).reshape(n, c * f, t), [2, 0]))


@pytest.mark.parametrize("exporter", ["torchscript", "dynamo"])
def test_transposed_convolutions_import_as_the_convolutions_they_are(tmp_path, exporter):
    pytest.importorskip("onnxscript")
    torch.manual_seed(3)
    m = Decoder().eval()
    export_map_model(m, nine(2), tmp_path / "dec.onnx", exporter)
    g = qtool.load_model(tmp_path / "dec.onnx")
    assert [(n.op, n.attrs.get("freq_up", 1)) for n in g.nodes if n.op.startswith("conv")] == \
        [("conv2d", 1), ("conv2d", 1), ("conv2d", 2), ("conv1d", 1)]
    equals_module(g, m, np.random.default_rng(1).standard_normal((3, 2, 17, 9)).astype(np.float32))
    if exporter == "torchscript" and (shutil.which("cc") or shutil.which("gcc")):
        data = as_data(np.random.default_rng(2).standard_normal((12, 2, 16, 9)).astype(np.float32))
        _, v = verified_in_c(g, data, tmp_path, "dec")
        assert v.mismatches == 0 and v.stream_values > 0


def test_a_transposed_convolution_that_upsamples_time_is_refused(tmp_path):
    from qtool.errors import QtoolError

    m = torch.nn.Sequential(torch.nn.ConvTranspose1d(4, 4, 3, stride=2)).eval()
    import warnings

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        torch.onnx.export(m, (torch.randn(1, 4, 10),), str(tmp_path / "up.onnx"), input_names=["x"],
                          output_names=["y"], dynamo=False, dynamic_axes={"x": {0: "n", 2: "t"}})
    with pytest.raises(QtoolError, match=r"ConvTranspose\).*upsamples time \(strides \[2\]\)"):
        qtool.load_model(tmp_path / "up.onnx")



class Attention(torch.nn.Module):
    """GTCRN's temporal recurrent attention: the mean over frequency of the map squared, a GRU and
    a sigmoid over time, multiplying every frequency of the map."""

    def __init__(self, c: int = 4):
        super().__init__()
        self.conv = torch.nn.Conv2d(2, c, (1, 3), padding=(0, 1))
        self.att_gru = torch.nn.GRU(c, c * 2, 1, batch_first=True)
        self.att_fc = torch.nn.Linear(c * 2, c)

    def forward(self, x):  # [N, 2, T, 9]
        x = self.conv(x)
        zt = torch.mean(x.pow(2), dim=-1)  # [N, C, T]
        at = torch.sigmoid(self.att_fc(self.att_gru(zt.transpose(1, 2))[0]).transpose(1, 2))
        return x * at[..., None]


@pytest.mark.parametrize("exporter", ["torchscript", "dynamo"])
def test_an_attention_over_frequency_imports_and_verifies(tmp_path, exporter):
    pytest.importorskip("onnxscript")
    torch.manual_seed(5)
    m = Attention().eval()
    export_map_model(m, nine(2), tmp_path / "att.onnx", exporter)
    g = qtool.load_model(tmp_path / "att.onnx")
    assert [(n.op, n.attrs) for n in g.nodes if n.op in ("activation", "reduce_mean", "mul")] == [
        ("activation", {"kind": "square"}), ("reduce_mean", {"size": 9, "stride": 1}),
        ("activation", {"kind": "sigmoid"}), ("mul", {"repeat": (9, 1)})]
    equals_module(g, m, np.random.default_rng(1).standard_normal((3, 2, 17, 9)).astype(np.float32))
    if exporter == "torchscript" and (shutil.which("cc") or shutil.which("gcc")):
        data = as_data(np.random.default_rng(2).standard_normal((12, 2, 16, 9)).astype(np.float32))
        qg, v = verified_in_c(g, data, tmp_path, "att")
        assert qtool.simulate(qg, data[8:]).to_dict()["outputs"]["y"]["cosine"] > 0.999
        assert v.mismatches == 0 and v.stream_values > 0


class Bands(torch.nn.Module):
    """GTCRN's ERB bands: a Linear along the frequency axis of a map [N, C, T, F] (and its inverse)."""

    def __init__(self):
        super().__init__()
        self.conv = torch.nn.Conv2d(2, 3, (1, 3), padding=(0, 1))
        self.erb = torch.nn.Linear(9, 5, bias=False)
        self.ierb = torch.nn.Linear(5, 9)

    def forward(self, x):
        return self.ierb(torch.tanh(self.erb(self.conv(x))))


@pytest.mark.parametrize("exporter", ["torchscript", "dynamo"])
def test_a_linear_along_frequency_is_a_grouped_conv1d_of_kernel_1(tmp_path, exporter):
    pytest.importorskip("onnxscript")
    torch.manual_seed(6)
    m = Bands().eval()
    g = qtool.load_model(export_map_model(m, nine(2), tmp_path / "erb.onnx", exporter))
    assert [(n.op, n.attrs) for n in g.nodes if n.op == "conv1d"] == [("conv1d", {"kernel": 1, "groups": 3})] * 2
    equals_module(g, m, nine(3, 1))
    if exporter == "torchscript" and (shutil.which("cc") or shutil.which("gcc")):
        assert verified_in_c(g, as_data(nine(12, 2)), tmp_path, "erb")[1].mismatches == 0


class Padded(torch.nn.Module):
    """Zeros along frequency (and time) written as a Pad before each Conv2d (Keras' "same" through
    the torch exporter, or F.pad by hand)."""

    def __init__(self):
        super().__init__()
        self.c = torch.nn.Conv2d(2, 4, 3, stride=(1, 2))
        self.c2 = torch.nn.Conv2d(4, 4, (1, 3))

    def forward(self, x):
        h = torch.relu(self.c(torch.nn.functional.pad(x, [0, 1, 2, 0])))  # frequency (0, 1), time (2, 0)
        return self.c2(torch.nn.functional.pad(h, [1, 1]))


@pytest.mark.parametrize("exporter", ["torchscript", "dynamo"])
def test_a_pad_along_frequency_is_the_conv2ds_own(tmp_path, exporter):
    pytest.importorskip("onnxscript")
    torch.manual_seed(7)
    m = Padded().eval()
    g = qtool.load_model(export_map_model(m, nine(2), tmp_path / "pad.onnx", exporter))
    assert [n.attrs["freq_pads"] for n in g.nodes if n.op == "conv2d"] == [(0, 1), (1, 1)]
    equals_module(g, m, nine(3, 1))  # 4-D data: each frame [C, F] flattened


def test_data_frames_in_the_other_order_are_refused_naming_the_order(tmp_path):
    """Two channels of ten frequencies: TensorFlow's [N, T, F, C] given to a PyTorch model, whose
    frames are [C, F], holds as many values a frame but not the same ones."""
    from qtool.errors import QtoolError

    qg = qtool.calibrate(export(crnn(2), tmp_path / "m.onnx", "torchscript", 2), as_data(maps(8, 1, 2)),
                         method="minmax")
    x = maps(4, 2, 2)
    with pytest.raises(QtoolError, match=r"its frames are \[10, 2\] but the model reads data \[N, T, 2, 10\]"):
        qtool.simulate(qg, np.ascontiguousarray(x.transpose(0, 2, 3, 1)))
    with pytest.raises(QtoolError, match=r"data shape \(4, 2, 24, 10\) read as \[N, T, A, B\]\); the model reads"):
        qtool.simulate(qg, x)  # PyTorch's own [N, C, T, F]
    assert qtool.simulate(qg, as_data(x)).to_dict()["outputs"]["y"]["cosine"] > 0.99


def test_the_frame_order_is_checked_through_a_pad_before_the_first_conv(tmp_path):
    """A causal model pads time before its first Conv2d: the data's frames are still the conv's."""
    from qtool.errors import QtoolError

    m = Padded().eval()
    g = qtool.load_model(export_map_model(m, nine(2), tmp_path / "pad.onnx", "torchscript"))
    assert qtool.layers.input_map(g) == ("cf", 9, 2)
    x = nine(4, 3)
    with pytest.raises(QtoolError, match=r"its frames are \[9, 2\] but the model reads \[2, 9\]"):
        qtool.layers.run(g, np.ascontiguousarray(x.transpose(0, 2, 3, 1)))
    qg = qtool.calibrate(g, as_data(x), method="minmax")
    with pytest.raises(QtoolError, match=r"its frames are \[9, 2\] but the model reads data \[N, T, 2, 9\]"):
        qtool.simulate(qg, np.ascontiguousarray(x.transpose(0, 2, 3, 1)))


def test_a_module_on_maps_loads_from_an_example():
    m = crnn(2)
    g = qtool.load_model(m, example=maps(2, 0, 2))
    assert "input read as [N, C, T, F]: data [N, T, C, F]" in g.source
    equals_module(g, m, maps(3, 5, 2))
