"""The fake-quant GRU (qtool.numerics.fakequant) and QAT (qtool.qat.QuantGRU) on every cell form
(qtool.core.model.CellForm): the reset-before cell, hard_sigmoid gates, relu and linear
candidates. "integer" rounding against the integer engine on every tensor, "tensor" rounding
against the exact tables of the form's functions, QuantGRU's forward against the numpy fake-quant,
a few QAT steps that learn and write back a valid model of the same form, and `qtool simulate
--mode both` on a reset-before model."""

import json

import numpy as np
import pytest
from conftest import calibrated, fine_tune, random_model

from qtool.core.model import CellForm, GruModel, open_h5
from qtool.core.tensors import cell_names
from qtool.engine.cpu import run_int
from qtool.numerics.fakequant import activations, run_fakequant, to_int
from qtool.numerics.float_gru import run_float, traced
from qtool.numerics.lut import cell_gates, exact_outputs
from qtool.simulation.run import int_tensors

FORMS = {
    "reset_before": CellForm(reset_after=False),
    "reset_before_hard_relu": CellForm(reset_after=False, gate="hard_sigmoid", gate_alpha=0.2, gate_beta=0.5,
                                       candidate="relu"),
    "hard_linear": CellForm(gate="hard_sigmoid", gate_alpha=1 / 6, gate_beta=0.5, candidate="linear"),
}
SHAPES = [(1, 1), (2, 2)]  # (layers, directions): single; stacked and bidirectional


def with_form(model: GruModel, form: CellForm) -> GruModel:
    for row in model.layers:
        for cell in row:
            cell.form = form
    return model


def form_qmodel(form: CellForm, preset: str, layers: int, dirs: int, C=5, H=6, seed=None):
    model = with_form(random_model(C=C, H=H, layers=layers, dirs=dirs, seed=layers + dirs if seed is None else seed),
                      form)
    rng = np.random.RandomState(1)
    return calibrated(model, rng.randn(32, 10, C).astype(np.float32), preset)


def test_the_forms_tensors():
    """What each form's cell traces: rh for Rh_add_br and rRh in a reset-before cell."""
    for form in FORMS.values():
        names = set(activations(form))
        assert names == {n for n in cell_names(form) if n not in ("W", "R", "bx", "br")} == set(traced(form))
        assert ("rh" in names) == (not form.reset_after) and ("rRh" in names) == form.reset_after


@pytest.mark.parametrize("preset", ["int8", "int16"])
@pytest.mark.parametrize("layers,dirs", SHAPES)
@pytest.mark.parametrize("form", FORMS)
def test_integer_rounding_gives_the_engines_integers(form, preset, layers, dirs):
    """Every tensor of every step of the fake-quant GRU with "integer" rounding, read back as
    integers, equals the integer engine's, for every form (as tests/qat/test_fakequant.py for haste)."""
    qm = form_qmodel(FORMS[form], preset, layers, dirs)
    x = np.random.RandomState(2).randn(16, 12, 5).astype(np.float32)  # not the calibration data
    itr, ftr = [], []
    y_int = run_int(qm, x, itr)
    y_fq = run_fakequant(qm, x, ftr, rounding="integer")
    assert np.array_equal(to_int(y_fq, qm.cells[-1][0].spec["h"]), y_int)
    for l, row in enumerate(qm.cells):
        for d, cq in enumerate(row):
            ints = int_tensors(itr[l][d], cq.form)
            assert set(ints) == set(ftr[l][d]) == set(traced(cq.form))
            for name, q in ints.items():
                assert np.array_equal(to_int(ftr[l][d][name], cq.spec[name]), q), (l, d, name)


@pytest.mark.parametrize("preset", ["int8", "int16"])
@pytest.mark.parametrize("form", FORMS)
def test_tensor_rounding_rounds_the_forms_functions(form, preset):
    """"tensor" rounding: each gate output is the form's function of its input, correctly rounded
    onto the output grid (the exact table, lut.exact_outputs), at every step; relu and linear
    candidates on g_pre's own grid are the identity."""
    qm = form_qmodel(FORMS[form], preset, 2, 2)
    x = np.random.RandomState(3).randn(8, 9, 5).astype(np.float32)
    ftr = []
    run_fakequant(qm, x, ftr, rounding="tensor")
    for l, row in enumerate(qm.cells):
        for d, cq in enumerate(row):
            tr, s = ftr[l][d], cq.spec
            for _, func, src, dst in cell_gates(cq.form):
                a, b = s[src], s[dst]
                want = exact_outputs(func, to_int(tr[src], a), a.exp2_inv, a.zp, b.bits, b.exp2_inv, b.zp)
                assert np.array_equal(to_int(tr[dst], b), want), (l, d, dst)
            if cq.form.candidate != "tanh":
                assert np.array_equal(tr["g_out"], tr["g_pre"])


