"""Importers and the float reference against golden outputs of PyTorch, Keras and ONNX Runtime."""

import numpy as np
import pytest
from conftest import GOLDEN, has

from qtool.errors import QtoolError
from qtool.float_gru import run_float
from qtool.importers import import_model

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


def test_keras_reset_after_false_is_refused():
    with pytest.raises(QtoolError, match="reset_after=False"):
        import_model(GOLDEN / "keras_reset_before.keras")


@pytest.mark.skipif(not has("onnx"), reason="onnx not installed")
def test_onnx_gru_matches_onnxruntime():
    model = import_model(GOLDEN / "onnx_bidir.onnx")
    assert model.name == "encoder_gru"
    check(model, "onnx_bidir")


@pytest.mark.skipif(not has("onnx"), reason="onnx not installed")
def test_onnx_linear_before_reset_0_is_refused():
    with pytest.raises(QtoolError, match="linear_before_reset=0"):
        import_model(GOLDEN / "onnx_lbr0.onnx")


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
    with pytest.raises(QtoolError, match="several GRUs.*--name"):
        import_model(tmp_path / "two.safetensors")
    assert import_model(tmp_path / "two.safetensors", name="dec").name == "dec"


def test_unknown_format_and_lstm_refused(tmp_path):
    (tmp_path / "m.bin").write_bytes(b"xx")
    with pytest.raises(QtoolError, match="--format"):
        import_model(tmp_path / "m.bin")
    pytest.importorskip("safetensors")
    from safetensors.numpy import save_file

    save_file({"weight_ih_l0": np.zeros((16, 3), np.float32),
               "weight_hh_l0": np.zeros((16, 4), np.float32)}, str(tmp_path / "lstm.safetensors"))
    with pytest.raises(QtoolError, match="LSTM"):
        import_model(tmp_path / "lstm.safetensors")
