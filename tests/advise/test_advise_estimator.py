"""The precision estimator (sampled mean/std, absmax), its P_zero prediction formulas, the
grid-aware error of a Gaussian on a grid, and the per-layer bits file the advisor writes."""

import math

import numpy as np
import pytest
from qtool.calibrators.sampled import SampledStatsObserver

from qtool.advisor import pzero
from qtool.advisor.noise import gaussian_grid_error
from qtool.calibration.observe import model_config
from qtool.core.tensors import TensorConfig, bits_toml, load_bits, preset_config
from qtool.errors import QtoolError
from qtool.numerics.qparams import choose_qparams, dequantize, grid_range, quantize


def test_all_values_give_the_seed_formulas_exactly():
    """gamma = 1 samples every value: mu = X / N, sigma = sqrt(X2 / N - mu^2), M = max |x|."""
    x = np.random.default_rng(0).normal(2.0, 3.0, (7, 50, 9))
    o = SampledStatsObserver(gamma=1.0, k=2, seed=3)
    o.observe(x[:3])
    o.observe(x[3:])
    s = o.stats()
    assert s.mu == pytest.approx(x.mean(), rel=1e-12)
    assert s.sigma == pytest.approx(x.std(), rel=1e-9)
    assert s.M == np.abs(x).max() and s.n_sample == s.n == x.size
    assert s.mean_square == pytest.approx(np.mean(x * x), rel=1e-12)


def test_sampling_rate_and_reproducibility():
    x = np.random.default_rng(1).normal(0.0, 1.0, 200_000)
    a, b, c = (SampledStatsObserver(0.01, 5, seed=s) for s in (7, 7, 8))
    for o in (a, b, c):
        o.observe(x)
    assert np.array_equal(a.sums, b.sums)  # same seed, same data: same samples
    assert not np.array_equal(a.sums, c.sums)
    n = a.sums[:, 0]
    sd = math.sqrt(x.size * 0.01 * 0.99)
    assert np.all(np.abs(n - 2000) < 5 * sd)  # each sample keeps about gamma of the values
    assert len(set(n)) > 1  # the K samples are independent


def test_batches_sample_like_one_array_and_merges_add():
    x = np.random.default_rng(2).laplace(0.0, 1.0, (40, 30, 8)).astype(np.float32)
    whole = SampledStatsObserver(0.05, 4, seed=1)
    whole.observe(x)
    parts = SampledStatsObserver(0.05, 4, seed=1)
    for i in range(0, 40, 7):  # the gaps carry over from batch to batch
        parts.observe(x[i:i + 7])
    assert np.allclose(parts.sums, whole.sums) and parts.stats().M == whole.stats().M
    a, b = SampledStatsObserver(0.05, 4, seed=1), SampledStatsObserver(0.05, 4, seed=2)
    a.observe(x[:20])
    b.observe(x[20:])
    m = a.merge(b)
    assert np.array_equal(m.sums, a.sums + b.sums) and m.range() == (float(x.min()), float(x.max()))
    assert m.stats().n == x.size


def test_multi_negative_sampling_avoids_the_outliers():
    """About one outlier per sample: single samples are often hit, the least-variance one of
    five is not, so the bulk's sigma comes out right while the full std is far off."""
    rng = np.random.default_rng(3)
    x = rng.normal(0.0, 1.0, 100_000)
    x[rng.choice(x.size, 60, replace=False)] = 1000.0
    o = SampledStatsObserver(0.01, 5, seed=0)
    o.observe(x)
    hit = [math.sqrt(x2 / n - (s / n) ** 2) > 2 for n, s, x2 in o.sums]
    assert any(hit) and not all(hit)
    s = o.stats()
    assert abs(s.sigma - 1.0) < 0.05 and s.M == 1000.0 and x.std() > 20


