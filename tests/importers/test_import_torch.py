"""PyTorch and safetensors files: malformed and hostile state dicts refused with one line naming the
tensor, pickled code explained, library warnings silenced, and every import checked against nn.GRU."""

import pickle
import warnings

import numpy as np
import pytest
from conftest import has

from qtool.errors import QtoolError
from qtool.importers import import_model
from qtool.numerics.float_gru import run_float

needs_torch = pytest.mark.skipif(not has("torch"), reason="torch not installed")


def state_dict(c=3, h=4, **kw):
    import torch

    torch.manual_seed(0)
    return torch.nn.GRU(c, h, **kw).state_dict()


def save(tmp_path, sd, name="m.pt"):
    import torch

    torch.save(sd, tmp_path / name)
    return tmp_path / name


def refused(path, match):
    """Refused with one line, and no library warning on the way."""
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        with pytest.raises(QtoolError, match=match) as e:
            import_model(path)
    assert "\n" not in str(e.value) and "\x1b" not in str(e.value)
    assert [str(w.message) for w in caught] == []
    return str(e.value)


@needs_torch
@pytest.mark.parametrize("edit, match", [
    (lambda sd, t: sd.update(bias_ih_l0=t.zeros(13)), r"'bias_ih_l0' has shape \(13,\), expected \(12,\)"),
    (lambda sd, t: sd.update(weight_ih_l0=t.zeros(13, 3)), r"'weight_ih_l0' has shape \(13, 3\)"),
    (lambda sd, t: sd.update(weight_hh_l0=t.zeros(12, 5)), r"'weight_hh_l0' has shape \(12, 5\)"),
    (lambda sd, t: sd.update({k: v.to(t.complex64) for k, v in sd.items()}), "complex64"),
    (lambda sd, t: sd.update(weight_ih_l0=sd["weight_ih_l0"].to(t.int64)), "torch.int64"),
    (lambda sd, t: sd.pop("bias_hh_l0"), "only one of bias_ih_l0 and bias_hh_l0"),
    (lambda sd, t: sd.update(bias_hh_l0=t.full((12,), 1e300, dtype=t.float64)), "'bias_hh_l0' contains NaN or Inf"),
    # one stored value viewed as 840 M (stride 0): refused before it is materialised
    (lambda sd, t: sd.update(weight_ih_l0=t.zeros(1).expand(12, 10**5, 700)), "beyond qtool's limit"),
])
def test_malformed_state_dicts_name_the_tensor(tmp_path, edit, match):
    import torch

    sd = dict(state_dict())
    edit(sd, torch)
    refused(save(tmp_path, sd), match)


@needs_torch
def test_lstm_with_projection_and_mixed_hidden_sizes_are_refused(tmp_path):
    import torch

    refused(save(tmp_path, torch.nn.LSTM(3, 4, proj_size=2).state_dict()), "proj_size")
    sd = {**{k: v for k, v in state_dict(3, 4).items()},
          **{k.replace("l0", "l1"): v for k, v in state_dict(4, 2).items()}}
    refused(save(tmp_path, sd), "different hidden sizes")


@needs_torch
def test_an_unprefixed_gru_beside_others_is_not_chosen_silently(tmp_path):
    sd = {**state_dict(), **{f"dec.{k}": v for k, v in state_dict(3, 2).items()}}
    with pytest.raises(QtoolError, match="several GRUs .root, dec."):
        import_model(save(tmp_path, sd))
    assert import_model(tmp_path / "m.pt", name="root").hidden_size == 4


@needs_torch
def test_whole_module_pickle_says_it_holds_code(tmp_path):
    import torch

    path = tmp_path / "whole.pt"
    torch.save(torch.nn.GRU(3, 4), path)
    msg = refused(path, "holds pickled Python objects")
    assert "torch.nn.modules.rnn.GRU" in msg and "state_dict()" in msg


