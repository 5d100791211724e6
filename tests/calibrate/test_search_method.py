"""`--method search`: auto's winner, then each observed edge in graph order takes the grid that
scores best at the model's output on auto's held-out sequences."""

import numpy as np
import pytest
from conftest import SAMPLES

from qtool import api
from qtool.core.graph import Graph, Node
from qtool.errors import QtoolError
from qtool.layers import check


def _node(op, name, ins, outs, attrs=None, params=None) -> Node:
    params = {k: np.asarray(v, np.float32) for k, v in (params or {}).items()}
    return Node(name, op, ins, outs, dict(attrs or {}), params, source="Test")


@pytest.fixture(scope="module")
def heavy_tailed():
    """dense -> tanh -> dense -> relu -> dense on inputs with Student-t tails, where clipping the
    input more than any whole-model candidate does pays at the output."""
    rng = np.random.RandomState(0)
    nodes = [_node("dense", "d1", ["x"], ["a"], params={"W": rng.randn(8, 4), "b": rng.randn(8) * 0.1}),
             _node("activation", "t1", ["a"], ["b"], {"kind": "tanh"}),
             _node("dense", "d2", ["b"], ["c"], params={"W": rng.randn(8, 8)}),
             _node("activation", "r2", ["c"], ["d"], {"kind": "relu"}),
             _node("dense", "d3", ["d"], ["y"], params={"W": rng.randn(3, 8)})]
    g = check(Graph(nodes, {"x": (None, 4)}, ["y"]))
    x = (rng.standard_t(2, size=(40, 10, 4)) * 0.5).astype(np.float32)
    return g, x, api.calibrate(g, x), api.calibrate(g, x, method="search")


def test_search_starts_from_auto_and_only_raises_the_output_snr(heavy_tailed):
    _, _, auto, found = heavy_tailed
    a, s = auto.info["auto"], found.info["search"]
    assert found.info["auto"] == a and s["from"] == a["chosen"] and s["open_edges"] == 6
    assert s["edges"] == {"x": "percentile 99.5"} and s["tried"] > len(s["edges"])
    assert s["output_snr_db"] > a["output_snr_db"][a["chosen"]] + 3  # 24.2 -> 29.1 dB on the 8 held out


def test_each_edge_has_the_grid_its_method_gives_it_alone(heavy_tailed):
    """An observed edge's grid depends on its float values only: a moved edge's is the one its
    method gives calibrating with that method alone, every other edge's is auto's."""
    g, x, auto, found = heavy_tailed
    alone = api.calibrate(g, x, method="percentile", percentile=99.5)
    assert found.grids["x"] == alone.grids["x"] != auto.grids["x"]
    assert found.info["edge_methods"]["x"] == "search: percentile 99.5"
    assert all(found.grids[e] == auto.grids[e] for e in "abcdy")


def test_search_holds_on_data_it_never_saw(heavy_tailed):
    _, _, auto, found = heavy_tailed
    test = (np.random.RandomState(1).standard_t(2, size=(200, 10, 4)) * 0.5).astype(np.float32)
    assert api.simulate(found, test).outputs["y"].snr_db > api.simulate(auto, test).outputs["y"].snr_db + 1


def test_search_needs_sequences_to_hold_out(heavy_tailed):
    g, x, _, _ = heavy_tailed
    with pytest.raises(QtoolError, match="needs at least 10 calibration sequences, got 9"):
        api.calibrate(g, x[:9], method="search")


def test_search_is_a_whole_models(tmp_path):
    x = np.load(SAMPLES / "calib.npy")[:20]
    with pytest.raises(QtoolError, match="search is a whole model's"):
        api.calibrate(SAMPLES / "digits_gru.pt", x, method="search")


def test_calibrate_prints_what_search_moved(cli, tmp_path):
    out = tmp_path / "q.h5"
    code, stdout, stderr = cli("calibrate", SAMPLES / "digits.onnx", SAMPLES / "calib.npy", "--method", "search",
                               "--limit", "40", "-o", out)
    assert code == 0, stderr
    assert "search: " in stdout and "tried on 1 edge," in stdout and out.is_file()
    assert api.load(out).info["method"] == "search"
