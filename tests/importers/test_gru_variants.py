"""The GRU cells other than the haste form: the reset gate before the recurrent GEMM
(Keras reset_after=False, ONNX linear_before_reset=0), hard_sigmoid gates, relu and linear
candidates. Keras models are built, compiled (one with a custom loss), trained a few steps and
saved as .keras and legacy .h5; ONNX GRUs are built with onnx.helper. Each import is checked
against the framework itself (Keras, ONNX Runtime) and qtool's float GRU is compared with the
framework's output on held-out data. The model file keeps the form (and haste files as they were);
everything integer refuses these cells in one line until they have their integer form."""

import json
import zipfile

import h5py
import numpy as np
import pytest
from conftest import fit_and_save, has, keras_on_torch, random_model

from qtool.core.model import (
    HASTE,
    KERAS2_HARD_SIGMOID,
    KERAS3_HARD_SIGMOID,
    CellForm,
    GruCell,
    GruModel,
    load_model,
    write_model,
)
from qtool.core.model import RESET_BEFORE as RESET_BEFORE_TEXT
from qtool.errors import QtoolError
from qtool.importers import import_graph, import_model
from qtool.numerics.float_gru import TRACED_RESET_BEFORE, run_direction, run_float

TOL = 1e-4  # the import check's: float32 arithmetic of two libraries
RESET_BEFORE = CellForm(reset_after=False)
PRECISE = CellForm(reset_after=False, gate="hard_sigmoid", gate_alpha=0.2, gate_beta=0.5, candidate="linear")


# ---- the model representation


@pytest.mark.parametrize("kw, match", [
    (dict(gate="tanh"), "gate activation 'tanh'"),
    (dict(candidate="sigmoid"), "candidate activation 'sigmoid'"),
    (dict(gate="hard_sigmoid"), "needs a finite gate_alpha > 0"),
    (dict(gate="hard_sigmoid", gate_alpha=0.0, gate_beta=0.5), "needs a finite gate_alpha > 0"),
    (dict(gate="hard_sigmoid", gate_alpha=float("nan"), gate_beta=0.5), "needs a finite gate_alpha > 0"),
    (dict(gate_alpha=0.2), "belong to a hard_sigmoid gate"),
    (dict(reset_after="no"), "reset_after must be true or false"),
])
def test_a_cell_form_qtool_does_not_compute_is_refused(kw, match):
    with pytest.raises(QtoolError, match=match):
        CellForm(**kw)


def test_cell_form_names_what_differs_from_haste():
    assert HASTE.haste and HASTE.attrs() == {} and HASTE.describe() == "the haste form"
    assert PRECISE.attrs() == {"reset_after": False, "gate": "hard_sigmoid", "gate_alpha": 0.2, "gate_beta": 0.5,
                               "candidate": "linear"}
    assert PRECISE.describe() == f"{RESET_BEFORE_TEXT}, gate hard_sigmoid(0.2x + 0.5), candidate linear"


def _with_form(model: GruModel, form: CellForm) -> GruModel:
    return GruModel([[GruCell(c.W, c.R, c.bx, c.br, form) for c in cells] for cells in model.layers], name="v")


def test_model_file_keeps_the_form_and_haste_files_stay_version_1(tmp_path):
    haste = random_model(C=3, H=4, layers=2, dirs=2)
    with h5py.File(tmp_path / "haste.h5", "w") as f:
        write_model(f, haste)
    with h5py.File(tmp_path / "haste.h5") as f:  # what qtool wrote before the form existed
        assert f.attrs["version"] == 1
        assert all(len(f[f"layer{l}/{d}"].attrs) == 0 for l in range(2) for d in ("fwd", "bwd"))
    assert all(c.form == HASTE for cells in load_model(tmp_path / "haste.h5").layers for c in cells)

    model = _with_form(haste, PRECISE)
    model.layers[1][1] = GruCell(*(getattr(model.layers[1][1], k) for k in ("W", "R", "bx", "br")), RESET_BEFORE)
    with h5py.File(tmp_path / "v.h5", "w") as f:
        write_model(f, model)
    with h5py.File(tmp_path / "v.h5") as f:  # version 2: a qtool without forms refuses it, never misreads it
        assert f.attrs["version"] == 2
        assert dict(f["layer1/bwd"].attrs) == {"reset_after": False}
    back = load_model(tmp_path / "v.h5")
    assert [[c.form for c in cells] for cells in back.layers] == [[PRECISE, PRECISE], [PRECISE, RESET_BEFORE]]
    x = np.random.default_rng(1).standard_normal((2, 5, 3)).astype(np.float32)
    assert np.array_equal(run_float(back, x), run_float(model, x))