@needs_torch
def test_a_cut_file_says_so_in_whole_sentences(tmp_path):
    """A .pt cut short (a failed copy): torch's long zip error becomes one whole sentence."""
    import torch

    whole = tmp_path / "whole.pt"
    torch.save(state_dict(), whole)
    data = whole.read_bytes()
    for keep in (len(data) // 10, len(data) // 2, len(data) - 30):  # torch says EINVAL or a miniz error
        cut = tmp_path / f"cut{keep}.pt"
        cut.write_bytes(data[:keep])
        msg = refused(cut, r"not a whole PyTorch file \(its zip archive is truncated or damaged")
        assert msg.endswith("save it again") and "If you are seeing" not in msg


@needs_torch
@pytest.mark.parametrize("protocol", [2, 4])
def test_raw_pickle_is_one_line_without_warnings(tmp_path, protocol):
    path = tmp_path / "raw.pth"
    with open(path, "wb") as f:
        pickle.dump({k: v.numpy() for k, v in state_dict().items()}, f, protocol=protocol)
    refused(path, "pickled Python objects" if protocol == 2 else "weights-only loader refuses")


@needs_torch
def test_no_bias_and_legacy_serialization_match_nn_gru(tmp_path):
    import torch

    torch.manual_seed(1)
    gru = torch.nn.GRU(3, 5, num_layers=2, bias=False, batch_first=True, bidirectional=True)
    path = tmp_path / "m.pt"
    torch.save({"model": {"gru": gru.state_dict()}}, path, _use_new_zipfile_serialization=False)
    x = torch.randn(4, 9, 3)
    model = import_model(path)
    with torch.no_grad():
        assert np.abs(run_float(model, x.numpy()) - gru(x)[0].numpy()).max() < 1e-5
    assert model.extra["check"]["checked"] and model.extra["check"]["max_abs_diff"] < 1e-5


@needs_torch
def test_the_check_refuses_a_misread_file(tmp_path, monkeypatch):
    """Were the gate blocks not reordered, nn.GRU would disagree and the import be refused."""
    import qtool.importers.torch.state_dict as torch_sd

    path = save(tmp_path, state_dict())
    monkeypatch.setattr(torch_sd, "rzn_to_zrg", lambda a: a)
    with pytest.raises(QtoolError, match="differs from PyTorch nn.GRU by up to"):
        import_model(path)
    assert "check" not in import_model(path, check=False).extra


def test_check_without_the_framework_says_so(tmp_path, monkeypatch):
    pytest.importorskip("safetensors")
    from safetensors.numpy import save_file

    import qtool.importers.torch.check as check_torch

    rng = np.random.RandomState(0)
    save_file({"weight_ih_l0": rng.randn(6, 3).astype(np.float32), "weight_hh_l0": rng.randn(6, 2).astype(np.float32)},
              str(tmp_path / "m.safetensors"))

    def no_torch(*a):
        raise ImportError("No module named 'torch'", name="torch")

    monkeypatch.setattr(check_torch, "run_torch", no_torch)
    check = import_model(tmp_path / "m.safetensors").extra["check"]
    assert check == {"checked": False, "reason": "PyTorch nn.GRU cannot be imported (no module 'torch')"}


@pytest.mark.skipif(not has("safetensors"), reason="safetensors not installed")
@pytest.mark.parametrize("dtype, ok", [(np.float64, True), (np.float16, True), (np.int8, False)])
def test_safetensors_dtypes(tmp_path, dtype, ok):
    from safetensors.numpy import save_file

    rng = np.random.RandomState(0)
    save_file({"rnn.weight_ih_l0": (rng.randn(6, 3) * 3).astype(dtype),
               "rnn.weight_hh_l0": (rng.randn(6, 2) * 3).astype(dtype),
               "other": np.zeros(3, np.int64)}, str(tmp_path / "m.safetensors"))
    if ok:
        assert import_model(tmp_path / "m.safetensors").name == "rnn"
    else:
        refused(tmp_path / "m.safetensors", "'rnn.weight_.h_l0' has dtype I8")
