"""What `qtool report` draws, computed without any plotting library.

The numbers come from `qtool simulate`'s own Simulation (the same Distance per tensor, per time
step and at the output, so the report and `simulate` agree to the last digit); the report only
adds what the pictures need, kept in bounded memory however much data it runs over:
- per tensor, a histogram of the float reference values (qtool.calibrators.histogram.Histogram:
  streamed, at most 8192 bins; numpy's float GRU traced per chunk, as the engine keeps no traces), the
  grid's representable interval and the calibrated range;
- per weight channel, the float range, the calibrated range and the grid;
- the float and the dequantized integer output of the first few sequences.
A quantized whole model's report (`collect_graph`) gathers the same for each of its GRUs, each
on its own input.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np

from qtool.calibrators.histogram import Histogram
from qtool.core.qgraph import QGraph
from qtool.core.qmodel import QuantModel, TensorQ
from qtool.core.tensors import BY_NAME, cell_names
from qtool.io.files import SequenceData
from qtool.layers import layer
from qtool.numerics.rescale import qrange
from qtool.simulation.run import Simulation, tensor_key

if TYPE_CHECKING:
    from qtool.graph.simulate import GraphSimulation

DISPLAY_BINS = 160  # bars per histogram: enough to see a shape, small enough for the page
GRID_VIEW = 4.0     # a grid wider than this many times the data's span is noted, not drawn
VIEW_PAD = 0.04     # share of the view left empty on either side


def grid_interval(exp2_inv, zp: int, bits: int) -> tuple[np.ndarray, np.ndarray]:
    """The values a grid holds without clipping: [(qmin - zp - 1/2) s, (qmax - zp + 1/2) s),
    s = 2^-exp2_inv (per channel when exp2_inv is an array); the bounds count_clipped uses."""
    qmin, qmax = qrange(bits)
    s = np.ldexp(1.0, -np.asarray(exp2_inv, np.int64))
    return (qmin - zp - 0.5) * s, (qmax - zp + 0.5) * s


@dataclass
class TensorView:
    """One tensor's histogram and its grid. Per-channel tensors (W, R, bx, br) are shown in
    units of their channel's step (`levels`), where every channel has the same grid."""

    key: str
    name: str
    spec: TensorQ
    levels: bool
    grid: tuple[float, float]
    calibrated: tuple[float, float] | None
    data: tuple[float, float]
    edges: np.ndarray
    counts: np.ndarray
    distance: dict  # Distance.as_dict() of simulate: snr_db, exact, saturated (the clipped share)...

    @property
    def grid_in_view(self) -> bool:
        return self.edges[0] <= self.grid[0] and self.grid[1] <= self.edges[-1]


@dataclass
class ChannelView:
    """A weight tensor's float range and calibrated range per output channel (gate blocks
    z | r | g), in units of each channel's step: every channel's grid is then the same,
    `grid` (levels), and the bars show how much of it each channel uses."""

    key: str
    name: str
    exp2_inv: np.ndarray
    lo: np.ndarray
    hi: np.ndarray
    calibrated_lo: np.ndarray
    calibrated_hi: np.ndarray
    grid: tuple[float, float]


@dataclass
class ReportData:
    results: dict          # Simulation.results(): what `qtool simulate --json` prints
    steps: list[dict]      # per time step: Distance.as_dict() of the output, and its rms_error
    tensors: list[TensorView]
    channels: list[ChannelView]
    y_float: np.ndarray    # [S, T, H * directions]: the first S sequences' float output
    y_quant: np.ndarray    # the same, dequantized from the integer GRU
    samples: int


def display_bins(h: Histogram, lo: float, hi: float, bins: int = DISPLAY_BINS) -> tuple[np.ndarray, np.ndarray]:
    """(edges, counts) of `h` on bins of width 2^W covering [lo, hi] in at most about `bins`
    bars. The histogram's bins are 2^w wide and aligned at 0, so whole groups of them add up
    exactly into each wider bin."""
    W = max(h.w, math.ceil(math.log2(max(hi - lo, 2.0**h.w) / bins)))
    first, last = math.floor(lo / 2.0**W), math.floor(hi / 2.0**W)
    k = np.arange(h.start, h.start + h.counts.size)
    if W - h.w < 63:
        idx = np.floor_divide(k, 1 << (W - h.w)) - first
    else:  # a histogram this fine holds a tensor of zeros (an unused bias): its bins fall at 0
        idx = np.floor(k * 2.0 ** (h.w - W)).astype(np.int64) - first
    counts = np.bincount(idx, weights=h.counts, minlength=last - first + 1).astype(np.int64)
    return (first + np.arange(counts.size + 1)) * 2.0**W, counts


def _view(key: str, name: str, spec: TensorQ, h: Histogram, distance: dict) -> TensorView:
    levels = BY_NAME[name].per_channel
    g_lo, g_hi = grid_interval(0 if levels else spec.exp2_inv, spec.zp, spec.bits)
    grid = (float(g_lo), float(g_hi))
    calibrated = None if levels else (float(spec.lo), float(spec.hi))
    lo, hi = h.lo, h.hi
    if calibrated:
        lo, hi = min(lo, calibrated[0]), max(hi, calibrated[1])
    if grid[1] - grid[0] <= GRID_VIEW * max(hi - lo, 0.0) or hi <= lo:
        lo, hi = min(lo, grid[0]), max(hi, grid[1])
    pad = VIEW_PAD * (hi - lo)  # so that the grid's ends show as edges, not as the frame
    edges, counts = display_bins(h, lo - pad, hi + pad)
    return TensorView(key, name, spec, levels, grid, calibrated, (h.lo, h.hi), edges, counts, distance)


