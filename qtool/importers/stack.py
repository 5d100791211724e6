"""What every format reader returns: a `Stack`, one importable GRU with what the file holds
besides it, and the helpers the readers share."""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass, field

import numpy as np

from qtool.core.model import GruCell


@dataclass
class Stack:
    """One importable GRU: its cells `layers[l][d]` and, where the source is a framework, a function
    that runs the framework's own GRU on batch-first `x [N, T, C]` (raises ImportError when the
    framework is not installed).

    What the file holds besides it, so that nothing is converted partly without a word:
    `took` names the file's layers or nodes that make this GRU; `left_out` the computing layers,
    nodes or tensor groups it does not take (`"name (Op)"`; inference no-ops and layout ops are
    not listed); `input_from` is None when the GRU reads the model's own input (through layout
    ops only), else the `"name (Op)"` whose output it reads, so that data for the file is not
    data for the GRU."""

    layers: list[list[GruCell]]
    framework: str | None = None
    run_source: Callable[[np.ndarray], np.ndarray] | None = None
    took: list[str] = field(default_factory=list)
    left_out: list[str] = field(default_factory=list)
    input_from: str | None = None
    notes: list[str] = field(default_factory=list)  # what the import assumed, said by `import`


def natural_key(s: str) -> list:
    return [int(t) if t.isdigit() else t for t in re.split(r"(\d+)", s)]


def chained(layers: list) -> bool:
    """Whether single layers `[[fwd(, bwd)], ...]` chain by size (each takes the one before's output)."""
    return all(layers[l][0].W.shape[1] == layers[l - 1][0].R.shape[1] * len(layers[l - 1])
               and len(layers[l]) == len(layers[l - 1]) for l in range(1, len(layers)))
