"""The integer GRU of every cell form: the reset gate before the recurrent GEMM,
hard_sigmoid gates, relu and linear candidates. The CPU engine against the independent rational
reference of the formulas (tests/reference_int_gru.py), the files, the validator and the proof
of the lanes. The haste cell's numbers are pinned by tests/engine/test_integer_gru.py and the golden files."""

import h5py
import numpy as np
import pytest
from conftest import calibrated, random_model
from reference_int_gru import cell_forward

from qtool.core.model import CellForm, GruCell, GruModel
from qtool.core.tensors import BitsConfig, TensorConfig, cell_names, preset_config
from qtool.engine.cpu import plan_model, run_int, run_model
from qtool.engine.layout import EVERY_TENSOR, cell_layout, quantize_input
from qtool.errors import QtoolError
from qtool.io.qmodel_file import load_qmodel, write_qmodel
from qtool.numerics.float_gru import run_float
from qtool.numerics.interval import cell_statements
from qtool.numerics.validate import validate

RESET_BEFORE = CellForm(reset_after=False)
PRECISE = CellForm(reset_after=False, gate="hard_sigmoid", gate_alpha=0.2, gate_beta=0.5, candidate="linear")
RB_RELU = CellForm(reset_after=False, gate="hard_sigmoid", gate_alpha=1 / 6, gate_beta=0.5, candidate="relu")
AFTER_RELU = CellForm(gate="hard_sigmoid", gate_alpha=0.2, gate_beta=0.5, candidate="relu")
AFTER_LINEAR = CellForm(candidate="linear")
FORMS = {"reset_before": RESET_BEFORE, "precise": PRECISE, "rb_relu": RB_RELU, "after_relu": AFTER_RELU,
         "after_linear": AFTER_LINEAR}


def with_form(model: GruModel, form: CellForm) -> GruModel:
    return GruModel([[GruCell(c.W, c.R, c.bx, c.br, form) for c in cells] for cells in model.layers], name="v")


def mixed_bits() -> BitsConfig:
    """Wx, rh and g_pre on 16 bits beside 8-bit others: P's entries of every width differ, so an
    engine that read one cell form's P with the other's indices could not pass."""
    cfg = preset_config("int8")
    for name in ("Wx", "rh", "g_pre", "old_contrib"):
        cfg[name] = TensorConfig(16, cfg[name].symmetric)
    return BitsConfig(cfg)


@pytest.mark.parametrize("name", list(FORMS))
@pytest.mark.parametrize("preset", ["int8", "w8a16", "int16", "mixed"])
def test_engine_equals_the_rational_reference(name, preset):
    model = with_form(random_model(C=4, H=5, layers=2, dirs=2, seed=3), FORMS[name])
    rng = np.random.RandomState(1)
    config = mixed_bits() if preset == "mixed" else preset_config(preset)
    qm = calibrated(model, rng.randn(12, 9, 4).astype(np.float32), config=config)
    x = rng.randn(3, 6, 4).astype(np.float32)  # held out
    y = run_int(qm, x)
    seq = quantize_input(qm, x).transpose(1, 0, 2).tolist()
    for cells in qm.cells:
        fwd = np.array(cell_forward(cells[0], seq))
        bwd = np.array(cell_forward(cells[1], seq[::-1]))[::-1]
        seq = np.concatenate([fwd, bwd], axis=2).tolist()
    want = np.array(seq).transpose(1, 0, 2)
    assert np.array_equal(y, want), f"{np.count_nonzero(y != want)} mismatches"


@pytest.mark.parametrize("name", list(FORMS))
def test_the_float_reference_and_the_traces_of_every_tensor(name):
    """The engine's float32 reference equals numpy's float GRU of the form, and its per-tensor
    statistics name the form's tensors (rh, not rRh, for a reset-before cell)."""
    form = FORMS[name]
    model = with_form(random_model(C=3, H=6, seed=2), form)
    rng = np.random.RandomState(0)
    qm = calibrated(model, rng.randn(10, 8, 3).astype(np.float32), "int16")
    x = rng.randn(4, 7, 3).astype(np.float32)
    traces = []
    run = run_model(qm, x, EVERY_TENSOR, traces=traces)
    assert np.abs(run.y_float - run_float(model, x)).max() < 1e-5
    layout = cell_layout(form)
    assert traces[0][0].shape[2] == layout.rows and run.stats[0][0].shape[0] == len(layout.measured)
    assert ("rh" in layout.measured) == (not form.reset_after) and ("rRh" in layout.measured) == form.reset_after
    h = qm.cells[0][0].spec["h"]
    y = (run.y_int - h.zp) * 2.0 ** -h.exp2_inv
    cos = float((y * run.y_float).sum() / np.sqrt((y * y).sum() * (run.y_float ** 2).sum()))
    assert cos > 0.9999


def test_a_relu_candidate_is_an_exact_identity_table_on_g_pre_grid():
    """relu's g_out is g_pre's grid with its zero point at the lowest level: negative sums
    saturate to 0 and the table is the identity, exact under interpolation (16-bit g_pre)."""
    model = with_form(random_model(C=3, H=6, seed=2), RB_RELU)
    qm = calibrated(model, np.random.RandomState(0).randn(10, 8, 3).astype(np.float32), "int16")
    cq = qm.cells[0][0]
    g_pre, g_out = cq.spec["g_pre"], cq.spec["g_out"]
    assert (g_pre.exp2_inv, g_pre.zp, g_pre.bits) == (g_out.exp2_inv, g_out.zp, g_out.bits)
    assert g_pre.zp == -(1 << 15) and cq.lut_error["lut_g"] <= 1.0  # the top knot saturates