def test_seed_prediction_formulas():
    from qtool.calibrators.sampled import BulkStats

    s = BulkStats(mu=0.1, sigma=0.5, M=4.0, lo=-4.0, hi=3.0, mean=0.1, mean_square=0.26, n_sample=10, n=100)
    d8 = 2 * 4.0 / 255
    assert pzero.delta(4.0, 8) == pytest.approx(d8)
    assert pzero.p_zero(s, 8) == pytest.approx(math.erf(d8 / (2 * math.sqrt(2) * 0.5)))
    p1, p2 = 0.01, 0.02
    assert pzero.snr_db(p1, p2) == pytest.approx(-20 * math.log10(p1 + p2 - p1 * p2))
    assert pzero.snr_db(p1) == pytest.approx(40.0)
    one = pzero.one_minus(BulkStats(0.3, 0.1, 0.9, 0.05, 0.9, 0.3, 0.1, 10, 100))
    assert (one.mu, one.lo, one.hi, one.M) == pytest.approx((0.7, 0.1, 0.95, 0.95))
    assert one.mean_square == pytest.approx(1 - 0.6 + 0.1)


@pytest.mark.parametrize("mu,sigma,bits,clip", [(0.3, 1.0, 8, 0.6), (0.0, 1.0, 4, 1.0), (2.0, 0.05, 8, 1.0),
                                                (-0.5, 2.0, 16, 0.3)])
def test_gaussian_grid_error_matches_monte_carlo(mu, sigma, bits, clip):
    """Rounding and clipping of a Gaussian (restricted to its observed range) on a real grid,
    integrated in closed form, against quantizing a million draws with qtool's quantizer."""
    rng = np.random.default_rng(4)
    x = rng.normal(mu, sigma, 1_000_000)
    lo, hi = float(x.min()), float(x.max())
    e, zp = choose_qparams(lo * clip, hi * clip, bits, False)  # clip < 1 cuts the tails
    L, H = grid_range(e, zp, bits)
    rnd, clipped = gaussian_grid_error(mu, sigma, lo, hi, 2.0**-e, L, H)
    mc = np.mean((dequantize(quantize(x, e, zp, bits), e, zp) - x) ** 2)
    assert rnd + clipped == pytest.approx(mc, rel=0.03)


def test_per_layer_bits_file_round_trip(tmp_path):
    per_layer = [preset_config("int8") for _ in range(3)]
    per_layer[1]["R"] = TensorConfig(16, True, None)
    per_layer[2]["h"] = TensorConfig(16, False, "mse")
    for cfg in per_layer:
        cfg["z_pre"] = TensorConfig(8, False, "kl")
    text = bits_toml("int8", per_layer, "made by a test")
    path = tmp_path / "b.toml"
    path.write_text(text)
    _, config = load_bits(str(path))
    got = model_config(config, 3)
    for l in range(3):
        for name, c in per_layer[l].items():
            if name != "x" or l == 0:
                assert got[l][name] == c, (l, name)
    assert got[2]["x"] == got[1]["h"]  # layer l's input is the h below
    assert "[tensors.z_pre]" in text and "[layers.1.R]" in text and "[layers.2.h]" in text


@pytest.mark.parametrize("body,message", [
    ('[layers.1.x]\nbits = 16\n', "the input of layer 1 is the h of layer 0"),
    ('[layers.one.h]\nbits = 16\n', "layer numbers are integers"),
    ('[layers.0.nope]\nbits = 16\n', "unknown tensor 'nope'"),
    ('[layers.0.h]\nbits = 40\n', "bits of 'h' must be an integer"),
])
def test_per_layer_bits_errors(tmp_path, body, message):
    path = tmp_path / "b.toml"
    path.write_text(body)
    with pytest.raises(QtoolError, match=message):
        load_bits(str(path))


def test_a_layer_the_model_lacks_is_refused(tmp_path):
    path = tmp_path / "b.toml"
    path.write_text("[layers.4.h]\nbits = 16\n")
    _, config = load_bits(str(path))
    with pytest.raises(QtoolError, match="sets layer 4; the model has 2"):
        model_config(config, 2)
