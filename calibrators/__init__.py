"""Range-setting methods. Every method is an Observer (qtool.calibrators.base) with three verbs:
observe a batch, merge with another observer, compute parameters. `make_observer` builds one by
method name."""

from __future__ import annotations

from qtool.calibrators.base import Observer
from qtool.calibrators.ema import EmaObserver
from qtool.calibrators.kl import KlObserver
from qtool.calibrators.minmax import MinMaxObserver
from qtool.calibrators.mse import MseObserver
from qtool.calibrators.percentile import DEFAULT_PERCENTILE, PercentileObserver

from qtool.core.tensors import METHOD_NAMES

METHODS = {"minmax": MinMaxObserver, "ema": EmaObserver, "percentile": PercentileObserver,
           "mse": MseObserver, "kl": KlObserver}
assert tuple(METHODS) == METHOD_NAMES, "qtool.core.tensors.METHOD_NAMES names the methods bits files may use"
# Sigmoid/tanh outputs are bounded; clipping them only saturates gates, so they keep min/max.
GATE_OUTPUTS = ("z_out", "r_out", "g_out")


def make_observer(method: str, tensor: str, percentile: float = DEFAULT_PERCENTILE) -> Observer:
    """An observer for one tensor. The EMA (docs/calibration.md) applies to x and h; the gate
    outputs always use min/max; everything else uses the chosen method."""
    if method not in METHODS:
        from qtool.errors import QtoolError

        raise QtoolError(f"unknown calibration method '{method}' (use one of {', '.join(METHODS)})")
    if (method == "ema" and tensor not in ("x", "h")) or tensor in GATE_OUTPUTS:
        return MinMaxObserver()
    if method == "percentile":
        return PercentileObserver(percentile)
    return METHODS[method]()


__all__ = ["Observer", "MinMaxObserver", "EmaObserver", "PercentileObserver", "MseObserver", "KlObserver",
           "METHODS", "make_observer"]
