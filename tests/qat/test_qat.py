"""QuantGRU (qtool.qat): its forward pass against the integer engine, its gradients against their
definitions, and the QAT round trip float nn.GRU -> fine-tune -> to_qtool -> simulate -> export c ->
verify, with the fake-quant vs integer agreement asserted on held-out data."""

import json
import shutil

import numpy as np
import pytest
from conftest import fine_tune, has

pytestmark = pytest.mark.skipif(not has("torch"), reason="QAT needs PyTorch")


def _agreement(module, x, qm):
    """Share of output integers identical between the module and the engine, largest difference."""
    from qtool.engine.cpu import run_int
    from qtool.numerics.fakequant import to_int

    xm = x.to(next(module.parameters()).dtype)  # the same float32 values, in the module's dtype
    y, _ = module(xm if module.batch_first else xm.transpose(0, 1))
    y = y if module.batch_first else y.transpose(0, 1)
    d = np.abs(to_int(y.detach().double().numpy(), qm.cells[-1][0].spec["h"]) - run_int(qm, x.numpy()))
    return float((d == 0).mean()), int(d.max())


@pytest.mark.parametrize("layers,bidir,batch_first,bits", [(1, False, True, "int8"), (2, True, False, "int8"),
                                                           (1, False, True, "w8a16")])
def test_forward_gives_the_integer_engines_output(torch, layers, bidir, batch_first, bits):
    from qtool.qat import QuantGRU

    gru = torch.nn.GRU(5, 7, num_layers=layers, bidirectional=bidir, batch_first=batch_first)
    module = QuantGRU.from_float(gru, torch.randn(48, 9, 5), bits)
    if bits != "int8":  # 16-bit activations: products need float64 to be exact
        module = module.double()
    x = torch.randn(20, 11, 5)
    qm = module.to_quant_model()
    assert _agreement(module, x, qm) == (1.0, 0)
    xm = x.to(next(module.parameters()).dtype)
    y, h_n = module(xm if batch_first else xm.transpose(0, 1))
    assert h_n.shape == (layers * (2 if bidir else 1), 20, 7)
    last = y[:, -1] if batch_first else y[-1]
    assert torch.equal(h_n[-1 if not bidir else -2], last[:, :7])  # the forward direction's final state


def test_tensor_rounding_is_simulated_quantization(torch):
    """rounding="tensor" rounds each tensor once: close to the integers, not equal to them."""
    from qtool.qat import QuantGRU

    gru = torch.nn.GRU(5, 7, batch_first=True)
    module = QuantGRU.from_float(gru, torch.randn(48, 9, 5), "int8", rounding="tensor")
    identical, max_lsb = _agreement(module, torch.randn(20, 11, 5), module.to_quant_model())
    assert 0.2 < identical < 1.0 and max_lsb < 16


def test_fake_quant_gradients(torch):
    """Straight-through inside the grid, zero where it saturates; LSQ's step and offset terms."""
    import math

    from qtool.qat.ops import FakeQuant

    v = torch.tensor([-3.0, -0.26, 0.1, 0.74, 5.0], requires_grad=True)
    e = torch.tensor(2.0, requires_grad=True)
    zp = torch.tensor(-1.0, requires_grad=True)
    y = FakeQuant.apply(v, e, zp, -4, 3)  # grid step 1/4, levels (-4..3) - zp: [-0.75, 1.0]
    assert y.tolist() == [-0.75, -0.25, 0.0, 0.75, 1.0]
    y.sum().backward()
    assert v.grad.tolist() == [0.0, 1.0, 1.0, 1.0, 0.0]
    s, scale = 0.25, 1 / math.sqrt(5 * 3)
    # dy/ds: inside round(v/s) - v/s, saturated q_end - zp; ds/de = -ln2 s
    dy_ds = [-4 + 1, -1 + 1.04, 0 - 0.4, 3 - 2.96, 3 + 1]
    assert e.grad.item() == pytest.approx(sum(dy_ds) * -math.log(2) * s * scale)
    assert zp.grad.item() == pytest.approx(-2 * s * scale)


