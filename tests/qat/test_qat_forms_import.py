"""A QuantGRU checkpoint of any cell form (qtool.core.model.CellForm) imports as that form: the
module stores each non-haste cell's form in its state dict (`cell_form_l{k}[_reverse]`, int64),
`qtool calibrate qat.pt` / `qtool import qat.pt` and the Python API read it back, check the import
against QuantGRU's float forward (nn.GRU computes the haste cell only), and the calibrated model's
integers are those of `module.to_quant_model()`. A haste checkpoint is what it always was, and a
checkpoint whose buffers or quantizers name a cell qtool cannot compute is refused in one line."""

import json

import numpy as np
import pytest
from conftest import calibrated, has, random_model

from qtool.core.model import CellForm
from qtool.errors import QtoolError

FORMS = {
    "reset_before_hard_relu": CellForm(reset_after=False, gate="hard_sigmoid", gate_alpha=0.2, gate_beta=0.5,
                                       candidate="relu"),
    "hard_linear": CellForm(reset_after=True, gate="hard_sigmoid", gate_alpha=1 / 6, gate_beta=0.5,
                            candidate="linear"),
}
C, H, T = 5, 6, 10


def form_qmodel(form: CellForm, layers: int = 2, dirs: int = 2, seed: int = 3):
    model = random_model(C=C, H=H, layers=layers, dirs=dirs, seed=seed)
    for row in model.layers:
        for cell in row:
            cell.form = form
    return calibrated(model, np.random.RandomState(1).randn(32, T, C).astype(np.float32))


def train(torch, module, steps: int = 3):
    """A few QAT steps (halve the output): weights, biases and grids move."""
    x = torch.from_numpy(np.random.RandomState(7).randn(32, T, C).astype(np.float32))
    with torch.no_grad():
        target = 0.5 * module(x)[0]
    opt = torch.optim.Adam([{"params": module.weight_parameters(), "lr": 1e-2},
                            {"params": module.range_parameters(), "lr": 5e-2}])
    for _ in range(steps):
        loss = ((module(x)[0] - target) ** 2).mean()
        opt.zero_grad()
        loss.backward()
        opt.step()
    return module


def checkpoint(torch, tmp_path, form: CellForm, name: str = "qat.pt"):
    """A trained QuantGRU of `form` saved right after training (as a user saves it, before any
    to_qtool), the calibration data beside it; returns (path, module)."""
    from qtool.qat import QuantGRU

    torch.manual_seed(1)
    module = train(torch, QuantGRU(form_qmodel(form), batch_first=True))
    torch.save(module.state_dict(), tmp_path / name)
    np.save(tmp_path / "calib.npy", np.random.RandomState(2).randn(24, T, C).astype(np.float32))
    return tmp_path / name, module


def same_integers(got, want) -> None:
    """Every cell's form, integers, tables and grids (lo/hi included) are the module's."""
    assert got.fingerprint() == want.fingerprint()
    for cg, cw in zip(sum(got.cells, []), sum(want.cells, [])):
        assert cg.form == cw.form
        for k in ("qW", "qR", "qbx", "qbr", "P", "CH"):
            assert np.array_equal(getattr(cg, k), getattr(cw, k)), k
        assert all(np.array_equal(cg.luts[n], cw.luts[n]) for n in cw.luts)
        assert set(cg.spec) == set(cw.spec)
        for n, t in cw.spec.items():
            g = cg.spec[n]
            assert all(np.array_equal(getattr(g, f), getattr(t, f))
                       for f in ("bits", "symmetric", "exp2_inv", "zp", "lo", "hi")), n


def one_line_error(code: int, err: str, match: str) -> None:
    assert code != 0 and match in err, err
    assert len(err.strip().splitlines()) == 1, err


# ---- the checkpoint


@pytest.mark.parametrize("form", FORMS)
def test_the_checkpoint_holds_each_cells_form_exactly(torch, form):
    """One int64 buffer per non-haste cell, decoding to the very form (1/6 included), through
    float(), double() and half(), which never cast integer buffers."""
    from qtool.importers.torch.forms import decode_form, encode_form
    from qtool.qat import QuantGRU

    module = QuantGRU(form_qmodel(FORMS[form]))
    for cast in (module.float, module.double, module.half, module.float):
        cast()
        state = module.state_dict()
        keys = [k for k in state if "cell_form" in k]
        assert keys == ["cell_form_l0", "cell_form_l0_reverse", "cell_form_l1", "cell_form_l1_reverse"]
        for k in keys:
            assert state[k].dtype == torch.int64
            assert decode_form(state[k].numpy(), k) == FORMS[form]
    assert decode_form(encode_form(FORMS[form]), "x").gate_alpha == FORMS[form].gate_alpha  # bit for bit
    haste = QuantGRU(form_qmodel(CellForm()))
    assert not any("cell_form" in k for k in haste.state_dict())


