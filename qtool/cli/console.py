"""What every command prints and asks with: the consoles, the progress bar, JSON for scripts, the
API's messages in the command line's words, prompts at a terminal, and the stop signals' handler.
(qtool.cli.app's commands and graph_cmds share them.)"""

from __future__ import annotations

import json
import logging
import math
import os
import re
import signal
import sys
import threading
import time
from pathlib import Path

import typer
from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeRemainingColumn

from qtool.errors import STOP_SIGNALS, QtoolError, hold_signal, ignore_stop_signals

out = Console()
err = Console(stderr=True)
for _c in (out, err):  # a log or a pipe gets each message on one line (grep); a terminal wraps by words
    _c.soft_wrap = not _c.is_terminal


def progress_bar() -> Progress:
    return Progress(TextColumn("[bold]{task.description}"), BarColumn(), MofNCompleteColumn(),
                    TextColumn("{task.fields[rate]}"), TimeRemainingColumn(), console=err,
                    transient=True, disable=not err.is_terminal)


class Bar:
    """A progress bar whose `update(done, total)` fits the API's progress callbacks; while it runs,
    the phases the API says (qtool.io.phases) show in its description."""

    def __init__(self, description: str, total: int):
        self.bar = progress_bar()
        self.description = description
        self.task = self.bar.add_task(description, total=total, rate="")
        self.t0 = time.perf_counter()

    def __enter__(self) -> Bar:
        self.bar.__enter__()
        ACTIVE.append(self)
        return self

    def __exit__(self, *exc) -> None:
        ACTIVE.remove(self)
        self.bar.__exit__(*exc)

    def say(self, text: str) -> None:
        # short enough that the bar keeps its room at 80 columns; the log lines say it whole
        text = text.removeprefix(f"{self.description}: ")  # "verify: compiling" under the verify bar
        text = text if len(text) <= PHASE_WIDTH else text[:PHASE_WIDTH - 1] + "…"
        self.bar.update(self.task, description=f"{self.description}: {text}")

    def stage(self, stage: str, done: int, total: int | None) -> None:
        """A progress callback of stages (advise's): each stage a count of its own (None: no total)."""
        if stage != self.description:
            self.bar.update(self.task, visible=False)
            self.description, self.task = stage, self.bar.add_task(stage, total=total, rate="")
        self.bar.update(self.task, completed=done)

    def update(self, done: int, total: int) -> None:
        rate = done / max(time.perf_counter() - self.t0, 1e-9)
        self.bar.update(self.task, completed=done, total=total, rate=f"{rate:.0f} seq/s")


ACTIVE: list[Bar] = []  # the progress bar on screen, if any
PHASE_WIDTH = 28


class PhaseLines(logging.Handler):
    """The phases the API says (qtool.io.phases): in the progress bar at a terminal, otherwise (a
    log, a pipe, CI) as timestamped lines on stderr, so that a long run is never silent
    (QTOOL_PROGRESS_LINES=0 turns the lines off; an error stays one line after them). A line the
    last REPEAT_S seconds already printed is not printed again: an advisor's search calibrates
    every candidate with the same phases, which said each time made a log of hundreds of lines."""

    REPEAT_S = 10.0

    def __init__(self) -> None:
        super().__init__()
        self.said: dict[str, float] = {}

    def emit(self, record: logging.LogRecord) -> None:
        text = record.getMessage()
        if ACTIVE and err.is_terminal:
            ACTIVE[-1].say(text)
        elif os.environ.get("QTOOL_PROGRESS_LINES", "1") != "0":
            now = time.monotonic()
            if now - self.said.get(text, -math.inf) < self.REPEAT_S:
                return
            self.said[text] = now
            # one line each, however long: a log is read with grep
            err.print(f"{time.strftime('%H:%M:%S')} {text}", highlight=False, markup=False, soft_wrap=True)


def say_phases() -> None:
    """Show the API's phases (once per process)."""
    log = logging.getLogger("qtool")
    if not any(isinstance(h, PhaseLines) for h in log.handlers):
        log.addHandler(PhaseLines())
        log.setLevel(logging.INFO)
        log.propagate = False


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


NOTES: list[str] = []  # the command's notes: on stderr when it succeeds (an error stays one line), and in --json


def emit_json(obj) -> None:
    """One JSON object on stdout; its `notes` (the command's NOTES first) in the command line's
    words, as on stderr."""
    if isinstance(obj, dict) and (NOTES or "notes" in obj):
        obj = {**obj, "notes": [as_flags(n) for n in [*NOTES, *obj.get("notes", [])]]}
    print(json.dumps(clean(obj), allow_nan=False))


