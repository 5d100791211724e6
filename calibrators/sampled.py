"""The precision-speculation estimator (docs/advisor.md): the absmax M of all values, and the bulk
distribution N(mu, sigma) from K independent samples at rate gamma, keeping the sample with the
smallest variance ("multi negative sampling": a sample that missed every outlier has the least
variance, so no outlier criterion is needed).

Each sample takes every value with probability gamma. Instead of one random number per value,
the kernel draws the gap to the next sampled value from the geometric distribution
`floor(log(u) / log(1 - gamma))`, which selects exactly the same way (independent Bernoulli
trials) at a cost of gamma * K random numbers per value. Gaps carry over from one batch to the
next, so a stream of batches is sampled like one long array. The random numbers are splitmix64,
seeded per observer: the same seed, data and batches give the same statistics.

Statistics are the estimator's sums (N, X = sum x, X2 = sum x^2) per sample, plus the exact
min/max and the sums over all values; merging adds sums and takes extremes, so observers of
other batches, files or processes combine into K samples of the union.
"""

from __future__ import annotations

import math
import zlib
from dataclasses import dataclass

import numpy as np
from numba import njit
from qtool.calibrators.base import Observer

GAMMA = 0.01
K = 5
MIN_SAMPLE = 30  # a sample with fewer values cannot tell a variance; fall back to all values


@njit(cache=True)
def _splitmix(state: np.uint64) -> tuple[np.uint64, float]:
    """The next state and a uniform number in (0, 1] (splitmix64, 53 random bits)."""
    state = state + np.uint64(0x9E3779B97F4A7C15)
    z = state
    z = (z ^ (z >> np.uint64(30))) * np.uint64(0xBF58476D1CE4E5B9)
    z = (z ^ (z >> np.uint64(27))) * np.uint64(0x94D049BB133111EB)
    z = z ^ (z >> np.uint64(31))
    return state, (float(z >> np.uint64(11)) + 1.0) * 2.0**-53


@njit(cache=True)
def _gap(state: np.uint64, log1m_gamma: float) -> tuple[np.uint64, int]:
    """Values skipped before the next sampled one: geometric, P(gap = g) = (1-gamma)^g gamma."""
    state, u = _splitmix(state)
    return state, int(math.floor(math.log(u) / log1m_gamma))


@njit(cache=True)
def _observe(v, log1m_gamma, states, gaps, sums, full, extremes):
    """Feed flat float values: extremes [lo, hi], full sums [N, X, X2] and per sample k the sums
    sums[k] = [N, X, X2] of the values it selects; gaps[k] is where sample k picks next."""
    n = v.size
    lo, hi = extremes[0], extremes[1]
    s1, s2 = 0.0, 0.0
    for i in range(n):
        x = float(v[i])
        lo = min(lo, x)
        hi = max(hi, x)
        s1 += x
        s2 += x * x
    extremes[0], extremes[1] = lo, hi
    full[0] += n
    full[1] += s1
    full[2] += s2
    for k in range(states.size):
        i = gaps[k]
        state = states[k]
        while i < n:
            x = float(v[i])
            sums[k, 0] += 1.0
            sums[k, 1] += x
            sums[k, 2] += x * x
            state, g = _gap(state, log1m_gamma)
            i += 1 + g
        gaps[k] = i - n
        states[k] = state


def observer_seed(seed: int, key: str) -> int:
    """A 64-bit stream seed for one tensor: the user's seed mixed with the tensor's name."""
    return (int(seed) * 0x100000001B3 + zlib.crc32(key.encode())) & (2**64 - 1)


@dataclass(frozen=True)
class BulkStats:
    """The estimate: bulk N(mu, sigma) from the least-variance sample, absmax M, the exact
    extremes, mean and mean square over all values (the signal power). `n_sample`: values in the
    chosen sample, `n`: all values."""

    mu: float
    sigma: float
    M: float
    lo: float
    hi: float
    mean: float
    mean_square: float
    n_sample: int
    n: int


class SampledStatsObserver(Observer):
    def __init__(self, gamma: float = GAMMA, k: int = K, seed: int = 0) -> None:
        if not 0.0 < gamma <= 1.0 or k < 1:
            raise ValueError("gamma must be in (0, 1] and K at least 1")
        self.gamma, self.k = gamma, k
        self.log1m_gamma = math.log1p(-gamma) if gamma < 1.0 else -math.inf  # gamma 1: every gap 0
        self.states = np.array([observer_seed(seed, str(i)) for i in range(k)], np.uint64)
        self.gaps = np.zeros(k, np.int64)
        for i in range(k):  # the first sampled value's position
            self.states[i], self.gaps[i] = _gap(self.states[i], self.log1m_gamma)
        self.sums = np.zeros((k, 3))
        self.full = np.zeros(3)
        self.extremes = np.array([np.inf, -np.inf])

    def observe(self, values: np.ndarray) -> None:
        v = np.ascontiguousarray(values).ravel()
        if v.size:
            _observe(v, self.log1m_gamma, self.states, self.gaps, self.sums, self.full, self.extremes)

    def merge(self, other: Observer) -> Observer:
        if not isinstance(other, SampledStatsObserver) or (other.gamma, other.k) != (self.gamma, self.k):
            raise ValueError("merge needs an estimator with the same gamma and K")
        out = SampledStatsObserver.__new__(SampledStatsObserver)
        out.__dict__.update(self.__dict__)
        out.states, out.gaps = self.states.copy(), self.gaps.copy()
        out.sums = self.sums + other.sums
        out.full = self.full + other.full
        out.extremes = np.array([min(self.extremes[0], other.extremes[0]),
                                 max(self.extremes[1], other.extremes[1])])
        return out

    def range(self) -> tuple[float, float]:
        return (0.0, 0.0) if self.empty else (float(self.extremes[0]), float(self.extremes[1]))

    @property
    def empty(self) -> bool:
        return self.full[0] == 0

    def stats(self) -> BulkStats:
        """mu = X / N, sigma = sqrt(X2 / N - mu^2) of the sample with the least variance
        (docs/advisor.md); M = max |x| over all values."""
        if self.empty:
            return BulkStats(0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0, 0)
        lo, hi = self.range()
        n_all, s1, s2 = self.full
        best = None
        for n, x, x2 in self.sums:
            if n >= MIN_SAMPLE:
                mu = x / n
                var = max(x2 / n - mu * mu, 0.0)
                if best is None or var < best[1]:
                    best = (mu, var, int(n))
        if best is None:  # too few values for any sample: all of them are the bulk
            mu = s1 / n_all
            best = (mu, max(s2 / n_all - mu * mu, 0.0), int(n_all))
        mu, var, n_sample = best
        return BulkStats(float(mu), math.sqrt(var), max(-lo, hi), lo, hi, float(s1 / n_all),
                         float(s2 / n_all), n_sample, int(n_all))
