"""What every command prints with: the consoles, the progress bar, JSON for scripts, and the
API's messages in the command line's words. (qtool.cli.app's commands and graph_cmds share them.)"""

from __future__ import annotations

import json
import math
import re
import time
from pathlib import Path

from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeRemainingColumn

out = Console()
err = Console(stderr=True)


def progress_bar() -> Progress:
    return Progress(TextColumn("[bold]{task.description}"), BarColumn(), MofNCompleteColumn(),
                    TextColumn("{task.fields[rate]}"), TimeRemainingColumn(), console=err,
                    transient=True, disable=not err.is_terminal)


class Bar:
    """A progress bar whose `update(done, total)` fits the API's progress callbacks."""

    def __init__(self, description: str, total: int):
        self.bar = progress_bar()
        self.task = self.bar.add_task(description, total=total, rate="")
        self.t0 = time.perf_counter()

    def __enter__(self) -> Bar:
        self.bar.__enter__()
        return self

    def __exit__(self, *exc) -> None:
        self.bar.__exit__(*exc)

    def update(self, done: int, total: int) -> None:
        rate = done / max(time.perf_counter() - self.t0, 1e-9)
        self.bar.update(self.task, completed=done, total=total, rate=f"{rate:.0f} seq/s")


def clean(v):
    """JSON without NaN or Infinity: non-finite numbers become null."""
    if isinstance(v, float):
        return v if math.isfinite(v) else None
    if isinstance(v, dict):
        return {str(k): clean(x) for k, x in v.items()}
    if isinstance(v, (list, tuple)):
        return [clean(x) for x in v]
    if hasattr(v, "item") and not isinstance(v, (str, bytes)):
        return clean(v.item()) if getattr(v, "ndim", 0) == 0 else clean(v.tolist())
    if isinstance(v, Path):
        return str(v)
    return v


def emit_json(obj) -> None:
    print(json.dumps(clean(obj), allow_nan=False))


# The API's messages name its parameters in backticks (`limit`, `check=False`); the command line
# shows its flags instead. Every parameter is its flag with dashes, but these:
FLAGS = {"methods": "--compare", "test": "--eval", "fmt": "--format", "check=False": "--no-check"}


def as_flags(text) -> str:
    """An API message as the command line says it: `batch_size` -> --batch-size."""
    return re.sub(r"`([a-z_]+(?:=False)?)`", lambda m: FLAGS.get(m[1], "--" + m[1].replace("_", "-")), str(text))