@pytest.mark.parametrize("edit, match", [
    (lambda g: g.attrs.update(gate="relu"), "layer0/fwd: gate activation 'relu'"),
    (lambda g: g.attrs.update(reset_after="false"), "layer0/fwd: attribute 'reset_after' must be a boolean"),
    (lambda g: g.attrs.update(gate="hard_sigmoid"), "layer0/fwd: a hard_sigmoid gate needs"),
    (lambda g: g.attrs.update(gate="hard_sigmoid", gate_alpha=np.inf, gate_beta=0.5), "'gate_alpha' must be a finite"),
    (lambda g: g.file.attrs.update(version=3), "model format version 3 is not one this qtool reads"),
])
def test_a_damaged_form_in_a_model_file_is_one_line(tmp_path, edit, match):
    with h5py.File(tmp_path / "m.h5", "w") as f:
        write_model(f, random_model(C=3, H=4))
        edit(f["layer0/fwd"])
    with pytest.raises(QtoolError, match=match):
        load_model(tmp_path / "m.h5")


def _reset_before_numpy(cell: GruCell, x: np.ndarray, gate, candidate) -> np.ndarray:
    """The reset-before GRU written out on its own, float64, batch first."""
    H = cell.R.shape[1]
    W, R, b = (np.asarray(a, np.float64) for a in (cell.W, cell.R, cell.bx + cell.br))
    h, out = np.zeros((x.shape[0], H)), []
    for t in range(x.shape[1]):
        z = gate(x[:, t] @ W[:H].T + h @ R[:H].T + b[:H])
        r = gate(x[:, t] @ W[H:2 * H].T + h @ R[H:2 * H].T + b[H:2 * H])
        g = candidate(x[:, t] @ W[2 * H:].T + (r * h) @ R[2 * H:].T + b[2 * H:])
        h = z * h + (1 - z) * g
        out.append(h)
    return np.stack(out, axis=1)


def test_float_reference_of_every_form_against_a_written_out_cell():
    rng = np.random.default_rng(3)
    base = random_model(C=4, H=5, seed=2).layers[0][0]
    x = rng.standard_normal((3, 12, 4)).astype(np.float32)
    sigmoid = lambda v: 1 / (1 + np.exp(-v))  # noqa: E731
    for form, gate, candidate in [
        (RESET_BEFORE, sigmoid, np.tanh),
        (PRECISE, lambda v: np.clip(0.2 * v + 0.5, 0, 1), lambda v: v),
        (CellForm(reset_after=False, candidate="relu"), sigmoid, lambda v: np.maximum(v, 0)),
    ]:
        cell = GruCell(base.W, base.R, base.bx, base.br, form)
        trace: dict = {}
        got = run_direction(cell, np.ascontiguousarray(x.transpose(1, 0, 2)), trace).transpose(1, 0, 2)
        assert np.abs(got - _reset_before_numpy(cell, x, gate, candidate)).max() < 1e-5
        assert set(trace) == set(TRACED_RESET_BEFORE)
        H = 5
        r = trace["r_out"]
        h_old = np.concatenate([np.zeros_like(trace["h"][:1]), trace["h"][:-1]])
        assert np.allclose(trace["rh"], r * h_old)  # rh = r * h_old, and Rh's g block is R_g rh
        assert np.allclose(trace["Rh"][..., 2 * H:], trace["rh"] @ cell.R[2 * H:].T, atol=1e-6)


