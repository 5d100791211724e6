"""Importers and the float reference against golden outputs of PyTorch, Keras and ONNX Runtime."""


import numpy as np
import pytest
from conftest import GOLDEN, has

from qtool.errors import QtoolError
from qtool.importers import import_model
from qtool.numerics.float_gru import run_float

CASES = ["single", "stacked", "bidir"]


def check(model, io_name, tol=1e-5):
    io = np.load(GOLDEN / f"{io_name}_io.npz")
    y = run_float(model, io["x"])
    assert y.shape == io["y"].shape
    assert np.abs(y - io["y"]).max() < tol


@pytest.mark.skipif(not has("safetensors"), reason="safetensors not installed")
@pytest.mark.parametrize("case", CASES)
def test_safetensors_state_dict_matches_pytorch(case):
    model = import_model(GOLDEN / f"torch_{case}.safetensors")
    assert model.bidirectional == (case == "bidir")
    check(model, f"torch_{case}")


@pytest.mark.skipif(not has("torch"), reason="torch not installed")
@pytest.mark.parametrize("case", CASES)
def test_pt_checkpoint_matches_pytorch(case):
    model = import_model(GOLDEN / f"torch_{case}.pt")  # nested {"rnn": state_dict}
    check(model, f"torch_{case}")


@pytest.mark.skipif(not has("torch"), reason="torch not installed")
@pytest.mark.parametrize("layers,bidir,c,h", [(1, False, 3, 7), (2, True, 6, 5), (3, False, 4, 9)])
def test_live_against_nn_gru(tmp_path, layers, bidir, c, h):
    import torch

    torch.manual_seed(layers * 10 + c)
    gru = torch.nn.GRU(c, h, num_layers=layers, bidirectional=bidir, batch_first=True)
    torch.save(gru.state_dict(), tmp_path / "m.pt")
    x = torch.randn(4, 11, c)
    with torch.no_grad():
        want = gru(x)[0].numpy()
    got = run_float(import_model(tmp_path / "m.pt"), x.numpy())
    assert np.abs(got - want).max() < 1e-5


def test_keras_archive_matches_keras():
    model = import_model(GOLDEN / "keras_stack.keras")
    assert model.num_layers == 2 and model.bidirectional
    check(model, "keras_stack")


@pytest.mark.parametrize("ext", ["keras", "h5"])
def test_keras_stack_built_second_in_its_process_matches_keras(ext):
    """Config names gru_1, gru_2 vs weight groups layers/gru, layers/gru_1: read in Keras' order."""
    model = import_model(GOLDEN / f"keras_order.{ext}")
    assert model.num_layers == 2
    check(model, "keras_order")


def test_keras_reset_after_false_imports_as_the_reset_before_cell_and_calibrates():
    """Keras' reset_after=False GRU (one bias [3H]) imports as the reset-before cell, which
    calibrates and runs in integers (tests/importers/test_gru_variants.py holds its numbers against Keras,
    tests/importers/test_gru_forms_trained.py its integer accuracy)."""
    from conftest import calibrated

    model = import_model(GOLDEN / "keras_reset_before.keras")
    cell = model.layers[0][0]
    assert not cell.form.reset_after and cell.form.gate == "sigmoid" and cell.form.candidate == "tanh"
    assert not cell.br.any()  # the one bias is bx
    qm = calibrated(model, np.random.RandomState(0).randn(8, 5, model.input_size).astype(np.float32))
    assert qm.cells[0][0].form == cell.form and "rh" in qm.cells[0][0].spec


@pytest.mark.skipif(not has("onnx"), reason="onnx not installed")
def test_onnx_gru_matches_onnxruntime():
    model = import_model(GOLDEN / "onnx_bidir.onnx")
    assert model.name == "encoder_gru"
    check(model, "onnx_bidir")


@pytest.mark.skipif(not has("onnx"), reason="onnx not installed")
def test_onnx_linear_before_reset_0_imports_as_the_reset_before_cell():
    model = import_model(GOLDEN / "onnx_lbr0.onnx")
    assert model.bidirectional and all(not c.form.reset_after for c in model.layers[0])
    if has("onnxruntime"):
        assert model.extra["check"]["checked"] and model.extra["check"]["max_abs_diff"] < 1e-4


@pytest.mark.skipif(not has("safetensors"), reason="safetensors not installed")
def test_haste_npz_matches_pytorch(tmp_path):
    """haste layout: kernel [C, 3H], recurrent_kernel [H, 3H], gates z | r | g."""
    from safetensors.numpy import load_file

    sd = load_file(str(GOLDEN / "torch_stacked.safetensors"))
    arrays = {}
    for l in range(3):
        def zrg(a):
            r, z, n = np.split(a, 3)
            return np.concatenate([z, r, n])

        arrays[f"layer{l}/kernel"] = zrg(sd[f"weight_ih_l{l}"]).T
        arrays[f"layer{l}/recurrent_kernel"] = zrg(sd[f"weight_hh_l{l}"]).T
        arrays[f"layer{l}/bias"] = zrg(sd[f"bias_ih_l{l}"])
        arrays[f"layer{l}/recurrent_bias"] = zrg(sd[f"bias_hh_l{l}"])
    np.savez(tmp_path / "haste.npz", **arrays)
    check(import_model(tmp_path / "haste.npz"), "torch_stacked")


