"""Framework files at the command line: the options the messages promise exist (--name,
--no-check), what an import leaves out is said, and a command that needs a quantized model says
what it was given instead."""

import json

import numpy as np
import pytest
from conftest import has

from qtool.errors import QtoolError

pytestmark = pytest.mark.skipif(not has("torch"), reason="needs PyTorch to write .pt files")


@pytest.fixture(scope="module")
def files(tmp_path_factory):
    """A state dict of an encoder GRU, a decoder GRU and a Linear head; a TorchScript archive."""
    import torch

    torch.manual_seed(0)
    d = tmp_path_factory.mktemp("fw")
    enc, dec, fc = torch.nn.GRU(4, 8, batch_first=True), torch.nn.GRU(8, 8, batch_first=True), torch.nn.Linear(8, 3)
    state = {**{f"enc.{k}": v for k, v in enc.state_dict().items()},
             **{f"dec.{k}": v for k, v in dec.state_dict().items()},
             **{f"fc.{k}": v for k, v in fc.state_dict().items()}}
    torch.save({**state, "epoch": 3}, d / "seq2seq.pt")  # a training checkpoint's count: no tensor
    torch.jit.save(torch.jit.script(enc), d / "scripted.pt")

    class LinearGruLinear(torch.nn.Module):  # what a user's model.state_dict() holds, in definition order
        def __init__(self):
            super().__init__()
            self.inp = torch.nn.Linear(4, 4)
            self.gru = torch.nn.GRU(4, 8, batch_first=True)
            self.out = torch.nn.Linear(8, 2)

    torch.save(LinearGruLinear().state_dict(), d / "lgl.pt")
    wide, narrow = torch.nn.GRU(4, 12, batch_first=True), torch.nn.GRU(4, 8, batch_first=True)  # both read x
    torch.save({**{f"wide.{k}": v for k, v in wide.state_dict().items()},
                **{f"narrow.{k}": v for k, v in narrow.state_dict().items()}}, d / "two_on_x.pt")
    rng = np.random.default_rng(0)
    np.save(d / "calib.npy", rng.standard_normal((24, 6, 4)).astype(np.float32))
    np.save(d / "test.npy", rng.standard_normal((8, 6, 4)).astype(np.float32))
    return d, enc


def test_calibrate_picks_a_gru_by_name_and_says_what_it_left_out(cli, files):
    import torch

    d, enc = files
    code, _, err = cli("calibrate", d / "seq2seq.pt", d / "calib.npy", "-o", d / "q.h5", "--method", "minmax")
    assert code == 2 and "choose one with --name" in err and "(enc, dec)" in err
    code, out, err = cli("calibrate", d / "seq2seq.pt", d / "calib.npy", "-o", d / "q.h5", "--method", "minmax",
                         "--name", "enc", "--force")
    assert code == 0, err
    assert "left out, not quantized: dec (GRU), fc (2 tensors)" in " ".join(err.split()) and "epoch" not in err
    for args in (("calibrate", "-o", d / "q.h5", "--force", "--method", "minmax"), ("advise",)):
        code, out, err = cli(args[0], d / "seq2seq.pt", d / "calib.npy", *args[1:], "--name", "enc", "--json")
        assert code == 0, err
        assert any("left out, not quantized: dec (GRU)" in n for n in json.loads(out)["notes"]), args
    import qtool

    qm = qtool.load(d / "q.h5")
    x = np.load(d / "test.npy")
    with torch.no_grad():
        want = enc(torch.from_numpy(x))[0].numpy()
    res = qtool.simulate(qm, x, outputs=True, backend="cpu")
    assert np.allclose(res.y_float, want, atol=1e-5)  # the encoder, not the decoder, was taken
    # the decoder is stored after the encoder: data for the file are not taken as data for it
    code, out, err = cli("advise", d / "seq2seq.pt", d / "calib.npy", "--name", "dec", "--no-check", "--limit", "8")
    assert code == 2 and "the GRU (dec) is fed by enc (GRU), stored before it" in err, err
    assert f"qtool import {d / 'seq2seq.pt'} --name dec -o gru.h5" in err and err.count("\n") == 1


