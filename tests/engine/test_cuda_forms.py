"""The numba.cuda engine runs every cell form (qtool.core.model.CellForm) as the CPU engine does:
the reset-before cell (gates and rh of every unit, a barrier, then R_g rh and the candidate),
hard_sigmoid gates, relu and linear candidates. Integers and traces equal the CPU engine's
exactly, the float reference agrees within float32 rounding, and so do the statistics, row for
row of cell_layout(form).measured. Runs under numba's CUDA simulator (tiny shapes) unless
QTOOL_TEST_REAL_GPU=1."""

import os

import numpy as np
import pytest
from conftest import calibrated, random_model
from test_integer_gru import mixed_config

from qtool.core.model import HASTE, CellForm, GruCell, GruModel
from qtool.engine.cpu import run_model
from qtool.engine.cuda import run_model_cuda
from qtool.engine.layout import EVERY_TENSOR, INTS, cell_layout
from qtool.engine.metrics import STAT_COUNT, STAT_ERR2, STAT_MAX_ABS, STAT_REF2, STAT_SATURATED, STATS

FORMS = {
    "reset_before": CellForm(reset_after=False),
    "reset_before_hard_relu": CellForm(reset_after=False, gate="hard_sigmoid", gate_alpha=0.2, gate_beta=0.5,
                                       candidate="relu"),
    "hard_linear": CellForm(gate="hard_sigmoid", gate_alpha=1 / 6, gate_beta=0.5, candidate="linear"),
}
# (H, T, N) per form: the simulator runs every thread in Python
SIZES = {"reset_before": (5, 4, 3), "reset_before_hard_relu": (4, 3, 2), "hard_linear": (6, 3, 2)}


def _model(name: str, seed: int, mix: bool) -> GruModel:
    """Two layers, bidirectional, every cell of the form; `mix`: layer 1's backward cell haste."""
    H = SIZES[name][0]
    base = random_model(C=3, H=H, layers=2, dirs=2, seed=seed)
    layers = [[GruCell(c.W, c.R, c.bx, c.br, FORMS[name]) for c in cells] for cells in base.layers]
    if mix:
        c = layers[1][1]
        layers[1][1] = GruCell(c.W, c.R, c.bx, c.br, HASTE)
    return GruModel(layers, name=name)


def _compare_stats(cpu: np.ndarray, gpu: np.ndarray, where) -> None:
    """Statistics rows (columns STATS) of the two engines: counts equal, sums within float32
    rounding of the reference (test_fused_metrics.close's tolerances)."""
    assert cpu.shape == gpu.shape, where
    for c, stat in enumerate(STATS):
        a, b = gpu[:, c], cpu[:, c]
        if c in (STAT_COUNT, STAT_SATURATED):
            assert np.array_equal(a, b), (where, stat)
            continue
        # the largest error is one value's; a reference value's rounding d moves err2 by about 2 err d
        atol = {STAT_MAX_ABS: 1e-6, STAT_ERR2: 1e-6 * np.sqrt(cpu[:, STAT_ERR2] * cpu[:, STAT_REF2])}.get(c, 1e-12)
        rtol = 0.0 if c == STAT_MAX_ABS else 1e-5
        assert np.all(np.abs(a - b) <= atol + rtol * np.abs(b)), (where, stat, a, b)


@pytest.mark.parametrize("preset", ["int8", "int16"])
@pytest.mark.parametrize("name", list(FORMS))
def test_cuda_equals_cpu_every_form(name, preset):
    H, T, N = SIZES[name]
    seed = list(FORMS).index(name)
    model = _model(name, seed, mix=preset == "int16")
    rng = np.random.RandomState(seed + 7)
    qm = calibrated(model, rng.randn(6, 5, 3).astype(np.float32), preset)
    x = rng.randn(N, T, 3).astype(np.float32) * 1.3  # held out, partly outside the calibrated range
    tr_cpu, tr_gpu = [], []
    cpu = run_model(qm, x, EVERY_TENSOR, traces=tr_cpu)
    gpu = run_model_cuda(qm, x, EVERY_TENSOR, traces=tr_gpu)
    assert np.array_equal(cpu.y_int, gpu.y_int)
    for a, b in zip(cpu.outputs, gpu.outputs, strict=True):
        assert np.array_equal(a, b)
    for l, cells in enumerate(qm.cells):
        for d, cq in enumerate(cells):
            rows = cell_layout(cq.form).rows
            assert tr_gpu[l][d].shape == tr_cpu[l][d].shape == (N, T, rows, H)
            assert np.array_equal(tr_cpu[l][d], tr_gpu[l][d]), (l, d)
            assert gpu.stats[l][d].shape == (len(cell_layout(cq.form).measured), len(STATS))
            _compare_stats(cpu.stats[l][d], gpu.stats[l][d], (l, d))
    assert np.abs(cpu.y_float - gpu.y_float).max() < 1e-5
    _compare_stats(cpu.step_stats, gpu.step_stats, "steps")


