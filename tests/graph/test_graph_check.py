"""qtool.layers.check on small hand-built graphs: a valid Dense -> GRU -> Dense model runs with
the right shapes and values; every malformed graph (duplicate names, an edge read before it is
written, an output nothing computes, an unknown op, channels that do not match, a huge declared
width) is one QtoolError line, raised before anything is allocated."""

from __future__ import annotations

import time
import tracemalloc

import numpy as np
import pytest

from qtool.core.graph import Graph, Node
from qtool.core.model import GruCell, GruModel
from qtool.errors import QtoolError
from qtool.layers import REGISTRY, check, run
from qtool.numerics.float_gru import run_float

C, D, H, K = 3, 4, 5, 2  # input channels, dense width, GRU hidden size, classes


def rand(*shape, seed=0, scale=0.5):
    return (np.random.RandomState(seed).randn(*shape) * scale).astype(np.float32)


def gru_params(c_in, seed=10):
    return {f"l0.{d}.{w}": rand(*s, seed=seed + i) for i, (d, (w, s)) in enumerate(
        (d, ws) for d in ("fwd", "bwd") for ws in (("W", (3 * H, c_in)), ("R", (3 * H, H)),
                                                   ("bx", (3 * H,)), ("br", (3 * H,))))}


def nodes():
    return [
        Node("proj", "dense", ["x"], ["p"], params={"W": rand(D, C, seed=1), "b": rand(D, seed=2)}, source="Dense"),
        Node("act", "activation", ["p"], ["a"], {"kind": "tanh"}, source="Activation"),
        Node("rnn", "gru", ["a"], ["h"], {"bidirectional": True, "return_sequences": False}, gru_params(D),
             source="Bidirectional"),
        Node("head", "dense", ["h"], ["logits"], params={"W": rand(K, 2 * H, seed=3)}, source="Dense"),
        Node("prob", "softmax", ["logits"], ["y"], source="Softmax"),
    ]


def graph(ns=None, inputs=None, outputs=("y",)):
    return Graph(nodes() if ns is None else ns, dict(inputs or {"x": (None, C)}), list(outputs), source="test")


def refused(g, *fragments):
    with pytest.raises(QtoolError) as e:
        check(g)
    msg = str(e.value)
    assert "\n" not in msg, msg
    for f in fragments:
        assert f in msg, msg
    return msg