class ReportSimulation(Simulation):
    """`qtool simulate`'s Simulation that also streams every tensor's float values into a
    histogram and keeps the output of the first `keep` sequences."""

    def __init__(self, qm: QuantModel, runner, keep: int):
        super().__init__(qm, True, runner)
        self.keep = keep
        self.hists: dict[str, Histogram] = {}
        self.kept: list[tuple[np.ndarray, np.ndarray]] = []
        for l, cells in enumerate(qm.cells):
            for d, cq in enumerate(cells):
                cell = qm.model.layers[l][d]
                for name in ("W", "R", "bx", "br"):  # in units of each channel's step
                    e = np.asarray(cq.spec[name].exp2_inv, np.int64)
                    v = getattr(cell, name).astype(np.float64)
                    self._hist(tensor_key(l, d, name)).add(np.ldexp(v, e.reshape(-1, *[1] * (v.ndim - 1))))

    def _hist(self, key: str) -> Histogram:
        return self.hists.setdefault(key, Histogram())

    def run_chunk(self, x: np.ndarray):
        y_float, y_q, y_int = super().run_chunk(x)
        have = sum(len(a) for a, _ in self.kept)
        if have < self.keep:
            self.kept.append((y_float[:self.keep - have], y_q[:self.keep - have]))
        return y_float, y_q, y_int

    def wants_float_traces(self) -> bool:
        return True

    def float_traces(self, ftr: list) -> None:
        for l, cells in enumerate(ftr):
            for d, trace in enumerate(cells):
                for name, values in trace.items():
                    self._hist(tensor_key(l, d, name)).add(values)


def _channels(qm: QuantModel) -> list[ChannelView]:
    out = []
    for l, cells in enumerate(qm.cells):
        for d, cq in enumerate(cells):
            cell = qm.model.layers[l][d]
            for name in ("W", "R"):
                s = cq.spec[name]
                v = getattr(cell, name).astype(np.float64)
                e = np.broadcast_to(np.asarray(s.exp2_inv, np.int64), v.shape[:1])
                g_lo, g_hi = grid_interval(0, s.zp, s.bits)
                out.append(ChannelView(tensor_key(l, d, name), name, e, np.ldexp(v.min(axis=1), e),
                                       np.ldexp(v.max(axis=1), e), np.ldexp(np.broadcast_to(s.lo, e.shape), e),
                                       np.ldexp(np.broadcast_to(s.hi, e.shape), e), (float(g_lo), float(g_hi))))
    return out


class Collector:
    """`collect` a chunk at a time, from wherever the chunks come (`add`), then `finish`."""

    def __init__(self, qm: QuantModel, keep: int = 3, runner=None):
        from qtool.engine.cpu import run_model

        self.qm = qm
        self.sim = ReportSimulation(qm, runner or run_model, keep)
        self.samples = 0

    def add(self, x: np.ndarray) -> None:
        self.sim.run_chunk(x)
        self.samples += len(x)

    def finish(self) -> ReportData:
        qm, sim = self.qm, self.sim
        results = sim.results()
        tensors = [_view(tensor_key(l, d, name), name, cq.spec[name], sim.hists[tensor_key(l, d, name)],
                         results["tensors"][tensor_key(l, d, name)])
                   for l, cells in enumerate(qm.cells) for d, cq in enumerate(cells) for name in cell_names(cq.form)]
        y_float = np.concatenate([a for a, _ in sim.kept])
        y_quant = np.concatenate([b for _, b in sim.kept])
        steps = [{**s.as_dict(), "rms_error": math.sqrt(s.err2 / s.count)} for s in sim.steps]
        return ReportData(results, steps, tensors, _channels(qm),
                          y_float, y_quant, self.samples)


def collect(qm: QuantModel, data: SequenceData, n: int, *, keep: int = 3, batch_size: int = 256,
            runner=None, progress=None) -> ReportData:
    """Run the integer and the float GRU over the first `n` sequences of `data` (in chunks of
    `batch_size`, so memory stays bounded) and gather everything the report draws."""
    c = Collector(qm, keep, runner)
    for start, x in data.chunks(batch_size, n):
        c.add(x)
        if progress:
            progress(start + len(x), n)
    return c.finish()


def collect_graph(qg: QGraph, data: SequenceData, n: int, *, batch_size: int = 256, runner=None,
                  progress=None) -> tuple[GraphSimulation, dict[str, ReportData]]:
    """A whole model's simulation (qtool.graph.simulate, as `simulate` runs it) and, per GRU node
    of its core, what the report of that GRU alone draws (`collect`), run on the GRU's own input:
    the float graph's values at its input edge, which the simulation computes for its reference
    chunk by chunk (the input the GRU was calibrated on, qtool.graph.calibrate). So each GRU's
    tensors are measured on their own, free of the error the layers before it pass on."""
    from qtool.graph.simulate import simulate_graph

    grus = {name: Collector(qg.qparams[name]["qm"], 1, runner) for name in qg.grus}

    def observe(ref: dict[str, np.ndarray]) -> None:
        for name, c in grus.items():
            node = qg.node(name)
            c.add(np.ascontiguousarray(layer(node.op, node.label).sequences(node, ref[node.inputs[0]]), np.float32))

    sim = simulate_graph(qg, data, n, batch_size, progress=progress, runner=runner, observe=observe)
    return sim, {name: c.finish() for name, c in grus.items()}