def test_no_check_skips_the_framework(cli, files):
    d, _ = files
    code, out, err = cli("import", d / "seq2seq.pt", "-o", d / "m.h5", "--name", "enc", "--no-check", "--force")
    assert code == 0 and "not checked against the source framework (--no-check)" in out, err
    code, out, err = cli("inspect", d / "seq2seq.pt", "--name", "dec")
    assert code == 0 and "matches PyTorch nn.GRU" not in out and "left out" in out, err


def test_commands_that_need_a_quantized_model_say_what_they_got(cli, files):
    d, _ = files
    cli("import", d / "seq2seq.pt", "-o", d / "float.h5", "--name", "enc", "--force")
    for path, kind in ((d / "seq2seq.pt", "a PyTorch file"), (d / "float.h5", "a float qtool model")):
        for args in (["simulate", path, d / "test.npy"], ["export", "c", path, "-o", d / "c"],
                     ["export", "json", path, "-o", d / "p.json"], ["verify", path, d / "c", d / "test.npy"],
                     ["report", path, d / "test.npy", "-o", d / "r.html"]):
            code, _, err = cli(*args)
            assert code == 2 and f"{kind}, not a quantized model" in err and "qtool calibrate" in err, (args, err)
            assert err.count("\n") == 1
    assert not (d / "c").exists() and not (d / "p.json").exists() and not (d / "r.html").exists()


def test_torchscript_is_named_with_the_way_out(cli, files):
    d, _ = files
    code, _, err = cli("import", d / "scripted.pt", "-o", d / "ts.h5")
    assert code == 2 and "a TorchScript archive" in err and ".state_dict()" in err and err.count("\n") == 1


def test_load_model_for_data_refuses_a_gru_fed_by_another_layer(tmp_path, files):
    """The refusal itself, on what an importer records (the importers' own tests build real files)."""
    import qtool
    from qtool.importers import not_fed_by_input

    d, _ = files
    model = qtool.load_model(d / "seq2seq.pt", name="enc", check=False)
    assert model.extra["import"] == {"took": ["enc"], "left_out": ["dec (GRU)", "fc (2 tensors)"],
                                     "input_from": None, "notes": []}
    assert not_fed_by_input(model, d / "seq2seq.pt") is None
    model.extra["import"]["input_from"] = "dense (Dense)"
    msg = not_fed_by_input(model, tmp_path / "m.keras")
    assert "is fed by dense (Dense), not by the model's input" in msg and f"qtool import {tmp_path / 'm.keras'}" in msg
    with pytest.raises(QtoolError, match="choose one with `name`"):
        qtool.load_model(d / "seq2seq.pt", check=False, for_data=True)


def test_a_state_dict_with_a_layer_stored_before_its_gru_is_not_calibrated_on_the_model_input(cli, files):
    d, _ = files
    code, _, err = cli("calibrate", d / "lgl.pt", d / "calib.npy", "-o", d / "lgl_q.h5")
    assert code == 2 and "the GRU (gru) is fed by inp (2 tensors), stored before it" in err and err.count("\n") == 1
    assert not (d / "lgl_q.h5").exists()
    code, out, err = cli("import", d / "lgl.pt", "-o", d / "lgl.h5", "--force")  # the remedy's first step
    assert code == 0 and "left out, not quantized: inp (2 tensors), out (2 tensors)" in " ".join(out.split()), err
    code, _, err = cli("calibrate", d / "lgl.h5", d / "calib.npy", "-o", d / "lgl_q.h5", "--method", "minmax")
    assert code == 0, err


def test_a_gru_stored_before_another_feeds_it_only_when_the_widths_agree(cli, files):
    """wide (H=12) is stored first but cannot feed narrow (C=4): narrow reads the model's input."""
    d, _ = files
    code, _, err = cli("calibrate", d / "two_on_x.pt", d / "calib.npy", "-o", d / "narrow.h5", "--name", "narrow",
                       "--method", "minmax", "--force")
    assert code == 0, err
