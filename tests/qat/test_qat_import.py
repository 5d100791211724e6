"""Quantized and QAT-trained models from other tools: ONNX QDQ made by ONNX Runtime's
quantize_static, torch.ao FakeQuantize state in a PyTorch checkpoint, and qtool's own QAT
checkpoints. The file's ranges are kept (snapped to powers of two as documented), the rest
calibrated from DATA, and missing ranges without DATA are named."""

import json
import math

import numpy as np
import pytest
from conftest import has

from qtool.numerics.qparams import choose_qparams, dequantize, grid_range

needs_torch = pytest.mark.skipif(not has("torch"), reason="needs PyTorch")


@pytest.fixture(scope="module")
def qdq_onnx(tmp_path_factory):
    """A stacked bidirectional nn.GRU exported to ONNX and quantized by ONNX Runtime (QDQ, GRU
    only), plus calibration and held-out data."""
    if not (has("torch") and has("onnxruntime") and has("onnx")):
        pytest.skip("needs torch, onnx and onnxruntime")
    import torch
    from onnxruntime.quantization import CalibrationDataReader, QuantFormat, quantize_static

    d = tmp_path_factory.mktemp("qdq")
    torch.manual_seed(0)
    gru = torch.nn.GRU(5, 6, num_layers=2, bidirectional=True)
    torch.onnx.export(gru, (torch.randn(7, 2, 5),), str(d / "f.onnx"), input_names=["x"],
                      output_names=["y", "h_n"], dynamo=False)
    rng = np.random.RandomState(0)
    batches = [rng.randn(7, 2, 5).astype(np.float32) for _ in range(8)]

    class Reader(CalibrationDataReader):
        def __init__(self):
            self.it = iter({"x": b} for b in batches)

        def get_next(self):
            return next(self.it, None)

    quantize_static(str(d / "f.onnx"), str(d / "q.onnx"), Reader(), quant_format=QuantFormat.QDQ,
                    op_types_to_quantize=["GRU"])
    np.save(d / "calib.npy", rng.randn(64, 7, 5).astype(np.float32))
    np.save(d / "test.npy", rng.randn(32, 7, 5).astype(np.float32))
    return d, gru


def _gru_input_quantizer(path, index: int):
    """(scale, zero point) of the DequantizeLinear feeding input `index` of the first GRU node,
    read with onnx directly."""
    import onnx
    from onnx import numpy_helper

    g = onnx.load(str(path)).graph
    inits = {t.name: numpy_helper.to_array(t) for t in g.initializer}
    gru = next(n for n in g.node if n.op_type == "GRU")
    dq = next(n for n in g.node if gru.input[index] in n.output)
    return float(inits[dq.input[1]]), int(inits[dq.input[2]])


def test_qdq_onnx_imports_weights_and_ranges(qdq_onnx, cli):
    d, gru = qdq_onnx
    from qtool.calibration.from_file import fixed_spec
    from qtool.core.tensors import preset_config
    from qtool.importers import import_model, read_imported

    model = import_model(d / "q.onnx")  # the float importer folds DequantizeLinear on constants
    assert model.num_layers == 2 and model.bidirectional
    # W is the int8 initializer dequantized: within half a step of nn.GRU's weights (z | r | g)
    scale_W, _ = _gru_input_quantizer(d / "q.onnx", 1)
    w_torch = gru.weight_ih_l0.detach().numpy()
    H = 6
    w_canon = np.concatenate([w_torch[H:2 * H], w_torch[:H], w_torch[2 * H:]])
    assert np.abs(model.layers[0][0].W - w_canon).max() <= scale_W / 2 + 1e-7
    imported = read_imported(d / "q.onnx", model)
    assert imported.kind == "ONNX QDQ"
    assert {k[2] for k in imported.ranges} == {"W", "R", "x", "h"}
    fixed, rows = fixed_spec(imported, model, preset_config("int8"))
    x_s, x_zp = _gru_input_quantizer(d / "q.onnx", 0)
    lo, hi = (-128 - x_zp) * x_s, (127 - x_zp) * x_s
    e, zp = choose_qparams(lo, hi, 8, False)  # the finest power-of-two grid holding the range
    tq = fixed[0][1]["x"]
    assert (tq.exp2_inv, tq.zp) == (e, zp)
    g_lo, g_hi = grid_range(e, zp, 8)
    assert g_lo <= lo and g_hi >= hi and 2.0 ** -e < 2 * x_s  # no clipping, less than 6.02 dB
    row = next(r for r in rows if r["tensor"] == "x")
    assert row["moved_db"] == pytest.approx(20 * math.log10(2.0 ** -e / x_s))
    assert fixed[1][0]["x"] is fixed[0][0]["h"] is fixed[0][1]["h"]  # the ties