def test_several_grus_need_a_name(tmp_path):
    pytest.importorskip("safetensors")
    from safetensors.numpy import load_file, save_file

    sd = load_file(str(GOLDEN / "torch_single.safetensors"))
    both = {f"enc.{k}": v for k, v in sd.items()} | {f"dec.{k}": v for k, v in sd.items()}
    save_file(both, str(tmp_path / "two.safetensors"))
    with pytest.raises(QtoolError, match="several GRUs.*`name`"):
        import_model(tmp_path / "two.safetensors")
    assert import_model(tmp_path / "two.safetensors", name="dec").name == "dec"


def test_import_command_reports_the_check(cli, tmp_path):
    pytest.importorskip("safetensors")
    code, out, err = cli("import", GOLDEN / "torch_single.safetensors", "-o", tmp_path / "m.h5")
    assert code == 0 and err == ""
    if has("torch"):
        assert "matches PyTorch nn.GRU on 3 random sequences" in out
    else:
        assert "not checked against the source framework: PyTorch nn.GRU cannot be imported" in out
    code, out, _ = cli("import", GOLDEN / "torch_single.safetensors", "-o", tmp_path / "m.h5", "--force", "--no-check")
    assert code == 0 and "not checked against the source framework (--no-check)" in out


@pytest.mark.skipif(not has("torch"), reason="torch not installed")
def test_import_command_pickled_module_is_one_line(cli, tmp_path):
    import torch

    torch.save(torch.nn.GRU(3, 4), tmp_path / "whole.pt")
    code, out, err = cli("import", tmp_path / "whole.pt", "-o", tmp_path / "m.h5")
    assert code == 2 and out == "" and len(err.strip().splitlines()) == 1 and "\x1b" not in err
    assert "holds pickled Python objects (torch.nn.modules.rnn.GRU)" in err and not (tmp_path / "m.h5").exists()


def test_unknown_format_and_lstm_refused(tmp_path):
    (tmp_path / "m.bin").write_bytes(b"xx")
    with pytest.raises(QtoolError, match="`fmt`"):
        import_model(tmp_path / "m.bin")
    pytest.importorskip("safetensors")
    from safetensors.numpy import save_file

    save_file({"weight_ih_l0": np.zeros((16, 3), np.float32),
               "weight_hh_l0": np.zeros((16, 4), np.float32)}, str(tmp_path / "lstm.safetensors"))
    with pytest.raises(QtoolError, match="LSTM"):
        import_model(tmp_path / "lstm.safetensors")


def haste_arrays(seed=0, C=3, H=4):
    rng = np.random.RandomState(seed)
    return {"kernel": rng.randn(C, 3 * H), "recurrent_kernel": rng.randn(H, 3 * H),
            "bias": rng.randn(3 * H), "recurrent_bias": rng.randn(3 * H)}


@pytest.mark.parametrize("edit, match", [
    (lambda a: a.update(bias=a["bias"][:-1]), r"'bias' has shape \(11,\), expected \(12,\)"),
    (lambda a: a.update(kernel=a["kernel"].astype(np.complex64)), "'kernel' has dtype complex64"),
    (lambda a: a.update(recurrent_kernel=a["recurrent_kernel"].astype(np.int16)), "dtype int16"),
    (lambda a: a.update(gamma=np.ones(12)), "LayerNormGRU"),
])
def test_haste_malformed_arrays_name_the_tensor(tmp_path, edit, match):
    arrays = haste_arrays()
    edit(arrays)
    np.savez(tmp_path / "h.npz", **arrays)
    with pytest.raises(QtoolError, match=match):
        import_model(tmp_path / "h.npz")


def test_haste_reads_only_its_arrays_after_checking_their_headers(tmp_path):
    """A side array is never read (here it is garbage); a header claiming 2^40 values is refused
    before its data is touched."""
    import zipfile

    np.savez(tmp_path / "h.npz", **haste_arrays())
    with zipfile.ZipFile(tmp_path / "h.npz", "a") as z:
        z.writestr("side.npy", b"\x93NUMPY garbage that is never parsed")
    model = import_model(tmp_path / "h.npz")
    assert model.hidden_size == 4
    header = np.lib.format.header_data_from_array_1_0(np.zeros(1))
    header["shape"] = (1 << 20, 1 << 20)
    with zipfile.ZipFile(tmp_path / "bomb.npz", "w") as z, z.open("kernel.npy", "w") as f:
        np.lib.format.write_array_header_1_0(f, header)
    with pytest.raises(QtoolError, match="beyond qtool's limit"):
        import_model(tmp_path / "bomb.npz")
