"""Histogram-based calibrators: exact, order-independent merges; percentiles against numpy."""

import numpy as np
import pytest
from qtool.calibrators import PercentileObserver, make_observer
from qtool.calibrators.histogram import MAX_BINS, Histogram

from qtool.numerics.qparams import choose_qparams


def parts():
    rng = np.random.RandomState(0)
    return [rng.randn(5000) * s + m for s, m in ((1, 0), (7, 3), (0.05, -2), (40, 0))]


def test_histogram_merge_is_exact_and_order_free():
    ps = parts()
    hs = []
    for p in ps:
        h = Histogram()
        h.add(p)
        hs.append(h)
    whole = Histogram()
    for p in ps:
        whole.add(p)
    a = hs[0].merge(hs[1]).merge(hs[2]).merge(hs[3])
    b = hs[3].merge(hs[2].merge(hs[0])).merge(hs[1])
    for m in (a, b):
        assert (m.w, m.start) == (whole.w, whole.start)
        assert np.array_equal(m.counts, whole.counts)
    assert a.total == 20000 and a.counts.size <= MAX_BINS


def test_merging_bins_of_2e_minus_40_with_bins_of_2e90_is_exact():
    """Tiny values in one chunk and +-1e30 in the next: bin widths 2^130 apart merge by shifting
    each bin index (no 2^130 divisor, which int64 cannot hold)."""
    tiny, huge = np.array([1e-12, 2e-12, 3e-12], np.float32), np.array([1e30, -1e30], np.float32)
    a, b, whole = Histogram(), Histogram(), Histogram()
    a.add(tiny)
    b.add(huge)
    whole.add(np.concatenate([tiny, huge]))
    for merged in (a.merge(b), b.merge(a)):
        assert merged.w == whole.w and merged.start == whole.start
        assert np.array_equal(merged.counts, whole.counts) and merged.total == 5


@pytest.mark.parametrize("value", [0.0, 1.0, -3.5, 1e-300, 1e30])
def test_constant_tensors_get_a_grid_that_holds_them(value):
    """A tensor with one value (a saturated gate, a constant feature) has no span: its bins are
    still finite and the grid each method chooses holds the value (or refuses it in one line)."""
    from qtool.errors import QtoolError
    from qtool.numerics.qparams import dequantize, quantize

    for method in ("percentile", "mse", "kl"):
        o = make_observer(method, "x")
        o.observe(np.full((2, 3), value))
        try:
            e, zp = o.compute_params(8, False)
        except QtoolError as err:
            assert value == 1e30 and "wider than any 8-bit" in str(err)
            continue
        back = dequantize(quantize(np.array([value]), e, zp, 8), e, zp)[0]
        assert abs(back - value) <= 2.0**-e / 2, (method, value, e, zp)


def test_histogram_counts_land_in_the_right_bins():
    h = Histogram()
    h.add(np.array([0.0, 0.24, 0.26, -0.01, 1.0]))
    e = h.edges()
    for v in (0.0, 0.24, 0.26, -0.01, 1.0):
        i = np.searchsorted(e, v, side="right") - 1
        assert h.counts[i] >= 1


@pytest.mark.parametrize("pct", [99.0, 99.9, 100.0])
def test_percentile_range_matches_numpy(pct):
    values = np.concatenate(parts())
    o = PercentileObserver(pct)
    for p in parts():
        o.observe(p[None, :])
    lo, hi = o.range()
    tail = (100 - pct) / 200
    bw = 2.0 ** o.hist.w
    # within one bin: the share of values below lo (above hi) brackets the requested tail
    eps = 1e-9  # (100 - 99.9) / 200 is not exactly 0.0005 in binary
    assert np.mean(values < lo - bw) <= tail + eps and tail - eps <= np.mean(values <= lo + bw)
    assert np.mean(values > hi + bw) <= tail + eps and tail - eps <= np.mean(values >= hi - bw)
    if pct == 100.0:
        assert lo <= values.min() + bw and hi >= values.max() - bw


def test_gate_outputs_keep_min_max():
    assert type(make_observer("percentile", "z_out")).__name__ == "MinMaxObserver"
    assert type(make_observer("percentile", "g_pre")) is PercentileObserver


