"""Models written the way DeepFilterNet's authors write theirs (df/modules.py, df/deepfilternet3.py)
and exported the way its export script exports its three blocks (torch.onnx.export of each block,
batch 1, the steps dynamic): grouped linear layers as `torch.einsum("btgi,gih->btgh")` around a
GRU (SqueezedGRU_S), an encoder of two feature maps with several outputs, a decoder that reads an
embedding `[N, T, C]` beside a map `[N, C, T, F]`. Each imports whole and equals the PyTorch
module on held-out inputs, through both exporters."""

import re
import warnings

import numpy as np
import pytest

import qtool
from qtool.errors import QtoolError
from qtool.layers import run

torch = pytest.importorskip("torch")
pytest.importorskip("onnx")
nn = torch.nn

FE, FC, C = 8, 12, 8  # ERB bands, complex bins, conv channels


class GroupedLinearEinsum(nn.Module):
    """DeepFilterNet's: the channels split into `groups`, each its own [I/G, H/G] matrix."""

    def __init__(self, input_size: int, hidden_size: int, groups: int):
        super().__init__()
        self.groups, self.ws = groups, input_size // groups
        self.weight = nn.Parameter(torch.empty(groups, input_size // groups, hidden_size // groups))
        nn.init.kaiming_uniform_(self.weight, a=5 ** 0.5)

    def forward(self, x):
        b, t, _ = x.shape
        x = x.view(b, t, self.groups, self.ws)
        x = torch.einsum("btgi,gih->btgh", x, self.weight)
        return x.flatten(2, 3)


class SqueezedGRU(nn.Module):
    """DeepFilterNet's SqueezedGRU_S: grouped linear in, a GRU, grouped linear out."""

    def __init__(self, size: int, hidden: int, groups: int):
        super().__init__()
        self.linear_in = nn.Sequential(GroupedLinearEinsum(size, hidden, groups), nn.ReLU())
        self.gru = nn.GRU(hidden, hidden, batch_first=True)
        self.linear_out = nn.Sequential(GroupedLinearEinsum(hidden, size, groups), nn.ReLU())

    def forward(self, x):
        x, h = self.gru(self.linear_in(x))
        return self.linear_out(x), h


def conv_norm_act(c_in: int, fstride: int = 1, k=(3, 3)) -> nn.Module:
    """Conv2dNormAct: causal along time (padded before), same along frequency, batch norm, ReLU."""
    return nn.Sequential(nn.ConstantPad2d((k[1] // 2, k[1] // 2, k[0] - 1, 0), 0.0),
                         nn.Conv2d(c_in, C, k, stride=(1, fstride), bias=False), nn.BatchNorm2d(C), nn.ReLU())


class Encoder(nn.Module):
    """feat_erb [B, 1, T, FE] and feat_spec [B, 2, T, FC] -> e0, emb, c0, lsnr."""

    def __init__(self):
        super().__init__()
        self.erb_conv0, self.erb_conv1 = conv_norm_act(1), conv_norm_act(C, 2, (1, 3))
        self.df_conv0, self.df_conv1 = conv_norm_act(2), conv_norm_act(C, 2, (1, 3))
        self.df_fc_emb = nn.Sequential(GroupedLinearEinsum(C * FC // 2, C * FE // 2, 4), nn.ReLU())
        self.emb_gru = SqueezedGRU(C * FE // 2, 16, 4)
        self.lsnr_fc = nn.Sequential(nn.Linear(C * FE // 2, 1), nn.Sigmoid())

    def forward(self, feat_erb, feat_spec):
        e0 = self.erb_conv0(feat_erb)
        e1 = self.erb_conv1(e0)
        c0 = self.df_conv0(feat_spec)
        c1 = self.df_conv1(c0)
        cemb = self.df_fc_emb(c1.permute(0, 2, 3, 1).flatten(2))
        emb = e1.permute(0, 2, 3, 1).flatten(2) + cemb
        emb, _ = self.emb_gru(emb)
        lsnr = self.lsnr_fc(emb) * 50 - 15
        return e0, emb, c0, lsnr


class Decoder(nn.Module):
    """emb [B, T, C * FE / 2] and the skip e0 [B, C, T, FE] -> the mask m [B, 1, T, FE]."""

    def __init__(self):
        super().__init__()
        self.emb_gru = SqueezedGRU(C * FE // 2, 16, 4)
        self.conv = nn.Sequential(nn.Conv2d(C, C, 1), nn.ReLU())
        self.up = nn.ConvTranspose2d(C, C, (1, 3), stride=(1, 2), padding=(0, 1), output_padding=(0, 1))
        self.out = nn.Sequential(nn.Conv2d(C, 1, 1), nn.Sigmoid())

    def forward(self, emb, e0):
        b, t, _ = emb.shape
        emb, _ = self.emb_gru(emb)
        x = emb.view(b, t, FE // 2, C).permute(0, 3, 1, 2)  # [B, C, T, F / 2]
        return self.out(self.up(self.conv(x)) + e0)


def trained(cls) -> nn.Module:
    torch.manual_seed(3)
    m = cls()
    for mod in m.modules():  # batch norms with statistics of their own
        if isinstance(mod, nn.BatchNorm2d):
            mod.running_mean.uniform_(-0.5, 0.5)
            mod.running_var.uniform_(0.5, 2.0)
    return m.eval()


def exported(m, args: tuple, names: list[str], outs: list[str], path, dynamo: bool) -> str:
    """As DeepFilterNet's export script exports a block: batch 1, the steps (axis S) dynamic (the
    TorchScript exporter; the dynamo exporter fixes them at the example's)."""
    axes = {n: {1 if a.ndim == 3 else 2: "S"} for n, a in zip(names, args)}
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        if dynamo:  # torch.export fixes the steps of a model with a GRU: the file computes on 10
            torch.onnx.export(m, args, str(path), dynamo=True, input_names=names, output_names=outs)
        else:
            torch.onnx.export(m, args, str(path), dynamo=False, opset_version=14, input_names=names, output_names=outs,
                              dynamic_axes=axes)
    return str(path)


def frames(g, name: str, x: np.ndarray) -> np.ndarray:
    """A map input `[N, C, T, F]` as the frames the graph reads (its input_maps' order)."""
    order = g.input_maps[name][0]
    return x.transpose(0, 2, 1, 3) if order == "cf" else x.transpose(0, 2, 3, 1)


def as_frames(g, name: str, y: np.ndarray) -> np.ndarray:
    """A module's output, as qtool gives it: a map's frames in the order its note names."""
    if y.ndim == 3:
        return y
    note = next((n for n in g.notes if n.startswith(f"output '{name}' is a map")), None)
    if note is None:  # one channel: the frame is the frequencies
        assert y.shape[1] == 1
        return y[:, 0]
    first, second = (int(a) for a in re.findall(r"axis (\d)", note))
    return y.transpose(0, 2, first, second).reshape(y.shape[0], y.shape[2], -1)


@pytest.mark.parametrize("dynamo", [False, True], ids=["torchscript", "dynamo"])
def test_deepfilternet_like_encoder_imports_whole(tmp_path, dynamo):
    m = trained(Encoder)
    args = (torch.zeros(1, 1, 10, FE), torch.zeros(1, 2, 10, FC))
    outs = ["e0", "emb", "c0", "lsnr"]
    g = qtool.load_model(exported(m, args, ["feat_erb", "feat_spec"], outs, tmp_path / "enc.onnx", dynamo))
    assert g.check_result["checked"] and g.check_result["max_abs_diff"] < 1e-5
    assert sum(n.op == "gru" for n in g.nodes) == 1 and sum(n.source == "Einsum" for n in g.nodes) == 3
    rng = np.random.default_rng(4)
    t = 10 if dynamo else 17
    erb, spec = rng.standard_normal((3, 1, t, FE), np.float32), rng.standard_normal((3, 2, t, FC), np.float32)
    got = run(g, {"feat_erb": frames(g, "feat_erb", erb).reshape(3, t, -1),
                  "feat_spec": frames(g, "feat_spec", spec).reshape(3, t, -1)})
    with torch.no_grad():
        want = [y.numpy() for y in m(torch.from_numpy(erb), torch.from_numpy(spec))]
    for name, y in zip(outs, want):
        np.testing.assert_allclose(got[name], as_frames(g, name, y), atol=2e-5 * np.abs(y).max())


@pytest.mark.parametrize("dynamo", [False, True], ids=["torchscript", "dynamo"])
def test_a_decoder_reading_an_embedding_beside_a_map_imports_whole(tmp_path, dynamo):
    """emb [1, S, 32] is read as [N, T, C] while e0 is PyTorch's [N, C, T, F]: the two inputs'
    layouts are found apart."""
    m = trained(Decoder)
    args = (torch.zeros(1, 10, C * FE // 2), torch.zeros(1, C, 10, FE))
    g = qtool.load_model(exported(m, args, ["emb", "e0"], ["m"], tmp_path / "dec.onnx", dynamo))
    assert g.check_result["checked"] and g.check_result["max_abs_diff"] < 1e-5
    rng = np.random.default_rng(5)
    t = 10 if dynamo else 13
    emb, e0 = rng.standard_normal((2, t, C * FE // 2), np.float32), rng.standard_normal((2, C, t, FE), np.float32)
    got = run(g, {"emb": emb, "e0": frames(g, "e0", e0).reshape(2, t, -1)})["m"]
    with torch.no_grad():
        want = m(torch.from_numpy(emb), torch.from_numpy(e0)).numpy()
    np.testing.assert_allclose(got, as_frames(g, "m", want), atol=2e-5)


class Einsum(nn.Module):
    def __init__(self, equation: str, weight_shape: tuple):
        super().__init__()
        torch.manual_seed(6)
        self.equation, self.weight = equation, nn.Parameter(torch.randn(*weight_shape))

    def forward(self, x):
        return torch.einsum(self.equation, x, self.weight)


def einsum_file(tmp_path, equation: str, weight_shape: tuple, cls=Einsum) -> tuple[nn.Module, str]:
    m = cls(equation, weight_shape).eval()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        torch.onnx.export(m, (torch.zeros(1, 5, 6),), str(tmp_path / "e.onnx"), dynamo=False, opset_version=14,
                          input_names=["x"], output_names=["y"], dynamic_axes={"x": {0: "n", 1: "t"}})
    return m, str(tmp_path / "e.onnx")


class GroupedView(Einsum):
    """The data viewed as groups first, as GroupedLinearEinsum does, then `equation`."""

    def forward(self, x):
        b, t, _ = x.shape
        y = torch.einsum(self.equation, x.view(b, t, self.weight.shape[0], -1), self.weight)
        return y.flatten(2, 3)


@pytest.mark.parametrize("equation, shape, op", [("bti,ih->bth", (6, 4), "dense"), ("...i,ih->...h", (6, 4), "dense"),
                                                 ("btgi,gih->btgh", (1, 6, 4), "dense"),
                                                 ("...gi,gih->...gh", (2, 3, 4), "conv1d")])
def test_an_einsum_by_a_constant_is_a_dense_or_a_grouped_conv1d(tmp_path, equation, shape, op):
    m, path = einsum_file(tmp_path, equation, shape, GroupedView if len(shape) == 3 else Einsum)
    g = qtool.load_model(path, check=False)  # held to PyTorch below
    assert [n.op for n in g.nodes if n.op != "select"] == [op]
    x = np.random.default_rng(7).standard_normal((2, 9, 6)).astype(np.float32)
    with torch.no_grad():
        np.testing.assert_allclose(run(g, x)["y"], m(torch.from_numpy(x)).numpy(), atol=1e-5)


@pytest.mark.parametrize("equation, shape, why", [
    ("bti,th->bih", (5, 4), r"computes 'bti,th->bih'; qtool reads an Einsum of the data by a constant"),
    ("bti,ii->bti", (6, 6), r"computes 'bti,ii->bti'; qtool reads"),  # the diagonal: no matrix product
])
def test_an_einsum_qtool_does_not_read_is_refused_saying_what_it_computes(tmp_path, equation, shape, why):
    _, path = einsum_file(tmp_path, equation, shape)
    with pytest.raises(QtoolError, match=why):
        qtool.load_model(path, check=False)
