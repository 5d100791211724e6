"""A whole model in integers: the float graph (after the float passes), every edge's grid, every
node's integer parameters, and the partition into the integer core and the float tail.

    quantize the inputs -> the core (every node of `core`, in integers) -> dequantize
    `core_outputs` -> the float tail (softmax, L2 normalization) -> the model's outputs

The integer parameters are derived from the grids and the float weights (each layer module's
`quantize`; a GRU's QuantModel is calibrated on its own input), so the file stores the graph and
the grids (qtool.graph.file, docs/file-formats.md) and a reader derives the rest the same way.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass, field

import numpy as np

from qtool.core.graph import Graph, Node
from qtool.core.qmodel import TensorQ

# The ops whose integers are a quantized model of their own (`qparams[name]["qm"]`, a QuantModel
# calibrated on the node's input): the file stores it, an engine runs it, the C export writes it as
# a model of its own. A second recurrent op is one more name here and in the stage tables that
# build it (qtool.graph.calibrate.SELF_CALIBRATED, qtool.advisor.graph.MODEL_OF).
MODEL_OPS = ("gru",)
QGFORMAT = "qtool-qgraph"
GVERSION = 1  # the version of both graph files (qtool.graph.file), part of the fingerprint


@dataclass
class QGraph:
    graph: Graph
    grids: dict[str, TensorQ]  # every edge the core reads or writes
    qparams: dict[str, dict]  # node name -> its integers (one of MODEL_OPS: {"qm": QuantModel})
    core: list[str]  # node names run in integers, in order
    tail: list[str]  # node names run in float after the dequantize, in order
    passes: list[tuple[str, str]] = field(default_factory=list)  # (pass, what it did)
    info: dict = field(default_factory=dict)

    def node(self, name: str) -> Node:
        return next(n for n in self.graph.nodes if n.name == name)

    @property
    def grus(self) -> list[str]:
        """The core's nodes of MODEL_OPS (the GRUs), in order; each one's QuantModel is
        `qparams[name]["qm"]`."""
        return [n for n in self.core if self.node(n).op in MODEL_OPS]

    @property
    def core_outputs(self) -> list[str]:
        """The edges dequantized: the core's edges the tail reads or the model outputs."""
        made = {e for n in self.core for e in self.node(n).outputs} | set(self.graph.inputs)
        read = [e for n in self.tail for e in self.node(n).inputs] + list(self.graph.outputs)
        return [e for e in dict.fromkeys(read) if e in made]

    def fingerprint(self) -> str:
        """A hash of everything that decides the quantized model's outputs: the graph's structure
        and float params, the core and tail, every grid, every layer's bits and each GRU's own
        fingerprint (its integers). Not the provenance, nor the names of the graph and its source."""
        g = self.graph
        structure = {"inputs": g.inputs, "outputs": g.outputs, "core": self.core, "tail": self.tail,
                     "nodes": [[n.name, n.op, n.inputs, n.outputs, n.attrs] for n in g.nodes],
                     "grids": {e: [t.bits, int(t.exp2_inv), int(t.zp)] for e, t in self.grids.items()},
                     "layer_bits": self.info.get("layer_bits", {}),
                     **({"input_shifts": {e: list(k) for e, k in g.input_shifts.items()}} if g.input_shifts else {})}
        h = hashlib.sha256(f"{QGFORMAT}/{GVERSION}|".encode())
        h.update(json.dumps(structure, default=plain_json, sort_keys=True).encode())
        for k, n in enumerate(g.nodes):
            for name in sorted(n.params):
                a = np.asarray(n.params[name], np.float32)  # as the file stores it
                h.update(f"|{k}.{name}{a.shape}".encode() + a.tobytes())
        for name in self.core:
            qp = self.qparams.get(name, {})
            if "qm" in qp:
                h.update(f"|{name}:{qp['qm'].fingerprint()}".encode())
            if "lut" in qp:  # an interpolated activation table: its knots decide the integers too
                h.update(f"|{name}:lut{int(qp['lut_shift'][0])}".encode()
                         + np.asarray(qp["lut"], np.int64).tobytes())
        return h.hexdigest()[:16]


def plain_json(v):
    """JSON for numpy scalars and tuples (as the graph file writes them)."""
    if isinstance(v, np.generic):
        return v.item()
    return list(v) if isinstance(v, tuple) else v
