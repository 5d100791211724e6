"""A whole model as qtool holds it: a graph of typed layers with named edges, one IR that every
importer (Keras, ONNX, PyTorch through ONNX) writes and every later pass reads.

Edges carry batch-first float tensors: a sequence `[N, T, C]` (shape `(None, C)`: any number of
steps T, C channels) or, after a layer that takes the last step or pools over the whole
sequence, a vector `[N, C]` (shape `(C,)`); qtool.core.edges is the one module that reads a
shape. Importers bring every framework layout (PyTorch's `[N, C, T]` convolutions, ONNX's
time-first GRUs) to this one, so a layer sees channels last.

A node's `op` names its module in `qtool.layers` (the registry), which defines the op's shapes and
float semantics and proves a graph well formed (`qtool.layers.check`); `attrs` hold its
settings, `params` its float32 weights, `source` what the framework called it (`"Dense"`,
`"Gemm"`, ...). Each op's attributes and params: docs/graph.md, "Ops".
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np


@dataclass
class Node:
    name: str
    op: str
    inputs: list[str]
    outputs: list[str]
    attrs: dict = field(default_factory=dict)
    params: dict[str, np.ndarray] = field(default_factory=dict)
    source: str = ""

    @property
    def label(self) -> str:
        """How messages name it: the framework's name and what the framework called it."""
        return f"{self.name} ({self.source or self.op})"


@dataclass
class Graph:
    """`nodes` in an order where every input is computed before it is read; `inputs` maps each
    graph input edge to its shape; `outputs` names the model's output edges."""

    nodes: list[Node]
    inputs: dict[str, tuple]
    outputs: list[str]
    name: str = "model"
    source: str = ""
    shapes: dict[str, tuple] = field(default_factory=dict)  # every edge's shape (qtool.layers.check)
    check_result: dict | None = None  # what the import checked against the framework (None: not asked)
    ranges: object = None  # a QDQ file's grids on its edges (qtool.importers.ranges.GraphRanges), or None
    steps: int | None = None  # the steps per sequence the file declares for its input (None: any)
    notes: list[str] = field(default_factory=list)  # what the import read as other ops (a loop as a GRU)
    # per input edge, per channel k_c: the model multiplies channel c of that input by 2^k_c before its
    # first layers, whose weights are divided by the same (qtool.graph.calibrate.scale_input_channels):
    # one grid on the scaled input is a power-of-two grid per channel of the model's own input
    input_shifts: dict[str, tuple[int, ...]] = field(default_factory=dict)
    # per input edge that is a feature map, (order, F, C) as the file declares it (its data's frames:
    # qtool.layers.input_map); an input without one is found from its first conv2d
    input_maps: dict[str, tuple] = field(default_factory=dict)

    def consumers(self, edge: str) -> list[Node]:
        return [n for n in self.nodes if edge in n.inputs]

    def scale_inputs(self, x: dict[str, np.ndarray], sign: int = 1) -> dict[str, np.ndarray]:
        """The model's float inputs as its first layers read them: each channel times 2^k_c
        (`input_shifts`; exact in float32), the others as they are; `sign` -1 undoes it."""
        return {e: np.ldexp(np.asarray(v, np.float32), sign * np.asarray(self.input_shifts[e], np.int32))
                .astype(np.float32) if e in self.input_shifts else v for e, v in x.items()}

