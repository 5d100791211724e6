"""A whole model's simulation over the ranks of `mpiexec`: every rank measures its chunks
(qtool.graph.simulate.measure_chunk), the root folds them in chunk order (the very float
additions of one process, so the numbers equal one process's bit for bit) and every rank gets
the result."""

from __future__ import annotations

from collections.abc import Callable

import numpy as np

from qtool.core.qgraph import QGraph
from qtool.graph.simulate import GraphSimulation, check_inputs, finish, fold, measure_chunk
from qtool.io.files import SequenceData
from qtool.parallel.agree import agreed
from qtool.parallel.rounds import run_rounds


def simulate_graph(comm, qg: QGraph, data: SequenceData, n: int, chunk: int, labels: np.ndarray | None,
                   keep: bool, progress: Callable[[int], None] | None = None, runner=None,
                   mode: str = "integer") -> GraphSimulation:
    check_inputs(qg, data, n, labels)
    state: dict = {"total": None}

    def work(start: int, x: np.ndarray) -> GraphSimulation:
        lab = None if labels is None else labels[start:start + len(x)]
        return measure_chunk(qg, x, lab, keep, runner, mode)

    def receive(start: int, part: GraphSimulation) -> None:
        state["total"] = fold(state["total"], part)

    with agreed(comm):
        run_rounds(comm, data, chunk, n, work, receive, progress)
    root = comm.Get_rank() == 0
    return comm.bcast(finish(state["total"]) if root else None, root=0)
