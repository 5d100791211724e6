"""Distributed simulation: every rank simulates its chunks (qtool.dist.rounds) into per-chunk
partial statistics; the root folds them in chunk order, which is the very sequence of float
additions one process performs (it adds chunk after chunk into zeroed accumulators), so the
metrics equal one process's bit for bit. With --save the root also receives every chunk's
outputs in sequence order and is the only rank that writes the results file.

What the fold relies on (qtool.simulation / qtool.metrics): `Simulation.run_chunk(x)` adds one
chunk into the accumulators `output` (a Distance), `steps` (a Distance per time step) and
`tensors` (a Distance per tensor, besides the weights' ones made at construction), and
`Distance.merge(a, b)` adds b's sums to a's, so that zero + chunk 0, then + chunk 1, ... equals
adding the chunks one after another.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import numpy as np

from qtool.dist.agree import agreed
from qtool.dist.rounds import run_rounds
from qtool.fileio import SequenceData
from qtool.metrics import Distance
from qtool.qmodel import QuantModel
from qtool.simulation import Simulation


def chunk_partial(sim: Simulation, x: np.ndarray, keep_outputs: bool) -> tuple:
    """Simulate one chunk into fresh accumulators: (output, steps, tensors), and the outputs."""
    kept = sim.output, sim.steps, sim.tensors
    sim.output, sim.steps, sim.tensors = Distance(), [], {}
    try:
        outs = sim.run_chunk(x)
        return (sim.output, sim.steps, sim.tensors), (outs if keep_outputs else None)
    finally:
        sim.output, sim.steps, sim.tensors = kept


def fold(acc: Simulation, partial: tuple) -> None:
    """Add one chunk's partial statistics into `acc`, as run_chunk would have."""
    output, steps, tensors = partial
    acc.output = acc.output.merge(output)
    for t, d in enumerate(steps):
        if t < len(acc.steps):
            acc.steps[t] = acc.steps[t].merge(d)
        else:
            acc.steps.append(Distance().merge(d))
    for key, d in tensors.items():
        acc.tensors[key] = acc.tensors.get(key, Distance()).merge(d)


class Merged:
    """What every rank returns: the root's folded results."""

    def __init__(self, res: dict):
        self.res = res

    def results(self) -> dict:
        return self.res


def simulate(comm, qm: QuantModel, data: SequenceData, chunk: int, per_tensor: bool, n: int, runner,
             progress: Callable[[int, int], None] | None = None, save: Path | None = None) -> Merged:
    """qtool.simulation.simulate over the ranks of `comm` (with --save: written by rank 0)."""
    data.check_features(qm.model.input_size)
    sim = Simulation(qm, per_tensor, runner)  # the root's accumulator; elsewhere a chunk runner
    root = comm.Get_rank() == 0

    def work(start: int, x: np.ndarray) -> tuple:
        return chunk_partial(sim, x, save is not None)

    def loop(on_chunk: Callable | None) -> None:
        def receive(start: int, got: tuple) -> None:
            fold(sim, got[0])
            if on_chunk is not None:
                on_chunk(start, *got[1])

        report = (lambda done: progress(done, n)) if progress and on_chunk is None else None
        run_rounds(comm, data, chunk, n, work, receive, report)

    res = None
    with agreed(comm):
        if root and save is not None:
            from qtool.results import write_results

            write_results(save, qm, data, n, loop, progress)
        else:
            loop(None)
        if root:
            res = sim.results()
    return Merged(comm.bcast(res, root=0))