@pytest.mark.parametrize("form", ["reset_before", "reset_before_hard_relu"])
def test_simulate_mode_both_on_a_reset_before_model(cli, tmp_path, form):
    from qtool.io.qmodel_file import write_qmodel

    qm = form_qmodel(FORMS[form], "int8", 2, 2)
    with open_h5(tmp_path / "q.h5", "w") as f:
        write_qmodel(f, qm)
    np.save(tmp_path / "x.npy", np.random.RandomState(4).randn(20, 9, 5).astype(np.float32))
    code, out, err = cli("simulate", tmp_path / "q.h5", tmp_path / "x.npy", "--mode", "both", "--json")
    assert code == 0, err
    res = json.loads(out)
    fq, agree = res["fakequant"], res["fakequant"]["agreement"]
    assert res["mode"] == "both" and set(fq["tensors"]) == set(res["tensors"])
    assert {"layer0.fwd.rh", "layer1.bwd.rh"} <= set(fq["tensors"]) and "layer0.fwd.rRh" not in fq["tensors"]
    for name in ("layer0.fwd.x", "layer0.fwd.Wx", "layer0.bwd.Wx"):
        assert agree[name] == {"identical": 1.0, "max_lsb": 0}
    assert fq["output"]["cosine"] > 0.95 and fq["output"]["count"] == res["output"]["count"]
    code, out, err = cli("simulate", tmp_path / "q.h5", tmp_path / "x.npy", "--mode", "fakequant")
    assert code == 0, err


# ---- QAT


def _forward(torch, module, x: np.ndarray, dtype) -> np.ndarray:
    xt = torch.from_numpy(x).to(dtype)
    y, _ = module(xt if module.batch_first else xt.transpose(0, 1))
    y = y if module.batch_first else y.transpose(0, 1)
    return y.detach().double().numpy()


@pytest.mark.parametrize("preset", ["int8", "int16"])
@pytest.mark.parametrize("layers,dirs", SHAPES)
@pytest.mark.parametrize("form", FORMS)
def test_quant_gru_forward_is_the_numpy_fake_quant(torch, form, preset, layers, dirs):
    """QuantGRU(qm) of a model of another form computes that form: with "integer" rounding its
    output is the numpy fake-quant's and the engine's (int8 in float32; 16-bit activations in
    float64, as docs/qat.md says), with "tensor" rounding the numpy fake-quant's (float64)."""
    from qtool.qat import QuantGRU

    qm = form_qmodel(FORMS[form], preset, layers, dirs)
    x = np.random.RandomState(5).randn(12, 10, 5).astype(np.float32)
    s = qm.cells[-1][0].spec["h"]
    for rounding in ("integer", "tensor"):
        module = QuantGRU(qm, batch_first=layers == 1, rounding=rounding)
        dtype = torch.float32 if (preset == "int8" and rounding == "integer") else torch.float64
        y = _forward(torch, module.to(dtype), x, dtype)
        assert np.array_equal(y, run_fakequant(qm, x, rounding=rounding)), rounding
        if rounding == "integer":
            assert np.array_equal(to_int(y, s), run_int(qm, x))
    assert module.forms == [[FORMS[form]] * dirs] * layers
    assert module.to_quant_model().fingerprint() == qm.fingerprint()  # untrained: the very model


def test_quant_gru_slots_follow_the_form(torch):
    """A reset-before cell's quantizers are its own tensors'; a relu candidate's g_out is g_pre's
    quantizer, whose zero point stays at the grid's lowest level; a checkpoint loads back."""
    from qtool.numerics.qparams import qrange
    from qtool.qat import QuantGRU

    qm = form_qmodel(FORMS["reset_before_hard_relu"], "int8", 2, 2)
    module = QuantGRU(qm)
    keys = module.state_dict().keys()
    assert {"rh_l0_fake_quant.exp2_inv", "rh_l1_reverse_fake_quant.exp2_inv"} <= set(keys)
    assert not any(k.startswith(("rRh_", "Rh_add_br_", "g_out_")) for k in keys)
    assert {"weight_ih_l0", "weight_hh_l1_reverse", "bias_ih_l1", "bias_hh_l0_reverse"} <= set(keys)
    for l, d, sfx in ((0, 0, ""), (1, 1, "_reverse")):
        q = getattr(module, f"g_pre_l{l}{sfx}_fake_quant")
        assert "zero_point" in dict(q.named_buffers()) and int(q.zero_point) == qrange(8)[0]
        assert module._quantizer("g_out", l, d) is q
    other = QuantGRU(form_qmodel(FORMS["reset_before_hard_relu"], "int8", 2, 2, seed=9))
    other.load_state_dict(module.state_dict())
    x = np.random.RandomState(6).randn(4, 7, 5).astype(np.float32)
    assert np.array_equal(_forward(torch, other, x, torch.float32), _forward(torch, module, x, torch.float32))
    haste = QuantGRU(form_qmodel(CellForm(), "int8", 1, 1))  # the haste cell keeps its slots
    assert {"g_out_l0_fake_quant.exp2_inv", "Rh_add_br_l0_fake_quant.exp2_inv"} <= set(haste.state_dict())