def test_hard_sigmoid_gates_and_relu_candidates_in_the_reset_after_form_against_torch():
    """The haste form with other activations: PyTorch's GRU cell written with F.hardsigmoid-like
    gates is the independent reference (torch's own GRU has only sigmoid and tanh)."""
    torch = pytest.importorskip("torch")
    base = random_model(C=3, H=4, seed=5).layers[0][0]
    form = CellForm(gate="hard_sigmoid", gate_alpha=1 / 6, gate_beta=0.5, candidate="relu")
    cell = GruCell(base.W, base.R, base.bx, base.br, form)
    x = np.random.default_rng(0).standard_normal((2, 9, 3)).astype(np.float32)
    W, R, bx, br = (torch.from_numpy(getattr(cell, k)) for k in ("W", "R", "bx", "br"))
    h, ys = torch.zeros(2, 4), []
    for t in range(9):
        gx, gh = torch.from_numpy(x[:, t]) @ W.T + bx, h @ R.T + br
        z = torch.nn.functional.hardsigmoid(gx[:, :4] + gh[:, :4])
        r = torch.nn.functional.hardsigmoid(gx[:, 4:8] + gh[:, 4:8])
        h = z * h + (1 - z) * torch.relu(gx[:, 8:] + r * gh[:, 8:])
        ys.append(h)
    assert np.abs(run_float(GruModel([[cell]]), x) - torch.stack(ys, 1).numpy()).max() < 1e-6


def test_engine_float_functions_compute_the_reset_before_cell():
    """qtool.engine.float_cell's functions for the other forms, in a jitted loop, against numpy's
    float GRU (float32; exp and the GEMMs' order differ by rounding)."""
    numba = pytest.importorskip("numba")
    from qtool.engine.float_cell import float_candidate_reset_before, float_gates, form_codes

    @numba.njit(cache=False)
    def run(Wx, R, bx, br, gate, alpha, beta, candidate):
        T, N, H3 = Wx.shape
        H = H3 // 3
        h = np.zeros((N, H), np.float32)
        out = np.empty((T, N, H), np.float32)
        z, rh = np.empty(H, np.float32), np.empty(H, np.float32)
        for t in range(T):
            for n in range(N):
                for j in range(H):
                    Rh_z, Rh_r = np.float32(0), np.float32(0)
                    for k in range(H):
                        Rh_z += R[j, k] * h[n, k]
                        Rh_r += R[H + j, k] * h[n, k]
                    _, _, z[j], r = float_gates(Wx[t, n, j], Wx[t, n, H + j], Rh_z, Rh_r, bx[j], bx[H + j],
                                                br[j], br[H + j], gate, alpha, beta)
                    rh[j] = r * h[n, j]
                for j in range(H):
                    Rrh = np.float32(0)
                    for k in range(H):
                        Rrh += R[2 * H + j, k] * rh[k]
                    out[t, n, j] = float_candidate_reset_before(Wx[t, n, 2 * H + j], Rrh, h[n, j], z[j],
                                                                bx[2 * H + j], br[2 * H + j], candidate)[4]
                h[n] = out[t, n]
        return out

    base = random_model(C=3, H=6, seed=4).layers[0][0]
    x = np.random.default_rng(2).standard_normal((10, 3, 3)).astype(np.float32)
    for form in (RESET_BEFORE, PRECISE, CellForm(reset_after=False, gate="hard_sigmoid", gate_alpha=1 / 6,
                                                  gate_beta=0.5, candidate="relu")):
        cell = GruCell(base.W, base.R, base.bx, base.br, form)
        got = run(x @ cell.W.T, cell.R, cell.bx, cell.br, *form_codes(form))
        assert np.abs(got - run_direction(cell, x)).max() < 1e-5


# ---- Keras


@pytest.fixture(scope="module")
def keras():
    return keras_on_torch(25)


def _custom_loss(keras):
    def loss(y, p):  # code the file names, which the import never needs
        return keras.ops.mean(keras.ops.abs(y - p)) + 0.1 * keras.ops.mean(keras.ops.square(y - p))

    return loss


KERAS_CASES = {  # name: GRU settings, as Keras 2 and Keras 3 users wrote them
    "reset_before": dict(reset_after=False),  # Keras 2's default cell: one bias
    "hard_sigmoid": dict(recurrent_activation="hard_sigmoid"),
    "hard_sigmoid_reset_before": dict(recurrent_activation="hard_sigmoid", reset_after=False),
    "relu": dict(activation="relu"),
    "precise": dict(recurrent_activation="hard_sigmoid", reset_after=False, activation="linear"),
}
HELD_OUT = np.random.RandomState(31).randn(5, 13, 4).astype(np.float32)


