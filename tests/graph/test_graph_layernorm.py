"""layernorm (qtool.layers.norm.layernorm): its integers against an independent reference in Python's
own integers (math.isqrt, exact rational rounding) on held-out and extreme inputs; the bound that
refuses what int64 cannot hold; PyTorch's LayerNorm over a map's frequencies and channels (GTCRN's),
over each frequency's channels and over a GRU's output, through both torch.onnx exporters, equal
to the module; Keras' LayerNormalization in both forms tf2onnx writes, equal to TensorFlow; the
C export with 0 mismatches on the host and the emulated Cortex-M4."""

import math
import shutil
from fractions import Fraction

import numpy as np
import pytest
from conftest import GOLDEN, export_map_model

import qtool
from qtool.core.graph import Graph, Node
from qtool.core.qmodel import TensorQ
from qtool.errors import QtoolError
from qtool.layers import check
from qtool.layers.integer import LayerBits
from qtool.layers.norm import layernorm


def _reference(q, zp, qp, size, stride, e_x, eps, g_out):
    """The module docstring's formula, element by element, in Python ints and Fractions."""
    Z, P, n = layernorm.Z, qp["P"], size
    out = np.zeros(q.shape, np.int64)
    lo, hi = -(1 << (g_out.bits - 1)), (1 << (g_out.bits - 1)) - 1
    E = round(Fraction(n ** 3) * Fraction(eps) * Fraction(2) ** (2 * e_x + 2 * P))
    for row in range(q.shape[0]):
        frame = [int(v) - zp for v in q[row]]
        for g in range(len(frame) // (n * stride)):
            for s in range(stride):
                idx = [g * n * stride + s + k * stride for k in range(n)]
                S = sum(frame[i] for i in idx)
                d = {i: n * frame[i] - S for i in idx}
                r = math.isqrt((sum(v * v for v in d.values()) * 4 ** P + E) // n)
                for i in idx:
                    if r == 0:
                        z = 0
                    else:  # half away from zero
                        f = Fraction(d[i] * 2 ** (Z + P), r)
                        z = int(math.copysign(math.floor(abs(f) + Fraction(1, 2)), f))
                    acc = z * int(qp["q_gamma"][i]) + int(qp["q_beta"][i])
                    sh = int(qp["sh"][i])
                    y = (acc + (1 << (sh - 1))) >> sh if sh > 0 else acc << -sh
                    out[row, i] = min(max(y + g_out.zp, lo), hi)
    return out


@pytest.mark.parametrize("bits,size,stride", [(8, 12, 1), (8, 3, 2), (16, 4, 3), (16, 24, 1)])
def test_the_integers_are_the_formulas(bits, size, stride):
    rng = np.random.default_rng(bits + size)
    W = 24
    nd = Node("ln", "layernorm", ["x"], ["y"], {"size": size, "stride": stride, "epsilon": 1e-5},
              {"gamma": (1 + 0.3 * rng.standard_normal(W)).astype(np.float32),
               "beta": rng.standard_normal(W).astype(np.float32)})
    check(Graph([nd], {"x": (None, W)}, ["y"]))
    g_in, g_out = TensorQ(bits, False, bits - 3, 7, 0, 0), TensorQ(bits, False, bits - 4, -3, 0, 0)
    qp = layernorm.quantize(nd, [g_in], [g_out], LayerBits(8, 32, bits))
    lo, hi = -(1 << (bits - 1)), (1 << (bits - 1)) - 1
    q = rng.integers(lo, hi + 1, (40, W))
    q[0] = hi  # a constant group: r from epsilon alone
    q[1, :] = rng.integers(-2, 3, W) + 7  # values a step or two from the zero point: a small r
    q[2, ::2], q[2, 1::2] = lo, hi  # the largest spread
    (got,) = layernorm.forward_int(nd, qp, [q], [g_in], [g_out])
    want = _reference(q, g_in.zp, qp, size, stride, bits - 3, 1e-5, g_out)
    assert np.array_equal(got, want)


def test_a_group_beyond_int64_is_refused_saying_so():
    nd = Node("ln", "layernorm", ["x"], ["y"], {"size": 4096, "epsilon": 1e-5},
              {"gamma": np.ones(4096, np.float32), "beta": np.zeros(4096, np.float32)})
    g = TensorQ(16, False, 8, 0, 0, 0)
    with pytest.raises(QtoolError, match="normalizes 4096 channels of 16 bits .* would pass 2\\^62"):
        layernorm.quantize(nd, [g], [g], LayerBits(8, 32, 16))


torch = pytest.importorskip("torch")
pytest.importorskip("onnxruntime")


class Normed(torch.nn.Module):
    """A map [N, 2, T, 9] through a Conv2d, LayerNorm over frequency and channels (GTCRN's
    intra-frame norm), LayerNorm over each frequency's channels, a GRU, LayerNorm over its units."""

    def __init__(self):
        super().__init__()
        self.conv = torch.nn.Conv2d(2, 4, (1, 3), padding=(0, 1))
        self.ln = torch.nn.LayerNorm((9, 4), eps=1e-8)
        self.ln2 = torch.nn.LayerNorm(4)
        self.gru = torch.nn.GRU(36, 8, batch_first=True)
        self.ln3 = torch.nn.LayerNorm(8)

    def forward(self, x):
        h = self.ln2(self.ln(self.conv(x).permute(0, 2, 3, 1)))  # [N, T, F, C]
        n, t, f, c = h.shape
        return self.ln3(self.gru(h.reshape(n, t, f * c))[0])


def normed():
    torch.manual_seed(4)
    m = Normed().eval()
    with torch.no_grad():
        for ln in (m.ln, m.ln2, m.ln3):
            ln.weight.uniform_(0.5, 1.5)
            ln.bias.uniform_(-0.5, 0.5)
    return m


def export(m, path, exporter):
    return export_map_model(m, np.random.default_rng(0).standard_normal((2, 2, 20, 9)).astype(np.float32), path,
                            exporter)


def data(n, seed):
    """[N, T, C, F]: PyTorch's [N, C, T, F] with time first."""
    return np.random.default_rng(seed).standard_normal((n, 24, 2, 9)).astype(np.float32)


@pytest.mark.parametrize("exporter", ["torchscript", "dynamo", "opset11", "opset16"])
def test_pytorchs_layernorms_import_as_layernorm_groups(tmp_path, exporter):
    if exporter == "dynamo":
        pytest.importorskip("onnxscript")
    m = normed()
    g = qtool.load_model(export(m, tmp_path / "m.onnx", exporter))
    assert [(n.op, n.attrs.get("size"), n.attrs.get("stride")) for n in g.nodes if n.op == "layernorm"] == \
        [("layernorm", 36, 1), ("layernorm", 4, 1), ("layernorm", 8, 1)]
    if exporter.startswith("opset"):  # written out op by op, gamma and beta included
        written = "ReduceMean+Sub+Pow+ReduceMean+Add+Sqrt+Div+Mul+Add"
        assert {n.source for n in g.nodes if n.op == "layernorm"} == {written}
    x = data(3, 1)
    with torch.no_grad():
        want = m(torch.from_numpy(x.transpose(0, 2, 1, 3).copy())).numpy()
    got = qtool.layers.run(g, x.reshape(3, 24, -1))["y"]
    np.testing.assert_allclose(got, want, atol=2e-5 * np.abs(want).max())


@pytest.mark.skipif(shutil.which("cc") is None and shutil.which("gcc") is None, reason="needs a C compiler")
@pytest.mark.parametrize("bits", ["int8", "w8a16"])
def test_the_c_export_verifies(tmp_path, bits):
    qg = qtool.calibrate(export(normed(), tmp_path / "m.onnx", "torchscript"), data(16, 2), method="minmax",
                         bits=bits)
    assert qtool.simulate(qg, data(6, 3)).to_dict()["outputs"]["y"]["cosine"] > (0.995 if bits == "int8" else 0.9999)
    qtool.export_c(qg, tmp_path / "c", name="normed")
    v = qtool.verify(qg, tmp_path / "c", data(4, 4))
    assert v.mismatches == 0 and v.stream_values > 0


def test_the_c_export_verifies_on_the_emulated_cortex_m4(tmp_path):
    from qtool.exporters.c_target import missing_tools

    if missing_tools():
        pytest.skip("no Cortex-M toolchain or QEMU")
    qg = qtool.calibrate(export(normed(), tmp_path / "m.onnx", "torchscript"), data(16, 2), method="minmax",
                         bits="w8a16")
    qtool.export_c(qg, tmp_path / "c", name="normed")
    v = qtool.verify(qg, tmp_path / "c", data(2, 5), target="cortex-m4")
    assert v.mismatches == 0 and v.target == "cortex-m4"


def test_keras_layernorms_through_tf2onnx_are_layernorms_equal_to_tensorflow():
    """tests/golden/make_tf_loops.py (layer_norms): Keras 2's fused form (a training-mode batch
    norm over the rows of a reshaped tensor, then gamma and beta) and tf.nn.batch_normalization's
    formula (epsilon 1e-5, which the fused kernel does not take), with and without beta: each one
    layernorm node, its gamma and beta folded in by the float passes, equal to TensorFlow's output
    on held-out sequences."""
    from qtool.graph.passes import run_float_passes

    g = qtool.load_model(GOLDEN / "tf_layernorm.onnx", check=False)
    norms = [n for n in g.nodes if n.op == "layernorm"]
    assert [n.source.split("+")[0] for n in norms] == ["ReduceMean", "GlobalAveragePool", "ReduceMean"]
    assert [n.source.split("+")[-1] for n in norms] == ["BatchNormalization", "Add", "BatchNormalization"]
    assert [n.attrs["epsilon"] for n in norms] == pytest.approx([1e-3, 1e-5, 1e-3])
    io = np.load(GOLDEN / "tf_layernorm_io.npz")
    np.testing.assert_allclose(qtool.layers.run(g, io["x"])[g.outputs[0]], io["y"], atol=1e-5)
    g, _ = run_float_passes(g)
    assert [n.op for n in g.nodes] == ["dense", "layernorm", "gru", "layernorm", "layernorm", "dense"]
    np.testing.assert_allclose(qtool.layers.run(g, io["x"])[g.outputs[0]], io["y"], atol=1e-5)
