"""The Keras layers a whole-model import reads, a builder each, registered by class name (as the
ONNX handlers are, qtool.importers.onnx.ops): `BUILDERS[class](reader, layer, sources)` adds
qtool nodes through the reader (qtool.importers.keras.model_graph): its weights (`weights`), the
shapes so far, `add` for a node and `fail` for a one-line refusal. A family of layers is one
module; a new layer is one builder."""

from __future__ import annotations

# the families register their builders as they are imported
from qtool.importers.keras.ops import activation, layout, linear, norm, pool, recurrent  # noqa: F401
from qtool.importers.keras.ops.registry import BUILDERS

__all__ = ["BUILDERS"]