@pytest.mark.parametrize("form", ["hard_sigmoid", "relu", "linear"])
def test_table_gate_has_the_fake_quant_gradients(torch, form):
    """The table node's gradients are those of qdq(f(v)) for the form's functions."""
    from qtool.numerics.lut import hard_sigmoid_name
    from qtool.qat.ops import FakeQuant, TableGate, activation

    func = hard_sigmoid_name(0.2, 0.5) if form == "hard_sigmoid" else form
    v = torch.linspace(-6, 6, 50, dtype=torch.float64, requires_grad=True)
    out = []
    for fused in (True, False):
        e = torch.tensor(4.0, dtype=torch.float64, requires_grad=True)
        zp = torch.tensor(-100.0 if form != "linear" else 0.0, dtype=torch.float64, requires_grad=True)
        y = (TableGate.apply(v, e, zp, -128, 127, torch.zeros(50), func) if fused
             else FakeQuant.apply(activation(func, v), e, zp, -128, 127))
        (y * torch.linspace(1, 2, 50, dtype=torch.float64)).sum().backward()
        out.append((v.grad.clone(), e.grad.item(), zp.grad.item()))
        v.grad = None
    assert torch.allclose(out[0][0], out[1][0]) and out[0][1:] == pytest.approx(out[1][1:])
    assert bool((out[0][0] != 0).any()) and bool((out[0][0] == 0).any() or form == "linear")


@pytest.mark.parametrize("preset", ["int8", "int16"])
@pytest.mark.parametrize("form", FORMS)
def test_qat_learns_and_writes_the_same_form(torch, cli, tmp_path, form, preset):
    """A few QAT steps on a tiny task (halve the float GRU's output) reduce the held-out loss, and
    the result is written as a valid quantized model of the same form, which gives the module's
    integers in the engine and simulates."""
    from qtool.io.qmodel_file import load_qmodel
    from qtool.numerics.validate import validate
    from qtool.qat import QuantGRU

    torch.manual_seed(1)
    qm = form_qmodel(FORMS[form], preset, 2, 2, C=4, H=5)
    rng = np.random.RandomState(7)
    train, test = rng.randn(64, 8, 4).astype(np.float32), rng.randn(32, 8, 4).astype(np.float32)
    target_t, target_s = (torch.from_numpy(0.5 * run_float(qm.model, a)).double() for a in (train, test))
    module = QuantGRU(qm, batch_first=True).double()
    xt, xs = torch.from_numpy(train).double(), torch.from_numpy(test).double()
    with torch.no_grad():
        loss_before = float(((module(xs)[0] - target_s) ** 2).mean())
    fine_tune(module, xt, target_t, batch=16)
    with torch.no_grad():
        loss_after = float(((module(xs)[0] - target_s) ** 2).mean())
    assert loss_after < 0.5 * loss_before, (loss_before, loss_after)  # measured: 0.1 to 0.23
    written = module.to_qtool(tmp_path / "qat.h5")
    back = load_qmodel(tmp_path / "qat.h5")  # read back: proven consistent
    validate(written)
    assert [[c.form for c in row] for row in back.cells] == [[FORMS[form]] * 2] * 2
    assert [[c.form for c in row] for row in back.model.layers] == [[FORMS[form]] * 2] * 2
    assert back.fingerprint() == written.fingerprint()
    for cq in (c for row in back.cells for c in row):
        if cq.form.candidate != "tanh":  # the tie held through training: the table is the identity
            assert cq.spec["g_out"] == cq.spec["g_pre"]
            assert cq.form.candidate != "relu" or cq.spec["g_pre"].zp == -(1 << (cq.spec["g_pre"].bits - 1))
    assert not np.array_equal(back.cells[0][0].qR, qm.cells[0][0].qR)  # it wrote what it learned
    y = _forward(torch, module, test, torch.float64)
    assert np.array_equal(to_int(y, back.cells[-1][0].spec["h"]), run_int(back, test))
    np.save(tmp_path / "test.npy", test)
    code, out, err = cli("simulate", tmp_path / "qat.h5", tmp_path / "test.npy", "--mode", "both", "--json")
    assert code == 0, err
    assert json.loads(out)["fakequant"]["agreement"]["layer0.fwd.Wx"]["identical"] == 1.0


def test_from_float_stays_the_haste_cell(torch):
    """nn.GRU is the haste cell: from_float builds it, and writes it back as such."""
    from qtool.qat import QuantGRU

    module = QuantGRU.from_float(torch.nn.GRU(3, 4, batch_first=True), np.random.RandomState(0).randn(8, 5, 3), "int8")
    assert module.forms == [[CellForm()]] and module.to_quant_model().haste
