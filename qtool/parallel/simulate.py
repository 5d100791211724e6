"""Distributed simulation: every rank simulates its chunks (qtool.parallel.rounds) into per-chunk
partial statistics (qtool.simulation.fold); the root folds them in chunk order, which is the very
sequence of float additions one process performs, so the metrics equal one process's bit for
bit, in every --mode. With --save the root also receives every chunk's outputs and writes them
at their sequence offsets (qtool.io.results), the only rank that writes the file.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import numpy as np

from qtool.core.qmodel import QuantModel
from qtool.io.files import SequenceData
from qtool.parallel.agree import agreed
from qtool.parallel.rounds import run_rounds
from qtool.simulation.fold import chunk_stats, fold_in_chunk_order
from qtool.simulation.run import Simulation


class Merged:
    """What every rank returns: the root's folded results."""

    def __init__(self, res: dict):
        self.res = res

    def results(self) -> dict:
        return self.res


def simulate(comm, qm: QuantModel, data: SequenceData, chunk: int, per_tensor: bool, n: int, runner,
             progress: Callable[[int, int], None] | None = None, save: Path | None = None,
             mode: str = "integer") -> Merged:
    """qtool.simulation.run.simulate over the ranks of `comm` (with --save: written by rank 0)."""
    data.check_features(qm.model.input_size)
    sim = Simulation(qm, per_tensor, runner, mode)  # the root's accumulator; elsewhere a chunk runner
    root = comm.Get_rank() == 0

    def work(start: int, x: np.ndarray) -> tuple:
        stats, outs = chunk_stats(sim, x)
        return stats, (outs if save is not None else None)

    def loop(on_chunk: Callable | None) -> None:
        def receive(start: int, got: tuple) -> None:
            fold_in_chunk_order(sim, [(start, got[0])])  # run_rounds delivers chunks in order
            if on_chunk is not None:
                on_chunk(start, *got[1])

        report = (lambda done: progress(done, n)) if progress and on_chunk is None else None
        run_rounds(comm, data, chunk, n, work, receive, report)

    res = None
    with agreed(comm):
        if root and save is not None:
            from qtool.io.results import write_results

            write_results(save, qm, data, n, loop, progress, mode)
        else:
            loop(None)
        if root:
            res = sim.results()
    return Merged(comm.bcast(res, root=0))
