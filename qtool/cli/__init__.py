"""The command line: the typer app, its tables and its console."""

from qtool.cli.app import main

__all__ = ["main"]
