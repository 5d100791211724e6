"""One reading of a model file per command: while a command runs (`read_once`), the conversion of
a whole-model file is kept, so the steps that each ask for it (deciding what the file is, importing,
calibrating, checking) read and convert it once. Outside such a block every call reads the file."""

from __future__ import annotations

import copy
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

_KEPT: dict | None = None


@contextmanager
def read_once() -> Iterator[None]:
    global _KEPT
    outer = _KEPT
    _KEPT = {} if outer is None else outer
    try:
        yield
    finally:
        _KEPT = outer


def once(kind: str, path, read: Callable):
    """`read()`, or within `read_once` the result of the first `read()` for this file and kind
    (a failed read is not kept). Results are tuples whose first item is the graph: callers get
    their own copy of it to change."""
    if _KEPT is None:
        return read()
    key = (kind, str(Path(path).resolve()))
    if key not in _KEPT:
        _KEPT[key] = read()
    first, *rest = _KEPT[key]
    return (copy.deepcopy(first), *rest)
