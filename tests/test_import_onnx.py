"""ONNX GRU nodes: every attribute and input either supported (and equal to ONNX Runtime on held-out
data) or refused with one line; stacks only where the graph really chains the nodes."""

import numpy as np
import pytest
from conftest import has

from qtool.errors import QtoolError
from qtool.float_gru import run_float
from qtool.importers import import_model

pytestmark = pytest.mark.skipif(not has("onnx"), reason="onnx not installed")
needs_ort = pytest.mark.skipif(not has("onnxruntime"), reason="onnxruntime not installed")
C, H, T, N = 3, 4, 6, 2


def gru_model(path, dirs=1, inputs=("X", "W", "R", "B"), extra_inits=(), nodes=(), **attrs):
    """A one-GRU graph (time-first X [T, N, C]) with `attrs` on the node; returns the path."""
    import onnx
    from onnx import TensorProto, helper, numpy_helper

    rng = np.random.RandomState(5)
    inits = [numpy_helper.from_array((rng.randn(*s) * 0.5).astype(np.float32), n)
             for n, s in (("W", (dirs, 3 * H, C)), ("R", (dirs, 3 * H, H)), ("B", (dirs, 6 * H)))]
    attrs = {"hidden_size": H, "linear_before_reset": 1,
             "direction": "bidirectional" if dirs == 2 else "forward", **attrs}
    node = helper.make_node("GRU", list(inputs), ["Y"], name="g", **attrs)
    graph = helper.make_graph(
        [*nodes, node], "m", [helper.make_tensor_value_info(i, TensorProto.FLOAT, [T, N, C] if i == "X" else None)
                              for i in ("X", "h0") if i in inputs],
        [helper.make_tensor_value_info("Y", TensorProto.FLOAT, None)], inits + list(extra_inits))
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 14)], ir_version=8), path)
    return path


def ort_out(path, x_time_first):
    import onnxruntime as ort

    sess = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    feed = {"X": x_time_first}
    if "h0" in [i.name for i in sess.get_inputs()]:
        feed["h0"] = np.zeros((1, N, H), np.float32)
    return sess.run(["Y"], feed)[0]


def held_out(seed=3):
    return np.random.RandomState(seed).randn(N, T, C).astype(np.float32)


def const(name, value):
    from onnx import numpy_helper

    return numpy_helper.from_array(np.asarray(value, np.float32), name)


@pytest.mark.parametrize("kw, match", [
    (dict(inputs=("X", "W", "R", "B", "", "h0"), extra_inits=[const("h0", np.full((1, N, H), 0.7))]),
     "initial_h 'h0', which is not zero"),
    (dict(inputs=("X", "W", "R", "B", "lens")), "sequence_lens"),
    (dict(activations=["Tanh", "Sigmoid"]), "activations"),
    (dict(activations=["Sigmoid", "Relu"]), "activations"),
    (dict(clip=5.0), "clip"),
    (dict(direction="reverse"), "direction 'reverse'"),
    (dict(hidden_size=10**9), "hidden_size=1000000000"),
    (dict(dirs=2, direction="forward"), r"expected \[1, 3H, H\]"),
    (dict(layout=1), "layout=1"),  # ONNX Runtime cannot run it either
    (dict(linear_before_reset=0), "linear_before_reset=0"),
])
def test_attributes_and_inputs_that_change_the_math_are_refused(tmp_path, kw, match):
    with pytest.raises(QtoolError, match=match):
        import_model(gru_model(tmp_path / "m.onnx", **kw))


@needs_ort
@pytest.mark.parametrize("kw", [
    dict(),
    dict(dirs=2, activations=["sigmoid", "tanh", "Sigmoid", "Tanh"]),
    dict(inputs=("X", "W", "R", "B", "", "h0"), extra_inits=[const("h0", np.zeros((1, N, H)))]),
    dict(inputs=("X", "W", "R", "", "", "h0")),  # state as a graph input: runs from zero by default
])
def test_supported_variants_match_onnxruntime(tmp_path, kw):
    path = gru_model(tmp_path / "m.onnx", **kw)
    x = held_out()
    model = import_model(path)
    y = ort_out(path, x.transpose(1, 0, 2)).transpose(2, 0, 1, 3)  # [T, dirs, N, H] -> [N, T, dirs, H]
    assert np.abs(run_float(model, x) - y.reshape(N, T, -1)).max() < 1e-5
    assert model.extra["check"]["checked"]


