"""How the ranks share a data set: in the chunks one process would use.

Chunk k is sequences [k B, min((k + 1) B, n)) for B = --batch-size, exactly as one process
streams them, so every chunk is computed from the same batch (float GEMMs over a batch give the
same bits only for the same batch). Round j gives chunk j R + r to rank r: the ranks keep in
step, every round ends in one exchange (errors, progress, partial results for the root), and
the root sees the round's chunks in chunk order.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np

from qtool.errors import QtoolError
from qtool.io.files import SequenceData
from qtool.parallel.agree import Failure, exchange, recv


def chunk_bounds(n: int, size: int) -> list[tuple[int, int]]:
    return [(start, min(start + size, n)) for start in range(0, n, size)]


def run_rounds(comm, data: SequenceData, size: int, n: int, work: Callable[[int, np.ndarray], object],
               receive: Callable[[int, object], None] | None = None,
               progress: Callable[[int], None] | None = None) -> None:
    """Every rank calls `work(start, x)` on its chunks; the root gets `receive(start, result)`
    for every chunk in chunk order and `progress(done)` after every round."""
    bounds = chunk_bounds(n, size)
    R, me = comm.Get_size(), comm.Get_rank()
    for first in range(0, len(bounds), R):
        item = None
        if first + me < len(bounds):
            start, stop = bounds[first + me]
            item = (start, work(start, data.chunk(start, stop)))
        items = exchange(comm, item)
        if me == 0:
            for got in items:
                if got is not None and receive is not None:
                    receive(*got)
            if progress:
                progress(bounds[min(first + R, len(bounds)) - 1][1])


def reduce_in_rank_order(comm, value, merge: Callable[[object, object], object]):
    """merge(...merge(v_0, v_1)..., v_{R-1}) on the root (None elsewhere) in a binomial tree:
    log2 R steps, every merge's left operand from lower ranks than its right. A merge that
    fails travels up as a Failure instead of leaving a parent waiting; the root raises it."""
    R, me = comm.Get_size(), comm.Get_rank()
    step = 1
    while step < R:
        if me % (2 * step):
            comm.send(value, dest=me - step, tag=step)
            return None
        if me + step < R:
            other = recv(comm, me + step, step)
            if isinstance(other, Failure) or isinstance(value, Failure):
                value = value if isinstance(value, Failure) else other
            else:
                try:
                    value = merge(value, other)
                except Exception as e:
                    value = Failure.of(me, e)
        step *= 2
    if isinstance(value, Failure):
        raise QtoolError(value.message)
    return value
