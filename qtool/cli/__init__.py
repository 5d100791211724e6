"""The command line: the typer app, its tables and its console.

`main` is the entry point. It is kept light: importing the commands (numpy, numba, typer, rich)
takes a few tenths of a second, and a stop signal in that time must end the run as quietly as
one during a command, not with a traceback."""

from __future__ import annotations

import signal
import sys

from qtool.errors import STOP_SIGNALS


def _stopped_while_starting(signum: int, frame) -> None:
    # nothing has been read or written yet: there is nothing to clean up
    sys.stderr.write(f"interrupted ({signal.Signals(signum).name}) while starting; nothing was written\n")
    raise SystemExit(128 + signum)


def main(argv: list[str] | None = None) -> None:
    """Run one qtool command (`qtool.cli.app.main`), stoppable from the first instant."""
    for sig in STOP_SIGNALS:
        signal.signal(sig, _stopped_while_starting)
    from qtool.cli.app import main as run

    run(argv)


__all__ = ["main"]
