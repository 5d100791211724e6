"""`qtool advise` on a whole model: int8 or int16 per layer's weights and output and per GRU
tensor, by the threshold rule or by a measured search; the bits file it writes rebuilds the very
model it measured, to the flash byte and the output SNR."""

import json
from pathlib import Path

import numpy as np
import pytest
from conftest import SAMPLES

from qtool import api
from qtool.advisor.graph import advise_graph, graph_flash, space
from qtool.calibration.observe import model_config
from qtool.core.graph import Graph, Node
from qtool.core.tensors import (
    METHOD_NAMES,
    BitsConfig,
    TensorConfig,
    bits_from_table,
    bits_table,
    load_bits,
    preset_config,
    table_toml,
)
from qtool.errors import QtoolError
from qtool.graph.calibrate import prepare, quantize_graph
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
    """Gaussian inputs; with `spikes`, a few values 300 times the bulk's on every channel, whose
    range an int8 grid must span (so that it rounds most of the bulk to zero; on one channel only,
    calibration's grid per input channel would spare the others)."""
    x = np.random.default_rng(seed).standard_normal((n, 10, C)).astype(np.float32)
    if spikes:
        x[::7, 3, :] = 300.0
    return SequenceData(x, False, f"data{seed}")


def test_the_rule_promotes_the_units_whose_int8_prediction_is_low():
    calm, wild = (advise_graph(model(), data(60, 0, spikes), 60) for spikes in (False, True))
    rows = {(r["layer"], r["tensor"]): r for r in wild.rows}
    assert {("input x", "output"), ("front", "weights"), ("front", "output"), ("head", "weights"),
            ("head", "output"), ("GRU layer 0", "x"), ("GRU layer 0", "h"), ("GRU layer 0", "W")} <= set(rows)
    # the tanh writes the GRU's x and last_step keeps the GRU's grid: no units of their own
    assert ("act", "output") not in rows and ("last", "output") not in rows
    # the spiky input and the product of the front layer's weights with it are predicted poorly
    assert rows[("input x", "output")]["predicted_int8_db"] < 18.5 and rows[("input x", "output")]["bits"] == 16
    assert rows[("front", "weights")]["bits"] == 16
    assert all(r["bits"] == 8 for r in calm.rows) and len(calm.chosen.promoted) == 0
    assert wild.chosen.qg.grids["x"].bits == 16 and np.abs(wild.chosen.qg.qparams["front"]["q_W"]).max() > 127
    assert calm.presets["int8"]["flash_bytes"] < calm.presets["w8a16"]["flash_bytes"] < \
        calm.presets["int16"]["flash_bytes"]


def test_the_preset_figures_are_what_calibrate_then_export_gives():
    """Without held-out data the presets' flash is counted, not measured: each as `qtool calibrate
    --bits PRESET` builds it. The spikes widen the tanh's input, whose 16-bit table then differs
    from a min/max grid's by 32 KB."""
    g, calib = model(), data(60, 0, spikes=True)
    adv = advise_graph(g, calib, 60)
    for preset in ("int8", "w8a16", "int16"):
        assert adv.presets[preset]["flash_bytes"] == graph_flash(api.calibrate(g, calib, bits=preset))


@pytest.fixture(scope="module")
def searched(tmp_path_factory):
    g, calib, test = model(), data(60, 0), data(40, 1)
    int8 = api.calibrate(g, calib.chunk(0, 60))
    target = output_snr_db(api.simulate(int8, test.chunk(0, 40)), int8) + 8.0
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
    qg = api.calibrate(g, calib.chunk(0, 60), bits=str(path))
    assert graph_flash(qg) == adv.chosen.flash
    assert output_snr_db(api.simulate(qg, test.chunk(0, 40)), qg) == adv.chosen.snr_db
    assert all(np.array_equal(qg.grids[e].exp2_inv, adv.chosen.qg.grids[e].exp2_inv) for e in qg.grids)
    assert qg.fingerprint() == adv.chosen.qg.fingerprint()  # every layer's bits too, those of no unit included


