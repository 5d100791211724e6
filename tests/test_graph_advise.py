"""`qtool advise` on a whole model: int8 or int16 per layer's weights and output and per GRU
tensor, by the threshold rule or by a measured search; the bits file it writes rebuilds the very
model it measured, to the flash byte and the output SNR."""

import json

import numpy as np
import pytest
from conftest import SAMPLES

from qtool import api
from qtool.advisor.graph import advise_graph, graph_flash
from qtool.core.graph import Graph, Node
from qtool.errors import QtoolError
from qtool.graph.simulate import output_snr_db
from qtool.io.files import SequenceData
from qtool.layers import check

C, H, K = 6, 8, 3


def model() -> Graph:
    """dense -> tanh -> GRU -> last step -> dense."""
    rng = np.random.default_rng(5)

    def w(*shape):
        return (rng.standard_normal(shape) / np.sqrt(shape[-1])).astype(np.float32)

    front = w(C, C)
    gru = {f"l0.fwd.{k}": v for k, v in (("W", w(3 * H, C)), ("R", w(3 * H, H)), ("bx", w(3 * H) / 4),
                                          ("br", w(3 * H) / 4))}
    nodes = [
        Node("front", "dense", ["x"], ["f"], {}, {"W": front, "b": w(C)}),
        Node("act", "activation", ["f"], ["a"], {"kind": "tanh"}),
        Node("gru", "gru", ["a"], ["h"], {}, gru),
        Node("last", "last_step", ["h"], ["l"]),
        Node("head", "dense", ["l"], ["y"], {}, {"W": w(K, H), "b": w(K)}),
    ]
    return check(Graph(nodes, {"x": (None, C)}, ["y"]))


def data(n: int, seed: int, spikes: bool = False) -> SequenceData:
    """Gaussian inputs; with `spikes`, a few values 300 times the bulk's, whose range an int8 grid
    must span (so that it rounds most of the bulk to zero)."""
    x = np.random.default_rng(seed).standard_normal((n, 10, C)).astype(np.float32)
    if spikes:
        x[::7, 3, 0] = 300.0
    return SequenceData(x, False, f"data{seed}")


def test_the_rule_promotes_the_units_whose_int8_prediction_is_low():
    calm, wild = (advise_graph(model(), data(60, 0, spikes), 60) for spikes in (False, True))
    rows = {(r["layer"], r["tensor"]): r for r in wild.rows}
    assert {("x", "output"), ("front", "weights"), ("front", "output"), ("head", "weights"),
            ("head", "output"), ("GRU layer 0", "x"), ("GRU layer 0", "h"), ("GRU layer 0", "W")} <= set(rows)
    # the tanh writes the GRU's x and last_step keeps the GRU's grid: no units of their own
    assert ("act", "output") not in rows and ("last", "output") not in rows
    # the spiky input and the product of the front layer's weights with it are predicted poorly
    assert rows[("x", "output")]["predicted_int8_db"] < 18.5 and rows[("x", "output")]["bits"] == 16
    assert rows[("front", "weights")]["bits"] == 16
    assert all(r["bits"] == 8 for r in calm.rows) and len(calm.chosen.promoted) == 0
    assert wild.chosen.qg.grids["x"].bits == 16 and np.abs(wild.chosen.qg.qparams["front"]["q_W"]).max() > 127
    assert calm.presets["int8"]["flash_bytes"] < calm.presets["w8a16"]["flash_bytes"] < \
        calm.presets["int16"]["flash_bytes"]


@pytest.fixture(scope="module")
def searched(tmp_path_factory):
    g, calib, test = model(), data(60, 0), data(40, 1)
    int8 = api.calibrate_graph(g, calib.chunk(0, 60))
    target = output_snr_db(api.simulate_graph(int8, test.chunk(0, 40))) + 8.0
    path = tmp_path_factory.mktemp("adv") / "bits.toml"
    adv = api.advise(g, calib.chunk(0, 60), test.chunk(0, 40), target_snr=target, output=path)
    return g, calib, test, target, adv, path


def test_the_target_search_reaches_the_target_with_less_flash_than_int16(searched):
    g, calib, test, target, adv, path = searched
    assert adv.mode == "target" and adv.chosen.snr_db >= target
    assert adv.presets["int8"]["snr_db"] < target <= adv.presets["int16"]["snr_db"]
    assert adv.chosen.flash < adv.presets["int16"]["flash_bytes"]
    assert 0 < len(adv.chosen.promoted) < len(adv.rows) and adv.simulations >= 3


def test_the_bits_file_rebuilds_the_measured_model(searched):
    g, calib, test, target, adv, path = searched
    qg = api.calibrate_graph(g, calib.chunk(0, 60), bits=str(path))
    assert graph_flash(qg) == adv.chosen.flash
    assert output_snr_db(api.simulate_graph(qg, test.chunk(0, 40))) == adv.chosen.snr_db
    assert all(np.array_equal(qg.grids[e].exp2_inv, adv.chosen.qg.grids[e].exp2_inv) for e in qg.grids)


def test_the_budget_search_stays_within_the_budget(searched):
    g, calib, test, target, adv, path = searched
    budget = (adv.presets["int8"]["flash_bytes"] + adv.presets["int16"]["flash_bytes"]) // 2
    within = api.advise(g, calib.chunk(0, 60), test.chunk(0, 40), max_flash=budget)
    assert within.chosen.flash <= budget and within.chosen.snr_db >= adv.presets["int8"]["snr_db"]
    with pytest.raises(QtoolError, match="below the all-int8 flash"):
        api.advise(g, calib.chunk(0, 60), test.chunk(0, 40), max_flash=100)


def test_advise_on_the_whole_sample_at_the_command_line(cli, tmp_path):
    out = tmp_path / "bits.toml"
    code, stdout, stderr = cli("advise", SAMPLES / "digits.onnx", SAMPLES / "calib.npy", "-o", out, "--json")
    assert code == 0, stderr
    got = json.loads(stdout)
    units = {(u["layer"], u["tensor"]) for u in got["units"]}
    assert {("/head/Gemm", "weights"), ("/head/Gemm", "output"), ("GRU layer 1", "h")} <= units
    assert got["mode"] == "rule" and got["bits_file"] == str(out) and out.read_text().startswith("# qtool advise")
    code, stdout, stderr = cli("advise", SAMPLES / "digits.onnx", SAMPLES / "calib.npy", "--target-snr", 30)
    assert code != 0 and "need --eval" in stderr and len(stderr.strip().splitlines()) == 1