def samples(kind, n=100000, seed=2):
    rng = np.random.RandomState(seed)
    return {"laplace": lambda: rng.laplace(size=n),
            "outliers": lambda: np.concatenate([rng.randn(n) * 0.5 + 0.3, rng.randn(n // 5000) * 30]),
            "skew": lambda: rng.exponential(size=n) - 0.3}[kind]()


@pytest.mark.parametrize("kind", ["laplace", "outliers", "skew"])
@pytest.mark.parametrize("bits,sym", [(8, True), (8, False), (4, False)])
def test_mse_finds_the_best_power_of_two_grid(kind, bits, sym):
    """Against brute force on the raw samples: quantize, dequantize, average the squared error
    for every exponent near the choice and every zero point; the choice is the best up to the
    histogram's resolution (uniform density inside a bin)."""
    from qtool.calibrators import MseObserver

    from qtool.numerics.qparams import dequantize, qrange, quantize

    v = samples(kind)
    o = MseObserver()
    for part in np.array_split(v, 3):
        o.observe(part[None])
    e, zp = o.compute_params(bits, sym)
    qmin, qmax = qrange(bits)

    def mse(e, zp):
        return np.mean((dequantize(quantize(v, e, zp, bits), e, zp) - v) ** 2)

    best = min(mse(ee, z) for ee in range(e - 3, e + 4) for z in ([0] if sym else range(qmin, qmax + 1)))
    assert mse(e, zp) <= best * 1.01
    if kind == "outliers":  # min/max would keep the outliers; the least error clips them
        lo, hi = o.range()
        assert e > choose_qparams(lo, hi, bits, sym)[0]


def test_mse_search_scores_what_the_bin_by_bin_sum_scores():
    from qtool.calibrators.mse import MseObserver, grid_error

    o = MseObserver()
    o.observe(samples("skew")[None])
    counts, start, lo, hi = o.clamped((-np.inf, np.inf))
    e, zp = o.compute_params(8, False)
    best = grid_error(counts, start, o.hist.w, e, zp, -128, 127)
    for ee in range(e - 1, e + 6):
        for z in range(-128, 128, 5):
            assert grid_error(counts, start, o.hist.w, ee, z, -128, 127) >= best * (1 - 1e-9)


def tvm_kl_threshold(arr, num_bins=8001, num_quantized_bins=255):
    """TVM's `_find_scale_by_kl` (python/tvm/relay/quantize/kl_divergence.py), symmetric int8,
    written out here as the independent reference."""
    th = np.abs(arr).max()
    hist, edges = np.histogram(arr, bins=num_bins, range=(-th, th))
    zero, half = num_bins // 2, num_quantized_bins // 2

    def smooth(p, eps=1e-4):
        zeros = p == 0
        eps1 = eps * zeros.sum() / (p.size - zeros.sum())
        return p + eps * zeros - eps1 * ~zeros

    best, best_t = np.inf, th
    for i in range(half, zero + 1):
        sliced = hist[zero - i:zero + i + 1].astype(np.float64)
        p = sliced.copy()
        p[0] += hist[:zero - i].sum()
        p[-1] += hist[zero + i + 1:].sum()
        m = sliced.size // num_quantized_bins
        q = np.zeros_like(p)
        for j in range(num_quantized_bins):
            a, b = j * m, (None if j == num_quantized_bins - 1 else (j + 1) * m)
            nz = (p[a:b] != 0).sum()
            if nz:
                q[a:b] = sliced[a:b].sum() / nz
        q[p == 0] = 0
        if not q.any():
            continue
        p, q = smooth(p), smooth(q)
        p, q = p / p.sum(), q / q.sum()
        d = np.sum(p * np.log(p / q))
        if d < best:
            best, best_t = d, edges[zero + i + 1]
    return best_t


@pytest.mark.parametrize("kind", ["laplace", "outliers"])
def test_kl_lands_next_to_tvms_threshold(kind):
    """TVM's continuous optimum T, snapped to a power of two, lies between the two neighbouring
    grids; qtool's choice must be one of them."""
    from qtool.calibrators import KlObserver

    v = samples(kind, n=60000)
    o = KlObserver()
    o.observe(v[None])
    e, zp = o.compute_params(8, True)
    top = 128 * 2.0 ** -e  # the grid covers [-top, top)
    t = tvm_kl_threshold(v)
    assert zp == 0 and top / 2 <= t * (1 + 1e-9) and t <= 2 * top * (1 + 1e-9)


def test_kl_and_mse_merge_like_one_pass():
    from qtool.calibrators import KlObserver, MseObserver

    v = samples("outliers")
    for cls in (KlObserver, MseObserver):
        whole, parts = cls(), []
        whole.observe(v[None])
        for p in np.array_split(v, 4):
            parts.append(cls())
            parts[-1].observe(p[None])
        merged = parts[2].merge(parts[0]).merge(parts[3].merge(parts[1]))
        assert merged.compute_params(8, False) == whole.compute_params(8, False)


@pytest.mark.parametrize("sym", [True, False])
def test_kl_ignores_exact_zeros(sym):
    """Exact zeros sit on a level of every grid: they add no evidence for any, so a share of them
    (zero-padded steps, silent frames, zero pixels) must not move kl's choice. Observed in two
    batches, so the count of zeros also goes through a merge."""
    from qtool.calibrators import KlObserver

    v = samples("laplace", n=40000)
    with_zeros = np.concatenate([v, np.zeros(30000)])
    plain, parts = KlObserver(), [KlObserver(), KlObserver()]
    plain.observe(v[None])
    for o, part in zip(parts, np.array_split(np.random.RandomState(1).permutation(with_zeros), 2)):
        o.observe(part[None])
    merged = parts[0].merge(parts[1])
    assert merged.compute_params(8, sym) == plain.compute_params(8, sym)
    assert merged.hist.zeros == 30000


def test_kl_keeps_a_sparse_inputs_gemm_output():
    """Regression: a GRU reading sparse inputs (half the steps exactly 0, the rest pixel-like
    levels) makes Wx = W x exactly 0 on those steps. kl used to let that spike pick a grid a
    step or two finer than a bin, clipping every negative Wx onto it ([0, 0.249] instead of
    [-1.84, 1.92]) and the output collapsed (-2.8 dB against 17.9 dB with min/max)."""
    from conftest import calibrated, random_model

    from qtool.engine.cpu import run_int
    from qtool.numerics.float_gru import run_float
    from qtool.numerics.qparams import dequantize

    def sparse(n, seed):
        rng = np.random.RandomState(seed)
        x = rng.randint(0, 17, size=(n, 24, 2)) / 16.0
        x[rng.rand(n, 24) < 0.5] = 0.0
        return x

    model = random_model(C=2, H=8, seed=1, scale=0.8)
    x_calib, x_test = sparse(64, 0), sparse(64, 1)
    wx = np.einsum("gc,ntc->ntg", model.layers[0][0].W, x_calib)
    ref = run_float(model, x_test)
    snr = {}
    for method in ("minmax", "kl"):
        q = calibrated(model, x_calib, method=method)
        s = q.cells[0][0].spec
        clipped = np.mean((wx < s["Wx"].lo) | (wx > s["Wx"].hi))
        if method == "kl":
            assert clipped < 0.01, (s["Wx"].exp2_inv, s["Wx"].zp, clipped)
        y = dequantize(run_int(q, x_test), s["h"].exp2_inv, s["h"].zp)
        snr[method] = 10 * np.log10(np.sum(ref**2) / np.sum((y - ref) ** 2))
    assert snr["kl"] > snr["minmax"] - 6.0, snr


def test_kl_does_not_collapse_on_a_relu_fed_input():
    """Regression: a ReLU-fed input (63% exact zeros, a long positive tail) let kl score a grid
    with the data on one or two of its levels (the rest clipped into them), where P ~ Q and
    KL ~ 0: it picked [0, 2^-8] for data reaching 16 (a GRU reading it fell to -0.4 dB output SNR
    against 22 dB with min/max)."""
    from qtool.calibrators import KlObserver

    rng = np.random.default_rng(0)
    n, T, C = 384, 50, 32
    base = np.abs(np.sin(np.linspace(0, 6, T))[None, :, None] * rng.normal(1, 0.3, (n, 1, C)))
    noisy = base + rng.standard_t(3.0, (n, T, C)) * 0.3
    v = np.maximum(noisy @ np.random.default_rng(7).normal(0, C**-0.5, (C, C)), 0.0) * 2.0
    o = KlObserver()
    o.observe(v.reshape(n, -1))
    e, zp = o.compute_params(8, False)
    lo, hi = (-128 - zp) * 2.0**-e, (127 - zp) * 2.0**-e
    assert lo <= 0.0 and np.mean(v > hi) < 0.01, (e, zp, hi)