def test_valid_graph_runs_with_the_right_shapes():
    g = check(graph())
    assert g.shapes == {"x": (None, C), "p": (None, D), "a": (None, D), "h": (2 * H,), "logits": (K,), "y": (K,)}
    x = rand(6, 9, C, seed=4, scale=1.0)
    out = run(g, x, keep=True)
    assert set(out) >= set(g.shapes)
    for edge, shape in g.shapes.items():
        assert out[edge].shape == ((6, 9, shape[-1]) if len(shape) == 2 else (6, shape[-1])), edge
    # the same model by hand: dense, tanh, the GRU's final states, dense, softmax
    p = gru_params(D)
    gru = GruModel([[GruCell(*(p[f"l0.{d}.{w}"] for w in ("W", "R", "bx", "br"))) for d in ("fwd", "bwd")]])
    ns = nodes()
    seq = run_float(gru, np.tanh(x @ ns[0].params["W"].T + ns[0].params["b"]))
    h = np.concatenate([seq[:, -1, :H], seq[:, 0, H:]], axis=-1)
    logits = h @ ns[3].params["W"].T
    want = np.exp(logits - logits.max(-1, keepdims=True))
    np.testing.assert_allclose(out["y"], want / want.sum(-1, keepdims=True), rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(out["y"].sum(-1), 1, rtol=1e-5)


def test_where_prefixes_the_message():
    ns = nodes()
    ns[1].name = "proj"
    with pytest.raises(QtoolError, match=r"^model\.keras: two nodes are named 'proj'$"):
        check(graph(ns), where="model.keras")


def test_duplicate_names():
    ns = nodes()
    ns[3].name = "rnn"
    refused(graph(ns), "two nodes are named 'rnn'")


def test_edge_read_before_it_is_written():
    ns = nodes()
    ns[1], ns[2] = ns[2], ns[1]  # the GRU reads 'a' before the activation writes it
    refused(graph(ns), "node rnn (Bidirectional) reads 'a'", "dangling input or a cycle")


def test_cycle():
    ns = nodes()
    ns[0].inputs = ["a"]  # proj reads the activation's output, which reads proj's
    refused(graph(ns), "node proj (Dense) reads 'a'", "cycle")


def test_dangling_input():
    ns = nodes()
    ns[4].inputs = ["logit"]
    refused(graph(ns), "node prob (Softmax) reads 'logit'")


def test_output_no_node_computes():
    refused(graph(outputs=("y", "embedding")), "output 'embedding' is computed by no node")


def test_edge_written_twice():
    ns = nodes()
    ns[1].outputs = ["p"]
    refused(graph(ns), "edge 'p' is written twice (by node act (Activation))")


def test_unknown_op_lists_the_supported_ones():
    ns = nodes()
    ns[1].op = "swish"
    msg = refused(graph(ns), "node act (Activation): op 'swish' is not supported")
    assert all(op in msg for op in REGISTRY), msg


def test_shape_mismatch():
    ns = nodes()
    ns[0].params["W"] = rand(D, C + 1)
    refused(graph(ns), "node proj (Dense)", "W is [4, 4]", "input has 3 channels")


def test_gru_width_mismatch():
    ns = nodes()
    ns[3].params["W"] = rand(K, H)  # a head that forgot the backward half
    refused(graph(ns), "node head (Dense)", "input has 10 channels")


def test_vector_into_a_sequence_op():
    ns = nodes()
    ns[2].attrs["return_sequences"] = True  # then the head's output is a sequence; a pooling of it...
    ns.append(Node("pool", "max_pool1d", ["y"], ["z"], {"pool": 2}, source="MaxPooling1D"))
    check(graph(ns, outputs=("z",)))
    ns[2].attrs["return_sequences"] = False  # ...and of a vector is refused
    refused(graph(ns, outputs=("z",)), "node pool (MaxPooling1D): takes a sequence (None, C), got shape (2,)")


def test_wrong_output_count():
    ns = nodes()
    ns[1].outputs = ["a", "a2"]
    refused(graph(ns), "node act (Activation) has 2 outputs, its op gives 1")


@pytest.mark.parametrize("shape", [(None, 1 << 30), (1 << 30,)])
def test_huge_declared_width_is_refused_without_allocating(shape):
    tracemalloc.start()
    start = time.perf_counter()
    refused(graph(inputs={"x": shape}), "input 'x'", "1,073,741,824 channels")
    _, peak = tracemalloc.get_traced_memory()
    tracemalloc.stop()
    assert time.perf_counter() - start < 0.5 and peak < 1 << 20


def test_huge_computed_width_is_refused_without_allocating():
    # 1024 inputs of 2^20 channels each are allowed; their concatenation (2^30) is not
    ns = [Node("cat", "concat", ["x"] * 1024, ["y"], source="Concatenate")]
    tracemalloc.start()
    start = time.perf_counter()
    refused(graph(ns, inputs={"x": (None, 1 << 20)}), "node cat (Concatenate)", "1,073,741,824 channels")
    _, peak = tracemalloc.get_traced_memory()
    tracemalloc.stop()
    assert time.perf_counter() - start < 0.5 and peak < 1 << 20


def test_malformed_input_shape():
    refused(graph(inputs={"x": (None, None, C)}), "input 'x'", "neither a sequence (None, C) nor a vector (C,)")


def test_run_says_what_input_it_wants():
    """Data of the wrong shape is one QtoolError naming the input, not a numpy error deep inside."""
    from qtool.core.graph import Graph, Node
    from qtool.layers import check, run

    g = check(Graph([Node("d", "dense", ["x"], ["y"], params={"W": np.ones((2, 3), np.float32)})],
                    {"x": (None, 3)}, ["y"]))
    for bad in (np.zeros((2, 4, 5), np.float32), np.zeros((2, 3), np.float32)):
        with pytest.raises(QtoolError, match=r"input 'x' must be \[N, T, 3\] \(batch first, channels last\)"):
            run(g, bad)


def test_inputs_of_different_lengths_meeting_is_one_line_when_it_runs():
    """Shapes leave the steps free, so a padded branch meeting an unpadded one shows only at run
    time, one line naming the node."""
    for op in ("add", "mul", "concat"):
        g = check(Graph([Node("pad", "zero_pad1d", ["x"], ["p"], {"pad": (1, 0)}),
                         Node("join", op, ["p", "x"], ["y"])], {"x": (None, 3)}, ["y"]))
        with pytest.raises(QtoolError, match=r"node join \(" + op + r"\): its inputs have different batch or step"):
            run(g, np.zeros((2, 5, 3), np.float32))
