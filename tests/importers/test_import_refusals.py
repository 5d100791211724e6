"""What `qtool import` says of files it cannot take whole: a GRU stack inside a model of another
rank (DeepFilterNet's decoders) is taken in one command by naming its first GRU node; a refusal
gives the whole model's reason first; a state input, an empty file, an LSTM, a loop and a damaged TFLite
file are named for what they are. One line and exit code 2 each, never a traceback."""

import warnings
from pathlib import Path

import numpy as np
import pytest
from conftest import has

from qtool.core.model import load_model
from qtool.numerics.float_gru import run_float

needs_onnx = pytest.mark.skipif(not (has("torch") and has("onnx") and has("onnxruntime")),
                                reason="needs PyTorch, onnx and ONNX Runtime")


def export(module, x, path, **kw):
    """torch.onnx.export's legacy exporter, its warnings kept off the CLI's captured stderr."""
    import torch

    with torch.no_grad(), warnings.catch_warnings():
        warnings.simplefilter("ignore")
        torch.onnx.export(module, x, str(path), dynamo=False, **kw)
    return path


def one_line(code, out, err, *want):
    assert code == 2 and err.count("\n") == 1 and "Traceback" not in err, err
    for w in want:
        assert w in err, err


@needs_onnx
def test_a_gru_stack_inside_a_feature_map_model_imports_whole_or_alone_by_its_first_grus_name(cli, tmp_path):
    """DeepFilterNet's ERB decoder: a 4-D input (a map of one channel), a 2-layer GRU written as two
    GRU nodes, a Linear: whole, or the GRU stack alone with --name."""
    import onnx
    import torch

    torch.manual_seed(0)

    class Decoder(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.emb_gru = torch.nn.GRU(16, 12, num_layers=2, batch_first=True)
            self.fc = torch.nn.Linear(12, 8)

        def forward(self, x):  # [N, 1, T, 16]
            return self.fc(self.emb_gru(x[:, 0])[0])

    m = Decoder().eval()
    path = export(m, torch.randn(2, 1, 5, 16), tmp_path / "erb_dec.onnx", input_names=["x"],
                  dynamic_axes={"x": {0: "N", 2: "T"}})
    grus = [n.name for n in onnx.load(str(path)).graph.node if n.op_type == "GRU"]
    assert len(grus) == 2
    code, out, err = cli("import", path, "-o", tmp_path / "whole.h5")
    assert code == 0 and "input read as [N, C, T, F]" in out, err
    x = np.random.default_rng(1).standard_normal((3, 7, 16)).astype(np.float32)  # held out: [N, T, F]
    with torch.no_grad():
        want = m(torch.from_numpy(x[:, None])).numpy()
    import qtool
    import qtool.layers

    g = qtool.load_model(tmp_path / "whole.h5")
    assert np.abs(qtool.layers.run(g, x)[g.outputs[0]] - want).max() < 1e-5
    code, out, err = cli("import", path, "--name", grus[0], "-o", tmp_path / "gru.h5")
    assert code == 0, err
    said = " ".join(out.split())
    assert f"took the GRU ({grus[0]}, {grus[1]})" in said and "starts a stack of 2 GRU layers: took them all" in said
    assert "left out, not quantized" in said and "(Gemm)" in said or "(MatMul)" in said
    model = load_model(tmp_path / "gru.h5")
    assert model.num_layers == 2
    x = np.random.default_rng(1).standard_normal((3, 7, 16)).astype(np.float32)  # held out
    with torch.no_grad():
        want = m.emb_gru(torch.from_numpy(x))[0].numpy()
    assert np.abs(run_float(model, x) - want).max() < 1e-5


@needs_onnx
def test_a_state_input_is_refused_not_dropped(cli, tmp_path):
    import torch

    class WithState(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.gru = torch.nn.GRU(4, 6, batch_first=True)
            self.fc = torch.nn.Linear(6, 2)

        def forward(self, x, h0):
            return self.fc(self.gru(x, h0)[0])

    path = export(WithState(), (torch.randn(1, 5, 4), torch.zeros(1, 1, 6)), tmp_path / "h0.onnx",
                  input_names=["x", "h0"])
    for args in ([], ["--name", "/gru/GRU"]):
        code, out, err = cli("import", path, *args, "-o", tmp_path / "m.h5")
        one_line(code, out, err, "read from the model's input 'h0': a state carried in from outside")
        assert err.count("a state carried in from outside") == 1  # one reason, said once


@pytest.mark.skipif(not has("torch"), reason="needs PyTorch")
def test_a_state_dict_of_several_grus_says_it_holds_weights_only(cli, tmp_path):
    import torch

    state = {f"{g}.{k}": v for g in ("a", "b", "c") for k, v in torch.nn.GRU(4, 4).state_dict().items()}
    torch.save(state, tmp_path / "three.pt")
    one_line(*cli("import", tmp_path / "three.pt", "-o", tmp_path / "m.h5"), "holds several GRUs (a, b, c)",
             "weights only", "choose one with --name", "export the whole model to ONNX")


@needs_onnx
def test_a_stacked_grus_h_n_as_a_whole_models_output_is_refused_saying_what_it_is(cli, tmp_path):
    import torch

    import qtool
    from qtool.errors import QtoolError

    export(torch.nn.GRU(4, 6, 2, batch_first=True), torch.randn(1, 5, 4), tmp_path / "hn.onnx", input_names=["x"])
    with pytest.raises(QtoolError, match="h_n of a stacked GRU.*return the GRU's output sequence, or one layer's"):
        qtool.load_model(tmp_path / "hn.onnx", whole=True)  # as a whole model; the CLI takes the GRU alone
    code, _, err = cli("import", tmp_path / "hn.onnx", "-o", tmp_path / "m.h5")
    assert code == 0, err


@needs_onnx
def test_recurrent_nodes_qtool_does_not_read_are_named(cli, tmp_path):
    import onnx
    import torch
    from onnx import TensorProto, helper

    export(torch.nn.LSTM(4, 6, batch_first=True), torch.randn(1, 5, 4), tmp_path / "lstm.onnx", input_names=["x"])
    one_line(*cli("import", tmp_path / "lstm.onnx", "-o", tmp_path / "m.h5"), "(LSTM) is an LSTM")
    # a Loop whose body reads the weights and the sequence from the outer graph, as TF1 exports do
    body = helper.make_graph(
        [helper.make_node("Identity", ["cond_in"], ["cond_out"]),
         helper.make_node("Gather", ["x", "i"], ["x_t"], axis=1),
         helper.make_node("MatMul", ["x_t", "W"], ["wx"]),
         helper.make_node("Add", ["h_in", "wx"], ["h_out"])], "body",
        [helper.make_tensor_value_info("i", TensorProto.INT64, []),
         helper.make_tensor_value_info("cond_in", TensorProto.BOOL, []),
         helper.make_tensor_value_info("h_in", TensorProto.FLOAT, None)],
        [helper.make_tensor_value_info("cond_out", TensorProto.BOOL, []),
         helper.make_tensor_value_info("h_out", TensorProto.FLOAT, None)])
    graph = helper.make_graph(
        [helper.make_node("Loop", ["T", "", "h0"], ["h"], name="while", body=body),
         helper.make_node("Sigmoid", ["h"], ["y"])], "tf1",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N", 5, 4])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["N", 3])],
        [helper.make_tensor("T", TensorProto.INT64, [], [5]),
         helper.make_tensor("W", TensorProto.FLOAT, [4, 3], np.ones(12).tolist()),
         helper.make_tensor("h0", TensorProto.FLOAT, [1, 3], [0.0, 0.0, 0.0])])
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]), str(tmp_path / "loop.onnx"))
    code, out, err = cli("import", tmp_path / "loop.onnx", "-o", tmp_path / "m.h5")
    one_line(code, out, err, "node 'while' (Loop) is a recurrent loop whose body computes 4 op(s) (Add, Gather, "
             "Identity, MatMul) and reads 2 value(s) of the outer graph ('x', 'W'); it is no GRU: its body reads "
             "no one sequence a step at a time", "a loop whose states are GRU cells")
    assert "does not depend on the model's input" not in err


