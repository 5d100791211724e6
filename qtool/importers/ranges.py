"""Quantizers read from a quantized or QAT-trained model file (ONNX QDQ, torch.ao fake-quant
state, QKeras, qtool's own QAT checkpoints), as learned ranges: a file's quantizer gives the
interval its grid covers, `[(qmin - zp) s, (qmax - zp) s]`, with its step and bits. How these
become qtool's power-of-two grids is qtool.calibration.from_file's job."""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from qtool.core.model import GruModel
from qtool.core.qmodel import TensorQ


@dataclass
class ImportedRange:
    """One tensor's quantizer as the file holds it. Per-channel values are [3H] arrays in qtool's
    row order (z | r | g)."""

    lo: float | np.ndarray
    hi: float | np.ndarray
    source: str
    step: float | np.ndarray | None = None  # the file's scale; None for an observer's min/max
    bits: int | None = None  # the file's integer width
    exact: TensorQ | None = None  # qtool's own grid (a QAT checkpoint): taken as it is


@dataclass
class Imported:
    """What a quantized model file says beyond its float weights."""

    kind: str  # "ONNX QDQ", "torch.ao fake-quant", "qtool QAT", "QKeras"
    ranges: dict[tuple[int, int, str], ImportedRange] = field(default_factory=dict)
    notes: list[str] = field(default_factory=list)

    def add(self, l: int, d: int, name: str, r: ImportedRange) -> None:
        """Record a range, applying the ties: x of layer l > 0 is h of layer l - 1, and both
        directions share h. A second quantizer of a tied tensor widens the range, with a note."""
        if name == "x" and l > 0:
            self.notes.append(f"{r.source}: x of layer {l} is h of layer {l - 1} (no requantization "
                              "between layers); merged into its range")
            l, name = l - 1, "h"
        if name in ("h", "x"):
            d = 0
        key = (l, d, name)
        old = self.ranges.get(key)
        if old is None:
            self.ranges[key] = r
            return
        if old.exact is not None:
            return
        self.notes.append(f"{r.source} also quantizes {name} of layer {l}; the union of the ranges is used")
        self.ranges[key] = ImportedRange(np.minimum(old.lo, r.lo), np.maximum(old.hi, r.hi),
                                         f"{old.source} + {r.source}",
                                         None if old.step is None or r.step is None else np.maximum(old.step, r.step),
                                         old.bits)


def source_key(model: GruModel) -> str:
    """The stack `importers.import_model` chose in the file (the third part of `model.source`,
    `fmt:file:key`): a GRU's name, or "" for the file's only GRU or its whole chained stack."""
    parts = model.source.split(":", 2)
    return parts[2] if len(parts) > 2 else ""


def learned_range(step, zp, qmin: int, qmax: int) -> tuple:
    """The interval a file's grid covers."""
    step = np.asarray(step, np.float64)
    return (qmin - np.asarray(zp)) * step, (qmax - np.asarray(zp)) * step


@dataclass
class GraphRanges:
    """The quantizers a whole-model file holds on its edges (a QDQ file's QuantizeLinear ->
    DequantizeLinear pairs between layers), by qtool edge. A graph carries them
    (`Graph.ranges`) to its calibration, which takes them as those edges' grids."""

    kind: str
    edges: dict[str, ImportedRange] = field(default_factory=dict)
    notes: list[str] = field(default_factory=list)

    def add(self, edge: str, r: ImportedRange) -> None:
        """A second quantizer of one edge (a pair after a value-moving op) widens its range."""
        old = self.edges.get(edge)
        if old is None:
            self.edges[edge] = r
            return
        if (old.lo, old.hi, old.step, old.bits) == (r.lo, r.hi, r.step, r.bits):
            return  # the same grid again (a pair on each side of a value-moving op)
        self.notes.append(f"{r.source} quantizes the values {old.source} does; the union of their ranges is used")
        self.edges[edge] = ImportedRange(min(old.lo, r.lo), max(old.hi, r.hi), f"{old.source} + {r.source}",
                                         max(old.step, r.step), max(old.bits, r.bits))

    def drop(self, edge: str, why: str) -> None:
        r = self.edges.pop(edge, None)
        if r is not None:
            self.notes.append(f"{r.source} is not used: {why}")

    def to_json(self) -> dict:
        return {"kind": self.kind, "notes": self.notes,
                "edges": {e: [float(r.lo), float(r.hi), float(r.step), int(r.bits), r.source]
                          for e, r in self.edges.items()}}

    @classmethod
    def from_json(cls, d: dict) -> GraphRanges:
        edges = {str(e): ImportedRange(float(lo), float(hi), str(src), float(step), int(bits))
                 for e, (lo, hi, step, bits, src) in d["edges"].items()}
        return cls(str(d["kind"]), edges, [str(n) for n in d.get("notes", [])])
