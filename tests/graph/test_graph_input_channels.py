"""A grid per input channel (qtool.graph.calibrate.scale_input_channels): where the model's input
channels differ in range (an MFCC's first coefficient spans [-247, 28], the others +-18), channel c
is multiplied by 2^k_c at the input and the first layers' weights divided by it. Held to: the shifts
from the channels' own min-max grids; the float model unchanged to the bit; the input's integers
those of a power-of-two grid per channel (worked out here independently); a better integer model
than one grid; the graph file and the C export (0 mismatches) keeping them."""

import shutil

import numpy as np
import pytest

import qtool
import qtool.graph.calibrate as gc
import qtool.layers as L
from qtool.core.graph import Graph, Node
from qtool.errors import QtoolError
from qtool.graph.simulate import run_int

C, H = 10, 16


def mfcc(n: int, seed: int) -> np.ndarray:
    rng = np.random.default_rng(seed)
    x = rng.standard_normal((n, 30, C)).astype(np.float32) * 6
    x[..., 0] = rng.uniform(-247, 28, (n, 30))
    return x


def model(first: str = "gru") -> Graph:
    """MFCC frames -> (a GRU | a dense | a conv1d | a conv2d over them as a map) -> ... -> dense(4):
    weights that read the wide
    first channel as the narrow ones (a trained model's)."""
    rng = np.random.default_rng(1)
    col = np.r_[1 / 150, np.full(C - 1, 0.05)].astype(np.float32)
    R = rng.standard_normal((3 * H, H)).astype(np.float32) * 0.3
    gru = {"l0.fwd.W": rng.standard_normal((3 * H, C)).astype(np.float32) * col, "l0.fwd.R": R,
           "l0.fwd.bx": rng.standard_normal(3 * H).astype(np.float32) * 0.1, "l0.fwd.br": np.zeros(3 * H, np.float32)}
    head = Node("fc", "dense", ["h"], ["y"], {}, {"W": rng.standard_normal((4, H)).astype(np.float32),
                                                 "b": np.zeros(4, np.float32)})
    if first == "gru":
        nodes = [Node("gru", "gru", ["x"], ["h"], {"return_sequences": False}, gru)]
    else:
        if first == "padded":  # zero padding and a batchnorm (kept: it is on the input) before a conv
            rng2 = np.random.default_rng(4)
            bn = {"gamma": rng2.uniform(0.5, 2, C), "beta": rng2.standard_normal(C),
                  "mean": np.r_[-100.0, np.zeros(C - 1)], "var": np.r_[5000.0, np.full(C - 1, 30.0)]}
            bn = {k: v.astype(np.float32) for k, v in bn.items()}
            nodes = [Node("pad", "zero_pad1d", ["x"], ["xp"], {"pad": (2, 0)}),
                     Node("bn", "batchnorm", ["xp"], ["xb"], {"epsilon": 1e-3}, bn),
                     Node("front", "conv1d", ["xb"], ["a"], {"kernel": 3},
                          {"W": rng.standard_normal((12, C, 3)).astype(np.float32) * 0.2})]
            gru["l0.fwd.W"] = rng.standard_normal((3 * H, 12)).astype(np.float32) * 0.2
            return Graph([*nodes, Node("gru", "gru", ["a"], ["h"], {"return_sequences": False}, gru), head],
                         {"x": (None, C)}, ["y"], "mfcc")
        if first == "conv2d":  # the frames a map of C frequencies (one channel): its kernel shared by all
            front = Node("front", "conv2d", ["x"], ["a"], {"kernel": (3, 3), "freq": C, "freq_pads": (1, 1),
                                                           "padding": "causal", "out_order": "fc"},
                         {"W": rng.standard_normal((2, 1, 3, 3)).astype(np.float32) * 0.05,
                          "b": rng.standard_normal(2).astype(np.float32) * 0.1})
            gru["l0.fwd.W"] = rng.standard_normal((3 * H, 2 * C)).astype(np.float32) * 0.2
            return Graph([front, Node("gru", "gru", ["a"], ["h"], {"return_sequences": False}, gru), head],
                         {"x": (None, C)}, ["y"], "mfcc")
        if first == "dense":
            W = rng.standard_normal((12, C)).astype(np.float32) * col
            front = Node("front", "dense", ["x"], ["a"], {}, {"W": W})
        else:  # two groups of 5 input channels, 6 outputs each: output o reads channels of group o // 6
            scale = col.reshape(2, 1, 5).repeat(6, axis=1).reshape(12, 5, 1)
            front = Node("front", "conv1d", ["x"], ["a"], {"kernel": 3, "groups": 2, "padding": "causal"},
                         {"W": rng.standard_normal((12, 5, 3)).astype(np.float32) * scale})
        gru["l0.fwd.W"] = rng.standard_normal((3 * H, 12)).astype(np.float32) * 0.2
        nodes = [front, Node("gru", "gru", ["a"], ["h"], {"return_sequences": False}, gru)]
    return Graph([*nodes, head], {"x": (None, C)}, ["y"], "mfcc")