# The API's messages name its parameters in backticks (`limit`, `check=False`); the command line
# shows its flags instead. Every parameter is its flag with dashes, but these:
FLAGS = {"methods": "--compare", "test": "--eval", "fmt": "--format", "check=False": "--no-check"}


def as_flags(text) -> str:
    """An API message as the command line says it: `batch_size` -> --batch-size."""
    return re.sub(r"`([a-z_]+(?:=False)?)`", lambda m: FLAGS.get(m[1], "--" + m[1].replace("_", "-")), str(text))


def warn(notes) -> None:
    """What looks wrong but does not stop the command, one `warning:` line each on stderr."""
    from rich.markup import escape

    for note in notes:
        err.print(f"[yellow]warning:[/] {escape(as_flags(note))}", highlight=False, soft_wrap=True)


def wrote(res, output: Path, as_json: bool = False, name: str | None = None) -> None:
    """The files an export wrote and those it replaced (not with --json: its summary says so),
    a warning for each replaced file that had been edited since qtool wrote it, and one when
    `name` had to become another C prefix (`res`: qtool.api.ExportResult)."""
    from rich.markup import escape

    if name is not None and name != res.name:
        warn([f"`name` '{name}' is no C identifier prefix: the files and identifiers use '{res.name}'"])
    warn(f"{name} had been edited since qtool wrote it; this export replaced it" for name in res.edited)
    if not as_json:
        replaced = f" (replaced {', '.join(res.replaced)})" if res.replaced else ""
        out.print(f"wrote {', '.join(res.files)} -> {escape(str(output))}{replaced}")
        if res.removed:
            out.print(f"removed {', '.join(res.removed)}: an earlier export of {res.name} wrote them; this one "
                      "does not", highlight=False)


class Interrupted(BaseException):
    """SIGINT, SIGTERM or SIGHUP: unwinds the stack (every temporary file is removed on the way)
    and passes every `except Exception`, as KeyboardInterrupt does, and typer's handler too."""

    def __init__(self, signum: int):
        super().__init__(signal.Signals(signum).name)
        self.signum = signum


RESIGNAL_S = 0.05


def on_signal(signum, frame):
    """SIGINT, SIGTERM, SIGHUP: raise Interrupted (once: the next stop signal is ignored)."""
    if hold_signal(signum):  # raised when the steps that hold it are done
        return
    if _inside_llvmlite(frame):
        # An exception raised in llvmlite's ctypes callbacks (numba compiling or loading its
        # cache) is swallowed and leaves LLVM half-built, which crashes: ask again shortly.
        _resignal(signum)
        return
    ignore_stop_signals()
    raise Interrupted(signum)


def on_unraisable(unraisable) -> None:
    """An Interrupted raised where Python cannot pass it on (a `__del__`, a weakref callback, a
    ctypes callback) is dropped with an "Exception ignored" message, and the run could no longer
    be stopped: arm the handler again and send the signal again, once back in ordinary code."""
    e = unraisable.exc_value
    if not isinstance(e, Interrupted) or threading.current_thread() is not threading.main_thread():
        sys.__unraisablehook__(unraisable)
        return
    if _over:  # the command has ended: nothing is left to stop
        return
    signal.signal(e.signum, on_signal)
    _resignal(e.signum)


def _resignal(signum: int) -> None:
    """The signal again in a moment, from a timer: sent from here, it could land before the
    code that dropped the exception has returned."""
    timer = threading.Timer(RESIGNAL_S, os.kill, (os.getpid(), signum))
    timer.daemon = True
    timer.start()


_over = False


def stop_on_signals() -> None:
    """SIGINT, SIGTERM and SIGHUP raise Interrupted, also where Python would drop it."""
    global _over
    _over = False
    for sig in STOP_SIGNALS:
        signal.signal(sig, on_signal)
    sys.unraisablehook = on_unraisable


def command_over() -> None:
    """The command has ended, its output written or its error found: a stop signal from here on
    has nothing to stop or clean up, and the exit status stays the command's own."""
    global _over
    _over = True
    ignore_stop_signals()


def _inside_llvmlite(frame) -> bool:
    while frame is not None:
        if f"{os.sep}llvmlite{os.sep}" in frame.f_code.co_filename:
            return True
        frame = frame.f_back
    return False


def interactive() -> bool:
    return sys.stdin is not None and sys.stdin.isatty()


def confirm_at_terminal():
    """A yes/no question at a terminal; in scripts no question is asked (None)."""
    return (lambda question: typer.confirm(question, default=False)) if interactive() else None


def need(value, what: str, option: str):
    """A required value: asked for at a terminal, an error in scripts."""
    if value is not None:
        return value
    if interactive():
        return typer.prompt(what)
    raise QtoolError(f"missing {option} ({what})")