def outliers(n: int, seed: int) -> SequenceData:
    """Gaussian inputs with 1% of the values 8 times larger: at 8 bits some edges are best on a
    clipped grid (mse), others on their min/max, and the GRU's tensors differ too."""
    rng = np.random.default_rng(seed)
    x = rng.standard_normal((n, 10, C))
    x[rng.random(x.shape) < 0.01] *= 8.0
    return SequenceData(x.astype(np.float32), False, f"outliers{seed}")


def same_model(a, b) -> None:
    """Integer for integer: every edge's grid, every layer's bits and integers, each GRU's."""
    assert a.grids.keys() == b.grids.keys()
    for e in a.grids:
        assert (a.grids[e].bits, int(a.grids[e].exp2_inv), int(a.grids[e].zp)) == \
            (b.grids[e].bits, int(b.grids[e].exp2_inv), int(b.grids[e].zp)), e
    assert a.info["layer_bits"] == b.info["layer_bits"]
    for name in a.core:
        pa, pb = a.qparams[name], b.qparams[name]
        assert pa.keys() == pb.keys(), name
        for k in pa:
            if k == "qm":
                assert pa[k].fingerprint() == pb[k].fingerprint(), name
            else:
                assert np.array_equal(np.asarray(pa[k]), np.asarray(pb[k])), (name, k)
    assert a.fingerprint() == b.fingerprint()


@pytest.fixture(scope="module")
def per_edge(tmp_path_factory):
    """A target search whose chosen model auto calibrated per edge, with methods that differ."""
    g, calib, test = model(), outliers(60, 2), outliers(40, 102)
    int8 = api.calibrate(g, calib.chunk(0, 60))
    target = output_snr_db(api.simulate(int8, test.chunk(0, 40)), int8) + 3.0
    path = tmp_path_factory.mktemp("adv") / "bits.toml"
    adv = api.advise(g, calib.chunk(0, 60), test.chunk(0, 40), target_snr=target, output=path)
    return g, calib, test, adv, path


@pytest.mark.parametrize("method", ["auto", "per-edge", "minmax", "mse"])
def test_the_bits_file_names_every_method_so_any_method_rebuilds_the_model(per_edge, method):
    g, calib, test, adv, path = per_edge
    info = adv.chosen.qg.info
    assert info["auto"]["chosen"] == "per-edge" and adv.chosen.promoted  # bits and methods both to rebuild
    edges = {e: m for e, m in info["edge_methods"].items() if m in METHOD_NAMES}
    gru = {m for layer in info["gru_methods"]["gru"] for m in layer.values()}
    assert len(set(edges.values())) > 1 and len(gru) > 1  # no single --method rebuilds this model
    said = adv.summary()["methods"]  # advise --json: the winner and each edge's method
    assert said["winner"] == "per-edge" and {r["edge"]: r["method"] for r in said["edges"]} == info["edge_methods"]
    assert said["held_out_snr_db"] == info["auto"]["output_snr_db"]["per-edge"]
    file = load_bits(str(path))[1]
    assert {n: t["method"] for n, t in file.graph.items()} == {"x": edges["x"], "front": edges["f"], "head": edges["y"]}
    assert {(l, n): t.method for l, t in file.layers.items() for n, t in t.items()} | \
        {(0, n): t.method for n, t in file.items() if t.method} == \
        {(0, n): m for n, m in info["gru_methods"]["gru"][0].items()}  # every tensor auto chooses
    qg = api.calibrate(g, calib.chunk(0, 60), bits=str(path), method=method)
    same_model(qg, adv.chosen.qg)
    assert output_snr_db(api.simulate(qg, test.chunk(0, 40)), qg) == adv.chosen.snr_db