def test_qdq_calibrate_keeps_the_file_ranges_and_fills_in_the_rest(qdq_onnx, cli):
    d, _ = qdq_onnx
    code, out, err = cli("calibrate", d / "q.onnx", "-o", d / "none.h5")
    assert code == 2 and "holds no range for 48 tensors" in err
    named = err.split("in every cell: ")[1].split(")")[0].split(", ")
    assert set(named) == {"Wx", "Rh", "z_pre", "r_pre", "g_pre", "z_out", "r_out", "g_out", "Rh_add_br",
                          "rRh", "old_contrib", "new_contrib"}
    assert not (d / "none.h5").exists()
    code, out, err = cli("calibrate", d / "q.onnx", d / "calib.npy", "-o", d / "q.h5", "--json")
    assert code == 0, err
    res = json.loads(out)
    assert "ONNX QDQ" in res["method"] and "minmax" in res["method"]
    assert {r["tensor"] for r in res["imported"]} == {"W", "R", "x", "h"}
    assert any("initial_h" in n for n in res["notes"]) and any("32-bit bias" in n for n in res["notes"])
    from qtool.io.qmodel_file import load_qmodel

    qm = load_qmodel(d / "q.h5")
    x_row = next(r for r in res["imported"] if r["tensor"] == "x")
    assert (qm.cells[0][0].spec["x"].exp2_inv, qm.cells[0][0].spec["x"].zp) == (x_row["exp2_inv"], x_row["zp"])
    code, out, err = cli("simulate", d / "q.h5", d / "test.npy", "--json")
    assert code == 0 and json.loads(out)["output"]["cosine"] > 0.98


def test_qdq_per_channel_axis(qdq_onnx, tmp_path):
    """A per-channel DequantizeLinear (axis 1 over the 3H rows) gives one grid per row."""
    import onnx
    from onnx import helper, numpy_helper

    d, _ = qdq_onnx
    m = onnx.load(str(d / "q.onnx"))
    g = m.graph
    inits = {t.name: t for t in g.initializer}
    dq = next(n for n in g.node if n.op_type == "DequantizeLinear" and n.input[0] in inits
              and numpy_helper.to_array(inits[n.input[0]]).ndim == 3)
    q = numpy_helper.to_array(inits[dq.input[0]])  # [dirs, 3H, C] int8
    w = (q.astype(np.float64) - numpy_helper.to_array(inits[dq.input[2]])) * numpy_helper.to_array(inits[dq.input[1]])
    scales = np.abs(w).max(axis=(0, 2)) / 127  # per row, shared by both directions
    scales[0] = 2.0 ** -9  # one power-of-two row comes back unchanged
    q_new = np.clip(np.round(w / scales[None, :, None]), -128, 127).astype(np.int8)
    for name, arr in ((dq.input[0], q_new), (dq.input[1], scales.astype(np.float32)),
                      (dq.input[2], np.zeros(scales.size, np.int8))):
        inits[name].CopyFrom(numpy_helper.from_array(arr, name))
    dq.attribute.append(helper.make_attribute("axis", 1))
    onnx.save(m, str(tmp_path / "pc.onnx"))
    from qtool.calibration.from_file import fixed_spec
    from qtool.core.tensors import preset_config
    from qtool.importers import import_model, read_imported

    model = import_model(tmp_path / "pc.onnx")
    imported = read_imported(tmp_path / "pc.onnx", model)
    name = next(k[2] for k, r in imported.ranges.items() if "per channel" in r.source)
    fixed, rows = fixed_spec(imported, model, preset_config("int8"))
    e = fixed[0][0][name].exp2_inv
    want = [choose_qparams(-128 * s, 127 * s, 8, True)[0] for s in scales]
    assert np.array_equal(e, want) and e[0] == 9
    cell = getattr(model.layers[0][0], name)
    assert np.array_equal(dequantize(np.round(cell[0] * 2 ** 9), 9, 0), cell[0])  # row 0 exact