def test_each_channel_gets_the_shift_its_own_min_max_grid_takes():
    x = np.zeros((4, 3, 4), np.float32)
    x[..., 0] = np.linspace(-128, 127, 12).reshape(4, 3)  # span 255: 2^0 per step at 8 bits
    x[..., 1] = np.linspace(-16, 15.875, 12).reshape(4, 3)  # span 31.875: 2^3 finer
    x[..., 2] = np.linspace(0, 1, 12).reshape(4, 3)  # span 1: 2^7 finer (255 / 1 -> 2^7)
    span = x.reshape(-1, 4).max(0) - x.reshape(-1, 4).min(0)
    assert gc.channel_shifts(span, 8).tolist() == [0, 3, 7, 0]  # a constant channel gains nothing
    assert gc.channel_shifts(span, 16).tolist() == [0, 3, 7, 0]


@pytest.mark.parametrize("first", ["gru", "dense", "conv1d", "padded", "conv2d"])
def test_the_float_model_is_unchanged_to_the_bit(first):
    g, x = model(first), mfcc(40, 0)
    qg = qtool.calibrate(g, x, method="minmax")
    assert qg.graph.input_shifts == {"x": (0, *[3] * (C - 1))}
    assert np.array_equal(L.run(qg.graph, x)["y"], L.run(g, x)["y"])
    assert any(name == "scale_input_channels" and "k = [0, 3" in what for name, what in qg.passes)


def test_the_inputs_integers_are_a_power_of_two_grid_per_channel():
    x = mfcc(40, 0)
    qg = qtool.calibrate(model(), x, method="minmax")
    t = qg.grids["x"]
    shifts = np.array(qg.graph.input_shifts["x"])
    e = int(t.exp2_inv) + shifts  # channel c's own grid 2^-e_c, the zero point shared
    lo, hi = -(1 << (t.bits - 1)), (1 << (t.bits - 1)) - 1
    want = np.clip(np.floor(x.astype(np.float64) * 2.0 ** e + 0.5) + t.zp, lo, hi)
    assert np.array_equal(run_int(qg, x)["x"], want)


def test_a_grid_per_channel_beats_one_grid_on_held_out_data(monkeypatch):
    calib, test = mfcc(300, 0), mfcc(200, 1)
    per_channel = next(iter(qtool.simulate(qtool.calibrate(model(), calib, method="minmax"), test).outputs.values()))
    monkeypatch.setattr(gc, "SHIFT_MIN_GAIN", 99)
    one = qtool.calibrate(model(), calib, method="minmax")
    assert one.graph.input_shifts == {}
    one = next(iter(qtool.simulate(one, test).outputs.values()))
    assert per_channel.snr_db > one.snr_db + 3, (per_channel.snr_db, one.snr_db)


