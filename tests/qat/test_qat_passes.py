"""The compiler passes (qtool.numerics.passes) as named steps on the realized program, their use by the C
export, and the fully-integral check on the program and on the C written."""

import json
import shutil

import numpy as np
import pytest
from conftest import calibrated, random_model

from qtool.core.tensors import TensorConfig, preset_config
from qtool.errors import QtoolError
from qtool.numerics.intops import rshift_round
from qtool.numerics.passes import realize, report, run_passes
from qtool.numerics.rescale import CHANNEL_ROWS


@pytest.fixture(scope="module")
def qm():
    """2 layers, bidirectional; layer 0's x symmetric, so its compensation tables are zeros."""
    config = {**preset_config("int8"), "x": TensorConfig(8, True)}
    rng = np.random.RandomState(0)
    return calibrated(random_model(C=4, H=5, layers=2, dirs=2, seed=4), rng.randn(32, 6, 4).astype(np.float32),
                      config=config)


def test_each_pass_removes_what_it_names(qm):
    naive = realize(qm)
    assert sum(not op.integral for op in naive.ops) == 1 + 4 * 4 + 2 * 2 + 1  # x, constants, 2 pairs, y
    p = run_passes(qm)
    fold, elide, zero = (p.removed[n] for n in ("fold_constants", "elide_requantize", "drop_zero_tables"))
    assert sorted({op.kind for op in fold}) == ["fake_quant", "rescale"]
    assert len(fold) == 4 * (4 + 6)  # per cell: W, R, bx, br fake-quant; 6 bias shifts per step
    assert sum(op.count for op in fold if op.per_step) == 4 * 6 * 5  # 6 H shift-and-adds per cell
    assert [(op.kind, op.where) for op in elide] == [("dequantize", "layer0.fwd -> layer1"),
                                                     ("quantize", "layer0.fwd -> layer1"),
                                                     ("dequantize", "layer0.bwd -> layer1"),
                                                     ("quantize", "layer0.bwd -> layer1")]
    # zero point 0 on layer 0's x: exactly its two W_sum_mul_x_zp tables go
    assert [(op.where, op.what) for op in zero] == [("layer0.fwd", "W_sum_mul_x_zp"),
                                                    ("layer0.bwd", "W_sum_mul_x_zp")]
    assert [op.what for op in p.prefix] == ["x"] and [op.what for op in p.suffix] == ["y"]
    assert all(op.integral for op in p.ops)
    rep = report(p)
    assert rep["partition"]["core_fully_integral"] and rep["passes"]["fold_constants"]["operations"] == 40


def test_folded_biases_are_the_cells_bias_terms(qm):
    from qtool.numerics.passes import folded_biases

    cq = qm.cells[0][1]
    rows = {r: cq.CH[i] for i, r in enumerate(CHANNEL_ROWS)}
    b_pre, b_rab = folded_biases(rows)
    H = cq.hidden_size
    for j in range(3 * H):  # z and r blocks: both biases; g block: bx only
        want = rshift_round(int(cq.qbx[j]), int(rows["sh_bx"][j]))
        if j < 2 * H:
            want += rshift_round(int(cq.qbr[j]), int(rows["sh_br"][j]))
        assert b_pre[j] == want
    assert [int(v) for v in b_rab] == [rshift_round(int(cq.qbr[j]), int(rows["sh_br"][j])) for j in range(2 * H, 3 * H)]


def test_fully_integral_refuses_a_float_core(qm):
    with pytest.raises(QtoolError, match="floating-point operation: fake_quant of W in layer0.fwd"):
        run_passes(qm, passes=("elide_requantize", "drop_zero_tables"))
    p = run_passes(qm, fully_integral=False, passes=("fold_constants",))
    assert not report(p)["partition"]["core_fully_integral"]
    assert {op.kind for op in p.ops if not op.integral} == {"dequantize", "quantize"}  # between layers


def test_a_broken_tie_between_layers_is_refused(qm):
    import copy

    bad = copy.deepcopy(qm)
    bad.cells[1][0].spec["x"].exp2_inv += 1
    with pytest.raises(QtoolError, match="x of layer 1 .* differs from h of layer 0"):
        run_passes(bad)


@pytest.mark.skipif(shutil.which("cc") is None, reason="the C export is checked with the C runtime")
def test_export_uses_the_passes_and_checks_the_c_core(qm, tmp_path, monkeypatch):
    from qtool.exporters import c_export
    from qtool.exporters.c_integral import function_bodies

    fp = c_export.export_c(qm, tmp_path, "m")
    assert fp.passes == report(run_passes(qm))
    params = (tmp_path / "m_params.h").read_text()
    assert "m_l0_fwd_W_sum_mul_x_zp" not in params and "m_l1_fwd_W_sum_mul_x_zp" in params
    bodies = function_bodies((tmp_path / "m.c").read_text())
    assert "float" in bodies["m_quantize_input"] and "m_step" in bodies  # the prefix converts floats
    runtime = tmp_path / "runtime"
    shutil.copytree(c_export.RUNTIME, runtime)
    src = (runtime / "qgru.h").read_text()
    assert "return (int64_t)((uint64_t)v << -n);" in src
    (runtime / "qgru.h").write_text(src.replace("return (int64_t)((uint64_t)v << -n);",
                                                "return (int64_t)(0.5 * (double)v) + (int64_t)((uint64_t)v << -n);", 1))
    monkeypatch.setattr(c_export, "RUNTIME", runtime)
    (tmp_path / "out").mkdir()
    with pytest.raises(QtoolError, match=r"qgru_rshift_round64\(\) in qgru.h uses '(0.5|double)'"):
        c_export.export_c(qm, tmp_path / "out", "m")
    c_export.export_c(qm, tmp_path / "out", "m", fully_integral=False)


def test_cli_export_reports_the_passes(cli, qm, tmp_path):
    from qtool.core.model import open_h5
    from qtool.io.qmodel_file import write_qmodel

    with open_h5(tmp_path / "q.h5", "w") as f:
        write_qmodel(f, qm)
    code, out, err = cli("export", "c", tmp_path / "q.h5", "-o", tmp_path / "c", "--json")
    assert code == 0, err
    res = json.loads(out)
    assert res["passes"]["elide_requantize"]["operations"] == 4
    assert res["partition"]["core_fully_integral"] is True
    code, out, err = cli("export", "c", tmp_path / "q.h5", "-o", tmp_path / "c", "--force")
    assert code == 0 and "fold_constants" in out and "partition_conversions" in out
