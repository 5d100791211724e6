"""GRUs written as loops (qtool.importers.onnx.loops), in files tf2onnx wrote from TensorFlow models
(tests/golden/make_tf_loops.py): a Keras GRU as a Loop (a Mycroft Precise-like wake-word model; a
stack of two on sequences of any length; reset after the recurrent matmul) and TF1's GRUCell as a
Scan (alone, and two in one body); and TFLite files (qtool.importers.tflite) whose Keras GRUs are
WHILE loops, as TensorFlow's converter writes them.
Each is imported whole and held to TensorFlow's own output on held-out inputs; a loop that is no GRU,
or one that starts from a nonzero state or whose counter the graph reads, is refused saying why."""

import importlib.util
import shutil
from pathlib import Path

import numpy as np
import pytest

onnx = pytest.importorskip("onnx")

import qtool  # noqa: E402
import qtool.layers as L  # noqa: E402
from qtool.errors import QtoolError  # noqa: E402

GOLDEN = Path(__file__).parent.parent / "golden"
# file -> (the loop's op, the GRU layers it holds, what its cells compute)
LOOPS = {"tf_loop_precise": ("Loop", 1, "Keras GRU cell, reset before the recurrent matmul (Keras reset_after=False, "
                             "ONNX linear_before_reset=0), gate hard_sigmoid(0.2x + 0.5), candidate linear"),
         "tf_loop_keras_v1": ("Loop", 1, "Keras GRU cell, reset before the recurrent matmul"),
         "tf_loop_reset_after": ("Loop", 1, "Keras GRU cell, gate hard_sigmoid(0.2x + 0.5), candidate relu"),
         "tf_scan_gru": ("Scan", 1, "TF1 GRUCell, reset before the recurrent matmul"),
         "tf_scan_stack": ("Scan", 2, "TF1 GRUCell, reset before the recurrent matmul")}


def _io(name: str) -> tuple[np.ndarray, np.ndarray]:
    io = np.load(GOLDEN / f"{name}_io.npz")
    return io["x"], io["y"]


@pytest.mark.parametrize("name", sorted(LOOPS))
def test_a_gru_written_as_a_loop_imports_whole_and_computes_what_tensorflow_computed(name):
    op, layers, form = LOOPS[name]
    g = qtool.load_model(GOLDEN / f"{name}.onnx", check=False)
    x, want = _io(name)
    got = L.run(g, x)[g.outputs[0]]
    assert got.shape == want.shape
    assert np.abs(got - want).max() <= 1e-5 * max(1.0, float(np.abs(want).max()))
    grus = [n for n in g.nodes if n.op == "gru"]
    assert sum(n.attrs.get("num_layers", 1) for n in grus) == layers * (2 if name == "tf_loop_keras_v1" else 1)
    assert g.notes and all(f"({op}) read as" in note and form in note for note in g.notes), g.notes
    assert all("qtool's float GRU matches the loop on 3 probe sequences" in note for note in g.notes)


def test_the_import_check_runs_the_file_as_written_with_its_loop(monkeypatch):
    pytest.importorskip("onnxruntime")
    from qtool.importers.onnx import check

    ran, inlined = [], check._inlined_model
    monkeypatch.setattr(check, "_inlined_model", lambda r: ran.append(m := inlined(r)) or m)
    g = qtool.load_model(GOLDEN / "tf_loop_precise.onnx")
    assert [n.op_type for n in ran[0].graph.node if n.op_type in ("Loop", "GRU")] == ["Loop"]
    assert g.check_result["checked"] and g.check_result["max_abs_diff"] < 1e-5
    assert g.steps == 29  # the file declares its 29 frames


def test_a_gru_of_a_loop_is_taken_alone_by_the_name_of_its_loop():
    m = qtool.load_model(GOLDEN / "tf_scan_stack.onnx", name=_gru_name("tf_scan_stack"), check=False)
    assert m.num_layers == 2 and m.hidden_size == 16 and m.input_size == 10
    assert all(not c.form.reset_after for row in m.layers for c in row)
    assert any("(Scan) read as a stack of 2 GRU layers" in n for n in m.extra["import"]["notes"])


def _gru_name(name: str) -> str:
    g = qtool.load_model(GOLDEN / f"{name}.onnx", check=False)
    return next(n.name for n in g.nodes if n.op == "gru")


