"""The fused engine's distances (accumulated inside its loops, no traces) against the reduction of
full traces: numpy's float GRU (qtool.numerics.float_gru) traced per tensor and step, the integer engine's
traces, and metrics.Distance.add over whole arrays, as `qtool simulate` computed them before."""

import numpy as np
import pytest
from conftest import calibrated, random_model
from test_integer_gru import mixed_config

from qtool.engine.cpu import run_int, run_model
from qtool.engine.cuda import run_model_cuda
from qtool.engine.layout import EVERY_TENSOR
from qtool.engine.metrics import Distance, count_clipped
from qtool.numerics.float_gru import run_float
from qtool.numerics.qparams import dequantize
from qtool.simulation.run import Simulation, int_tensors, tensor_key


def traced_distances(qm, x):
    """Every tensor's Distance from full float and integer traces."""
    ftr, itr = [], []
    y_float = run_float(qm.model, x, ftr)
    y_int = run_int(qm, x, itr)
    out = {}
    for l, cells in enumerate(qm.cells):
        for d, cq in enumerate(cells):
            for name, q in int_tensors(itr[l][d]).items():
                s = cq.spec[name]
                ref = ftr[l][d][name]
                dist = Distance()
                dist.add(dequantize(q, s.exp2_inv, s.zp), ref, count_clipped(ref, s.exp2_inv, s.zp, s.bits))
                out[tensor_key(l, d, name)] = dist
    s = qm.cells[-1][0].spec["h"]
    y_q = dequantize(y_int, s.exp2_inv, s.zp).astype(np.float32)
    output = Distance()
    output.add(y_q, y_float, count_clipped(y_float, s.exp2_inv, s.zp, s.bits))
    steps = []
    for t in range(x.shape[1]):
        steps.append(Distance())
        steps[t].add(y_q[:, t], y_float[:, t])
    return out, output, steps, y_float, y_int


def close(a: Distance, b: Distance, rtol: float, saturated: bool = True) -> None:
    # a reference value's float32 rounding d moves err2 by about 2 err d: relative to err2 that
    # is large when the errors are small, so err2 also gets an absolute slack of that size
    slack = {"err2": 1e-6 * (b.err2 * b.ref2) ** 0.5}
    for k in ("ref2", "err2", "dot", "q2"):
        assert getattr(a, k) == pytest.approx(getattr(b, k), rel=rtol, abs=slack.get(k, 1e-12)), k
    # the largest error is one value's: it moves with that reference value's float32 rounding
    assert a.max_abs == pytest.approx(b.max_abs, abs=1e-6)
    assert a.count == b.count
    assert not saturated or a.saturated == b.saturated


# the float reference's exp, tanh and GEMM summation order differ from numpy's by float32 rounding
# (relative 1e-7 per value, amplified by the recurrence): the sums of squares agree to 1e-5
RTOL = 1e-5


@pytest.mark.parametrize("preset,layers,dirs,engine", [
    ("int8", 1, 1, "cpu"), ("w8a16", 2, 2, "cpu"), ("int16", 1, 2, "cpu"), ("mixed", 2, 1, "cpu"),
    ("w8a16", 1, 2, "cuda")])
def test_fused_distances_equal_traced_reductions(preset, layers, dirs, engine):
    """CUDA: reduced on the device (under numba's simulator unless QTOOL_TEST_REAL_GPU=1)."""
    C, H, N, T = (7, 12, 9, 11) if engine == "cpu" else (3, 4, 3, 3)  # the simulator is slow
    model = random_model(C=C, H=H, layers=layers, dirs=dirs, seed=layers * 3 + dirs)
    rng = np.random.RandomState(4)
    qm = calibrated(model, rng.randn(12, 8, C).astype(np.float32),
                    "int8" if preset == "mixed" else preset,
                    config=mixed_config() if preset == "mixed" else None)
    x = rng.randn(N, T, C).astype(np.float32) * 1.4  # held out, partly outside the range
    want, output, steps, y_float, y_int = traced_distances(qm, x)
    sim = Simulation(qm, runner=run_model if engine == "cpu" else run_model_cuda)
    yf, yq, yi = sim.run_chunk(x[:2])
    sim.run_chunk(x[2:])  # two chunks: the statistics add up across them
    assert np.array_equal(yi, y_int[:2])
    np.testing.assert_allclose(yf, y_float[:2], rtol=1e-5, atol=1e-6)
    assert set(sim.tensors) >= set(want)
    for key, dist in want.items():
        close(sim.tensors[key], dist, RTOL)
    close(sim.output, output, RTOL)
    for a, b in zip(sim.steps, steps):
        close(a, b, RTOL, saturated=False)  # per step only the SNR is reported


@pytest.mark.parametrize("workers", [2, 3])
def test_statistics_do_not_depend_on_threads(monkeypatch, workers):
    """Blocks of sequences keep their own statistics, summed in block order: the same bits from
    one thread as from several (what lets qtool.parallel fold ranks of one thread each)."""
    import qtool.engine.cpu as engine

    model = random_model(C=5, H=6, layers=2, dirs=2, seed=8)
    rng = np.random.RandomState(9)
    qm = calibrated(model, rng.randn(12, 7, 5).astype(np.float32), "int8")
    x = rng.randn(11, 7, 5).astype(np.float32) * 1.4  # 3 blocks of 4 sequences, the last short
    monkeypatch.setattr(engine, "threads", lambda: 1)
    one = run_model(qm, x, EVERY_TENSOR)
    monkeypatch.setattr(engine, "threads", lambda: workers)
    assert len(engine.slices(len(x), engine.threads())) > 1
    many = run_model(qm, x, EVERY_TENSOR)
    assert np.array_equal(one.step_stats, many.step_stats)
    assert all(np.array_equal(a, b) for ra, rb in zip(one.stats, many.stats) for a, b in zip(ra, rb))
