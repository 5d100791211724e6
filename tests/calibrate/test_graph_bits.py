"""A bits file's `graph` table sets a whole model's layers one by one: weight, bias and output
bits and the output's method; what it cannot mean is refused in one line."""

import json

import numpy as np
import pytest
from conftest import SAMPLES

from qtool import api
from qtool.errors import QtoolError


@pytest.fixture(scope="module")
def graph():
    return api.load_model(SAMPLES / "digits.onnx", check=False)


def bits_file(tmp_path, graph_table: dict) -> str:
    path = tmp_path / "bits.json"
    path.write_text(json.dumps({"preset": "int8", "graph": graph_table}))
    return str(path)


def test_a_layer_takes_its_own_bits_and_method(graph, tmp_path):
    x = np.load(SAMPLES / "calib.npy")[:100]
    qg = api.calibrate(graph, x, bits=bits_file(tmp_path, {"/head/Gemm": {"weight": 12, "activation": 16,
                                                                               "method": "minmax"}}))
    head = qg.node("/head/Gemm")
    grid = qg.grids[head.outputs[0]]
    assert grid.bits == 16 and qg.info["edge_methods"][head.outputs[0]] == "minmax"
    q_W = qg.qparams["/head/Gemm"]["q_W"]
    assert np.abs(q_W).max() > 127 and np.abs(q_W).max() <= 2047  # 12-bit weights, the whole range used
    qg8 = api.calibrate(graph, x, bits="int8")
    assert qg8.grids[head.outputs[0]].bits == 8 and np.abs(qg8.qparams["/head/Gemm"]["q_W"]).max() <= 127
    api.save(qg, tmp_path / "q.h5")
    again = api.load(tmp_path / "q.h5")
    assert np.array_equal(again.qparams["/head/Gemm"]["q_W"], q_W)
    test = np.load(SAMPLES / "test.npy")
    assert api.simulate(again, test).to_dict() | {"seconds": 0} == api.simulate(qg, test).to_dict() | {"seconds": 0}


@pytest.mark.parametrize("table,says", [
    ({"nope": {"weight": 16}}, "names 'nope', which is no layer of the model"),
    ({"/gru/GRU": {"weight": 16}}, "names the GRU '/gru/GRU'"),
    ({"rows": {"activation": 16}}, "which is a GRU's input or output"),
    ({"/head/Gemm": {"weight": 40}}, "weight bits must be an integer in 2..16"),
    ({"/head/Gemm": {"colour": 1}}, "needs a table of weight, bias, activation"),
    ({"/head/Gemm": {"method": "best"}}, "method must be one of"),
])
def test_what_a_graph_table_cannot_mean_is_one_line(graph, tmp_path, table, says):
    with pytest.raises(QtoolError) as e:
        api.calibrate(graph, np.load(SAMPLES / "calib.npy")[:20], bits=bits_file(tmp_path, table))
    assert says in str(e.value) and "\n" not in str(e.value)


def test_auto_scores_its_candidates_at_the_output_and_keeps_the_best(graph):
    x = np.load(SAMPLES / "calib.npy")
    qg = api.calibrate(graph, x, bits="int8")
    auto = qg.info["auto"]
    assert auto["held_out"] == 80 and set(auto["output_snr_db"]) == {
        "per-edge", "minmax", "mse", "percentile 99.9", "percentile 99.95", "percentile 99.99"}
    assert auto["output_snr_db"][auto["chosen"]] == max(auto["output_snr_db"].values())
    # the score is the candidate's own: calibrated on the first 320 sequences, simulated on the last 80
    for label, method, p in (("per-edge", "per-edge", 99.99), ("percentile 99.9", "percentile", 99.9)):
        fit = api.calibrate(graph, x[:320], bits="int8", method=method, percentile=p)
        d = api.simulate(fit, x[320:]).outputs["logits"]
        assert auto["output_snr_db"][label] == pytest.approx(d.snr_db, abs=1e-9)
    with pytest.raises(QtoolError, match="use auto, per-edge or one of"):
        api.calibrate(graph, x, method="best")


def test_auto_with_too_few_sequences_to_hold_out_scores_on_the_calibration_data(graph):
    """Under 10 sequences nothing is held out: each candidate is calibrated on all of them and
    scored on them, and the best is the model, as `calibrate` with its method gives it."""
    x = np.load(SAMPLES / "calib.npy")[:6]
    qg = api.calibrate(graph, x, bits="int8")
    auto = qg.info["auto"]
    assert auto["held_out"] == 0 and auto["output_snr_db"][auto["chosen"]] == max(auto["output_snr_db"].values())
    method, _, level = auto["chosen"].partition(" ")
    alone = api.calibrate(graph, x, bits="int8", method=method, percentile=float(level or 99.99))
    assert qg.grids == alone.grids
    for label in auto["output_snr_db"]:
        m, _, p = label.partition(" ")
        own = api.calibrate(graph, x, bits="int8", method=m, percentile=float(p or 99.99))
        assert auto["output_snr_db"][label] == pytest.approx(api.simulate(own, x).outputs["logits"].snr_db, abs=1e-9)


def test_auto_scores_once_the_candidates_a_bits_file_makes_one_model(graph, tmp_path, monkeypatch):
    """A bits file that sets every edge's method leaves auto's candidates one model: it is
    simulated once, and every candidate has its score."""
    import qtool.graph.simulate as simulate
    from qtool.core.tensors import TENSORS

    grus = {e for n in graph.nodes if n.op == "gru" for e in n.inputs + n.outputs}
    table = {n.name: {"method": "mse"} for n in graph.nodes if n.op != "gru" and not set(n.outputs) & grus}
    table.update({e: {"method": "mse"} for e in graph.inputs if e not in grus})
    path = tmp_path / "bits.json"
    path.write_text(json.dumps({"preset": "int8", "graph": table,
                                "tensors": {t.name: {"method": "mse"} for t in TENSORS if t.kind != "bias"}}))
    runs = []
    real = simulate.simulate_graph
    monkeypatch.setattr(simulate, "simulate_graph", lambda *a, **k: runs.append(1) or real(*a, **k))
    x = np.load(SAMPLES / "calib.npy")[:60]
    scores = api.calibrate(graph, x, bits=str(path)).info["auto"]["output_snr_db"]
    assert len(runs) == 1 and len(scores) == 6 and len(set(scores.values())) == 1
    fit = api.calibrate(graph, x[:48], bits=str(path), method="minmax")
    assert scores["minmax"] == pytest.approx(api.simulate(fit, x[48:]).outputs["logits"].snr_db, abs=1e-9)
