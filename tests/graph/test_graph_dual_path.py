"""Dual-path RNNs (qtool.layers.gru over a feature map, qtool.layers.moves.select): a GRU along each
frame's frequencies and a GRU along time per frequency equal PyTorch's nn.GRU run the way a
dual-path block runs them; a DPRNN block (Conv2d, a bidirectional GRU along frequency, Linear,
LayerNorm, a GRU along time) and a GTCRN-like grouped block (the channels split in two, a GRU
each, joined) exported with both torch.onnx exporters import whole and equal the module on
held-out data; their C export verifies with 0 mismatches, whole and frame by frame."""

import shutil
import subprocess

import numpy as np
import pytest
from conftest import export_map_model

import qtool
from qtool.core.graph import Graph, Node
from qtool.core.qmodel import TensorQ
from qtool.errors import QtoolError
from qtool.layers import check, run
from qtool.layers.moves import select

torch = pytest.importorskip("torch")
pytest.importorskip("onnxruntime")

F, C = 6, 3


def gru_params(g, H: int, bidirectional: bool) -> dict:
    """nn.GRU's weights as a gru node's params (PyTorch's r | z | n rows as qtool's z | r | g)."""
    def zrg(a):
        return np.concatenate([a[H:2 * H], a[:H], a[2 * H:]])

    out = {}
    for d, suffix in enumerate(["", "_reverse"][:1 + bidirectional]):
        for w, name in (("W", "weight_ih"), ("R", "weight_hh"), ("bx", "bias_ih"), ("br", "bias_hh")):
            out[f"l0.{('fwd', 'bwd')[d]}.{w}"] = zrg(getattr(g, f"{name}_l0{suffix}").detach().numpy())
    return out


def pytorch_dual_path(g, x: np.ndarray, along: str, order: str) -> np.ndarray:
    """nn.GRU `g` on the maps `x` [N, T, F * C] as a dual-path block runs it, frames "fc" out."""
    N, T, _ = x.shape
    m = x.reshape(N, T, F, C) if order == "fc" else x.reshape(N, T, C, F).transpose(0, 1, 3, 2)
    with torch.no_grad():
        if along == "freq":
            return g(torch.from_numpy(np.ascontiguousarray(m.reshape(N * T, F, C))))[0].numpy().reshape(N, T, -1)
        y = g(torch.from_numpy(np.ascontiguousarray(m.transpose(0, 2, 1, 3).reshape(N * F, T, C))))[0].numpy()
    return y.reshape(N, F, T, -1).transpose(0, 2, 1, 3).reshape(N, T, -1)


@pytest.mark.parametrize("along,bidirectional,order", [("freq", True, "fc"), ("freq", False, "cf"),
                                                       ("time", False, "cf"), ("time", True, "fc")])
def test_a_gru_over_a_map_is_pytorchs_gru_run_along_that_axis(along, bidirectional, order):
    torch.manual_seed(0)
    g = torch.nn.GRU(C, 4, batch_first=True, bidirectional=bidirectional)
    node = Node("g", "gru", ["x"], ["y"], {"along": along, "freq": F, "order": order,
                                          "bidirectional": bidirectional}, gru_params(g, 4, bidirectional))
    graph = check(Graph([node], {"x": (None, F * C)}, ["y"]))
    assert graph.shapes["y"] == (None, F * 4 * (1 + bidirectional))
    x = np.random.default_rng(1).normal(size=(3, 7, F * C)).astype(np.float32)
    np.testing.assert_allclose(run(graph, x)["y"], pytorch_dual_path(g, x, along, order), atol=1e-6)


def test_a_gru_over_a_map_refuses_what_does_not_fit():
    torch.manual_seed(0)
    params = gru_params(torch.nn.GRU(C, 4), 4, False)
    for attrs, why in (({"along": "freq", "freq": 1}, "fewer than 2 frequencies"),
                       ({"along": "freq", "freq": 4}, "not 4 frequencies"),
                       ({"along": "diagonal", "freq": F}, "'along' must be one of"),
                       ({"along": "time", "freq": F, "return_sequences": False}, "returns its sequence")):
        with pytest.raises(QtoolError, match=why):
            check(Graph([Node("g", "gru", ["x"], ["y"], attrs, params)], {"x": (None, F * C)}, ["y"]))