def test_grus_that_choose_differently_get_the_model_the_file_rebuilds(tmp_path):
    """Two GRUs share the file's tensors table: where their auto choices differ, the file names
    the first one's, and advise reports (and measures) the model that file rebuilds."""
    rng = np.random.default_rng(7)

    def w(*shape):
        return (rng.standard_normal(shape) / np.sqrt(shape[-1])).astype(np.float32)

    def gru(c):
        return {f"l0.fwd.{k}": v for k, v in (("W", w(3 * H, c)), ("R", w(3 * H, H)), ("bx", w(3 * H) / 4),
                                              ("br", w(3 * H) / 4))}
    g = check(Graph([Node("g1", "gru", ["x"], ["h1"], {}, gru(C)),
                     Node("mid", "dense", ["h1"], ["m"], {}, {"W": w(H, H), "b": w(H)}),
                     Node("g2", "gru", ["m"], ["h2"], {}, gru(H)), Node("last", "last_step", ["h2"], ["l"]),
                     Node("head", "dense", ["l"], ["y"], {}, {"W": w(K, H), "b": w(K)})], {"x": (None, C)}, ["y"]))
    calib, test, path = outliers(60, 1), outliers(40, 100), tmp_path / "bits.toml"
    adv = api.advise(g, calib.chunk(0, 60), test.chunk(0, 40), output=path)
    methods = adv.chosen.qg.info["gru_methods"]
    assert methods["g1"][0] == {**methods["g2"][0], "x": methods["g1"][0]["x"]}  # g2's x is g1's h, grid and all
    for method in ("auto", "minmax"):
        qg = api.calibrate(g, calib.chunk(0, 60), bits=str(path), method=method)
        same_model(qg, adv.chosen.qg)
        assert output_snr_db(api.simulate(qg, test.chunk(0, 40)), qg) == adv.chosen.snr_db


def test_a_layer_keeps_its_bits_where_the_file_sets_the_grus_w_and_h_to_16(tmp_path):
    """A layer's bits default to the GRUs' W and h (`[tensors.W]`, `[tensors.h]`): where those are
    16 bits and the layer's units are not, the file says 8 for it."""
    prep = prepare(model(), data(60, 0), 60, BitsConfig(preset_config("int8")))
    sp = space(prep, 60, 0, 0.01, 5, 64)
    promoted = frozenset({(0, "W"), (0, "h"), ("head", "activation")})
    path = tmp_path / "bits.toml"
    path.write_text(table_toml(sp.table(promoted)))
    text = path.read_text()
    assert "[tensors.h]\nbits = 16" in text and "[tensors.W]\nbits = 16" in text
    assert '[graph."front"]\nweight = 8\nactivation = 8\n' in text and '[graph."head"]\nweight = 8\n' in text
    qg = quantize_graph(prep, 60, load_bits(str(path))[1], "minmax", 99.99, 64, {})
    same_model(qg, quantize_graph(prep, 60, sp.config(promoted), "minmax", 99.99, 64, {}))
    assert qg.info["layer_bits"]["front"] == [8, 32, 8] and qg.info["layer_bits"]["head"] == [8, 32, 16]
    assert (qg.grids["x"].bits, qg.grids["f"].bits, qg.grids["h"].bits, qg.grids["y"].bits) == (8, 8, 16, 16)


def test_methods_that_differ_between_layers_leave_the_bits_in_the_tensors_table():
    """A whole model's file keeps a tensor's bits under [tensors.NAME] where only its layers'
    methods differ (its layers' defaults are the file's W and h); a GRU alone's file is as before."""
    int8 = preset_config("int8")
    cfgs = [{**int8, "h": TensorConfig(16, False, m)} for m in ("minmax", "mse")]
    apart = bits_table("int8", cfgs, methods_apart=True)
    assert apart["tensors"] == {"h": {"bits": 16}}
    assert apart["layers"] == {0: {"h": {"method": "minmax"}}, 1: {"h": {"method": "mse"}}}
    config = bits_from_table(apart, Path("bits.toml"))
    assert config["h"].bits == 16 and [c["h"] for c in model_config(config, 2)] == [c["h"] for c in cfgs]
    assert bits_table("int8", cfgs) == {"preset": "int8", "tensors": {}, "layers": {
        0: {"h": {"bits": 16, "method": "minmax"}}, 1: {"h": {"bits": 16, "method": "mse"}}}}