def test_cuda_integers_only_of_a_reset_before_model():
    """level INTS (no float reference) and a run from integers: the same integers as the CPU's."""
    model = _model("reset_before_hard_relu", 5, mix=False)
    rng = np.random.RandomState(3)
    qm = calibrated(model, rng.randn(6, 5, 3).astype(np.float32), "int8")
    x = rng.randn(2, 3, 3).astype(np.float32)
    cpu = run_model(qm, x, INTS)
    gpu = run_model_cuda(qm, x, INTS)
    assert gpu.y_float is None and gpu.stats is None
    assert np.array_equal(cpu.y_int, gpu.y_int)


def test_reset_before_wx_saturates_on_its_own_grid():
    """A reset-before cell's P has its own order (rescale.RB_*): Wx on 8 bits and Rh on 12
    (test_integer_gru.mixed_config), inputs far outside the calibrated range, so that Wx
    saturates; the wrong index would clamp it to Rh's range."""
    model = _model("reset_before", 0, mix=False)
    rng = np.random.RandomState(7)
    qm = calibrated(model, rng.randn(6, 5, 3).astype(np.float32), "int8", config=mixed_config())
    assert qm.cells[0][0].spec["Wx"].bits == 8 and qm.cells[0][0].spec["Rh"].bits == 12
    x = rng.randn(2, 3, 3).astype(np.float32) * 4
    tr_cpu, tr_gpu = [], []
    cpu = run_model(qm, x, INTS, traces=tr_cpu)
    gpu = run_model_cuda(qm, x, INTS, traces=tr_gpu)
    assert np.array_equal(cpu.y_int, gpu.y_int)
    wx = tr_gpu[0][0][:, :, :3]
    assert wx.min() == -128 and wx.max() == 127  # saturated, on Wx's own range
    for a, b in zip(tr_cpu, tr_gpu, strict=True):
        for p, q in zip(a, b, strict=True):
            assert np.array_equal(p, q)


@pytest.mark.skipif(os.environ.get("QTOOL_TEST_REAL_GPU") == "1",
                    reason="small tiles: numba freezes them when it compiles a kernel for a GPU")
@pytest.mark.parametrize("name,preset", [("haste", "int8"), ("reset_before", "int16")])
def test_cuda_past_every_tile(name, preset, monkeypatch):
    """Sizes past each tile of the kernels: a full block of sequences and a partial one, h
    staged in three chunks of K_CHUNK units, units in two blocks of THREADS, the W x GEMM's
    inputs in two chunks of WX_TILE columns; float32 R h sums (int8) and float64 (int16). The
    tiles are made small, as the simulator runs every thread in Python (the kernels read them at
    run time there; test_cuda_compile compiles the real ones)."""
    import qtool.engine.cuda as engine_cuda
    from qtool.engine.layout import gemm_dtype

    # blocks of 2 sequences (sequence_tile: 10 * 3 // 15) in tiles of 4
    for k, v in {"THREADS": 8, "TILE_N": 4, "THREADS_IN_FLIGHT": 15, "K_CHUNK": 4, "WX_TILE": 4}.items():
        monkeypatch.setattr(engine_cuda, k, v)
    H, N = 10, 3
    assert engine_cuda.sequence_tile(N, H) == 2
    form = HASTE if name == "haste" else FORMS[name]
    base = random_model(C=5, H=H, layers=1, dirs=1, seed=5)
    model = GruModel([[GruCell(c.W, c.R, c.bx, c.br, form) for c in cells] for cells in base.layers])
    rng = np.random.RandomState(8)
    qm = calibrated(model, rng.randn(6, 4, 5).astype(np.float32), preset)
    cq = qm.cells[0][0]
    assert gemm_dtype(cq.qR, cq.spec["h"].bits) is (np.float32 if preset == "int8" else np.float64)
    x = rng.randn(N, 3, 5).astype(np.float32) * 1.3
    tr_cpu, tr_gpu = [], []
    cpu = run_model(qm, x, EVERY_TENSOR, traces=tr_cpu)
    gpu = run_model_cuda(qm, x, EVERY_TENSOR, traces=tr_gpu)
    assert np.array_equal(cpu.y_int, gpu.y_int)
    assert np.array_equal(tr_cpu[0][0], tr_gpu[0][0])
    _compare_stats(cpu.stats[0][0], gpu.stats[0][0], name)
    _compare_stats(cpu.step_stats, gpu.step_stats, "steps")
    assert np.abs(cpu.y_float - gpu.y_float).max() < 1e-5