def _torch_ao_checkpoint(path, scale_x=0.04, disabled=True):
    """A 2-layer nn.GRU with torch.ao FakeQuantize modules under the documented names, run on
    data so the observers hold real statistics."""
    import torch
    from torch.ao.quantization import FakeQuantize, HistogramObserver, default_fake_quant
    from torch.ao.quantization import default_per_channel_weight_fake_quant as per_channel

    torch.manual_seed(1)
    net = torch.nn.Module()
    net.gru = gru = torch.nn.GRU(5, 6, num_layers=2, batch_first=True)
    x = torch.randn(16, 9, 5)
    for l in range(2):
        for kind in ("weight_ih", "weight_hh"):
            fq = per_channel()
            fq(getattr(gru, f"{kind}_l{l}").detach())
            gru.add_module(f"{kind}_l{l}_fake_quant", fq)
    fq = default_fake_quant()
    fq(x)
    fq.scale.fill_(scale_x)  # a learned, non-power-of-two scale
    fq.zero_point.fill_(128)
    gru.add_module("x_l0_fake_quant", fq)
    y = gru(x)[0]
    out = default_fake_quant()
    out(y.detach())
    out.scale.fill_(2.0 ** -7)  # a power of two: comes back unchanged
    out.zero_point.fill_(128)
    gru.add_module("activation_post_process", out)
    if disabled:
        off = default_fake_quant()
        off(torch.randn(10))
        off.disable_fake_quant()
        gru.add_module("z_pre_l0_fake_quant", off)
    hist = FakeQuantize(observer=HistogramObserver)
    hist(torch.rand(100))
    gru.add_module("r_out_l1_fake_quant", hist)
    torch.save(net.state_dict(), path)
    return gru