def test_frozen_graphs_and_data_given_as_the_model_are_named(cli, tmp_path):
    (tmp_path / "kws.pb").write_bytes(b"\x0a\x03abc")
    one_line(*cli("import", tmp_path / "kws.pb", "-o", tmp_path / "m.h5"), "a TensorFlow frozen graph",
             "tf2onnx")
    np.save(tmp_path / "calib.npy", np.zeros((2, 3, 4), np.float32))
    one_line(*cli("calibrate", tmp_path / "calib.npy", tmp_path / "kws.pb", "-o", tmp_path / "q.h5"),
             "qtool reads .npy files as data, not as a model; the model file comes first")


def test_empty_and_tflite_files_are_named(cli, tmp_path):
    (tmp_path / "m.onnx").write_bytes(b"")
    code, out, err = cli("import", tmp_path / "m.onnx", "-o", tmp_path / "m.h5")
    one_line(code, out, err, "is empty (0 bytes)")
    assert err.count("m.onnx") == 1
    (tmp_path / "m.tflite").write_bytes(b"TFL3" + bytes(60))
    one_line(*cli("import", tmp_path / "m.tflite", "-o", tmp_path / "m.h5"), "not a TFLite file (no TFL3 identifier)")
    (tmp_path / "m.tflite").write_bytes(bytes(4) + b"TFL3" + bytes(60))
    one_line(*cli("import", tmp_path / "m.tflite", "-o", tmp_path / "m.h5"), "TFLite file")
    whole = (Path(__file__).parent.parent / "golden" / "keras_order.keras").read_bytes()
    for n in (100, len(whole) // 2, len(whole) - 10):  # a .keras archive cut short: its zip, not HDF5, named
        (tmp_path / "cut.keras").write_bytes(whole[:n])
        one_line(*cli("import", tmp_path / "cut.keras", "-o", tmp_path / "m.h5"),
                 "not a whole .keras archive (its zip archive is truncated or damaged")
    assert not (tmp_path / "m.h5").exists()


@pytest.mark.skipif(not (has("keras") and has("torch") and has("onnxruntime")),
                    reason="needs Keras, PyTorch and ONNX Runtime")
def test_the_framework_checks_leave_nothing_in_the_temporary_folder(tmp_path):
    """Importing ONNX Runtime writes a .ses file, Keras on PyTorch a torchinductor_<user> folder, into
    the temporary folder: the checks give them a private one, removed afterwards."""
    import os
    import subprocess
    import sys

    from conftest import ROOT, SAMPLES

    keras_file = tmp_path / "k.keras"
    subprocess.run([sys.executable, "-c", "import keras; m = keras.Sequential([keras.Input((5, 3)), "
                    f"keras.layers.GRU(4), keras.layers.Dense(2)]); m.save({str(keras_file)!r})"],
                   env={**os.environ, "KERAS_BACKEND": "torch"}, check=True, capture_output=True)
    tmp = tmp_path / "tmp"
    tmp.mkdir()
    env = {**os.environ, "TMPDIR": str(tmp), "KERAS_BACKEND": "torch", "PYTHONPATH": str(ROOT)}
    for src in (SAMPLES / "digits.onnx", keras_file):
        done = subprocess.run([sys.executable, "-m", "qtool.cli", "import", str(src), "-o", str(tmp_path / "m.h5"),
                               "--force"], env=env, capture_output=True, text=True)
        assert done.returncode == 0 and "matches" in done.stdout, done.stderr
        assert sorted(p.name for p in tmp.iterdir()) == [], src


@pytest.mark.skipif(not has("onnxruntime"), reason="needs ONNX Runtime")
@pytest.mark.parametrize("command", [["import", "-o", "{tmp}/m.h5"], ["inspect"],
                                     ["calibrate", "{calib}", "-o", "{tmp}/q.h5", "--method", "minmax"]])
def test_a_whole_model_is_read_once_per_command(cli, tmp_path, monkeypatch, command):
    """Deciding what the file is, importing it, checking it and calibrating it share one reading."""
    from conftest import SAMPLES

    import qtool.importers.onnx.model_graph as model_graph

    reads = []
    read = model_graph._import
    monkeypatch.setattr(model_graph, "_import", lambda path: reads.append(path) or read(path))
    args = [a.format(tmp=tmp_path, calib=SAMPLES / "calib.npy") for a in command]
    code, out, err = cli(args[0], SAMPLES / "digits.onnx", *args[1:])
    assert code == 0, err
    assert len(reads) == 1


@pytest.mark.skipif(not has("onnxruntime"), reason="needs ONNX Runtime")
def test_an_input_no_output_reads_is_named(cli, tmp_path):
    import onnx
    from onnx import TensorProto, helper

    graph = helper.make_graph(
        [helper.make_node("MatMul", ["x", "W"], ["y"])], "extra",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N", "T", 4]),
         helper.make_tensor_value_info("spare", TensorProto.FLOAT, ["N", 3])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["N", "T", 2])],
        [helper.make_tensor("W", TensorProto.FLOAT, [4, 2], np.ones(8).tolist())])
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]), str(tmp_path / "m.onnx"))
    code, out, err = cli("import", tmp_path / "m.onnx", "-o", tmp_path / "m.h5")
    assert code == 0, err
    assert "input(s) 'spare' feed none of the outputs: left out" in " ".join(out.split())