@pytest.mark.parametrize("name", ["tf_loop_bidir", "tf_loop_bidir_seq"])
def test_a_bidirectional_gru_of_two_loops_is_one_bidirectional_gru(name):
    g = qtool.load_model(GOLDEN / f"{name}.onnx", check=False, whole=True)
    x, want = _io(name)
    assert np.abs(L.run(g, x)[g.outputs[0]] - want).max() <= 1e-5 * max(1.0, float(np.abs(want).max()))
    grus = [n for n in g.nodes if n.op == "gru"]
    assert grus[0].attrs.get("bidirectional")
    assert grus[0].attrs.get("return_sequences", True) == (name != "tf_loop_bidir")
    assert any("run backward" in n for n in g.notes)


def test_a_gru_run_backward_alone_is_refused_saying_so(cli, tmp_path):
    code, out, err = cli("import", GOLDEN / "tf_loop_backwards.onnx", "-o", tmp_path / "m.h5")
    assert code == 2 and err.count("\n") == 1, err
    assert "run backward alone (Keras' go_backwards=True)" in err


def test_a_loop_that_is_no_gru_is_refused_saying_what_it_computes(cli):
    code, out, err = cli("import", GOLDEN / "tf_loop_rnn.onnx", "-o", "unused.h5")
    assert code == 2 and err.count("\n") == 1, err
    assert "(Loop) is a recurrent loop whose body computes" in err
    assert "it is no GRU: its state" in err and "(8 wide, reading 4 channels) is computed by no GRU cell" in err
    assert not Path("unused.h5").exists()


def _edited(tmp_path: Path, edit) -> Path:
    m = onnx.load(str(GOLDEN / "tf_loop_precise.onnx"))
    edit(m)
    path = tmp_path / "edited.onnx"
    onnx.save(m, str(path))
    return path


def test_a_loop_from_a_nonzero_state_or_whose_counter_is_read_is_refused(tmp_path):
    from onnx import helper, numpy_helper

    def start_at_one(m):
        loop = next(n for n in m.graph.node if n.op_type == "Loop")
        m.graph.initializer.append(numpy_helper.from_array(np.ones((1, 20), np.float32), "h0"))
        loop.input[3] = "h0"  # its state: zeros of [N, 20] made from the input's shape

    with pytest.raises(QtoolError, match="starts from a value that is not zero; qtool's GRU starts from h0 = 0"):
        qtool.load_model(_edited(tmp_path, start_at_one), check=False)

    def read_counter(m):
        loop = next(n for n in m.graph.node if n.op_type == "Loop")
        m.graph.output.append(helper.make_tensor_value_info(loop.output[0], onnx.TensorProto.INT32, None))

    with pytest.raises(QtoolError, match="the graph reads its output '.*while_loop:0', which is no state of a GRU"):
        qtool.load_model(_edited(tmp_path, read_counter), check=False)


@pytest.mark.skipif(shutil.which("cc") is None and shutil.which("gcc") is None, reason="needs a C compiler")
def test_a_wake_word_model_written_as_a_loop_runs_in_integers_and_in_c(cli, tmp_path):
    x, _ = _io("tf_loop_precise")
    rng = np.random.default_rng(5)
    np.save(tmp_path / "calib.npy", rng.standard_normal((64, 29, 13)).astype(np.float32))
    np.save(tmp_path / "test.npy", x)
    model, q, c = GOLDEN / "tf_loop_precise.onnx", tmp_path / "q.h5", tmp_path / "c"
    assert cli("calibrate", model, tmp_path / "calib.npy", "-o", q, "--no-check")[0] == 0
    sim = qtool.simulate(q, x)
    assert next(iter(sim.outputs.values())).cosine > 0.99
    assert cli("export", "c", q, "-o", c)[0] == 0
    code, out, err = cli("verify", q, c, tmp_path / "test.npy")
    assert code == 0 and "PASS" in out, out + err


TFLITE = {"tf_while_precise": 1, "tf_while_stack": 2, "tf_while_gates": 1}  # file -> its GRUs


@pytest.mark.parametrize("name", sorted(TFLITE))
def test_a_tflite_model_imports_whole_and_computes_what_tensorflow_computed(name):
    pytest.importorskip("tflite")
    g = qtool.load_model(GOLDEN / f"{name}.tflite", check=False)
    x, want = _io(name)
    got = L.run(g, x)[g.outputs[0]]
    assert got.shape == want.shape
    assert np.abs(got - want).max() <= 1e-5 * max(1.0, float(np.abs(want).max()))
    assert g.source == "TFLite" and sum(n.op == "gru" for n in g.nodes) == TFLITE[name]
    assert len(g.notes) == TFLITE[name] and all("(Loop) read as a GRU" in n for n in g.notes)
    assert ("a matmul per gate" in g.notes[0]) == (name == "tf_while_gates")


