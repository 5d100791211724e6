"""Ranks that fail together: every collective step of a distributed run is an `exchange`, which
also carries each rank's outcome, so an error on any rank reaches every rank at the next step
instead of leaving the others blocked in a collective.

A rank that fails sends a `Failure` in the exchange the others are waiting in (whichever step
that is: every step is the same gather + broadcast pair, so they always match); the root picks
the first failure in rank order and every rank raises it as an `AgreedError`. `agreed()` wraps a
distributed block: a local error becomes a Failure at the next exchange, and success ends with
one last exchange, so a rank that fails after everybody else finished is heard too.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass

from qtool.errors import QtoolError, ignore_stop_signals

AGREED = "qtool_agreed"  # set on a rank's own exception once every rank has agreed on it


@dataclass
class Failure:
    rank: int
    message: str

    @classmethod
    def of(cls, rank: int, e: BaseException) -> Failure:
        if isinstance(e, QtoolError):
            return cls(rank, str(e))
        return cls(rank, f"internal error on rank {rank}: {type(e).__name__}: {e}")


class AgreedError(QtoolError):
    """A failure every rank raises at the same step (the first failing rank's message)."""

    def __init__(self, failure: Failure):
        super().__init__(failure.message)
        self.failure = failure


EXCHANGE_TAG = 30000  # apart from reduce_in_rank_order's tags (powers of two below the rank count)
STOP_TAG = 30001      # a rank stopped by a signal tells rank 0 (qtool.parallel.stop_every_rank)
POLL_S = 0.001


class RankStopped(BaseException):
    """Another rank was stopped by a signal that this one did not get (a scheduler or the OOM
    killer stops one process): unwind as if interrupted, so that temporary files are removed
    before that rank's MPI_Abort ends every rank. A BaseException, like KeyboardInterrupt:
    `agreed` must not turn it into an exchange that the stopped rank will never join."""

    def __init__(self, rank: int, signum: int):
        super().__init__(f"rank {rank} stopped by signal {signum}")
        self.rank, self.signum = rank, signum


def tell_root_stopped(comm, signum: int) -> None:
    """From a rank other than 0, stopped by `signum`: rank 0 raises RankStopped at its next wait."""
    comm.isend(signum, dest=0, tag=STOP_TAG)


def _check_stopped(comm) -> None:
    from mpi4py import MPI

    status = MPI.Status()
    if comm.Iprobe(source=MPI.ANY_SOURCE, tag=STOP_TAG, status=status):
        signum = comm.recv(source=status.Get_source(), tag=STOP_TAG)
        ignore_stop_signals()  # this rank's own signal, if it comes, must not break the clean-up
        raise RankStopped(status.Get_source(), signum)


def recv(comm, source: int, tag: int):
    """A receive that a signal can interrupt: Python's signal handlers run only between
    bytecodes, so rank 0 blocked in MPI while another rank stops on Ctrl-C would never say so or
    remove its temporary file. Polling keeps it in Python while it waits, and hears of a rank
    stopped by a signal of its own (RankStopped)."""
    while not comm.Iprobe(source=source, tag=tag):
        _check_stopped(comm)
        time.sleep(POLL_S)
    return comm.recv(source=source, tag=tag)


def gather(comm, item) -> list | None:
    """comm.gather(item, root=0), with the root's waits interruptible (`recv`); messages between
    two ranks with one tag arrive in order, so successive gathers never mix."""
    if comm.Get_rank() != 0:
        comm.send(item, dest=0, tag=EXCHANGE_TAG)
        return None
    return [item] + [recv(comm, r, EXCHANGE_TAG) for r in range(1, comm.Get_size())]


def exchange(comm, item=None) -> list | None:
    """One collective step: gather every rank's `item` on the root (returned there, in rank
    order; None elsewhere) and agree on the outcome. Raises AgreedError on every rank when any
    rank's item is a Failure."""
    items = gather(comm, item)
    verdict = next((i for i in items if isinstance(i, Failure)), None) if comm.Get_rank() == 0 else None
    verdict = comm.bcast(verdict, root=0)
    if verdict is not None:
        raise AgreedError(verdict)
    return items


@contextlib.contextmanager
def agreed(comm, passes: tuple[type[BaseException], ...] = ()) -> Iterator[None]:
    """Run a block on every rank and agree on its outcome. A local error is sent to the others
    at their next exchange; the rank whose error it was re-raises its own exception (its type
    and message intact), the others an AgreedError. Exceptions of the types in `passes` are
    outcomes that every rank reaches alike (a usage error, an explicit exit): they count as
    success. Signals (KeyboardInterrupt, SystemExit) reach every rank anyway and pass."""
    try:
        yield
    except Exception as e:
        if isinstance(e, AgreedError) or getattr(e, AGREED, False):
            raise  # every rank knows already
        if isinstance(e, passes):
            exchange(comm, None)
            raise
        try:
            exchange(comm, Failure.of(comm.Get_rank(), e))
        except AgreedError as agreed_error:
            if agreed_error.failure.rank == comm.Get_rank():
                setattr(e, AGREED, True)
                raise e from None
            raise
    else:
        exchange(comm, None)


def on_root(comm, write: Callable[[], object]) -> None:
    """Run `write` on rank 0 only (an output file) and agree on whether it succeeded."""
    with agreed(comm):
        if comm.Get_rank() == 0:
            write()
