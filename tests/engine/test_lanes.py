"""The CPU engine's cell in int32 lanes (qtool.numerics.lanes) gives the integers of its int64 lanes, and
is chosen only where the static bound proves that every value fits int32 (qtool.numerics.lane_bounds)."""

from __future__ import annotations

import numpy as np
import pytest
from conftest import calibrated, random_model

import qtool.engine.cpu as engine
from qtool.core.tensors import TensorConfig, preset_config
from qtool.engine.cpu import plan_model, run_int


def config(h_bits: int, z_bits: int):
    """int8, with h and z_out widened: old_contrib = (q_z - zp)(q_h - zp) approaches 2^(h + z - 2)."""
    cfg = preset_config("int8")
    cfg.update(h=TensorConfig(h_bits, False), z_out=TensorConfig(z_bits, False))
    return cfg


def model_and_inputs(cfg, preset="int8"):
    model = random_model(C=6, H=20, layers=2, dirs=2, seed=8)
    rng = np.random.RandomState(8)
    qm = calibrated(model, rng.randn(12, 9, 6).astype(np.float32), preset, config=cfg)
    # far outside the calibrated range too: every tensor reaches its saturation bounds
    x = np.concatenate([rng.randn(8, 12, 6), np.sign(rng.randn(8, 12, 6)) * 1e3]).astype(np.float32)
    return qm, x


def lanes(qm) -> set:
    return {dp.P.dtype for row in plan_model(qm) for dp in row}


def run_with(monkeypatch, qm, x, lane_t):
    monkeypatch.setattr(engine, "cell_lane_type", lambda *a: lane_t)
    return run_int(qm, x)


@pytest.mark.parametrize("preset, cfg", [("int8", None), ("w8a16", None), ("int8", config(16, 15))])
def test_int32_lanes_give_the_int64_integers(monkeypatch, preset, cfg):
    """Near the bound: w8a16's cells here reach 2^30.99998 (int32) and 2^31.08 (int64, the
    others), 16-bit h and 15-bit z_out 2^30.005; all at once in one stacked bidirectional model."""
    qm, x = model_and_inputs(cfg, preset)
    assert np.dtype(np.int32) in lanes(qm)
    want = run_with(monkeypatch, qm, x, np.int64)
    monkeypatch.undo()
    assert np.array_equal(run_int(qm, x), want)


@pytest.mark.parametrize("preset, cfg", [("int16", None), ("int8", config(16, 16))])
def test_the_bound_refuses_int32_where_it_would_wrap(monkeypatch, preset, cfg):
    """int16: the GEMM sums exceed 2^31; 16-bit h and z: old_contrib's product reaches 2^32,
    and forcing int32 lanes there does change the integers."""
    qm, x = model_and_inputs(cfg, preset)
    assert lanes(qm) == {np.dtype(np.int64)}
    want = run_int(qm, x)
    if cfg is not None:
        assert not np.array_equal(run_with(monkeypatch, qm, x, np.int32), want)
