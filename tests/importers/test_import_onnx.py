"""ONNX GRU nodes: every attribute and input either supported (and equal to ONNX Runtime on held-out
data) or refused with one line; stacks only where the graph really chains the nodes."""

import numpy as np
import pytest
from conftest import has

from qtool.errors import QtoolError
from qtool.importers import import_model
from qtool.numerics.float_gru import run_float

pytest.importorskip("onnx")  # before the parameters below, which build ONNX tensors, are collected
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
    # a state as a model input: carried in from outside, never taken as zero without a word
    (dict(inputs=("X", "W", "R", "", "", "h0")), "initial_h 'h0', read from the model's input 'h0'"),
    (dict(inputs=("X", "W", "R", "B", "lens")), "sequence_lens"),
    (dict(activations=["Tanh", "Sigmoid"]), "activation 'Tanh' for its gates"),
    (dict(activations=["Sigmoid", "Elu"]), "activation 'Elu' for its candidate"),
    (dict(activations=["Sigmoid", "Affine"], activation_alpha=[2.0]), r"Affine\(alpha=2, beta=0\) for its candidate"),
    (dict(activations=["Sigmoid", "Affine"]), "Affine without an activation_alpha"),
    (dict(activations=["Sigmoid"]), "takes 2"),
    (dict(activations=["Sigmoid", "Tanh"], activation_alpha=[0.5]), "1 activation_alpha and 0 activation_beta"),
    (dict(clip=5.0), "clip"),
    (dict(direction="reverse"), "direction 'reverse'"),
    (dict(hidden_size=10**9), "hidden_size=1000000000"),
    (dict(dirs=2, direction="forward"), r"expected \[1, 3H, H\]"),
    (dict(layout=1), "layout=1"),  # ONNX Runtime cannot run it either
    (dict(linear_before_reset=2), "linear_before_reset=2; ONNX defines 0 and 1"),
])
def test_attributes_and_inputs_that_change_the_math_are_refused(tmp_path, kw, match):
    with pytest.raises(QtoolError, match=match):
        import_model(gru_model(tmp_path / "m.onnx", **kw))