def test_a_tflite_import_is_checked_against_litert_running_the_file():
    pytest.importorskip("tflite")
    pytest.importorskip("ai_edge_litert")
    g = qtool.load_model(GOLDEN / "tf_while_stack.tflite")
    assert g.check_result["framework"] == "LiteRT" and g.check_result["max_abs_diff"] < 1e-5
    assert g.check_result["sequences"] == 3  # fixed at one sequence a run: run one at a time


def test_a_tflite_model_calibrates_and_simulates_in_integers(cli, tmp_path):
    pytest.importorskip("tflite")
    x, _ = _io("tf_while_stack")
    np.save(tmp_path / "calib.npy", np.random.default_rng(7).standard_normal((64, 17, 6)).astype(np.float32))
    q = tmp_path / "q.h5"
    code, out, err = cli("calibrate", GOLDEN / "tf_while_stack.tflite", tmp_path / "calib.npy", "-o", q, "--no-check")
    assert code == 0, err
    sim = qtool.simulate(q, x)
    assert sim.extra["core_outputs"] and next(iter(sim.outputs.values())).cosine > 0.99


def test_tflite_files_qtool_cannot_read_are_refused_in_one_line(cli, tmp_path):
    pytest.importorskip("tflite")
    (tmp_path / "fake.tflite").write_bytes(b"\x00" * 64)
    code, out, err = cli("import", tmp_path / "fake.tflite", "-o", tmp_path / "m.h5")
    assert code == 2 and err.count("\n") == 1 and "not a TFLite file" in err, err
    data = (GOLDEN / "tf_while_precise.tflite").read_bytes()
    (tmp_path / "cut.tflite").write_bytes(data[:len(data) // 3])
    code, out, err = cli("import", tmp_path / "cut.tflite", "-o", tmp_path / "m.h5")
    assert code == 2 and err.count("\n") == 1 and "Traceback" not in err, err
    assert not (tmp_path / "m.h5").exists()
    for name, said in (("tf_flex", "runs TensorFlow ops inside TFLite (TensorList"),
                       ("tf_dense_int8", "a quantized TFLite model")):
        code, out, err = cli("import", GOLDEN / f"{name}.tflite", "-o", tmp_path / "m.h5")
        assert code == 2 and err.count("\n") == 1 and said in err, err


def _per_gate_loop(tmp_path, reset_after: bool):
    """A Loop whose body computes a GRU with a matmul per gate (Keras' implementation=1), written by
    hand: x [T, N, 3] read by Gather at the step, weights as initializers, zero initial state."""
    from onnx import TensorProto, helper, numpy_helper

    rng = np.random.default_rng(11)
    I, H = 3, 4
    w = {f"W{g}": rng.standard_normal((I, H)).astype(np.float32) for g in "zrh"}
    w |= {f"R{g}": rng.standard_normal((H, H)).astype(np.float32) * 0.5 for g in "zrh"}
    w |= {f"b{g}": rng.standard_normal(H).astype(np.float32) * 0.2 for g in ("z", "r", "h", "rh")}
    n = helper.make_node
    nodes = [n("Gather", ["seq", "i_c"], ["x_t"]), n("Add", ["i_c", "one"], ["i_next"]),
             n("Less", ["i_next", "T"], ["go"])]
    for g in "zr":
        nodes += [n("MatMul", ["x_t", f"W{g}"], [f"xw{g}"]), n("Add", [f"xw{g}", f"b{g}"], [f"xb{g}"]),
                  n("MatMul", ["h", f"R{g}"], [f"hr{g}"]), n("Add", [f"xb{g}", f"hr{g}"], [f"a{g}"]),
                  n("Sigmoid", [f"a{g}"], [g])]
    nodes += [n("MatMul", ["x_t", "Wh"], ["xwh"]), n("Add", ["xwh", "bh"], ["xbh"])]
    if reset_after:  # g = tanh(x Wh + bh + r * (h Rh + brh))
        nodes += [n("MatMul", ["h", "Rh"], ["hrh"]), n("Add", ["hrh", "brh"], ["hrb"]), n("Mul", ["r", "hrb"], ["rh"])]
    else:  # g = tanh(x Wh + bh + (r * h) Rh)
        nodes += [n("Mul", ["r", "h"], ["r_h"]), n("MatMul", ["r_h", "Rh"], ["rh"])]
    nodes += [n("Add", ["xbh", "rh"], ["ah"]), n("Tanh", ["ah"], ["g"]), n("Mul", ["z", "h"], ["zh"]),
              n("Sub", ["one_f", "z"], ["zc"]), n("Mul", ["zc", "g"], ["zg"]), n("Add", ["zh", "zg"], ["h_next"]),
              n("Identity", ["h_next"], ["h_scan"])]
    f = TensorProto.FLOAT
    body = helper.make_graph(nodes, "body", [helper.make_tensor_value_info("it", TensorProto.INT64, []),
                                             helper.make_tensor_value_info("c", TensorProto.BOOL, []),
                                             helper.make_tensor_value_info("i_c", TensorProto.INT64, []),
                                             helper.make_tensor_value_info("h", f, None)],
                             [helper.make_tensor_value_info("go", TensorProto.BOOL, []),
                              helper.make_tensor_value_info("i_next", TensorProto.INT64, []),
                              helper.make_tensor_value_info("h_next", f, None),
                              helper.make_tensor_value_info("h_scan", f, None)],
                             [numpy_helper.from_array(v, k) for k, v in w.items()]
                             + [numpy_helper.from_array(np.array(1, np.int64), "one"),
                                numpy_helper.from_array(np.array(1, np.float32), "one_f"),
                                numpy_helper.from_array(np.array(7, np.int64), "T")])
    graph = helper.make_graph(
        [n("Transpose", ["x"], ["seq"], perm=[1, 0, 2]),
         n("Loop", ["", "yes", "zero_i", "h0"], ["i_end", "h_end", "hs"], name="loop", body=body),
         n("Transpose", ["hs"], ["y"], perm=[1, 0, 2])], "per_gate",
        [helper.make_tensor_value_info("x", f, ["N", 7, I])], [helper.make_tensor_value_info("y", f, None)],
        [numpy_helper.from_array(np.array(True), "yes"), numpy_helper.from_array(np.array(0, np.int64), "zero_i"),
         numpy_helper.from_array(np.zeros((1, H), np.float32), "h0")])
    path = tmp_path / "per_gate.onnx"
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]), str(path))
    return path, w