@pytest.fixture(scope="module")
def keras_models(keras, tmp_path_factory):
    """name: (trained model, folder with m.keras and m.h5). Each GRU-alone model is a 2-layer stack of
    Bidirectional GRUs, compiled with a custom loss or mse, trained one epoch."""
    root, L, found = tmp_path_factory.mktemp("keras"), keras.layers, {}
    x = np.random.RandomState(0).randn(16, 10, 4).astype(np.float32)
    for k, (name, kw) in enumerate(KERAS_CASES.items()):
        gru = dict(return_sequences=True, bias_initializer="random_normal", **kw)
        m = keras.Sequential([keras.Input((None, 4)), L.Bidirectional(L.GRU(5, **gru)),
                              L.Bidirectional(L.GRU(3, **gru))])
        m.compile(optimizer=keras.optimizers.Adam(1e-2), loss=_custom_loss(keras) if k % 2 else "mse")
        found[name] = fit_and_save(m, root / name, x, batch_size=4)
    return found


@pytest.mark.parametrize("fmt", ["m.keras", "m.h5"])
@pytest.mark.parametrize("name", list(KERAS_CASES))
def test_keras_gru_variants_import_and_equal_keras(keras_models, name, fmt):
    m, folder = keras_models[name]
    model = import_model(folder / fmt)
    check = model.extra["check"]
    assert check["checked"] and check["framework"] == "Keras" and check["max_abs_diff"] <= TOL
    diff = float(np.abs(run_float(model, HELD_OUT) - m.predict(HELD_OUT, verbose=0)).max())
    assert diff <= TOL, diff
    kw = KERAS_CASES[name]
    form = model.layers[0][0].form
    assert form.reset_after == kw.get("reset_after", True)
    assert (form.gate, form.candidate) == (kw.get("recurrent_activation", "sigmoid"), kw.get("activation", "tanh"))
    if form.gate == "hard_sigmoid":  # written by Keras 3: relu6(x + 3) / 6
        assert (form.gate_alpha, form.gate_beta) == KERAS3_HARD_SIGMOID
    assert all(c.form == form for cells in model.layers for c in cells)
    if not form.reset_after:  # Keras' one bias [3H] is bx
        assert all(not c.br.any() and c.bx.any() for cells in model.layers for c in cells)


def test_cli_import_writes_the_form_and_calibrate_simulate_run_it(keras_models, tmp_path, cli):
    m, folder = keras_models["precise"]
    code, out, err = cli("import", folder / "m.h5", "-o", tmp_path / "gru.h5")
    assert code == 0, err
    model = load_model(tmp_path / "gru.h5")
    assert model.layers[0][0].form == CellForm(False, "hard_sigmoid", *KERAS3_HARD_SIGMOID, "linear")
    assert np.abs(run_float(model, HELD_OUT) - m.predict(HELD_OUT, verbose=0)).max() <= TOL
    np.save(tmp_path / "calib.npy", HELD_OUT)
    code, out, err = cli("calibrate", tmp_path / "gru.h5", tmp_path / "calib.npy", "-o", tmp_path / "q.h5")
    assert code == 0, out + err
    with h5py.File(tmp_path / "q.h5") as f:  # a quantized file of another form is version 2
        assert f["quant"].attrs["version"] == 2 and "rh" in f["quant/layer0/fwd/spec"]
    code, out, err = cli("simulate", tmp_path / "q.h5", tmp_path / "calib.npy", "--json")
    assert code == 0, out + err
    assert json.loads(out)["output"]["cosine"] > 0.99


def test_keras_hard_sigmoid_is_measured_not_assumed(keras):
    """Keras 3 on this machine computes hard_sigmoid as x / 6 + 0.5 (its ops docstring says 0.2)."""
    v = np.array([-4.0, -1.0, 0.0, 1.0, 2.5, 4.0], np.float32)
    got = keras.ops.convert_to_numpy(keras.activations.hard_sigmoid(v))
    assert np.abs(got - np.clip(v * KERAS3_HARD_SIGMOID[0] + KERAS3_HARD_SIGMOID[1], 0, 1)).max() < 1e-7


def _as_keras2(path, tmp_path):
    """The file as a Keras 2 (tf.keras) writer records itself: keras_version 2.15.0."""
    out = tmp_path / path.name
    if path.suffix == ".h5":
        out.write_bytes(path.read_bytes())
        with h5py.File(out, "r+") as f:
            f.attrs["keras_version"] = "2.15.0"
        return out
    with zipfile.ZipFile(path) as z, zipfile.ZipFile(out, "w") as w:
        for item in z.namelist():
            data = z.read(item)
            if item == "metadata.json":
                data = json.dumps({**json.loads(data), "keras_version": "2.15.0"}).encode()
            w.writestr(item, data)
    return out