def test_loading_a_checkpoint_of_another_form_is_an_error(torch):
    """Same keys, another hard_sigmoid: load_state_dict says so, and the module keeps its form."""
    from qtool.importers.torch.forms import encode_form
    from qtool.qat import QuantGRU

    form = FORMS["reset_before_hard_relu"]
    module = QuantGRU(form_qmodel(form))
    other = QuantGRU(form_qmodel(CellForm(reset_after=False, gate="hard_sigmoid", gate_alpha=0.25, gate_beta=0.5,
                                          candidate="relu")))
    assert set(other.state_dict()) == set(module.state_dict())
    with pytest.raises(RuntimeError, match="cell_form_l0: the checkpoint's cell is"):
        module.load_state_dict(other.state_dict())
    assert module.forms[0][0] == form
    assert torch.equal(module.state_dict()["cell_form_l0"], torch.from_numpy(encode_form(form)))
    QuantGRU(form_qmodel(form, seed=9)).load_state_dict(module.state_dict())  # same form: loads


def test_slot_names_read_rh_as_its_own_tensor():
    """`rh_l0_fake_quant` is rh's quantizer, not h's under a module prefix 'r'."""
    from qtool.importers.torch.slots import SLOT

    m = SLOT.match("rh_l0_fake_quant.exp2_inv")
    assert (m["prefix"], m["alias"], m["layer"], m["rev"]) == ("", "rh", "0", None)
    m = SLOT.match("gru.rh_l1_reverse_fake_quant.bits")
    assert (m["prefix"], m["alias"], m["layer"], m["rev"]) == ("gru.", "rh", "1", "_reverse")
    m = SLOT.match("gru.x_l0_fake_quant.activation_post_process.min_val")  # a FakeQuantize's observer
    assert (m["prefix"], m["alias"], m["leaf"]) == ("gru.", "x", "activation_post_process.min_val")


# ---- importing it


@pytest.mark.parametrize("form", FORMS)
def test_a_trained_checkpoint_calibrates_to_the_modules_integers(torch, cli, tmp_path, form):
    """`qtool calibrate qat.pt DATA` and without DATA, `qtool import`, and the Python API: the
    cells keep their form, every range comes from the checkpoint (rh for a reset-before cell;
    g_out on g_pre's grid for relu and linear), and the integers are `to_qtool`'s."""
    from qtool import api
    from qtool.importers import read_imported
    from qtool.io.qmodel_file import load_qmodel

    path, module = checkpoint(torch, tmp_path, FORMS[form])
    want = module.to_qtool(tmp_path / "direct.h5")
    assert load_qmodel(tmp_path / "direct.h5").fingerprint() == want.fingerprint()
    forms = [[FORMS[form]] * 2] * 2

    code, out, err = cli("calibrate", path, tmp_path / "calib.npy", "-o", tmp_path / "q.h5", "--json")
    assert code == 0, err
    assert "qtool QAT" in json.loads(out)["method"]
    got = load_qmodel(tmp_path / "q.h5")
    assert [[c.form for c in row] for row in got.cells] == forms
    assert [[c.form for c in row] for row in got.model.layers] == forms
    same_integers(got, want)
    code, out, err = cli("calibrate", path, "-o", tmp_path / "nodata.h5")  # every range is in it
    assert code == 0, err
    same_integers(load_qmodel(tmp_path / "nodata.h5"), want)

    code, out, err = cli("import", path, "-o", tmp_path / "float.h5")
    assert code == 0, err
    assert "QuantGRU.float_forward" in out
    assert [[c.form for c in row] for row in api.load(tmp_path / "q.h5").model.layers] == forms

    model = api.load_model(path)
    assert [[c.form for c in row] for row in model.layers] == forms
    check = model.extra["check"]
    assert check["checked"] and check["framework"] == "PyTorch QuantGRU.float_forward"
    assert check["max_abs_diff"] < 1e-5
    imported = read_imported(path, model)
    names = {k[2] for k in imported.ranges}
    assert ("rh" in names) == (not FORMS[form].reset_after)
    assert not names & ({"Rh_add_br", "rRh"} if not FORMS[form].reset_after else {"rh"})
    assert imported.ranges[(0, 1, "g_out")].exact == imported.ranges[(0, 1, "g_pre")].exact  # tied
    same_integers(api.calibrate(path, tmp_path / "calib.npy"), want)
    same_integers(api.calibrate(path, None), want)