def test_select_takes_channels_and_keeps_the_grid():
    node = Node("s", "select", ["x"], ["y"], {"index": (4, 0, 0, 2)})
    graph = check(Graph([node], {"x": (None, 5)}, ["y"]))
    x = np.arange(10, dtype=np.float32).reshape(1, 2, 5)
    assert run(graph, x)["y"].tolist() == [[[4, 0, 0, 2], [9, 5, 5, 7]]]
    g = TensorQ(8, False, 3, 5, 0, 0)
    q = np.array([[[-128, 1, 2, 3, 127]]])
    assert select.forward_int(node, {}, [q], [g], [g])[0].tolist() == [[[127, -128, -128, 2]]]
    with pytest.raises(QtoolError, match="channels of its input"):
        check(Graph([Node("s", "select", ["x"], ["y"], {"index": (5,)})], {"x": (None, 5)}, ["y"]))


class DualPath(torch.nn.Module):
    """A DPRNN block over [N, 1, T, F]: Conv2d, a bidirectional GRU along frequency (batch and time
    merged), Linear, LayerNorm over (F, C), a residual; a GRU along time (batch and frequency
    merged), Linear, LayerNorm, a residual; a 1x1 Conv2d out."""

    def __init__(self, c: int = 8):
        super().__init__()
        self.conv = torch.nn.Conv2d(1, c, (1, 3), padding=(0, 1))
        self.intra = torch.nn.GRU(c, c // 2, batch_first=True, bidirectional=True)
        self.intra_fc = torch.nn.Linear(c, c)
        self.intra_ln = torch.nn.LayerNorm((F, c))
        self.inter = torch.nn.GRU(c, c, batch_first=True)
        self.inter_fc = torch.nn.Linear(c, c)
        self.inter_ln = torch.nn.LayerNorm((F, c))
        self.out = torch.nn.Conv2d(c, 1, 1)

    def forward(self, x):
        x = self.conv(x).permute(0, 2, 3, 1)  # [N, T, F, C]
        n, t, f, c = x.shape
        intra = self.intra_fc(self.intra(x.reshape(n * t, f, c))[0])
        x = x + self.intra_ln(intra.reshape(n, t, f, c))
        inter = self.inter(x.permute(0, 2, 1, 3).reshape(n * f, t, c))[0]
        x = x + self.inter_ln(self.inter_fc(inter).reshape(n, f, t, c).permute(0, 2, 1, 3))
        return self.out(x.permute(0, 3, 1, 2))


class Grouped(torch.nn.Module):
    """GTCRN's grouped dual-path block as its authors write it, over [N, C, T, F]: the channels
    split in two halves, a GRU each (bidirectional along frequency, then along time), joined."""

    def __init__(self, c: int = 8):
        super().__init__()
        self.intra = torch.nn.ModuleList(torch.nn.GRU(c // 2, c // 4, batch_first=True, bidirectional=True)
                                         for _ in range(2))
        self.intra_fc = torch.nn.Linear(c, c)
        self.intra_ln = torch.nn.LayerNorm((F, c), eps=1e-8)
        self.inter = torch.nn.ModuleList(torch.nn.GRU(c // 2, c // 2, batch_first=True) for _ in range(2))
        self.inter_fc = torch.nn.Linear(c, c)
        self.inter_ln = torch.nn.LayerNorm((F, c), eps=1e-8)

    @staticmethod
    def grouped(grus, x):
        halves = torch.chunk(x, 2, dim=-1)
        return torch.cat([gru(h)[0] for gru, h in zip(grus, halves)], dim=-1)

    def forward(self, x):
        x = x.permute(0, 2, 3, 1)  # [N, T, F, C]
        n, t, f, c = x.shape
        intra = self.intra_fc(self.grouped(self.intra, x.reshape(n * t, f, c)))
        x = x + self.intra_ln(intra.reshape(n, t, f, c))
        y = x.permute(0, 2, 1, 3)
        inter = self.inter_fc(self.grouped(self.inter, y.reshape(n * f, t, c)))
        x = x + self.inter_ln(inter.reshape(n, f, t, c).permute(0, 2, 1, 3))
        return x.permute(0, 3, 1, 2)


def maps(n: int, seed: int, c: int = 1, t: int = 24) -> np.ndarray:
    return np.random.default_rng(seed).standard_normal((n, c, t, F)).astype(np.float32)


def as_data(x: np.ndarray) -> np.ndarray:
    return np.ascontiguousarray(x.transpose(0, 2, 1, 3))


def imported(m, tmp_path, exporter: str, c: int, t: int = 24):
    torch.manual_seed(3)
    return qtool.load_model(export_map_model(m, maps(2, 0, c, t), tmp_path / "dp.onnx", exporter))


def equals_module(g, m, x: np.ndarray) -> None:
    with torch.no_grad():
        want = m(torch.from_numpy(x)).numpy()
    got = run(g, as_data(x))["y"]
    np.testing.assert_allclose(got, want.transpose(0, 2, 1, 3).reshape(got.shape), atol=2e-5 * np.abs(want).max())


@pytest.mark.parametrize("exporter", ["torchscript", "dynamo", "plain"])
def test_a_dprnn_block_imports_whole_from_either_exporter(tmp_path, exporter):
    if exporter != "torchscript":
        pytest.importorskip("onnxscript")
    torch.manual_seed(0)
    m = DualPath().eval()
    if exporter == "plain":  # one example map: batch 1 and 24 steps fixed in the file
        g = qtool.load_model(export_map_model(m, maps(1, 0), tmp_path / "dp.onnx", exporter))
    else:
        g = imported(m, tmp_path, exporter, 1)
    grus = [n for n in g.nodes if n.op == "gru"]
    assert [(n.attrs["along"], n.attrs["freq"], n.attrs["bidirectional"]) for n in grus] == [
        ("freq", F, True), ("time", F, False)]
    equals_module(g, m, maps(4, 11))


@pytest.mark.parametrize("exporter", ["torchscript", "dynamo"])
def test_gtcrns_grouped_block_imports_whole(tmp_path, exporter):
    if exporter == "dynamo":
        pytest.importorskip("onnxscript")
    torch.manual_seed(1)
    m = Grouped().eval()
    if exporter == "dynamo":  # torch.export fixes the time steps this block reshapes by
        g = qtool.load_model(export_map_model(m, maps(2, 0, 8), tmp_path / "g.onnx", "dynamo"))
    else:
        g = imported(m, tmp_path, exporter, 8)
    assert sum(n.op == "gru" for n in g.nodes) == 4 and "select" in {n.op for n in g.nodes}
    equals_module(g, m, maps(4, 12, 8))


def test_dual_path_integers_verify_in_c_whole_and_frame_by_frame(tmp_path):
    if shutil.which("cc") is None:
        pytest.skip("no C compiler")
    torch.manual_seed(1)
    g = imported(Grouped().eval(), tmp_path, "torchscript", 8)
    data = as_data(maps(12, 5, 8))
    qg = qtool.calibrate(g, data[:8], method="minmax")
    sim = qtool.simulate(qg, data[8:])
    assert sim.outputs["y"].cosine > 0.99
    qtool.export_c(qg, tmp_path / "c", name="dp")
    v = qtool.verify(qg, tmp_path / "c", data[8:])
    assert v.mismatches == 0 and v.streaming and v.stream_values > 0


def test_a_dprnn_block_verifies_on_the_emulated_cortex_m4(tmp_path):
    if not (shutil.which("arm-none-eabi-gcc") and shutil.which("qemu-system-arm")):
        pytest.skip("no arm-none-eabi-gcc or qemu-system-arm")
    torch.manual_seed(0)
    g = imported(DualPath().eval(), tmp_path, "torchscript", 1)
    data = as_data(maps(10, 6))
    qg = qtool.calibrate(g, data[:8], method="minmax")
    qtool.export_c(qg, tmp_path / "c", name="dp")
    v = qtool.verify(qg, tmp_path / "c", data[8:], target="cortex-m4")
    assert v.mismatches == 0 and v.target == "cortex-m4"


def test_a_gru_along_frequency_at_the_output_gives_the_map(tmp_path):
    """The intra-frame GRU as a model's last layer: its output map, frames [F, 2H], is PyTorch's."""
    class Intra(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.conv = torch.nn.Conv2d(2, 4, (1, 3), padding=(0, 1))
            self.gru = torch.nn.GRU(4, 4, batch_first=True, bidirectional=True)

        def forward(self, x):
            h = self.conv(x).permute(0, 2, 3, 1)  # [N, T, F, C]
            n, t, f, c = h.shape
            return self.gru(h.reshape(n * t, f, c))[0].reshape(n, t, f, 8)

    torch.manual_seed(2)
    m = Intra().eval()
    g = qtool.load_model(export_map_model(m, maps(2, 0, 2), tmp_path / "intra.onnx", "torchscript"))
    x = maps(3, 4, 2)
    with torch.no_grad():
        want = m(torch.from_numpy(x)).numpy()
    got = run(g, as_data(x))["y"]
    np.testing.assert_allclose(got, want.reshape(got.shape), atol=2e-5 * np.abs(want).max())


def test_final_states_along_frequency_are_refused_saying_so(tmp_path):
    class Last(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.conv = torch.nn.Conv2d(1, 2, (1, 3), padding=(0, 1))
            self.gru = torch.nn.GRU(2, 4, batch_first=True)

        def forward(self, x):  # [N, 1, T, F]
            x = self.conv(x)
            n, c, t, f = x.shape
            return self.gru(x.permute(0, 2, 3, 1).reshape(n * t, f, c))[1].reshape(n, t, 4)

    torch.manual_seed(0)
    path = export_map_model(Last().eval(), maps(2, 0), tmp_path / "last.onnx", "torchscript")
    with pytest.raises(QtoolError, match="final states"):
        qtool.load_model(path)


class Unfold3(torch.nn.Module):
    """GTCRN's subband features: each frequency with its two neighbours (PyTorch's Unfold)."""

    def __init__(self):
        super().__init__()
        self.unfold = torch.nn.Unfold((1, 3), padding=(0, 1))

    def forward(self, x):
        n, c, t, f = x.shape
        return self.unfold(x).reshape(n, c * 3, t, f)


class Attention(torch.nn.Module):
    """GTCRN's temporal recurrent attention: a GRU over each frame's mean energy per channel."""

    def __init__(self, c: int):
        super().__init__()
        self.gru = torch.nn.GRU(c, 2 * c, batch_first=True)
        self.fc = torch.nn.Linear(2 * c, c)

    def forward(self, x):
        z = x.pow(2).mean(-1)
        a = torch.sigmoid(self.fc(self.gru(z.transpose(1, 2))[0])).transpose(1, 2)
        return x * a[..., None]


class GroupedConv(torch.nn.Module):
    """GTCRN's grouped temporal convolution: half the channels through subband features, a
    pointwise conv, a causal dilated depthwise conv and the attention; the halves shuffled."""

    def __init__(self, c: int = 8, d: int = 2):
        super().__init__()
        self.sfe = Unfold3()
        self.pw1 = torch.nn.Conv2d(c // 2 * 3, c, 1)
        self.bn = torch.nn.BatchNorm2d(c)
        self.act1, self.act2 = torch.nn.PReLU(), torch.nn.PReLU()
        self.dw = torch.nn.Conv2d(c, c, (3, 3), padding=(0, 1), dilation=(d, 1), groups=c)
        self.pw2 = torch.nn.Conv2d(c, c // 2, 1)
        self.att = Attention(c // 2)
        self.pad = 2 * d

    def forward(self, x):
        x1, x2 = torch.chunk(x, 2, dim=1)
        h = self.act1(self.bn(self.pw1(self.sfe(x1))))
        h = self.act2(self.dw(torch.nn.functional.pad(h, [0, 0, self.pad, 0])))
        h = self.att(self.pw2(h))
        x = torch.stack([h, x2], dim=1).transpose(1, 2)  # the channel shuffle
        return x.reshape(x.shape[0], -1, x.shape[3], x.shape[4])


class MiniGtcrn(torch.nn.Module):
    """GTCRN's computation in small, as its authors write it, on a spectrum [N, F, T, 2]: the
    magnitude, subband features, a strided encoder, the grouped convolution, the grouped
    dual-path block, a transposed-convolution decoder and the complex mask."""

    def __init__(self):
        super().__init__()
        self.sfe = Unfold3()
        self.enc = torch.nn.Conv2d(9, 8, (1, 3), stride=(1, 2), padding=(0, 1))
        self.act = torch.nn.PReLU()
        self.block = GroupedConv()
        self.dp = Grouped()
        self.dec = torch.nn.ConvTranspose2d(8, 2, (1, 3), stride=(1, 2), padding=(0, 1))

    def forward(self, x):  # the spectrum [N, F, T, 2]
        spec = x
        re, im = spec[..., 0].permute(0, 2, 1), spec[..., 1].permute(0, 2, 1)
        mag = torch.sqrt(re ** 2 + im ** 2 + 1e-12)
        e = self.act(self.enc(self.sfe(torch.stack([mag, re, im], dim=1))))
        m = torch.tanh(self.dec(self.dp(self.block(e)) + e))
        s = spec.permute(0, 3, 2, 1)
        out_re = s[:, 0] * m[:, 0] - s[:, 1] * m[:, 1]
        out_im = s[:, 1] * m[:, 0] + s[:, 0] * m[:, 1]
        return torch.stack([out_re, out_im], dim=1).permute(0, 3, 2, 1)


def spectra(n: int, seed: int, t: int = 24) -> np.ndarray:
    return np.random.default_rng(seed).standard_normal((n, 11, t, 2)).astype(np.float32)


@pytest.mark.parametrize("exporter", ["torchscript", "dynamo", "plain"])
def test_gtcrns_layers_import_whole_and_verify_in_c(tmp_path, monkeypatch, exporter):
    """"plain": torch.onnx.export(m, (x,), f) of one spectrum, as a user first runs it: the batch
    fixed at 1 (merged into the GRUs' batches by Reshapes of literal sizes) and the steps at 24; the
    import still runs on any batch and length."""
    if exporter != "torchscript":
        pytest.importorskip("onnxscript")
    torch.manual_seed(4)
    m = MiniGtcrn().eval()
    with torch.no_grad():
        m.block.bn.running_mean.uniform_(-0.3, 0.3)
        m.block.bn.running_var.uniform_(0.5, 2)
    example = spectra(1 if exporter == "plain" else 2, 0)
    g = qtool.load_model(export_map_model(m, example, tmp_path / "gtcrn.onnx", exporter))
    ops = {n.op for n in g.nodes}
    assert {"select", "sub", "mul", "concat", "gru", "layernorm", "conv2d"} <= ops
    assert any(n.op == "activation" and n.attrs["kind"] == "sqrt" for n in g.nodes)
    x = spectra(12, 9)
    data = np.ascontiguousarray(x.transpose(0, 2, 1, 3))  # [N, T, F, 2]: its frames as the file holds them
    with torch.no_grad():
        want = m(torch.from_numpy(x)).numpy()
    got = run(g, data)["y"]  # frames [2, F]: the output's axis 3, then axis 1 (the import's note)
    np.testing.assert_allclose(got, want.transpose(0, 2, 3, 1).reshape(got.shape), atol=2e-5 * np.abs(want).max())
    if shutil.which("cc") is None or exporter != "torchscript":  # the C once
        return
    qg = qtool.calibrate(g, data[:8], method="minmax")
    assert qtool.simulate(qg, data[8:]).outputs["y"].cosine > 0.95
    qtool.export_c(qg, tmp_path / "c", name="gtcrn")
    probe = subprocess.run(["gcc", "-fsanitize=address,undefined", "-x", "c", "-", "-o", str(tmp_path / "p")],
                           input="int main(void){return 0;}", text=True, capture_output=True)
    if probe.returncode == 0:  # every array access checked: the layers', the GRUs' and the harness's
        monkeypatch.setenv("CC", "gcc -fsanitize=address,undefined -fno-sanitize-recover=all")
    v = qtool.verify(qg, tmp_path / "c", data[8:])
    assert v.mismatches == 0 and v.streaming and v.stream_values > 0


def test_a_graph_that_fixes_its_steps_is_read_on_that_many(tmp_path):
    """torch.export fixes the steps an op computes on at the example's (GTCRN's Unfold); such a
    file declares any length, but runs on that one: qtool reads it on that many and says so."""
    onnx = pytest.importorskip("onnx")
    from onnx import TensorProto, helper, numpy_helper

    W = np.random.default_rng(0).normal(size=(3, 4)).astype(np.float32)
    graph = helper.make_graph(
        [helper.make_node("Gather", ["x", "steps"], ["g"], axis=1), helper.make_node("MatMul", ["g", "W"], ["y"])],
        "fixed", [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["n", "t", 3])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["n", 5, 4])],
        [numpy_helper.from_array(np.arange(5, dtype=np.int64), "steps"), numpy_helper.from_array(W, "W")])
    path = tmp_path / "fixed.onnx"
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]), path)
    g = qtool.load_model(path)
    assert g.steps == 5 and any("5 time steps" in n for n in g.notes)
    x = np.random.default_rng(1).normal(size=(2, 5, 3)).astype(np.float32)
    np.testing.assert_allclose(run(g, x)["y"], x @ W, rtol=1e-6)


@pytest.mark.parametrize("bits,e,e_y", [(8, (4, 6), 3), (16, (10, 10), 11), (16, (12, 9), 6), (8, (2, 2), 9)])
def test_hypot_integers_are_the_rounded_magnitude(bits, e, e_y):
    """Every pair of input integers: q_y = round(sqrt(x0^2 + x1^2 + eps) 2^e_y) + zp_y, clamped,
    against Decimal arithmetic of 50 digits."""
    from decimal import ROUND_HALF_UP, Decimal, getcontext
    from fractions import Fraction

    from qtool.layers import hypot
    from qtool.layers.integer import LayerBits
    from qtool.numerics.qparams import qrange

    getcontext().prec = 50
    node = Node("h", "hypot", ["a", "b"], ["y"], {"epsilon": 1e-3})
    lo, hi = qrange(bits)
    g_in = [TensorQ(bits, False, e[0], 3, 0, 0), TensorQ(bits, False, e[1], -5, 0, 0)]
    g_out = TensorQ(bits, False, e_y, lo + 1, 0, 0)
    qp = hypot.quantize(node, g_in, [g_out], LayerBits(8, 32, bits))
    rng = np.random.default_rng(bits + e_y)
    qa = np.concatenate([[lo, hi, 3, 3], rng.integers(lo, hi + 1, 400)])
    qb = np.concatenate([[hi, lo, -5, -4], rng.integers(lo, hi + 1, 400)])
    got = hypot.forward_int(node, qp, [qa[None, :], qb[None, :]], g_in, [g_out])[0][0]
    eps = Fraction(qp["Q"], 4 ** max(e))  # the epsilon the integers add, on the finest grid
    for a, b, y in zip(qa, qb, got):
        v = Fraction(int(a) - 3, 2 ** e[0]) ** 2 + Fraction(int(b) + 5, 2 ** e[1]) ** 2 + eps
        root = (Decimal(v.numerator) / Decimal(v.denominator)).sqrt() * Decimal(2) ** e_y
        want = int(root.to_integral_value(ROUND_HALF_UP)) + lo + 1
        assert y == min(max(want, lo), hi), (a, b)


def test_the_magnitude_written_out_becomes_one_hypot():
    from qtool.graph.passes import run_float_passes

    sq = [Node(f"sq{k}", "activation", [x], [f"s{k}"], {"kind": "square"}) for k, x in enumerate("ab")]
    nodes = [*sq, Node("add", "add", ["s0", "s1"], ["p"]),
             Node("eps", "batchnorm", ["p"], ["pe"], {"epsilon": 1e-12},
                  {"gamma": np.ones(3, np.float32), "beta": np.full(3, 1e-6, np.float32),
                   "mean": np.zeros(3, np.float32), "var": np.ones(3, np.float32)}),
             Node("root", "activation", ["pe"], ["m"], {"kind": "sqrt"}),
             Node("d", "dense", ["m"], ["y"], {}, {"W": np.eye(3, dtype=np.float32)})]
    graph = check(Graph(nodes, {"a": (None, 3), "b": (None, 3)}, ["y"]))
    g, done = run_float_passes(graph)
    assert [n.op for n in g.nodes] == ["hypot", "dense"] and g.nodes[0].inputs == ["a", "b"]
    assert dict(done)["fuse_hypot"] == "fused root into hypot"
    x = {k: np.random.default_rng(k == "a").normal(size=(2, 5, 3)).astype(np.float32) for k in "ab"}
    np.testing.assert_allclose(run(g, x)["y"], run(graph, x)["y"], rtol=1e-6)


def test_a_flip_along_frequency_takes_every_frequency_reversed(tmp_path):
    """x.flip(-1) is a Slice of step -1 over the whole axis: ONNX clamps its end to before index 0,
    so the select takes every frequency (index 0 last), as PyTorch does."""
    class Flip(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.a = torch.nn.Conv2d(1, 3, (1, 3), padding=(0, 1))
            self.b = torch.nn.Conv2d(3, 2, (1, 3), padding=(0, 1))

        def forward(self, x):
            return self.b(self.a(x).flip(-1))

    torch.manual_seed(5)
    m = Flip().eval()
    g = qtool.load_model(export_map_model(m, maps(2, 0), tmp_path / "flip.onnx", "torchscript"))
    assert any(n.op == "select" for n in g.nodes)
    equals_module(g, m, maps(3, 8))