@pytest.mark.parametrize("fmt", ["m.keras", "m.h5"])
def test_keras2_files_mean_keras2s_hard_sigmoid(keras, keras_models, tmp_path, fmt):
    """Precise-style GRUs were trained with Keras 2's hard_sigmoid 0.2x + 0.5; Keras 3 reads the name as
    x / 6 + 0.5. A file written by Keras 2 imports as what its author ran, and the check runs Keras'
    own GRU with Keras 2's function in place."""
    m, folder = keras_models["hard_sigmoid_reset_before"]
    path = _as_keras2(folder / fmt, tmp_path)
    model = import_model(path)
    form = model.layers[0][0].form
    assert (form.gate, form.gate_alpha, form.gate_beta) == ("hard_sigmoid", *KERAS2_HARD_SIGMOID)
    assert model.extra["check"]["checked"] and model.extra["check"]["max_abs_diff"] <= TOL
    as_keras3 = import_model(folder / fmt)
    assert np.abs(run_float(model, HELD_OUT) - run_float(as_keras3, HELD_OUT)).max() > 1e-3  # it matters


def test_keras_hard_sigmoid_of_an_unknown_writer_is_refused(keras_models, tmp_path):
    _, folder = keras_models["hard_sigmoid"]
    path = tmp_path / "m.h5"
    path.write_bytes((folder / "m.h5").read_bytes())
    with h5py.File(path, "r+") as f:
        del f.attrs["keras_version"]
    with pytest.raises(QtoolError, match="does not record which Keras wrote it"):
        import_model(path)


def test_keras_bidirectional_with_another_backward_cell(keras, tmp_path):
    """A GRU alone may compute another cell in each direction; a whole model's gru node has one."""
    L = keras.layers
    fwd = L.GRU(4, return_sequences=True, reset_after=False, bias_initializer="random_normal")
    bwd = L.GRU(4, return_sequences=True, go_backwards=True, activation="relu", bias_initializer="random_normal")
    m = keras.Sequential([keras.Input((None, 4)), L.Bidirectional(fwd, backward_layer=bwd, name="bi")])
    m.save(tmp_path / "m.keras")
    model = import_model(tmp_path / "m.keras")
    assert [c.form for c in model.layers[0]] == [RESET_BEFORE, CellForm(candidate="relu")]
    assert np.abs(run_float(model, HELD_OUT) - m.predict(HELD_OUT, verbose=0)).max() <= TOL
    with pytest.raises(QtoolError, match="layer 'bi' .*computes different cells in its directions"):
        import_graph(tmp_path / "m.keras")


@pytest.fixture(scope="module")
def keras_whole(keras, tmp_path_factory):
    """A keyword spotter as Keras 2 users built it: Conv1D -> GRU(reset_after=False, hard_sigmoid)
    -> GRU(relu) -> Dense(softmax), and a Dense(hard_sigmoid) head; custom loss, one epoch."""
    L = keras.layers
    i = keras.Input((None, 4))
    h = L.Conv1D(6, 3, padding="causal", activation="relu", name="conv")(i)
    h = L.GRU(5, return_sequences=True, reset_after=False, recurrent_activation="hard_sigmoid",
              bias_initializer="random_normal", name="gru_a")(h)
    h = L.GRU(4, activation="relu", bias_initializer="random_normal", name="gru_b")(h)
    m = keras.Model(i, [L.Dense(3, activation="softmax", name="cls")(h), L.Dense(2, activation="hard_sigmoid",
                                                                                name="vad")(h)])
    m.compile(optimizer="adam", loss=_custom_loss(keras))
    x = np.random.RandomState(1).randn(16, 10, 4).astype(np.float32)
    return fit_and_save(m, tmp_path_factory.mktemp("whole") / "kws", x, batch_size=8)


@pytest.mark.parametrize("fmt", ["m.keras", "m.h5"])
def test_keras_whole_model_with_variant_grus_equals_keras(keras_whole, fmt):
    import qtool.layers

    m, folder = keras_whole
    graph = import_graph(folder / fmt)
    assert graph.check_result["checked"] and graph.check_result["max_abs_diff"] <= TOL
    grus = {n.name: n for n in graph.nodes if n.op == "gru"}
    assert {k: v for k, v in grus["gru_a"].attrs.items() if k not in ("layers", "return_sequences", "bidirectional")} \
        == {"reset_after": False, "gate": "hard_sigmoid", "gate_alpha": 1 / 6, "gate_beta": 0.5}
    assert grus["gru_b"].attrs["candidate"] == "relu" and "reset_after" not in grus["gru_b"].attrs
    got, want = qtool.layers.run(graph, HELD_OUT), m.predict(HELD_OUT, verbose=0)
    for edge, w in zip(graph.outputs, want):
        assert np.abs(got[edge] - w).max() <= TOL