@needs_ort
@pytest.mark.parametrize("kw", [
    dict(),
    dict(dirs=2, activations=["sigmoid", "tanh", "Sigmoid", "Tanh"]),
    dict(inputs=("X", "W", "R", "B", "", "h0"), extra_inits=[const("h0", np.zeros((1, N, H)))]),
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


def refused(path, match):
    """Refused with one line."""
    with pytest.raises(QtoolError, match=match) as e:
        import_model(path)
    assert "\n" not in str(e.value)


def external_model(tmp_path, **edit):
    """gru_model in tmp_path/model/ with every initializer in model/w.bin; `edit` rewrites W's
    external_data entries (location, offset, length)."""
    import onnx

    (tmp_path / "model").mkdir()
    path = gru_model(tmp_path / "model" / "m.onnx")
    onnx.save(onnx.load(path), path, save_as_external_data=True, all_tensors_to_one_file=True, location="w.bin",
              size_threshold=0)
    m = onnx.load(path, load_external_data=False)
    w = next(t for t in m.graph.initializer if t.name == "W")
    entries = {e.key: e.value for e in w.external_data} | {k: str(v) for k, v in edit.items()}
    del w.external_data[:]
    for k, v in entries.items():
        w.external_data.add(key=k, value=v)
    onnx.save(m, path)
    return path


@needs_ort
def test_external_data_beside_the_model_is_read(tmp_path):
    path = external_model(tmp_path)
    model = import_model(path)
    y = ort_out(path, held_out().transpose(1, 0, 2)).transpose(2, 0, 1, 3)
    assert np.abs(run_float(model, held_out()) - y.reshape(N, T, -1)).max() < 1e-5


@pytest.mark.parametrize("edit, match", [
    (lambda d: dict(location="../w.bin"), "outside the model's folder"),
    (lambda d: dict(location=str(d / "w.bin")), "outside the model's folder"),  # absolute
    (lambda d: dict(location="link.bin"), "leads outside the model's folder"),  # a symlink out of it
    (lambda d: dict(location="nope.bin"), "not found beside the model"),
    (lambda d: dict(length=4 * 3 * H * C + 4), r"declares dims \[1, 12, 3\] \(144 bytes\) but 148 bytes"),
    (lambda d: dict(offset=10**12), "needs bytes 1,000,000,000,000"),  # past the end of the file
    (lambda d: dict(offset=-1), "negative external data offset"),
])
def test_external_data_that_leaves_the_folder_or_the_file_is_refused(tmp_path, edit, match):
    (tmp_path / "w.bin").write_bytes(b"\0" * 4096)  # what a path leaving the folder would read
    path = external_model(tmp_path, **edit(tmp_path))
    (tmp_path / "model" / "link.bin").symlink_to(tmp_path / "w.bin")
    refused(path, match)


def test_external_file_shorter_than_offset_plus_length_is_refused(tmp_path):
    path = external_model(tmp_path)
    data = (tmp_path / "model" / "w.bin").read_bytes()
    (tmp_path / "model" / "w.bin").write_bytes(data[:100])  # W (144 bytes at offset 0) cut short
    refused(path, r"tensor 'W' needs bytes 0\.\.144 of 'w.bin', which holds 100")


def _int64(name, values):
    from onnx import numpy_helper

    return numpy_helper.from_array(np.asarray(values, np.int64), name)


@pytest.mark.parametrize("nodes, inits", [
    ([("ConstantOfShape", ["huge"], {})], [_int64("huge", [1 << 20, 1 << 20])]),
    ([("Expand", ["zero", "huge"], {})], [_int64("huge", [1 << 20, 1 << 20]), const("zero", [0.0])]),
    ([("Tile", ["zero", "reps"], {})], [_int64("reps", [1 << 14, 1 << 14, 1 << 12]), const("zero", [[[0.0]]])]),
    ([("Range", ["a", "b", "c"], {})], [const("a", 0.0), const("b", 2.0 ** 40), const("c", 1.0)]),
])
def test_a_huge_declared_state_is_refused_before_it_is_allocated(tmp_path, nodes, inits):
    """The state is zero whatever its size, but qtool evaluates constants only within its limits."""
    from onnx import helper

    made = [helper.make_node(op, ins, ["s"], **kw) for op, ins, kw in nodes]
    path = gru_model(tmp_path / "m.onnx", inputs=("X", "W", "R", "B", "", "s"), extra_inits=inits, nodes=made)
    refused(path, "1,099,511,627,776 values .* beyond qtool's limit")


def test_states_that_are_not_provably_zero_are_refused(tmp_path):
    """A non-zero ConstantOfShape, and values computed from zeros (Sigmoid(0) = 0.5)."""
    from onnx import helper

    made = [helper.make_node("ConstantOfShape", ["shape"], ["s"], value=helper.make_tensor("v", 1, [1], [0.25]))]
    path = gru_model(tmp_path / "a.onnx", inputs=("X", "W", "R", "B", "", "s"), nodes=made,
                     extra_inits=[_int64("shape", [1, N, H])])
    refused(path, "initial_h 's', which is not zero")
    made = [helper.make_node("Shape", ["X"], ["shape"]), helper.make_node("ConstantOfShape", ["shape"], ["z"]),
            helper.make_node("Sigmoid", ["z"], ["s"])]
    path = gru_model(tmp_path / "b.onnx", inputs=("X", "W", "R", "B", "", "s"), nodes=made)
    refused(path, "initial_h 's', which is not zero")


@needs_ort
def test_zero_states_of_data_dependent_shape_are_zero(tmp_path):
    """torch.onnx's dynamic-axes states: Slice(ConstantOfShape(Concat(.., Gather(Shape(X)), ..)), Pad of zeros."""
    from onnx import helper

    made = [helper.make_node("Shape", ["X"], ["shape"]),
            helper.make_node("Gather", ["shape", "one"], ["n"], axis=0),
            helper.make_node("Concat", ["two", "n", "h"], ["dims"], axis=0),
            helper.make_node("ConstantOfShape", ["dims"], ["zeros"]),
            helper.make_node("Slice", ["zeros", "zero", "one"], ["sliced"]),
            helper.make_node("Pad", ["sliced", "pads"], ["s"])]
    inits = [_int64("one", [1]), _int64("two", [2]), _int64("h", [H - 1]), _int64("zero", [0]),
             _int64("pads", [0, 0, 0, 0, 0, 1])]
    path = gru_model(tmp_path / "m.onnx", inputs=("X", "W", "R", "B", "", "s"), nodes=made, extra_inits=inits)
    model = import_model(path)
    assert model.extra["check"]["checked"]
    y = ort_out(path, held_out().transpose(1, 0, 2)).transpose(2, 0, 1, 3)
    assert np.abs(run_float(model, held_out()) - y.reshape(N, T, -1)).max() < 1e-5


def test_a_gemm_head_and_a_relu_in_front_are_named(tmp_path):
    """What the file computes besides the GRU is named, not dropped silently; layout ops are not."""
    import onnx
    from onnx import helper

    path = gru_model(tmp_path / "m.onnx")
    m = onnx.load(path)
    m.graph.node[0].input[0] = "Xr"
    m.graph.node.insert(0, helper.make_node("Relu", ["X"], ["Xr"], name="front"))
    m.graph.node.extend([helper.make_node("Squeeze", ["Y", "axis1"], ["Ys"]),
                         helper.make_node("Gemm", ["Ys", "Wh"], ["Z"], name="head")])
    m.graph.initializer.extend([_int64("axis1", [1]), const("Wh", np.ones((H, 2)))])
    onnx.save(m, path)
    model = import_model(path, check=False)
    assert model.extra["import"] == {"took": ["g"], "left_out": ["front (Relu)", "head (Gemm)"],
                                     "input_from": "front (Relu)", "notes": []}