def test_files_keep_the_form_and_the_validator_checks_it(tmp_path):
    model = with_form(random_model(C=3, H=4, layers=2), PRECISE)
    qm = calibrated(model, np.random.RandomState(0).randn(8, 6, 3).astype(np.float32))
    with h5py.File(tmp_path / "q.h5", "w") as f:
        write_qmodel(f, qm)
    back = load_qmodel(tmp_path / "q.h5")
    assert back.fingerprint() == qm.fingerprint() and back.cells[1][0].form == PRECISE
    assert set(back.cells[0][0].spec) == set(cell_names(PRECISE))
    with h5py.File(tmp_path / "q.h5") as f:
        assert f["quant"].attrs["version"] == 2 and "sh_rh" in list(f["quant/layer0/fwd/P"].attrs["names"])
    # another form's fingerprint differs: the same weights and grids compute other integers
    assert calibrated(with_form(model, RESET_BEFORE), np.random.RandomState(0).randn(8, 6, 3).astype(
        np.float32)).fingerprint() != qm.fingerprint()
    # a table of the wrong function is caught by name
    qm.cells[0][0].luts["lut_z"] = qm.cells[0][0].luts["lut_z"].copy()
    qm.cells[0][0].luts["lut_z"][3] += 1
    with pytest.raises(QtoolError, match=r"lut_z: entries differ from hard_sigmoid"):
        validate(qm)


def test_haste_files_stay_version_1(tmp_path):
    qm = calibrated(random_model(C=3, H=4), np.random.RandomState(0).randn(8, 6, 3).astype(np.float32))
    with h5py.File(tmp_path / "q.h5", "w") as f:
        write_qmodel(f, qm)
    with h5py.File(tmp_path / "q.h5") as f:
        assert f["quant"].attrs["version"] == 1 and "rh" not in f["quant/layer0/fwd/spec"]


@pytest.mark.parametrize("preset", ["int8", "int16"])
def test_the_lane_proof_covers_the_reset_before_cell(preset):
    """The interval proof bounds rh and the g rows' GEMM on rh; the int32 lanes it allows give
    the integers of the int64 lanes."""
    model = with_form(random_model(C=4, H=5, seed=7), RESET_BEFORE)
    rng = np.random.RandomState(3)
    qm = calibrated(model, rng.randn(10, 8, 4).astype(np.float32), preset)
    st = cell_statements(qm.cells[0][0], offset=False)
    assert "rh" in st and "rRh" not in st and st["rh"].bits == (32 if preset == "int8" else 64)
    plans = plan_model(qm)
    x = rng.randn(3, 6, 4).astype(np.float32)
    y32 = run_model(qm, x, plans=plans).y_int
    for row in plans:
        for dp in row:
            dp.P, dp.CH, dp.luts = dp.P.astype(np.int64), dp.CH.astype(np.int64), tuple(
                t.astype(np.int64) for t in dp.luts)
    assert np.array_equal(run_model(qm, x, plans=plans).y_int, y32)


def test_the_report_draws_a_tensor_of_zeros():
    """Keras' reset_after=False cell has br = 0: its histogram is as fine as a grid gets, and the
    report's bins over the 32-bit bias grid must still add up (they overflowed a shift)."""
    from qtool.calibrators.histogram import Histogram

    from qtool.report.data import display_bins

    h = Histogram()
    h.add(np.zeros(48, np.float32))
    edges, counts = display_bins(h, -2.3e9, 2.3e9)
    assert counts.sum() == 48 and edges[0] <= 0.0 < edges[-1]
    assert counts[np.searchsorted(edges, 0.0, side="right") - 1] == 48  # all in the bin holding 0


@pytest.mark.parametrize("text, form, match", [
    ("[tensors.rh]\nbits = 16\n", None, r"b.toml: rh: no GRU cell of this model has it \(rh belongs to a reset-before"),
    ("[layers.1.rh]\nbits = 16\n", "layer0", r"layers.1.rh: no GRU cell of layer 1 of this model has it"),
    ("[tensors.rRh]\nbits = 16\n", RESET_BEFORE, r"rRh: no GRU cell of this model has it"),
    ("[tensors.g_out]\nbits = 16\n", AFTER_RELU, r"g_out: a relu or linear candidate's g_out takes g_pre's grid"),
    ("[graph.head]\nweight = 16\n", None, r"b.toml: \[graph.head\]: graph tables set a whole model's layers; this"),
])
def test_a_bits_file_naming_what_the_cells_do_not_have_is_refused(tmp_path, text, form, match):
    """Otherwise the setting would be silently ignored."""
    from qtool.core.tensors import load_bits

    model = random_model(C=3, H=4, layers=2)
    if form == "layer0":  # a reset-before layer 0, a haste layer 1
        model.layers[0] = [GruCell(c.W, c.R, c.bx, c.br, RESET_BEFORE) for c in model.layers[0]]
    elif form is not None:
        model = with_form(model, form)
    (tmp_path / "b.toml").write_text(text)
    _, config = load_bits(str(tmp_path / "b.toml"))
    with pytest.raises(QtoolError, match=match):
        calibrated(model, np.random.RandomState(0).randn(4, 5, 3).astype(np.float32), config=config)
    (tmp_path / "ok.toml").write_text("[tensors.rh]\nbits = 16\n")  # rh of a reset-before model: taken
    qm = calibrated(with_form(model, RESET_BEFORE), np.random.RandomState(0).randn(4, 5, 3).astype(np.float32),
                    config=load_bits(str(tmp_path / "ok.toml"))[1])
    assert qm.cells[1][0].spec["rh"].bits == 16
