"""A tagger (a class per frame: a GRU's every step into a dense layer and a softmax) is a
classifier frame by frame: `simulate` counts the top-1 agreement over frames and takes labels
`[N, T]`, both held to argmax of the float and integer outputs computed here."""

import numpy as np
import pytest
from test_export_graph_c import _gru, _w

from qtool import api
from qtool.core.graph import Graph, Node
from qtool.errors import QtoolError
from qtool.graph.simulate import dequantized, run_int
from qtool.layers import run


def tagger(softmax: bool = True, seed: int = 4) -> Graph:
    rng = np.random.RandomState(seed)
    nodes = [_gru(rng, "gru", "x", "hs", 3, 8), Node("fc", "dense", ["hs"], ["logits"], {}, {"W": _w(rng, 4, 8) * 3})]
    if softmax:
        nodes.append(Node("probs", "softmax", ["logits"], ["y"]))
    return Graph(nodes, {"x": (None, 3)}, ["y" if softmax else "logits"], name="tagger")


def test_a_taggers_top1_and_accuracy_are_per_frame():
    rng = np.random.default_rng(0)
    calib, x = rng.standard_normal((24, 10, 3)).astype(np.float32), rng.standard_normal((12, 10, 3)).astype(np.float32)
    qg = api.calibrate(tagger(), calib, method="minmax", check=False)
    labels = rng.integers(0, 4, (12, 10))
    res = api.simulate(qg, x, labels=labels)
    top_f = run(qg.graph, x)["y"].argmax(-1)
    top_q = dequantized(qg, run_int(qg, x))["y"].argmax(-1)
    out = res.to_dict()
    assert out["classified"] == "frames" and top_f.shape == (12, 10)
    assert out["top1_agreement"] == pytest.approx(np.mean(top_q == top_f))
    assert out["accuracy_float"] == pytest.approx(np.mean(top_f == labels))
    assert out["accuracy_quant"] == pytest.approx(np.mean(top_q == labels))
    with pytest.raises(QtoolError, match=r"one integer class index per frame, \[N, T\]"):
        api.simulate(qg, x, labels=labels[:, 0])
    with pytest.raises(QtoolError, match="a class per sequence, or a tagger's per output frame"):
        api.simulate(qg, x, labels=labels[:, :5])


def test_a_sequence_that_no_softmax_makes_is_no_tagger():
    rng = np.random.default_rng(1)
    calib = rng.standard_normal((16, 6, 3)).astype(np.float32)
    qg = api.calibrate(tagger(softmax=False), calib, method="minmax", check=False)
    assert "top1_agreement" not in api.simulate(qg, calib).to_dict()
    with pytest.raises(QtoolError, match="a sequence that no softmax makes"):
        api.simulate(qg, calib, labels=np.zeros((16, 6), np.int64))