def test_keras_whole_model_keeps_its_forms_in_its_file_and_runs_in_integers(keras_whole, tmp_path):
    import qtool.layers
    from qtool.api import calibrate, simulate
    from qtool.graph.file import load, write_graph
    from qtool.graph.passes import run_float_passes

    _, folder = keras_whole
    graph = import_graph(folder / "m.keras")
    with h5py.File(tmp_path / "g.h5", "w") as f:
        write_graph(f, graph)
    back = load(tmp_path / "g.h5")
    assert [n.attrs for n in back.nodes] == [n.attrs for n in graph.nodes]
    assert all(np.array_equal(a, b) for a, b in zip(qtool.layers.run(back, HELD_OUT).values(),
                                                    qtool.layers.run(graph, HELD_OUT).values()))
    passed, _ = run_float_passes(graph)
    assert [n.name for n in passed.nodes if n.op == "gru"] == ["gru_a", "gru_b"]  # other forms: not stacked
    calib = np.random.RandomState(8).randn(32, 13, 4).astype(np.float32)
    qg = calibrate(graph, calib, bits="int16")  # the GRUs calibrate in their own forms
    forms = {n: qg.qparams[n]["qm"].model.layers[0][0].form for n in ("gru_a", "gru_b")}
    assert all(not f.haste for f in forms.values()) and forms["gru_a"].gate == "hard_sigmoid"
    outs = simulate(qg, HELD_OUT).to_dict()["outputs"]
    assert outs and all(o["cosine"] > 0.999 for o in outs.values()), outs
    # a bits file for both forms' tensors: each is some GRU's (gru_a's rh, gru_b's rRh), so it is taken
    (tmp_path / "b.toml").write_text("[tensors.rh]\nbits = 16\n\n[tensors.rRh]\nbits = 16\n")
    qg = calibrate(graph, calib, bits=str(tmp_path / "b.toml"), method="minmax")
    cell = {n: qg.qparams[n]["qm"].cells[0][0] for n in ("gru_a", "gru_b")}
    assert cell["gru_a"].spec["rh"].bits == 16 and cell["gru_b"].spec["rRh"].bits == 16


# ---- ONNX


def _onnx_gru(path, dirs=1, seed=5, C=4, H=5, **attrs):
    """A one-GRU ONNX model built with onnx.helper (time-first X [T, N, C]), attrs on the node."""
    onnx = pytest.importorskip("onnx")
    from onnx import TensorProto, helper, numpy_helper

    rng = np.random.RandomState(seed)
    inits = [numpy_helper.from_array((rng.randn(*s) * 0.6).astype(np.float32), n)
             for n, s in (("W", (dirs, 3 * H, C)), ("R", (dirs, 3 * H, H)), ("B", (dirs, 6 * H)))]
    node = helper.make_node("GRU", ["X", "W", "R", "B"], ["Y"], name="gru", hidden_size=H,
                            direction="bidirectional" if dirs == 2 else "forward", **attrs)
    graph = helper.make_graph([node], "m", [helper.make_tensor_value_info("X", TensorProto.FLOAT, [None, None, C])],
                              [helper.make_tensor_value_info("Y", TensorProto.FLOAT, None)], inits)
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 14)], ir_version=8), path)
    return path


def _ort(path, x_batch_first):
    ort = pytest.importorskip("onnxruntime")
    sess = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    y = sess.run(["Y"], {"X": np.ascontiguousarray(x_batch_first.transpose(1, 0, 2))})[0]  # [T, dirs, N, H]
    return y.transpose(2, 0, 1, 3).reshape(y.shape[2], y.shape[0], -1)


