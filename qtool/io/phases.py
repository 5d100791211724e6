"""What a long run is doing now, said as each phase starts (`phase("auto: scoring mse, 2 of 3")`):
to the `qtool` logger at INFO. The command line shows it in its progress bar at a terminal and as
a timestamped line on stderr otherwise (a log, a pipe, CI); a notebook shows it or not as its
logging is set."""

from __future__ import annotations

import logging

LOG = logging.getLogger("qtool")


def phase(text: str) -> None:
    LOG.info(text)
