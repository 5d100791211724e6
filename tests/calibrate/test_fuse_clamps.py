"""fuse_clamps: a layer whose output only a relu (relu6) reads writes onto that relu's grid, as
int8 toolchains fuse an activation into the layer before it. Its saturation at the grid's low
end is the relu's clamp, so no step of its grid goes to values the relu drops and its values are
rounded once, not twice. A bits file that sets the layer's own grid keeps it (and so rebuilds a
model calibrated before), and the advisor counts the fused edge as the relu's unit."""

import json

import numpy as np
import pytest

from qtool import api
from qtool.advisor.graph import space
from qtool.core.graph import Graph, Node
from qtool.core.tensors import BitsConfig, preset_config
from qtool.graph.calibrate import prepare
from qtool.graph.simulate import run_int
from qtool.io.files import SequenceData
from qtool.layers import check, run
from qtool.numerics.qparams import dequantize

C, H, K = 6, 24, 4


def model(kind: str = "relu") -> Graph:
    """dense -> relu -> dense, over sequences."""
    rng = np.random.default_rng(3)
    nodes = [Node("d1", "dense", ["x"], ["h1"], {}, {"W": rng.standard_normal((H, C)).astype(np.float32),
                                                        "b": rng.standard_normal(H).astype(np.float32)}),
             Node("r", "activation", ["h1"], ["a"], {"kind": kind}),
             Node("d2", "dense", ["a"], ["y"], {}, {"W": rng.standard_normal((K, H)).astype(np.float32) / 4})]
    return check(Graph(nodes, {"x": (None, C)}, ["y"]))


def data(n: int, seed: int) -> np.ndarray:
    return np.random.default_rng(seed).standard_normal((n, 12, C)).astype(np.float32)


def bits_file(tmp_path, table: dict) -> str:
    path = tmp_path / "bits.json"
    path.write_text(json.dumps({"preset": "int8", "graph": table}))
    return str(path)


def relu_snr_db(qg, x: np.ndarray) -> float:
    want = run(qg.graph, x, keep=True)["a"].astype(np.float64)
    g = qg.grids["a"]
    got = dequantize(run_int(qg, x)["a"], int(g.exp2_inv), g.zp)
    return 10 * np.log10(np.sum(want ** 2) / np.sum((want - got) ** 2))


@pytest.mark.parametrize("kind", ["relu", "relu6"])
def test_the_layer_writes_onto_its_relus_grid_and_the_relu_moves_nothing(kind):
    qg = api.calibrate(model(kind), data(80, 0), bits="int8", method="minmax")
    assert qg.info["fused_clamps"] == {"h1": "r"} and qg.grids["h1"] == qg.grids["a"]
    assert ("fuse_clamps", "1 edge(s) on the grid of the relu that reads them: h1 (r)") in qg.passes
    q, g = run_int(qg, data(40, 1)), qg.grids["a"]
    six = g.zp + 6 * 2 ** int(g.exp2_inv) if kind == "relu6" else None  # 0 and 6 lie on the grid
    assert (q["h1"] < g.zp).any() and np.array_equal(q["a"], np.clip(q["h1"], g.zp, six))
    assert "clamp" in qg.qparams["r"] and "table" not in qg.qparams["r"]  # on its input's grid: no table


def test_fused_the_relus_output_is_rounded_once_and_closer_to_float(tmp_path):
    x, test = data(80, 0), data(40, 1)
    fused = api.calibrate(model(), x, bits="int8", method="minmax")
    apart = api.calibrate(model(), x, bits=bits_file(tmp_path, {"d1": {"method": "minmax"}}), method="minmax")
    assert apart.info["fused_clamps"] == {} and ("fuse_clamps", "no relu to fuse") in apart.passes
    assert apart.grids["h1"] != apart.grids["a"] and apart.grids["a"] == fused.grids["a"]
    assert "table" in apart.qparams["r"]
    # the separate grid spans the negative half too (a coarser step) and rounds a second time:
    # 37.7 against 35.2 dB here
    assert relu_snr_db(fused, test) > relu_snr_db(apart, test) + 1.5
    assert api.simulate(fused, test).output["snr_db"] > api.simulate(apart, test).output["snr_db"]


def test_an_edge_read_elsewhere_or_given_out_keeps_its_own_grid():
    g = model()
    g.outputs = ["y", "h1"]  # the pre-relu values are an output: they need their negative half
    qg = api.calibrate(check(g), data(80, 0), bits="int8", method="minmax")
    assert qg.info["fused_clamps"] == {} and qg.grids["h1"] != qg.grids["a"]


def test_the_advisor_counts_the_fused_edge_as_the_relus_unit():
    prep = prepare(model(), SequenceData(data(40, 0), False, "x"), 40, BitsConfig(preset_config("int8")))
    sp = space(prep, 40, 0, 0.01, 5, 64)
    assert ("r", "activation") in sp.units and ("d1", "activation") not in sp.units
    assert sp.edge_unit["h1"] == sp.edge_unit["a"] == ("r", "activation")
    wide = api.calibrate(model(), data(40, 0), bits=sp.config(frozenset({("r", "activation")})), method="minmax")
    assert wide.grids["h1"].bits == wide.grids["a"].bits == 16 and wide.info["fused_clamps"] == {"h1": "r"}


@pytest.mark.parametrize("kind", ["relu", "relu6"])
def test_simulate_measures_the_fused_edge_against_what_its_grid_is_to_hold(kind):
    """The layer's integers stop at its grid's low end by design (the relu's clamp): measured
    against the float values below that raised to it, its error is its rounding, not the
    negative half, and nothing counts as saturated that the relu drops."""
    qg = api.calibrate(model(kind), data(80, 0), bits="int8", method="minmax")
    edges = api.simulate(qg, data(40, 1)).edges
    fused, relu = edges["h1"].as_dict(), edges["a"].as_dict()
    assert fused["saturated"] == 0 and abs(fused["snr_db"] - relu["snr_db"]) < 1.0 and fused["snr_db"] > 30


def test_advise_measures_a_relus_unit_on_the_relus_own_edge():
    from qtool.advisor.graph import advise_graph

    advice = advise_graph(model(), SequenceData(data(60, 0), False, "x"), 60)
    row = next(r for r in advice.rows if r["layer"] == "r")
    assert row["edge"] == "a" and not any(r["layer"] == "d1" and r["tensor"] == "output" for r in advice.rows)


def test_advise_starts_from_the_least_flash_where_16_bits_save_some():
    """A relu that is not fused (its input is read twice) keeps a 256-byte table on an 8-bit
    input and none on a 16-bit one: promoting its input saves flash, so all-int8 is not the least
    flash there. A target all-int8 meets is met with less flash, and a budget between the two is
    met, not refused."""
    from qtool.advisor.graph import advise_graph

    g = model()
    rng = np.random.default_rng(4)
    g.nodes.append(Node("d3", "dense", ["h1"], ["z"], {}, {"W": rng.standard_normal((K, H)).astype(np.float32)}))
    g.outputs = ["y", "z"]
    g = check(g)
    calib, test = (SequenceData(data(n, seed), False, "x") for n, seed in ((60, 0), (30, 1)))
    easy = advise_graph(g, calib, 60, test, target_db=10.0)
    int8 = easy.presets["int8"]["flash_bytes"]
    assert easy.chosen.flash < int8 and ("d1", "activation") in easy.chosen.promoted
    tight = advise_graph(g, calib, 60, test, max_flash=int8 - 100)
    assert tight.chosen.flash <= int8 - 100