def test_initializer_dims_larger_than_its_data_are_refused(tmp_path):
    import onnx

    path = gru_model(tmp_path / "m.onnx")
    m = onnx.load(path)
    w = m.graph.initializer[0]
    w.ClearField("dims")
    w.dims.extend([1, 3 * 10**9, 2])  # the case: 6e9 values declared over 144 bytes
    onnx.save(m, path)
    with pytest.raises(QtoolError, match="beyond qtool's limit|declares dims"):
        import_model(path)
    w.ClearField("dims")
    w.dims.extend([1, 3 * H, C + 1])
    onnx.save(m, path)
    with pytest.raises(QtoolError, match=r"declares dims \[1, 12, 4\] \(48 values\) but stores 36"):
        import_model(path)


def test_integer_weights_are_refused(tmp_path):
    import onnx
    from onnx import numpy_helper

    path = gru_model(tmp_path / "m.onnx")
    m = onnx.load(path)
    m.graph.initializer[1].CopyFrom(numpy_helper.from_array(np.ones((1, 3 * H, H), np.int32), "R"))
    onnx.save(m, path)
    with pytest.raises(QtoolError, match="'R' has ONNX data type 6"):
        import_model(path)


@needs_ort
@pytest.mark.skipif(not has("torch"), reason="torch not installed")
def test_torch_exported_stack_is_one_model_equal_to_pytorch(tmp_path):
    """torch.onnx's graph: zero initial_h via Expand, Transpose + Reshape between the layers."""
    import warnings

    import torch

    torch.manual_seed(2)
    gru = torch.nn.GRU(C, H, num_layers=2, bidirectional=True)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        torch.onnx.export(gru, (torch.randn(T, N, C),), str(tmp_path / "m.onnx"), dynamo=False,
                          input_names=["x"], output_names=["y", "h_n"])
    model = import_model(tmp_path / "m.onnx")
    assert model.num_layers == 2 and model.bidirectional
    x = torch.randn(N, T + 3, C)
    with torch.no_grad():
        want = gru(x.transpose(0, 1))[0].transpose(0, 1).numpy()
    assert np.abs(run_float(model, x.numpy()) - want).max() < 1e-5


def test_two_gru_nodes_that_do_not_chain_are_not_a_stack(tmp_path):
    """The sizes chain, but the second GRU reads another graph input, not the first one's output."""
    import onnx
    from onnx import TensorProto, helper

    path = gru_model(tmp_path / "m.onnx")
    m = onnx.load(path)
    rng = np.random.RandomState(1)
    m.graph.initializer.extend([const("W2", rng.randn(1, 3 * H, H)), const("R2", rng.randn(1, 3 * H, H))])
    m.graph.input.append(helper.make_tensor_value_info("X2", TensorProto.FLOAT, [T, N, H]))
    m.graph.node.append(helper.make_node("GRU", ["X2", "W2", "R2"], ["Y2"], name="g2", hidden_size=H,
                                         linear_before_reset=1))
    onnx.save(m, path)
    with pytest.raises(QtoolError, match="several GRUs"):
        import_model(path)
    assert import_model(path, name="g2").name == "g2"


def test_duplicate_gru_node_names_are_refused(tmp_path):
    import onnx

    path = gru_model(tmp_path / "m.onnx")
    m = onnx.load(path)
    m.graph.node.append(m.graph.node[0])
    m.graph.node[-1].output[0] = "Y2"
    onnx.save(m, path)
    with pytest.raises(QtoolError, match="two GRU nodes have this name"):
        import_model(path)