def test_onnx_runtimes_refusals_read_as_one_short_line():
    """ONNX Runtime's messages carry its source path and C++ signatures: qtool's reason keeps what
    it says, whole (the shapes at the end), and cuts a long one at a word."""
    from qtool.importers.checks import reason
    from qtool.importers.onnx.check import ORT_NOISE

    msg = ("[ONNXRuntimeError] : 2 : INVALID_ARGUMENT : Non-zero status code returned while running Reshape node. "
           "Name:'/Reshape' Status Message: /onnxruntime_src/onnxruntime/core/providers/cpu/tensor/reshape_helper.h"
           ":47 onnxruntime::ReshapeHelper::ReshapeHelper(const onnxruntime::TensorShape&, onnxruntime::"
           "TensorShapeVector&, bool) input_shape_size == size was false. The input tensor cannot be reshaped to the "
           "requested shape. Input shape:{3,8,4}, requested shape:{1,8,4}")
    assert reason(ORT_NOISE.sub("", msg)) == (
        "Non-zero status code returned while running Reshape node. Name:'/Reshape' Status Message: input_shape_size"
        " == size was false. The input tensor cannot be reshaped to the requested shape. Input shape:{3,8,4}, "
        "requested shape:{1,8,4}")
    msg = ("[ONNXRuntimeError] : 1 : FAIL : Status Message: /onnxruntime_src/onnxruntime/core/providers/cpu/"
           "quantization/quantize_linear.cc:117 void onnxruntime::PrepareForQDQ(const TensorShape&, int64_t&) "
           "scale.Shape().NumDimensions() == 1 was false.")
    assert reason(ORT_NOISE.sub("", msg)) == "Status Message: scale.Shape().NumDimensions() == 1 was false."
    assert reason("word " * 100).endswith("word ...") and len(reason("word " * 100)) <= 304
