"""One exception type for every error a user can act on; the CLI prints it as one line."""


class QtoolError(Exception):
    """A user-facing error: bad input, a missing package, an impossible configuration."""