@pytest.mark.parametrize("reset_after", [False, True])
def test_a_cell_of_one_matmul_per_gate_is_found_by_the_gates_its_weights_reach(tmp_path, reset_after):
    path, w = _per_gate_loop(tmp_path, reset_after)
    g = qtool.load_model(path, check=False, whole=True)
    x = np.random.default_rng(2).standard_normal((5, 7, 3)).astype(np.float32)
    h, want = np.zeros((5, 4), np.float32), []
    for t in range(7):  # the cell by hand, as the body computes it
        xt = x[:, t]
        z = 1 / (1 + np.exp(-(xt @ w["Wz"] + w["bz"] + h @ w["Rz"])))
        r = 1 / (1 + np.exp(-(xt @ w["Wr"] + w["br"] + h @ w["Rr"])))
        rec = r * (h @ w["Rh"] + w["brh"]) if reset_after else (r * h) @ w["Rh"]
        h = z * h + (1 - z) * np.tanh(xt @ w["Wh"] + w["bh"] + rec)
        want.append(h)
    assert np.abs(L.run(g, x)["y"] - np.stack(want, 1)).max() < 1e-5
    assert "a matmul per gate" in g.notes[0]


def test_a_gru_of_a_loop_taken_alone_calibrates(cli, tmp_path):
    x, _ = _io("tf_scan_stack")
    np.save(tmp_path / "calib.npy", x)
    code, out, err = cli("calibrate", GOLDEN / "tf_scan_stack.onnx", tmp_path / "calib.npy", "--name",
                         _gru_name("tf_scan_stack"), "-o", tmp_path / "q.h5", "--method", "minmax", "--no-check")
    assert code == 0, err
    assert qtool.load(tmp_path / "q.h5").model.num_layers == 2


def test_a_file_is_read_for_what_it_holds_whatever_its_name(tmp_path):
    pytest.importorskip("tflite")
    (tmp_path / "wake.onnx").write_bytes((GOLDEN / "tf_while_precise.tflite").read_bytes())
    (tmp_path / "wake.tflite").write_bytes((GOLDEN / "tf_loop_precise.onnx").read_bytes())
    for path in (tmp_path / "wake.onnx", tmp_path / "wake.tflite"):
        g = qtool.load_model(path, check=False)
        assert sum(n.op == "gru" for n in g.nodes) == 1
    assert qtool.load_model(tmp_path / "wake.onnx", check=False).source == "TFLite"


