"""Range-setting methods. Every method is an Observer (calibrators.base) with three verbs:
observe a batch, merge with another observer, compute parameters. `make_observer` builds one by
method name."""

from __future__ import annotations

from calibrators.base import Observer
from calibrators.ema import EmaObserver
from calibrators.minmax import MinMaxObserver

METHODS = {"minmax": MinMaxObserver, "ema": EmaObserver}


def make_observer(method: str, tensor: str) -> Observer:
    """An observer for one tensor. The seed's EMA applies to x and h; other tensors use min/max."""
    if method not in METHODS:
        from qtool.errors import QtoolError

        raise QtoolError(f"unknown calibration method '{method}' (use one of {', '.join(METHODS)})")
    if method == "ema" and tensor not in ("x", "h"):
        return MinMaxObserver()
    return METHODS[method]()


__all__ = ["Observer", "MinMaxObserver", "EmaObserver", "METHODS", "make_observer"]
