"""One exception type for every error a user can act on; the CLI prints it as one line. Also
the signals that stop qtool cleanly: kept here, where the CLI's start-up can read them without
importing numpy (as qtool.fileio would)."""

import signal

STOP_SIGNALS = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)  # each removes qtool's temporaries


class QtoolError(Exception):
    """A user-facing error: bad input, a missing package, an impossible configuration."""