def test_litert_checks_a_file_of_any_length_and_a_float16_one():
    pytest.importorskip("tflite")
    pytest.importorskip("ai_edge_litert")
    g = qtool.load_model(GOLDEN / "tf_while_dyn.tflite", whole=True)
    assert g.check_result["framework"] == "LiteRT" and g.check_result["steps"] == 8  # any length: resized
    x, want = _io("tf_while_dyn")
    assert np.abs(L.run(g, x)[g.outputs[0]] - want).max() < 1e-5
    g = qtool.load_model(GOLDEN / "tf_while_f16.tflite")  # float16 weights, dequantized to float32
    x, want = _io("tf_while_f16")
    assert g.check_result["framework"] == "LiteRT" and np.abs(L.run(g, x)[g.outputs[0]] - want).max() < 1e-3


@pytest.mark.parametrize("suffix", ["onnx", "tflite"])
def test_keras_conv1d_written_in_2d_over_a_unit_axis_is_a_conv1d(suffix):
    if suffix == "tflite":
        pytest.importorskip("tflite")
    g = qtool.load_model(GOLDEN / f"tf_conv.{suffix}", check=False)
    x, want = _io("tf_conv")
    assert np.abs(L.run(g, x)[g.outputs[0]] - want).max() < 1e-5
    convs = [n for n in g.nodes if n.op == "conv1d"]
    assert [n.attrs["stride"] for n in convs] == [2, 1] and convs[1].attrs["groups"] == 12


def test_the_docs_list_every_tflite_op_qtool_reads():
    pytest.importorskip("tflite")
    from qtool.importers.tflite.to_onnx import HANDLERS

    docs = (Path(__file__).parents[2] / "docs" / "importing.md").read_text()
    assert [op for op in HANDLERS if f"`{op}`" not in docs] == []


def test_a_whole_model_named_otherwise_imports_whole_with_its_format(cli, tmp_path):
    pytest.importorskip("tflite")
    (tmp_path / "wake.bin").write_bytes((GOLDEN / "tf_while_stack.tflite").read_bytes())
    code, out, err = cli("import", tmp_path / "wake.bin", "--format", "tflite", "-o", tmp_path / "m.h5", "--no-check")
    assert code == 0 and "imported the whole model" in out, out + err
    assert sum(n.op == "gru" for n in qtool.load_model(tmp_path / "m.h5").nodes) == 2


@pytest.mark.skipif(shutil.which("cc") is None and shutil.which("gcc") is None, reason="needs a C compiler")
def test_a_bidirectional_gru_of_two_loops_runs_in_c(tmp_path):
    """Its GRU node's name (the two loops') is longer than a C prefix takes: the GRU's own C and
    the model's call it by the same shortened prefix."""
    x, _ = _io("tf_loop_bidir_seq")
    qg = qtool.calibrate(GOLDEN / "tf_loop_bidir_seq.onnx", np.concatenate([x] * 8), method="minmax", check=False)
    qtool.export_c(qg, tmp_path / "c")
    assert qtool.verify(qg, tmp_path / "c", x).mismatches == 0


@pytest.mark.parametrize("name", ["tf_while_bidi", "tf_while_bidi_last"])
def test_a_tflite_bidirectional_gru_is_one_bidirectional_gru(name, tmp_path):
    """Keras' Bidirectional through the TFLite converter: the backward WHILE reads the sequence
    REVERSE_V2 reverses and its steps are reversed back; read as one bidirectional GRU node, equal
    to TensorFlow's own outputs, checked against LiteRT, and calibrated in integers."""
    pytest.importorskip("tflite")
    g = qtool.load_model(GOLDEN / f"{name}.tflite", check=False)
    x, want = _io(name)
    grus = [n for n in g.nodes if n.op == "gru"]
    assert len(grus) == 1 and grus[0].attrs["bidirectional"]
    assert grus[0].attrs["return_sequences"] == (name == "tf_while_bidi")
    got = L.run(g, x)[g.outputs[0]]
    assert got.shape == want.shape and np.abs(got - want).max() <= 1e-5 * max(1.0, float(np.abs(want).max()))
    if importlib.util.find_spec("ai_edge_litert") is not None:
        assert qtool.load_model(GOLDEN / f"{name}.tflite").check_result["checked"]
    rng = np.random.default_rng(3)
    qg = qtool.calibrate(g, rng.standard_normal((48, 15, 4)).astype(np.float32), check=False)
    assert qtool.simulate(qg, x).outputs[g.outputs[0]].cosine > 0.99