@needs_torch
def test_torch_ao_checkpoint_imports_with_snapping(tmp_path, cli):
    from qtool.calibration.from_file import fixed_spec
    from qtool.core.tensors import preset_config
    from qtool.importers import import_model, read_imported

    gru = _torch_ao_checkpoint(tmp_path / "ao.pt")
    model = import_model(tmp_path / "ao.pt")
    imported = read_imported(tmp_path / "ao.pt", model)
    assert imported.kind == "torch.ao fake-quant"
    assert {(k[0], k[2]) for k in imported.ranges} == {(0, "W"), (0, "R"), (1, "W"), (1, "R"), (0, "x"),
                                                       (1, "h"), (1, "r_out")}
    assert any("z_pre_l0_fake_quant" in n and "disabled" in n for n in imported.notes)
    assert any("histogram" in n for n in imported.notes)
    config = preset_config("int8")
    up, rows_up = fixed_spec(imported, model, config, "up")
    near, rows_near = fixed_spec(imported, model, config, "nearest")
    # x: quint8, zp 128, scale 0.04 -> learned range [-5.12, 5.08]; up: 2^-4 (+3.88 dB, no clip),
    # nearest: 2^-5 (-2.14 dB, clips)
    assert (up[0][0]["x"].exp2_inv, up[0][0]["x"].zp) == (4, 0)
    assert near[0][0]["x"].exp2_inv == 5
    x_up = next(r for r in rows_up if r["tensor"] == "x")
    x_near = next(r for r in rows_near if r["tensor"] == "x")
    assert x_up["moved_db"] == pytest.approx(20 * math.log10(0.0625 / 0.04)) and not x_up["clips"]
    assert x_near["moved_db"] == pytest.approx(20 * math.log10(0.03125 / 0.04)) and x_near["clips"]
    # the output FakeQuantize (h of the last layer, power of two) comes back exactly
    assert (up[1][0]["h"].exp2_inv, up[1][0]["h"].zp) == (7, 0)
    assert next(r for r in rows_up if r["tensor"] == "h")["moved_db"] == pytest.approx(0.0)
    # per-channel weights: PyTorch's rows r | z | n become qtool's z | r | g
    scale = gru.weight_hh_l1_fake_quant.scale.numpy()
    want = [choose_qparams(-128 * s, 127 * s, 8, True)[0] for s in np.concatenate([scale[6:12], scale[:6], scale[12:]])]
    assert np.array_equal(up[1][0]["R"].exp2_inv, want)
    code, out, err = cli("calibrate", tmp_path / "ao.pt", "-o", tmp_path / "q.h5")
    assert code == 2 and "torch.ao fake-quant" in err and "in every cell: Wx" in err
    np.save(tmp_path / "calib.npy", np.random.RandomState(2).randn(32, 9, 5).astype(np.float32))
    code, out, err = cli("calibrate", tmp_path / "ao.pt", tmp_path / "calib.npy", "-o", tmp_path / "q.h5",
                         "--snap", "nearest", "--json")
    assert code == 0, err
    from qtool.io.qmodel_file import load_qmodel

    qm = load_qmodel(tmp_path / "q.h5")
    assert qm.cells[0][0].spec["x"].exp2_inv == 5 and qm.cells[1][0].spec["h"].exp2_inv == 7
    code, out, err = cli("calibrate", tmp_path / "ao.pt", tmp_path / "calib.npy", "-o", tmp_path / "q.h5",
                         "--snap", "down", "--force")
    assert code == 2 and "--snap" in err


@needs_torch
def test_qtool_qat_checkpoint_needs_no_data(tmp_path, cli):
    """QuantGRU.state_dict() saved with torch.save: every grid is in it, exactly."""
    import torch

    from qtool.io.qmodel_file import load_qmodel
    from qtool.qat import QuantGRU

    torch.manual_seed(3)
    gru = torch.nn.GRU(4, 5, num_layers=2, bidirectional=True, batch_first=True)
    module = QuantGRU.from_float(gru, torch.randn(32, 6, 4), "w8a16")
    with torch.no_grad():
        module.h_l0_fake_quant.exp2_inv -= 1.0  # as if training had moved a grid
    torch.save(module.state_dict(), tmp_path / "qat.pt")
    code, out, err = cli("calibrate", tmp_path / "qat.pt", "-o", tmp_path / "q.h5", "--bits", "w8a16", "--json")
    assert code == 0, err
    assert "qtool QAT" in json.loads(out)["method"]
    got, want = load_qmodel(tmp_path / "q.h5"), module.to_quant_model()
    for cg, cw in zip(sum(got.cells, []), sum(want.cells, [])):
        for k in ("qW", "qR", "qbx", "qbr", "P", "CH"):
            assert np.array_equal(getattr(cg, k), getattr(cw, k)), k
        assert all(np.array_equal(cg.luts[n], cw.luts[n]) for n in cw.luts)


@needs_torch
def test_fake_quant_of_a_top_level_gru_beside_another(tmp_path):
    """A checkpoint whose GRU sits at the top of the state dict, with another GRU beside it: the
    importer names the top one 'root', and its quantizers must be found under no prefix."""
    import torch

    from qtool.importers import import_model, read_imported

    gru = _torch_ao_checkpoint(tmp_path / "ao.pt")
    state = {**gru.state_dict(), **{f"enc.{k}": v for k, v in torch.nn.GRU(3, 4).state_dict().items()}}
    torch.save(state, tmp_path / "two.pt")
    model = import_model(tmp_path / "two.pt", name="root")
    imported = read_imported(tmp_path / "two.pt", model)
    assert imported is not None and {(k[0], k[2]) for k in imported.ranges} >= {(0, "x"), (1, "h"), (0, "W")}
