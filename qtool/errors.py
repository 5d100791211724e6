"""One exception type for every error a user can act on; the CLI prints it as one line. Also
the signals that stop qtool cleanly: kept here, where the CLI's start-up can read them without
importing numpy (as qtool.io.files would)."""

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
