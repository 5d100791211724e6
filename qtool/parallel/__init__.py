"""Runs over several processes with MPI (mpi4py), and the AllGather + int8 matmul +
dequantize operator (docs/distributed.md).

Under `mpiexec -n R qtool calibrate ...` or `... simulate ...` (R > 1) each rank streams its own
chunks of the data and the statistics merge so that the result equals one process's, bit for
bit; rank 0 writes the files and prints. Without mpiexec nothing here imports mpi4py: the
launcher's environment variables say whether this process is one of several before MPI is
initialised. `QTOOL_MPI=0` runs every process on its own even under mpiexec; `QTOOL_MPI=1`
initialises MPI even where the launcher sets none of the variables below (srun, for example).
"""

from __future__ import annotations

import contextlib
import os
import sys
import time
from collections.abc import Iterator

from qtool.errors import QtoolError

# The world size as the launchers export it: Open MPI, MPICH/Intel MPI (hydra), MVAPICH.
SIZE_VARS = ("OMPI_COMM_WORLD_SIZE", "PMI_SIZE", "MV2_COMM_WORLD_SIZE")
_world: list = []  # [communicator or None], once decided


def launched_size() -> int:
    """How many processes the launcher started (1 when none did)."""
    for var in SIZE_VARS:
        try:
            return max(int(os.environ[var]), 1)
        except (KeyError, ValueError):
            continue
    return 1


def _wanted() -> bool:
    setting = os.environ.get("QTOOL_MPI", "").strip().lower()
    if setting in ("0", "no", "off", "false"):
        return False
    return setting in ("1", "yes", "on", "true") or launched_size() > 1


def world():
    """MPI_COMM_WORLD when this process is one of several MPI ranks, else None (one process:
    everything runs as without MPI, and mpi4py is never imported)."""
    if not _world:
        comm = None
        if _wanted():
            try:
                from mpi4py import MPI
            except ImportError:
                raise QtoolError(f"started by mpiexec as one of {launched_size()} processes, but mpi4py is "
                                 "not installed: pip install 'qtool[mpi]' (or set QTOOL_MPI=0 to run "
                                 "each process on its own)") from None
            comm = MPI.COMM_WORLD if MPI.COMM_WORLD.Get_size() > 1 else None
        _world.append(comm)
    return _world[0]


DISTRIBUTED = ("calibrate", "simulate")
ON_EVERY_RANK = ("inspect", "version")  # they only read and print (rank 0 prints)


def check_command(name: str | None) -> None:
    """Under mpiexec, refuse a command that is not distributed: it would run whole on every
    rank, each writing the same output files."""
    if name in (None, *DISTRIBUTED, *ON_EVERY_RANK) or world() is None:
        return
    raise QtoolError(f"qtool {name} runs as one process; under mpiexec only "
                     f"{' and '.join(DISTRIBUTED)} are distributed (run it without mpiexec)")


def rank() -> int:
    comm = world()
    return comm.Get_rank() if comm is not None else 0


def allgather_dequant_matmul(comm, a, b, token_scale, channel_scale, return_int32: bool = False, *,
                             chunk_rows: int | None = None, backend: str = "cpu"):
    """The AllGather + int8 matmul + dequantize operator: `A = allgather(a)` in rank order,
    `C = A @ b` with exact int32 sums, `D = float16(float32(C) * token_scale[m] * channel_scale[n])`, on every
    rank; the gather of chunk k + 1 runs while the GEMM consumes chunk k. See
    qtool.parallel.matmul.allgather_dequant_matmul."""
    from qtool.parallel.matmul import allgather_dequant_matmul as run

    return run(comm, a, b, token_scale, channel_scale, return_int32, chunk_rows=chunk_rows,
               backend=backend)


def prepare(b, channel_scale, backend: str = "cpu"):
    """b [K, N] and channel_scale [N] laid out for allgather_dequant_matmul once, for repeated
    calls with the same b (pass it as b, with channel_scale None)."""
    from qtool.parallel.matmul import prepare as run

    return run(b, channel_scale, backend)


@contextlib.contextmanager
def command_scope(*consoles) -> Iterator[None]:
    """A command-line run: under mpiexec rank 0 alone prints (the other ranks' consoles and
    stdout go quiet) and the ranks agree on the outcome (qtool.parallel.agree), so an error on any
    rank ends every rank with the same exit code and rank 0 prints it once."""
    comm = world()
    if comm is None:
        yield
        return
    import typer

    from qtool.parallel.agree import agreed

    if comm.Get_rank() != 0:
        for console in consoles:
            console.quiet = True
        sys.stdout = open(os.devnull, "w")  # for the rest of the process
    with agreed(comm, passes=(typer.Exit, typer.Abort, typer.TyperException)):
        yield


ABORT_GRACE_S = 2.0  # how long the other ranks let rank 0 remove its temporary file first
STDERR_GRACE_S = 0.2  # MPI_Abort tears down mpiexec's I/O forwarding: rank 0's last line was lost


def stop_every_rank(code: int) -> None:
    """Exit after a signal, once this rank's temporary files are gone. Under mpiexec another
    rank may be blocked in a collective, or may have swallowed the signal (raised where Python
    ignores exceptions), so MPI_Abort ends them all: rank 0 at once, the others after a grace
    period, so that an abort elsewhere does not kill rank 0 before it removed its temporary."""
    comm = world() if _world else None
    if comm is not None:
        sys.stderr.flush()
        if comm.Get_rank() != 0:
            from qtool.parallel.agree import tell_root_stopped

            tell_root_stopped(comm, code - 128)  # the signal may have reached this rank alone
            time.sleep(ABORT_GRACE_S)
        else:
            time.sleep(STDERR_GRACE_S)
        comm.Abort(code)
    sys.exit(code)