def test_alike_channels_or_an_input_read_by_a_nonlinear_layer_keep_one_grid():
    x = np.random.default_rng(0).standard_normal((20, 30, C)).astype(np.float32)
    qg = qtool.calibrate(model(), x, method="minmax")
    assert qg.graph.input_shifts == {}
    assert ("scale_input_channels", "one grid: x's channels' ranges are alike") in qg.passes
    g = model()
    g.nodes.insert(0, Node("act", "activation", ["x"], ["x1"], {"kind": "relu"}))
    g.nodes[1].inputs = ["x1"]
    qg = qtool.calibrate(g, mfcc(20, 0), method="minmax")
    assert qg.graph.input_shifts == {}
    assert ("scale_input_channels", "one grid: x is read by act (relu), which is not linear in it") in qg.passes


def test_the_shifts_live_in_the_file_and_a_malformed_table_is_refused(tmp_path):
    import h5py

    qg = qtool.calibrate(model(), mfcc(40, 0), method="minmax")
    qtool.save(qg, tmp_path / "q.h5")
    back = qtool.load(tmp_path / "q.h5")
    assert back.graph.input_shifts == qg.graph.input_shifts
    x = mfcc(5, 3)
    assert np.array_equal(run_int(back, x)["y"], run_int(qg, x)["y"])
    text = None
    with h5py.File(tmp_path / "q.h5", "r+") as f:
        text = f.attrs["graph"]
        f.attrs["graph"] = text.replace('"input_shifts": {"x": [0, 3', '"input_shifts": {"x": [-1, 3')
    with pytest.raises(QtoolError, match="input_shifts of 'x' is not one shift in 0..30 per channel"):
        qtool.load(tmp_path / "q.h5")
    with h5py.File(tmp_path / "q.h5", "r+") as f:  # valid shifts, but not the ones the weights were divided by
        f.attrs["graph"] = text.replace('"input_shifts": {"x": [0, 3', '"input_shifts": {"x": [0, 2')
    with pytest.raises(QtoolError, match="fingerprint"):
        qtool.load(tmp_path / "q.h5")


@pytest.mark.skipif(shutil.which("cc") is None and shutil.which("gcc") is None, reason="needs a C compiler")
@pytest.mark.parametrize("first", ["gru", "padded", "conv2d"])
def test_the_c_export_quantizes_each_channel_on_its_grid(tmp_path, first):
    x = mfcc(40, 0)
    qg = qtool.calibrate(model(first), x, method="minmax")
    res = qtool.export_c(qg, tmp_path / "c", name="kws")
    c = (tmp_path / "c" / "kws.c").read_text()
    assert "static const float kws_input_scale[10] = {0x1p" in c and "kws_input_scale[i % 10]" in c
    shifts = ", ".join(map(str, qg.graph.input_shifts["x"]))
    assert f"#define KWS_INPUT_SHIFTS {{{shifts}}}" in (tmp_path / "c" / "kws.h").read_text()
    assert res.name == "kws"
    v = qtool.verify(qg, tmp_path / "c", mfcc(6, 4))
    assert v.mismatches == 0


def test_the_c_export_verifies_on_the_emulated_cortex_m4(tmp_path):
    from qtool.exporters.c_target import missing_tools

    if missing_tools():
        pytest.skip("no Cortex-M toolchain or QEMU")
    qg = qtool.calibrate(model("conv1d"), mfcc(40, 0), method="minmax")
    assert qg.graph.input_shifts
    qtool.export_c(qg, tmp_path / "c", name="kws")
    v = qtool.verify(qg, tmp_path / "c", mfcc(3, 5), target="cortex-m4")
    assert v.mismatches == 0 and v.target == "cortex-m4"


def test_simulate_names_the_channel_most_outside_its_grid():
    qg = qtool.calibrate(model(), mfcc(40, 0), method="minmax")
    x = mfcc(20, 1)
    x[..., 3] *= 100  # one channel scaled unlike the calibration data
    notes = " ".join(qtool.simulate(qg, x).notes)
    said = "lie outside its grid (saturated; most on channel 3 (a grid 2^3 times finer than the coarsest):"
    assert said in notes, notes
