"""Streaming ONNX files (qtool.importers.onnx.streaming): a model written the way GTCRN's authors
write their streaming model (stream/gtcrn_stream.py: a convolution that joins its cache before the
frame, GRUs that take their state from a cache and give it back, the caches updated in place),
exported one frame a run with torch.onnx.export, imports as the model over whole sequences. It
equals the PyTorch module run frame by frame with its caches fed back, on held-out sequences, and
its integers verify in C whole and frame by frame; a cache read any other way is refused."""

import shutil
import warnings

import numpy as np
import pytest

import qtool
from qtool.errors import QtoolError
from qtool.layers import run

torch = pytest.importorskip("torch")
pytest.importorskip("onnx")
pytest.importorskip("onnxruntime")

F, C, H = 6, 4, 5  # frequencies, channels, GRU units


class StreamConv(torch.nn.Module):
    """GTCRN's StreamConv2d: the cache's frames joined before the frame, a convolution with no
    time padding, the joined frames but the first written back."""

    def __init__(self, kt: int, d: int):
        super().__init__()
        self.conv = torch.nn.Conv2d(C, C, (kt, 3), padding=(0, 1), dilation=(d, 1), groups=C)

    def forward(self, x, cache):
        inp = torch.cat([cache, x], dim=2)
        return self.conv(inp), inp[:, :, 1:]


class Stream(torch.nn.Module):
    """One frame [1, 2, 1, F]: a 1x3 convolution, a dilated causal depthwise convolution with its
    cache, a GRU along time on each frequency (GTCRN's inter-RNN) and one over the frequencies' mean
    (its temporal attention), each GRU's state in the GRU cache."""

    def __init__(self, read_cache_otherwise: bool = False):
        super().__init__()
        self.pre = torch.nn.Conv2d(2, C, (1, 3), padding=(0, 1))
        self.act = torch.nn.PReLU()
        self.dw = StreamConv(3, 2)  # looks back (3 - 1) * 2 = 4 frames
        self.inter = torch.nn.GRU(C, H, batch_first=True)
        self.att = torch.nn.GRU(C, C, batch_first=True)
        self.out = torch.nn.Linear(H, 2)
        self.otherwise = read_cache_otherwise

    def forward(self, x, conv_cache, gru_cache):
        """x [1, 2, 1, F]; conv_cache [1, C, 4, F]; gru_cache [2, 1, F, H]: [0] the inter GRU's
        state per frequency, [1, :, :1, :C] the attention GRU's."""
        h = self.act(self.pre(x))
        past = conv_cache[:, :, :1] * 0.5  # a value of the last run's cache, read as data
        h, conv_cache[:, :, :4] = self.dw(h, conv_cache[:, :, :4])
        if self.otherwise:
            h = h + past
        z = h.pow(2).mean(-1).transpose(1, 2)  # [1, T, C]
        a, gru_cache[1, :, :1, :C] = self.att(z, gru_cache[1, :, :1, :C].contiguous())
        h = h * torch.sigmoid(a).transpose(1, 2).unsqueeze(-1)
        y = h.permute(0, 3, 2, 1).reshape(F, 1, C)  # [B * F, T, C]
        y, gru_cache[0] = self.inter(y, gru_cache[0].contiguous())
        y = self.out(y).reshape(1, F, 1, 2).permute(0, 3, 2, 1)  # [1, 2, T, F]
        return y, conv_cache, gru_cache


def caches():
    return torch.zeros(1, C, 4, F), torch.zeros(2, 1, F, H)


