"""Histogram-based calibrators: exact, order-independent merges; percentiles against numpy."""

import numpy as np
import pytest

from calibrators import PercentileObserver, make_observer
from calibrators.histogram import MAX_BINS, Histogram


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