def test_the_budget_search_stays_within_the_budget(searched):
    g, calib, test, target, adv, path = searched
    budget = (adv.presets["int8"]["flash_bytes"] + adv.presets["int16"]["flash_bytes"]) // 2
    within = api.advise(g, calib.chunk(0, 60), test.chunk(0, 40), max_flash=budget)
    assert within.chosen.flash <= budget and within.chosen.snr_db >= adv.presets["int8"]["snr_db"]
    with pytest.raises(QtoolError, match="below the all-int8 flash"):
        api.advise(g, calib.chunk(0, 60), test.chunk(0, 40), max_flash=100)
    with pytest.raises(QtoolError, match="below the all-int8 flash"):  # before the target's search
        api.advise(g, calib.chunk(0, 60), test.chunk(0, 40), target_snr=300, max_flash=100)


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


def test_a_gru_is_observed_once_for_every_candidate(monkeypatch):
    """The advisor's candidates differ in bits only: each GRU's float pass and observations are
    made once per run, and a candidate built from them is the one a fresh calibration builds."""
    from qtool.calibration import auto
    from qtool.graph.calibrate import auto_graph

    made = []
    real = auto.AutoCalibrator.__init__
    monkeypatch.setattr(auto.AutoCalibrator, "__init__", lambda self, *a, **k: made.append(1) or real(self, *a, **k))
    g, calib = model(), data(60, 0)
    prep = prepare(g, calib, 60, BitsConfig(preset_config("int8")))
    shared = [auto_graph(prep, 60, BitsConfig(preset_config(b))) for b in ("int8", "w8a16", "int16")]
    assert len(made) == 2  # one on the 80% auto fits its candidates on, one on all the rows
    fresh = auto_graph(prepare(g, calib, 60, BitsConfig(preset_config("w8a16"))), 60,
                       BitsConfig(preset_config("w8a16")))
    assert fresh.fingerprint() == shared[1].fingerprint()


def test_a_layernorms_scale_and_prelus_slopes_are_units_of_their_own():
    """The weight bits a layernorm keeps its gamma on and a prelu its slopes on are the advisor's
    to choose, as a dense layer's W: promoting them gives those params 16 bits, and more flash."""
    rng = np.random.default_rng(2)
    nodes = [Node("ln", "layernorm", ["x"], ["n"], {"size": C, "epsilon": 1e-5},
                  {"gamma": rng.uniform(0.5, 2, C).astype(np.float32), "beta": rng.normal(size=C).astype(np.float32)}),
             Node("pr", "prelu", ["n"], ["p"], {}, {"alpha": rng.uniform(0.05, 0.3, C).astype(np.float32)}),
             Node("head", "dense", ["p"], ["y"], {}, {"W": rng.normal(size=(K, C)).astype(np.float32)})]
    g = check(Graph(nodes, {"x": (None, C)}, ["y"]))
    prep = prepare(g, data(40, 1), 40, BitsConfig(preset_config("int8")))
    sp = space(prep, 40, 0, 0.01, 5, 64)
    assert {("ln", "weight"), ("pr", "weight")} <= set(sp.units)
    int8 = quantize_graph(prep, 40, sp.config(frozenset()), "minmax", 99.99, 64, {})
    wide = quantize_graph(prep, 40, sp.config(frozenset({("ln", "weight"), ("pr", "weight")})), "minmax", 99.99, 64, {})
    assert int(np.abs(wide.qparams["ln"]["q_gamma"]).max()) > 127 >= int(np.abs(int8.qparams["ln"]["q_gamma"]).max())
    assert int(np.abs(wide.qparams["pr"]["q_alpha"]).max()) > 127
    assert graph_flash(wide) > graph_flash(int8)
