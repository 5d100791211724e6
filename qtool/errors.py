"""One exception type for every error a user can act on; the CLI prints it as one line. Also
the signals that stop qtool cleanly: kept here, where the CLI's start-up can read them without
importing numpy (as qtool.io.files would)."""

import contextlib
import signal

STOP_SIGNALS = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)  # each removes qtool's temporaries


class QtoolError(Exception):
    """A user-facing error: bad input, a missing package, an impossible configuration."""


def ignore_stop_signals() -> None:
    """After the first stop: a second signal must not break the unwinding that removes
    temporaries. The process-wide disposition, not a thread's mask: numba's worker threads
    would take a signal that the main thread blocks and hand it to the main thread's handler."""
    for sig in STOP_SIGNALS:
        signal.signal(sig, signal.SIG_IGN)


_held: list[int] | None = None  # stop signals that arrived inside signals_held(), in order


def hold_signal(signum: int) -> bool:
    """Called first by a stop-signal handler: True if the signal is held for later."""
    if _held is None:
        return False
    _held.append(signum)
    return True


@contextlib.contextmanager
def signals_held():
    """Hold stop signals over a few steps that must not be split (a temporary file made and put
    in a `finally`'s care). Both the thread mask and a flag: the OS may hand a process signal to
    any thread (numba's, MPI's), and Python then runs the handler in the main thread anyway."""
    global _held
    if _held is not None:  # nested: the outer one delivers
        yield
        return
    _held = []
    old_mask = signal.pthread_sigmask(signal.SIG_BLOCK, STOP_SIGNALS)
    try:
        yield
    finally:
        held, _held = _held, None
        signal.pthread_sigmask(signal.SIG_SETMASK, old_mask)
        if held:
            handler = signal.getsignal(held[0])
            if callable(handler):
                handler(held[0], None)  # raises now, where the caller can clean up