def test_cells_of_different_forms_in_one_gru(torch, tmp_path):
    """A haste layer under a reset-before one: buffers only for the other form's cells."""
    from qtool import api
    from qtool.qat import QuantGRU

    model = random_model(C=C, H=H, layers=2, dirs=2, seed=5)
    for cell in model.layers[1]:
        cell.form = FORMS["reset_before_hard_relu"]
    qm = calibrated(model, np.random.RandomState(1).randn(32, T, C).astype(np.float32))
    module = train(torch, QuantGRU(qm, batch_first=True))
    assert [k for k in module.state_dict() if "cell_form" in k] == ["cell_form_l1", "cell_form_l1_reverse"]
    torch.save(module.state_dict(), tmp_path / "mixed.pt")
    got = api.calibrate(tmp_path / "mixed.pt", None)
    assert [[c.form for c in row] for row in got.cells] == [[CellForm()] * 2, [FORMS["reset_before_hard_relu"]] * 2]
    same_integers(got, module.to_quant_model())


def test_bias_grids_follow_the_biases_not_the_stored_exponents(torch, tmp_path):
    """A bias quantizer follows its bias (QuantGRU refits it at every forward and in
    to_quant_model): the exponents stored at the last forward pass, before the optimizer moved
    the biases, are not what the module writes, and the import refits them as it does."""
    from qtool import api

    path, module = checkpoint(torch, tmp_path, FORMS["reset_before_hard_relu"])
    state = torch.load(path)
    for k in [k for k in state if k.startswith("bias_") and k.endswith("exp2_inv")]:
        state[k].fill_(3.0)  # nonsense: never read
    torch.save(state, tmp_path / "stale.pt")
    same_integers(api.calibrate(tmp_path / "stale.pt", None), module.to_quant_model())


def test_the_import_check_computes_the_form(torch, tmp_path, monkeypatch):
    """The check runs QuantGRU's float forward (torch, nn.GRU's layout), which is nn.GRU for the
    haste cell and qtool's float reference for the forms; an importer that lost the forms (read
    the cells as haste) is refused by it."""
    import qtool.importers.torch.state_dict as torch_sd
    from qtool.importers import import_model
    from qtool.numerics.float_gru import run_float
    from qtool.qat import QuantGRU

    x = np.random.RandomState(4).randn(6, 9, C).astype(np.float32)
    gru = torch.nn.GRU(C, H, num_layers=2, bidirectional=True, batch_first=True)
    haste = QuantGRU.from_float(gru, x, "int8")
    with torch.no_grad():
        want = gru(torch.from_numpy(x))[0].numpy()
        assert np.abs(haste.float_forward(torch.from_numpy(x)).numpy() - want).max() < 1e-5
    for form in FORMS.values():
        module = QuantGRU(form_qmodel(form), batch_first=True)
        with torch.no_grad():
            y = module.float_forward(torch.from_numpy(x)).numpy()
        assert np.abs(y - run_float(module.float_model(), x)).max() < 1e-5

    module = QuantGRU(form_qmodel(FORMS["hard_linear"]))
    weights = {k: v for k, v in module.state_dict().items() if "_fake_quant." not in k}  # float + forms
    torch.save(weights, tmp_path / "float.pt")
    assert import_model(tmp_path / "float.pt").layers[1][1].form == FORMS["hard_linear"]
    monkeypatch.setattr(torch_sd, "cell_forms", lambda forms, layers, where: layers)  # the old bug
    with pytest.raises(QtoolError, match="differs from PyTorch QuantGRU.float_forward by up to"):
        import_model(tmp_path / "float.pt")


def test_a_haste_checkpoint_imports_as_before(torch, cli, tmp_path):
    """No cell form buffer; checked against nn.GRU; the module's integers."""
    from qtool.importers import import_model
    from qtool.io.qmodel_file import load_qmodel
    from qtool.qat import QuantGRU

    torch.manual_seed(2)
    x = np.random.RandomState(5).randn(32, T, C).astype(np.float32)
    module = train(torch, QuantGRU.from_float(torch.nn.GRU(C, H, num_layers=2, batch_first=True), x, "int8"))
    torch.save(module.state_dict(), tmp_path / "haste.pt")
    assert not any("cell_form" in k for k in module.state_dict())
    model = import_model(tmp_path / "haste.pt")
    assert all(c.form.haste for row in model.layers for c in row)
    assert model.extra["check"]["framework"] == "PyTorch nn.GRU"
    code, out, err = cli("calibrate", tmp_path / "haste.pt", "-o", tmp_path / "q.h5")
    assert code == 0, err
    same_integers(load_qmodel(tmp_path / "q.h5"), module.to_quant_model())