def exported(m, path, dynamo: bool = False) -> str:
    """As gtcrn_stream.py exports it: one frame and the caches, their updates as outputs. The
    TorchScript exporter writes the in-place updates as ScatterND; the dynamo exporter as
    ScatterElements, and a cache overwritten whole as the joined frames sliced, its weights in a
    file beside the model."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        torch.onnx.export(m, (torch.zeros(1, 2, 1, F), *caches()), str(path), dynamo=dynamo,
                          **({} if dynamo else {"opset_version": 11}),
                          input_names=["mix", "conv_cache", "gru_cache"],
                          output_names=["enh", "conv_cache_out", "gru_cache_out"])
    return str(path)


def frame_by_frame(m, x: np.ndarray) -> np.ndarray:
    """The module on spectra `[N, T, 2, F]` (the input's frames as qtool reads them), a frame a
    run, its caches fed back."""
    out = []
    with torch.no_grad():
        for seq in x:
            conv_cache, gru_cache = caches()
            frames = []
            for frame in seq:
                y, conv_cache, gru_cache = m(torch.from_numpy(frame)[None, :, None, :], conv_cache, gru_cache)
                frames.append(y[0, :, 0, :].numpy().T)  # [F, 2]: the output's axis 3, then axis 1 (its note)
            out.append(np.stack(frames).reshape(len(seq), -1))
    return np.stack(out)


def spectra(n: int, seed: int, t: int = 20) -> np.ndarray:
    return np.random.default_rng(seed).standard_normal((n, t, 2, F)).astype(np.float32)


def trained() -> Stream:
    torch.manual_seed(5)
    return Stream().eval()


@pytest.mark.parametrize("dynamo", [False, True], ids=["torchscript", "dynamo"])
def test_a_streaming_file_imports_as_the_model_over_whole_sequences(tmp_path, dynamo):
    m = trained()
    g = qtool.load_model(exported(m, tmp_path / "stream.onnx", dynamo))  # checked against ONNX Runtime frame by frame
    assert g.check_result["frame_by_frame"] and g.check_result["max_abs_diff"] < 1e-5
    assert any("carry 2 GRU states and the past frames of 1 convolution from run to run" in n for n in g.notes)
    assert g.steps is None  # a run's one frame is no sequence length the data should have
    assert sum(n.op == "gru" for n in g.nodes) == 2
    x = spectra(3, 1)
    want = frame_by_frame(m, x)
    np.testing.assert_allclose(run(g, x)["enh"], want, atol=2e-5 * np.abs(want).max())


@pytest.mark.skipif(shutil.which("cc") is None and shutil.which("gcc") is None, reason="needs a C compiler")
@pytest.mark.parametrize("dynamo", [False, True], ids=["torchscript", "dynamo"])
def test_a_streaming_files_integers_verify_in_c_whole_and_frame_by_frame(tmp_path, dynamo):
    qg = qtool.calibrate(exported(trained(), tmp_path / "stream.onnx", dynamo), spectra(16, 2), bits="w8a16",
                         method="minmax")
    assert qtool.simulate(qg, spectra(4, 3)).outputs["enh"].cosine > 0.999
    qtool.export_c(qg, tmp_path / "c", name="stream")
    v = qtool.verify(qg, tmp_path / "c", spectra(3, 4))
    assert v.mismatches == 0 and v.streaming and v.stream_values > 0


def test_a_cache_read_otherwise_is_refused_saying_where(tmp_path):
    torch.manual_seed(5)
    path = exported(Stream(read_cache_otherwise=True).eval(), tmp_path / "other.onnx")
    with pytest.raises(QtoolError, match=r"reads cells of the cache 'conv_cache' in a way qtool does not follow"):
        qtool.load_model(path, check=False)


class Carried(torch.nn.Module):
    """A GRU whose state the caller carries: forward(x, h0) returns (y, h_n)."""

    def __init__(self):
        super().__init__()
        self.gru = torch.nn.GRU(C, H, num_layers=2, batch_first=True)
        self.out = torch.nn.Linear(H, 3)

    def forward(self, x, h0):
        y, hn = self.gru(x, h0)
        return self.out(y), hn


@pytest.mark.parametrize("steps", [1, 5, None])
def test_a_gru_whose_state_the_caller_carries_imports_as_the_gru(tmp_path, steps):
    """torch.onnx.export(m, (x, h0)) with h_n among the outputs, fixed at one frame, at 5 steps a
    call, or of any batch and length: h0 and h_n are the GRU's state carried from call to call."""
    torch.manual_seed(6)
    m = Carried().eval()
    dynamic = steps is None
    axes = {"dynamic_axes": {"x": {0: "n", 1: "t"}, "h0": {1: "n"}, "y": {0: "n", 1: "t"}}} if dynamic else {}
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        torch.onnx.export(m, (torch.zeros(1, steps or 1, C), torch.zeros(2, 1, H)), str(tmp_path / "carried.onnx"),
                          dynamo=False, input_names=["x", "h0"], output_names=["y", "hn"], **axes)
    g = qtool.load_model(tmp_path / "carried.onnx")
    assert g.check_result["frame_by_frame"] and any("carry 2 GRU states" in n for n in g.notes)
    x = np.random.default_rng(7).standard_normal((3, 15, C)).astype(np.float32)
    with torch.no_grad():
        want = m(torch.from_numpy(x), torch.zeros(2, 3, H))[0].numpy()
    np.testing.assert_allclose(run(g, x)["y"], want, atol=1e-5)


class CacheFirst(torch.nn.Module):
    """The frame's cache joined before it as the model's first op: which axis of the input [1, 2,
    1, F] is time shows only in the other reading of a map (its unit axis)."""

    def __init__(self):
        super().__init__()
        self.conv = torch.nn.Conv2d(2, C, (3, 3), padding=(0, 1))
        self.gru = torch.nn.GRU(C * F, H, batch_first=True)

    def forward(self, x, cache, h0):
        inp = torch.cat([cache, x], dim=2)
        cache[:] = inp[:, :, 1:]  # updated in place, as GTCRN's caches are
        h = torch.relu(self.conv(inp)).permute(0, 2, 1, 3).reshape(1, 1, C * F)  # [B, T, C * F]
        y, hn = self.gru(h, h0)
        return y, cache, hn


def cache_and_state_fed_back(m, x: np.ndarray) -> np.ndarray:
    """`m(frame, cache, h0) -> (y, cache, h_n)` run a frame at a time on spectra `[N, T, 2, F]`."""
    want = []
    with torch.no_grad():
        for seq in x:
            cache, h, ys = torch.zeros(1, 2, 2, F), torch.zeros(1, 1, H), []
            for frame in seq:
                y, cache, h = m(torch.from_numpy(frame)[None, :, None, :], cache, h)
                ys.append(y[0, 0].numpy())
            want.append(np.stack(ys))
    return np.stack(want)


def test_a_cache_joined_first_finds_the_time_axis(tmp_path):
    torch.manual_seed(8)
    m = CacheFirst().eval()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        torch.onnx.export(m, (torch.zeros(1, 2, 1, F), torch.zeros(1, 2, 2, F), torch.zeros(1, 1, H)),
                          str(tmp_path / "first.onnx"), dynamo=False, opset_version=11,
                          input_names=["x", "cache", "h0"], output_names=["y", "cache_out", "hn"])
    g = qtool.load_model(tmp_path / "first.onnx")
    assert g.check_result["frame_by_frame"]
    x = spectra(2, 9, t=12)
    np.testing.assert_allclose(run(g, x)["y"], cache_and_state_fed_back(m, x), atol=1e-5)


class Sliced(torch.nn.Module):
    """A convolution's cache given back as the joined frames sliced (no in-place update), a GRU's
    state as `h0`/`h_n`; `returned=False`: the cache is joined but never given back."""

    def __init__(self, returned: bool = True):
        super().__init__()
        self.conv = torch.nn.Conv2d(2, C, (3, 3), padding=(0, 1))
        self.gru = torch.nn.GRU(C * F, H, batch_first=True)
        self.returned = returned

    def forward(self, x, cache, h0):
        inp = torch.cat([cache, x], dim=2)
        h = torch.relu(self.conv(inp)).permute(0, 2, 1, 3).reshape(1, 1, C * F)
        y, hn = self.gru(h, h0)
        return (y, inp[:, :, 1:], hn) if self.returned else (y, hn)


def sliced(path, dynamo: bool, returned: bool = True) -> tuple[torch.nn.Module, str]:
    torch.manual_seed(10)
    m = Sliced(returned).eval()
    outs = ["y", "cache_out", "hn"] if returned else ["y", "hn"]
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        torch.onnx.export(m, (torch.zeros(1, 2, 1, F), torch.zeros(1, 2, 2, F), torch.zeros(1, 1, H)), str(path),
                          dynamo=dynamo, input_names=["x", "cache", "h0"], output_names=outs,
                          **({} if dynamo else {"opset_version": 11}))
    return m, str(path)


@pytest.mark.parametrize("dynamo", [False, True], ids=["torchscript", "dynamo"])
def test_a_cache_given_back_as_the_joined_frames_sliced_is_a_cache(tmp_path, dynamo):
    m, path = sliced(tmp_path / "sliced.onnx", dynamo)
    g = qtool.load_model(path)
    assert g.check_result["frame_by_frame"]
    assert any("carry 1 GRU state and the past frames of 1 convolution" in n for n in g.notes)
    x = spectra(2, 11, t=9)
    np.testing.assert_allclose(run(g, x)["y"], cache_and_state_fed_back(m, x), atol=1e-5)


@pytest.mark.parametrize("dynamo", [False, True], ids=["torchscript", "dynamo"])
def test_a_cache_no_output_gives_back_is_refused_saying_so(tmp_path, dynamo):
    """Read as data, the cache does not fit the layout of the frame it is joined to: the refusal
    says why it came to be read so."""
    _, path = sliced(tmp_path / "dropped.onnx", dynamo, returned=False)
    with pytest.raises(QtoolError, match=r"note: the input 'cache' is joined before the frame by node '.*' \(Concat\) "
                                         r"as a convolution's cache is, and no output gives it back"):
        qtool.load_model(path, check=False)


class Beside(torch.nn.Module):
    """`torch.cat([a, b], 1)`: with `channels`, two inputs side by side on the channel axis (a
    microphone and a reference: no cache); else `a` is the previous frame kept on the channel axis
    and given back (a state qtool does not read as a convolution's past frames)."""

    def __init__(self, channels: bool):
        super().__init__()
        self.channels = channels
        self.gru = torch.nn.GRU(4 * F, H, batch_first=True)

    def forward(self, a, b, h0):
        z = torch.cat([a, b], 1)
        y, hn = self.gru(torch.relu(z).permute(0, 2, 1, 3).reshape(1, 1, 4 * F), h0)
        return (y, hn) if self.channels else (y, z[:, 2:], hn)


def beside(path, channels: bool) -> tuple[torch.nn.Module, str]:
    torch.manual_seed(12)
    m = Beside(channels).eval()
    outs = ["y", "hn"] if channels else ["y", "a_out", "hn"]
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        torch.onnx.export(m, (torch.zeros(1, 2, 1, F), torch.zeros(1, 2, 1, F), torch.zeros(1, 1, H)), str(path),
                          dynamo=False, opset_version=13, input_names=["a", "b", "h0"], output_names=outs)
    return m, str(path)


def test_two_inputs_joined_on_the_channels_are_data_not_a_cache(tmp_path):
    m, path = beside(tmp_path / "two.onnx", channels=True)
    g = qtool.load_model(path)
    assert sorted(g.inputs) == ["a", "b"] and any("carry 1 GRU state" in n for n in g.notes)
    a, b = spectra(2, 13, t=7), spectra(2, 14, t=7)
    want = []
    with torch.no_grad():
        for sa, sb in zip(a, b):  # a frame a run, h_n fed back
            h, ys = torch.zeros(1, 1, H), []
            for fa, fb in zip(sa, sb):
                y, h = m(torch.from_numpy(fa)[None, :, None], torch.from_numpy(fb)[None, :, None], h)
                ys.append(y[0, 0].numpy())
            want.append(np.stack(ys))
    got = run(g, {"a": a.reshape(2, 7, -1), "b": b.reshape(2, 7, -1)})["y"]
    np.testing.assert_allclose(got, np.stack(want), atol=1e-5)


def test_a_streaming_files_reading_is_checked_frame_by_frame_even_unasked(tmp_path):
    """A frame kept on the channel axis and given back is no convolution's past frames; read as
    one, the model over whole sequences differs from the file run frame by frame, which the
    import runs even with check=False (a streaming file's reading is qtool's own)."""
    _, path = beside(tmp_path / "chan.onnx", channels=False)
    with pytest.raises(QtoolError, match=r"differs from ONNX Runtime frame by frame by up to .*a wrong import"):
        qtool.load_model(path, check=False)