def test_integer_sum_and_table_gate_have_the_fake_quant_gradients(torch):
    """The fused nodes of the integer rounding give the gradients of the unfused simulated
    quantization: qdq of the float sum, qdq of the float sigmoid."""
    from qtool.qat.ops import FakeQuant, IntegerSum, TableGate

    g = torch.Generator().manual_seed(0)
    terms = [torch.randn(6, 4, generator=g, dtype=torch.float64, requires_grad=True) * 3 for _ in range(2)]
    terms = [t.detach().requires_grad_() for t in terms] + [torch.randn(4, dtype=torch.float64, requires_grad=True)]
    grads = []
    for fused in (True, False):
        e = torch.tensor(2.0, dtype=torch.float64, requires_grad=True)
        zp = torch.tensor(3.0, dtype=torch.float64, requires_grad=True)
        y = IntegerSum.apply(e, zp, -32, 31, *terms) if fused else FakeQuant.apply(sum(terms), e, zp, -32, 31)
        (y * torch.arange(24, dtype=torch.float64).reshape(6, 4)).sum().backward()
        grads.append([e.grad.item(), zp.grad.item()] + [t.grad.clone() for t in terms])
        for t in terms:
            t.grad = None
    assert grads[0][:2] == pytest.approx(grads[1][:2])
    assert all(torch.equal(a, b) for a, b in zip(grads[0][2:], grads[1][2:]))
    v = torch.linspace(-6, 6, 50, dtype=torch.float64, requires_grad=True)
    out = []
    for fused in (True, False):
        e = torch.tensor(7.0, dtype=torch.float64, requires_grad=True)
        zp = torch.tensor(-64.0, dtype=torch.float64, requires_grad=True)
        y = (TableGate.apply(v, e, zp, -128, 127, torch.zeros(50), False) if fused
             else FakeQuant.apply(torch.sigmoid(v), e, zp, -128, 127))
        (y * torch.linspace(1, 2, 50, dtype=torch.float64)).sum().backward()
        out.append((v.grad.clone(), e.grad.item(), zp.grad.item()))
        v.grad = None
    assert torch.allclose(out[0][0], out[1][0]) and out[0][1:] == pytest.approx(out[1][1:])


def test_initial_state_and_bad_input(torch):
    from qtool.errors import QtoolError
    from qtool.qat import QuantGRU

    gru = torch.nn.GRU(3, 4)
    module = QuantGRU.from_float(gru, np.random.RandomState(0).randn(8, 5, 3), "int8")
    x = torch.randn(5, 2, 3)
    assert torch.equal(module(x, torch.zeros(1, 2, 4))[0], module(x)[0])
    with pytest.raises(ValueError, match="h0 = 0"):
        module(x, torch.ones(1, 2, 4))
    with pytest.raises(QtoolError, match="nn.GRU"):
        QuantGRU.from_float(torch.nn.LSTM(3, 4), np.zeros((2, 3, 3)), "int8")


@pytest.mark.skipif(shutil.which("cc") is None, reason="no C compiler")
def test_qat_round_trip(torch, cli, tmp_path):
    """float nn.GRU -> QuantGRU -> fine-tune (to half the float GRU's output, a target it must
    learn through every quantizer) -> to_qtool -> simulate -> export c -> verify; the module and
    the written file give the same integers on sequences used neither for calibration nor for
    fine-tuning."""
    from qtool.io.qmodel_file import load_qmodel
    from qtool.qat import QuantGRU

    torch.manual_seed(2)
    gru = torch.nn.GRU(6, 10, num_layers=2, bidirectional=True, batch_first=True)
    rng = np.random.RandomState(1)
    calib, train, test = (rng.randn(n, 8, 6).astype(np.float32) for n in (64, 128, 64))
    module = QuantGRU.from_float(gru, calib, "int8")
    before = module.to_quant_model()
    xt, xs = torch.from_numpy(train), torch.from_numpy(test)
    with torch.no_grad():
        target_t, target_s = 0.5 * gru(xt)[0], 0.5 * gru(xs)[0]
        loss_before = float(((module(xs)[0] - target_s) ** 2).mean())
    fine_tune(module, xt, target_t, batch=32)
    with torch.no_grad():
        loss_after = float(((module(xs)[0] - target_s) ** 2).mean())
    assert loss_after < 0.5 * loss_before  # the fine-tune learns through the quantizers
    qm = module.to_qtool(tmp_path / "qat.h5")
    assert not np.array_equal(qm.cells[0][0].qR, before.cells[0][0].qR)  # it wrote what it learned
    with torch.no_grad():
        assert _agreement(module, xs, load_qmodel(tmp_path / "qat.h5")) == (1.0, 0)
    np.save(tmp_path / "test.npy", test)
    code, out, err = cli("simulate", tmp_path / "qat.h5", tmp_path / "test.npy", "--json")
    assert code == 0, err
    assert json.loads(out)["output"]["cosine"] > 0.9
    code, out, err = cli("export", "c", tmp_path / "qat.h5", "-o", tmp_path / "c", "--name", "qat")
    assert code == 0, err
    code, out, err = cli("verify", tmp_path / "qat.h5", tmp_path / "c", tmp_path / "test.npy", "--name",
                         "qat", "--json")
    assert code == 0, err
    res = json.loads(out)
    assert res["output_mismatches"] == 0 and res["state_mismatches"] == 0 and res["output_values"] > 0