@pytest.mark.skipif(not has("safetensors"), reason="safetensors not installed")
def test_a_safetensors_checkpoint_keeps_the_form(torch, tmp_path):
    from safetensors.torch import save_file

    from qtool import api

    path, module = checkpoint(torch, tmp_path, FORMS["reset_before_hard_relu"])
    save_file({k: v.contiguous() for k, v in module.state_dict().items()}, str(tmp_path / "qat.safetensors"))
    model = api.load_model(tmp_path / "qat.safetensors")
    assert model.layers[0][0].form == FORMS["reset_before_hard_relu"]
    same_integers(api.calibrate(tmp_path / "qat.safetensors", None), module.to_quant_model())


# ---- refusals: never read as haste


def _edit_relu(state, torch):
    del state["cell_form_l0"]  # a reset-before cell's rh quantizer, on what would be a haste cell


def _strip_linear(state, torch):
    for k in [k for k in state if "cell_form" in k]:
        del state[k]  # a linear candidate's tied g_out, on what would be a tanh cell


EDITS = {
    "unknown gate": ("reset_before_hard_relu", lambda s, t: s["cell_form_l0"].__setitem__(1, 2),
                     "names a cell qtool cannot compute"),
    "unknown candidate": ("hard_linear", lambda s, t: s["cell_form_l1_reverse"].__setitem__(4, 7),
                          "names a cell qtool cannot compute"),
    "float buffer": ("hard_linear", lambda s, t: s.__setitem__("cell_form_l0", s["cell_form_l0"].double()),
                     "cell form buffer is float64 [5]"),
    "longer buffer": ("hard_linear", lambda s, t: s.__setitem__("cell_form_l0", t.zeros(6, dtype=t.int64)),
                      "cell form buffer is int64 [6]"),
    "sigmoid with constants": ("reset_before_hard_relu", lambda s, t: s["cell_form_l0"].__setitem__(1, 0),
                               "a sigmoid gate has no alpha or beta"),
    "alpha not a number": ("hard_linear",
                           lambda s, t: s["cell_form_l0"].__setitem__(2, int(np.array(np.nan).view(np.int64))),
                           "needs a finite gate_alpha > 0"),
    "no such layer": ("hard_linear", lambda s, t: s.__setitem__("cell_form_l2", s["cell_form_l0"].clone()),
                      "is for a cell the GRU does not have"),
    "no such GRU": ("hard_linear", lambda s, t: s.__setitem__("head.cell_form_l0", s["cell_form_l0"].clone()),
                    "belongs to no GRU"),
    "rh without the form": ("reset_before_hard_relu", _edit_relu, "'rh_l0_fake_quant' is for rh"),
    "tied g_out without the form": ("hard_linear", _strip_linear, "has no g_out beside it"),
}


@pytest.mark.parametrize("edit", EDITS)
def test_a_checkpoint_naming_what_qtool_cannot_compute_is_refused(torch, cli, tmp_path, edit):
    form, change, match = EDITS[edit]
    path, _ = checkpoint(torch, tmp_path, FORMS[form])
    state = torch.load(path)
    change(state, torch)
    torch.save(state, tmp_path / "bad.pt")
    for args in (("import", tmp_path / "bad.pt", "-o", tmp_path / "f.h5"),
                 ("calibrate", tmp_path / "bad.pt", tmp_path / "calib.npy", "-o", tmp_path / "q.h5")):
        one_line_error(*cli(*args)[::2], match)
    assert not (tmp_path / "f.h5").exists() and not (tmp_path / "q.h5").exists()


def test_ranges_are_never_put_on_a_model_of_another_form(torch, tmp_path):
    """The Python API takes a model beside the file: one of another form is refused."""
    from qtool.importers import import_model, read_imported

    path, _ = checkpoint(torch, tmp_path, FORMS["hard_linear"])
    model = import_model(path)
    model.layers[1][0].form = CellForm(gate="hard_sigmoid", gate_alpha=0.2, gate_beta=0.5, candidate="linear")
    with pytest.raises(QtoolError, match="the checkpoint's layer 1 fwd cell is"):
        read_imported(path, model)