ONNX_CASES = {  # name: (node attrs, the forms qtool reads per direction)
    "lbr0": (dict(linear_before_reset=0), [RESET_BEFORE]),
    "lbr0_hard_sigmoid_relu": (dict(linear_before_reset=0, activations=["HardSigmoid", "Relu"],
                                    activation_alpha=[0.25], activation_beta=[0.45]),
                               [CellForm(False, "hard_sigmoid", *map(float, np.float32([0.25, 0.45])), "relu")]),
    "hard_sigmoid_defaults_lbr1": (dict(linear_before_reset=1, activations=["hardsigmoid", "tanh"]),
                                   [CellForm(True, "hard_sigmoid", 0.2, 0.5)]),  # HardSigmoid's own defaults
    "bidir_per_direction": (dict(dirs=2, activations=["Sigmoid", "Affine", "HardSigmoid", "Relu"],
                                 activation_alpha=[1.0, 0.2], activation_beta=[0.0, 0.5]),
                            [CellForm(False, candidate="linear"),
                             CellForm(False, "hard_sigmoid", float(np.float32(0.2)), 0.5, "relu")]),
}


@pytest.mark.parametrize("name", list(ONNX_CASES))
def test_onnx_gru_variants_equal_onnxruntime(tmp_path, name):
    pytest.importorskip("onnxruntime")
    attrs, forms = ONNX_CASES[name]
    path = _onnx_gru(tmp_path / "m.onnx", **attrs)
    model = import_model(path)
    assert [c.form for c in model.layers[0]] == forms
    check = model.extra["check"]
    assert check["checked"] and check["framework"] == "ONNX Runtime" and check["max_abs_diff"] <= TOL
    x = np.random.default_rng(9).standard_normal((3, 17, 4)).astype(np.float32)
    diff = float(np.abs(run_float(model, x) - _ort(path, x)).max())
    assert diff <= TOL, diff


def test_onnx_whole_model_with_a_linear_before_reset_0_gru(tmp_path):
    """Linear -> GRU -> Linear exported by torch.onnx (which writes linear_before_reset=1), its GRU node
    then set to ONNX's default cell with HardSigmoid gates, as tf2onnx writes a Keras 2 GRU: the whole
    model imports, checked against ONNX Runtime, and qtool's graph equals ONNX Runtime on held-out data."""
    torch = pytest.importorskip("torch")
    onnx = pytest.importorskip("onnx")
    pytest.importorskip("onnxruntime")
    import warnings

    from onnx import helper

    import qtool.layers

    class Net(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.inp, self.gru, self.out = torch.nn.Linear(4, 6), torch.nn.GRU(6, 5, batch_first=True), \
                torch.nn.Linear(5, 2)

        def forward(self, x):
            return self.out(self.gru(torch.relu(self.inp(x)))[0])

    torch.manual_seed(0)
    path = tmp_path / "m.onnx"
    with warnings.catch_warnings(), torch.no_grad():
        warnings.simplefilter("ignore")
        torch.onnx.export(Net().eval(), (torch.randn(2, 7, 4),), str(path), input_names=["x"], output_names=["y"],
                          dynamo=False, dynamic_axes={"x": {0: "batch", 1: "time"}})
    m = onnx.load(str(path))
    node = next(n for n in m.graph.node if n.op_type == "GRU")
    keep = [a for a in node.attribute if a.name not in ("linear_before_reset", "activations")]
    del node.attribute[:]
    node.attribute.extend(keep + [helper.make_attribute("linear_before_reset", 0),
                                  helper.make_attribute("activations", ["HardSigmoid", "Tanh"])])
    onnx.save(m, str(path))
    graph = import_graph(path)
    assert graph.check_result["checked"] and graph.check_result["max_abs_diff"] <= TOL
    gru = next(n for n in graph.nodes if n.op == "gru")
    assert gru.attrs["reset_after"] is False and gru.attrs["gate"] == "hard_sigmoid"
    ort = pytest.importorskip("onnxruntime")
    x = np.random.default_rng(4).standard_normal((3, 11, 4)).astype(np.float32)
    want = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"]).run(["y"], {"x": x})[0]
    assert np.abs(qtool.layers.run(graph, x)[graph.outputs[0]] - want).max() <= TOL


@pytest.mark.skipif(not has("onnx"), reason="onnx not installed")
def test_onnx_whole_model_refuses_a_bidirectional_gru_of_two_cells(tmp_path):
    path = _onnx_gru(tmp_path / "m.onnx", dirs=2, activations=["Sigmoid", "Tanh", "Sigmoid", "Relu"])
    with pytest.raises(QtoolError, match="computes different cells in its directions"):
        import_graph(path, check=False)
