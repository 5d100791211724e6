"""Distributed calibration: every rank observes its chunks (qtool.parallel.rounds); the observers
then merge into exactly the state one process reaches by observing every chunk in order.

- minmax: the union of ranges, exact in any order.
- percentile, mse, kl (histograms): the counts on a grid of width 2^w are the counts of any
  finer aligned grid added in groups, so they merge exactly; but the width a histogram ends with
  depends on the order its batches came in (each batch may widen the bins so that the span seen
  so far, measured on the aligned grid, fits). So every rank logs its histogram's extent after
  each chunk, the root replays one process's sequence of widths from the logs in chunk order (a
  scratch histogram fed the extents), and re-bins the counts onto that width.
- ema: the EMA (docs/calibration.md) is a recurrence over time steps in data order; every rank
  logs each chunk's per-step minima and maxima and the root runs the recurrence over them in
  chunk order.

The ranks' states (counts on a common width, logs) merge exactly in any grouping, so they
reduce in a binomial tree (log2 R steps); the root finishes with the replays.
"""

from __future__ import annotations

import copy
import functools

import numpy as np

from qtool.calibration.observe import MethodPlan, Observers, new_observers, observe_batch
from qtool.calibrators.base import Observer
from qtool.calibrators.ema import EmaObserver
from qtool.calibrators.histogram import Histogram, HistogramObserver
from qtool.core.model import GruModel
from qtool.io.files import SequenceData
from qtool.parallel.agree import agreed
from qtool.parallel.rounds import reduce_in_rank_order, run_rounds


class Logged:
    """An observer that also logs, per chunk (`clock[0]`: the chunk's first sequence), what the
    exact merge needs. A rank's histogram extent after chunk k stands in for chunk k's own
    extent: both give the same width step, because the part of the rank's extent that chunk k
    did not add lies inside the extent one process has seen by then (earlier chunks)."""

    def __init__(self, inner: Observer, clock: list[int]):
        self.inner = inner
        self.clock = clock
        self.log: list[tuple] = []

    def observe(self, values: np.ndarray) -> None:
        self.inner.observe(values)
        if not np.size(values):
            return
        if isinstance(self.inner, HistogramObserver):
            self.log.append((self.clock[0], self.inner.hist.lo, self.inner.hist.hi))
        elif isinstance(self.inner, EmaObserver):
            flat = values.reshape(values.shape[0], -1)
            self.log.append((self.clock[0], flat.min(axis=1), flat.max(axis=1)))


def map_observers(obs: Observers, f) -> Observers:
    """f applied to every observer of a set (layers, directions, tensors)."""
    return [[{name: f(o) for name, o in cell.items()} for cell in layer] for layer in obs]


def _histogram_on(parts: list[Histogram], w: int) -> Histogram:
    """The sum of histograms re-binned onto width 2^w (exact: aligned power-of-two bins)."""
    out = Histogram(w)
    for h in parts:
        out.zeros += h.zeros
        if not h.counts.size:
            continue
        if h.w > w:
            raise RuntimeError(f"a rank's histogram is coarser (2^{h.w}) than one process's (2^{w})")
        c = copy.deepcopy(h)
        c._coarsen(w)
        out._add_counts(c.start, c.counts)
        out.lo, out.hi = min(out.lo, h.lo), max(out.hi, h.hi)
    return out


def merge_pair(left: tuple[Observer, list], right: tuple[Observer, list]) -> tuple[Observer, list]:
    """Two partial states (observer, log) of disjoint chunks as one: exact and associative, so
    the ranks can merge in a tree. Histograms add on the coarser of their widths (still at most
    one process's), logs concatenate; the final width and the EMA come in `finish`."""
    (a, log_a), (b, log_b) = left, right
    if isinstance(a, HistogramObserver):
        widths = [h.w for h in (a.hist, b.hist) if h.counts.size]
        out = copy.copy(a)
        out.hist = _histogram_on([a.hist, b.hist], max(widths)) if widths else a.hist
        return out, log_a + log_b
    if isinstance(a, EmaObserver):
        return a, log_a + log_b  # the recurrence is replayed from the logs in `finish`
    return a.merge(b), []


def finish(state: tuple[Observer, list]) -> Observer:
    """The merged state as one process's observer: histograms on the width one process ends
    with (replayed from the extents in chunk order), the EMA replayed in chunk order."""
    obs, log = state
    log = sorted(log, key=lambda e: e[0])  # stable: a chunk's entries keep their order
    if isinstance(obs, HistogramObserver) and log:
        out = copy.copy(obs)
        out.hist = _histogram_on([obs.hist], _final_width(log))
        return out
    if isinstance(obs, EmaObserver):
        ema = EmaObserver()
        for _, lo, hi in log:
            ema.observe(np.stack([lo, hi], axis=1))
        return ema
    return obs


def _final_width(log: list) -> int:
    """The bin width one process's histogram ends with, from the extents logged in chunk order.
    A scratch histogram is fed, per chunk, the extent seen so far by all ranks (which gives the
    same width steps as the chunk's own extent), skipping a repeat of an input that left the
    scratch's grid unchanged (the same input on the same grid leaves it unchanged again), so a
    long run costs one add per change, not per chunk."""
    widths = Histogram()
    lo, hi = np.inf, -np.inf
    fixed = None
    for _, chunk_lo, chunk_hi in log:
        lo, hi = min(lo, chunk_lo), max(hi, chunk_hi)
        grid = (widths.w, widths.start, widths.counts.size)
        if (lo, hi, grid) == fixed:
            continue
        widths.add(np.array([lo, hi]))
        fixed = (lo, hi, grid) if (widths.w, widths.start, widths.counts.size) == grid else None
    return widths.w


def merge_logged(parts: list[tuple[Observer, list]]) -> Observer:
    """One observer from every rank's (observer, log), equal to one process's."""
    return finish(functools.reduce(merge_pair, parts))


def collect_many(comm, model: GruModel, data: SequenceData, plans: list[MethodPlan | str], chunk: int,
                 n: int, progress=None) -> list[Observers]:
    """qtool.calibration.observe.collect_many over the ranks of `comm`: the same observers on every
    rank, equal to one process's."""
    data.check_features(model.input_size)
    clock = [0]
    sets = [map_observers(new_observers(model, p), lambda o: Logged(o, clock)) for p in plans]
    traces: list = []

    def work(start: int, x: np.ndarray) -> None:
        clock[0] = start
        observe_batch(model, x, *sets, traces=traces)

    merged = None
    with agreed(comm):
        run_rounds(comm, data, chunk, n, work, progress=progress)
        states = [map_observers(s, lambda o: (o.inner, o.log)) for s in sets]
        states = reduce_in_rank_order(comm, states, _merge_sets)
        if comm.Get_rank() == 0:
            merged = [map_observers(s, finish) for s in states]
    return comm.bcast(merged, root=0)


def _merge_sets(a: list[Observers], b: list[Observers]) -> list[Observers]:
    return [zip_observers(merge_pair, x, y) for x, y in zip(a, b)]


def zip_observers(f, a: Observers, b: Observers) -> Observers:
    """f applied to the observers of two sets of the same model and plan, pairwise."""
    return [[{name: f(o, b[l][d][name]) for name, o in cell.items()} for d, cell in enumerate(layer)]
            for l, layer in enumerate(a)]
