"""The fake-quant twin of every layer around the GRU (qtool.graph.fakequant) equals its integer
semantics: given the same on-grid inputs, each layer's rounded float output is the integer
layer's output, integer for integer; and `simulate --mode both` reports the two side by side."""

import json

import numpy as np
import pytest
from conftest import SAMPLES

from qtool import api
from qtool.core.graph import Graph, Node
from qtool.core.tensors import load_bits
from qtool.graph.calibrate import calibrate_graph
from qtool.graph.fakequant import forward_fq
from qtool.graph.simulate import run_int
from qtool.io.files import SequenceData
from qtool.layers import check
from qtool.numerics.fakequant import to_int
from qtool.numerics.qparams import dequantize


def model() -> Graph:
    rng = np.random.default_rng(3)

    def w(*shape):
        return (rng.standard_normal(shape) / np.sqrt(shape[-1])).astype(np.float32)

    bn = {"gamma": 1 + 0.2 * w(6), "beta": w(6), "mean": w(6), "var": np.abs(1 + w(6))}
    nodes = [
        Node("conv", "conv1d", ["x"], ["c"], {"kernel": 3, "padding": "causal", "groups": 2},
             {"W": w(6, 3, 3), "b": w(6)}),
        Node("pre", "prelu", ["c"], ["c1"], {}, {"alpha": 0.3 * w(6)}),
        Node("ln", "layernorm", ["c1"], ["c2"], {"size": 3, "stride": 2, "epsilon": 1e-5},
             {"gamma": 1 + 0.2 * w(6), "beta": w(6)}),
        Node("act", "activation", ["c2"], ["a"], {"kind": "tanh"}),
        Node("bn", "batchnorm", ["a"], ["n"], {"epsilon": 1e-3}, bn),  # after an activation: an integer affine
        Node("pad", "zero_pad1d", ["n"], ["p"], {"pad": (1, 0)}),
        Node("avg", "avg_pool1d", ["p"], ["v"], {"pool": 2, "stride": 1}),
        Node("max", "max_pool1d", ["n"], ["m"], {"pool": 3, "stride": 1, "padding": "same"}),
        Node("sum", "add", ["v", "m"], ["s"]),
        Node("mul", "mul", ["s", "a"], ["t"]),
        Node("cat", "concat", ["t", "x"], ["k"]),
        Node("last", "last_step", ["k2"], ["l"]),
        Node("head", "dense", ["l"], ["y"], {}, {"W": w(4, 12), "b": w(4)}),
    ]
    # x as a map of 3 frequencies x 2 channels, through a grouped conv2d into 4 channels x 3 frequencies
    nodes[-2:-2] = [Node("map", "conv2d", ["k"], ["f"], {"kernel": (2, 2), "freq": 3, "freq_pads": (1, 0),
                                                         "padding": "causal", "groups": 2, "order": "fc"},
                         {"W": w(4, 2, 2, 2), "b": w(4)}),
                    Node("sq", "activation", ["f"], ["f2"], {"kind": "square"}),
                    Node("fmean", "reduce_mean", ["f2"], ["fm"], {"size": 3, "stride": 4}),
                    Node("att", "mul", ["f", "fm"], ["fa"], {"repeat": (3, 4)}),
                    Node("sum2", "add", ["fa", "k"], ["k2"])]
    return check(Graph(nodes, {"x": (None, 6)}, ["y"]))


@pytest.mark.parametrize("bits", ["int8", "int16"])
def test_every_layer_twin_gives_the_integer_layers_integers(bits):
    x = np.random.default_rng(0).standard_normal((40, 9, 6)).astype(np.float32)
    qg = calibrate_graph(model(), SequenceData(x[:30], False, "calib"), 30, load_bits(bits)[1], "minmax")
    q = run_int(qg, x[30:])
    for name in qg.core:
        node = qg.node(name)
        xs = [dequantize(q[e], int(qg.grids[e].exp2_inv), qg.grids[e].zp) for e in node.inputs]
        (v,) = forward_fq(qg, node, xs)
        got = to_int(v, qg.grids[node.outputs[0]])
        assert np.array_equal(got, q[node.outputs[0]]), (name, np.mean(got != q[node.outputs[0]]))


def test_mode_both_reports_the_integer_and_the_fake_quant_model(cli, tmp_path):
    code, _, err = cli("calibrate", SAMPLES / "digits.onnx", SAMPLES / "calib.npy", "-o", tmp_path / "q.h5",
                       "--no-check", "--method", "minmax")
    assert code == 0, err
    runs = {}
    for mode in ("integer", "fakequant", "both"):
        code, out, err = cli("simulate", tmp_path / "q.h5", SAMPLES / "test.npy", "--mode", mode, "--json",
                             "--labels", SAMPLES / "test_labels.npy")
        assert code == 0, err
        runs[mode] = json.loads(out)
    both = runs["both"]
    for key in ("top1_agreement", "accuracy_quant"):  # each model's own classes, side by side
        assert both[key] == runs["integer"][key] and both["fakequant"][key] == runs["fakequant"][key]
    code, out, err = cli("simulate", tmp_path / "q.h5", SAMPLES / "test.npy", "--mode", "fakequant",
                         "--labels", SAMPLES / "test_labels.npy")
    assert "accuracy: fake-quant" in out and "accuracy: integer" not in out
    assert both["outputs"] == runs["integer"]["outputs"] and both["edges"] == runs["integer"]["edges"]
    assert both["fakequant"]["outputs"] == runs["fakequant"]["outputs"]
    same = both["fakequant"]["same_integers"]
    assert same["rows"] == 1.0 and 0.2 < same["/gru/GRU_1_output_0"] < 1.0  # the input; the GRU's own arithmetic
    qg = api.load(tmp_path / "q.h5")
    x = np.load(SAMPLES / "test.npy")
    from qtool.graph.fakequant import run_fakequant

    fq, q = run_fakequant(qg, x), run_int(qg, x)
    assert same["logits"] == pytest.approx(np.mean(to_int(fq["logits"], qg.grids["logits"]) == q["logits"]))
