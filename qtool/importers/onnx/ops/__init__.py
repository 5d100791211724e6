"""The ONNX ops a whole-model import reads, a handler each, registered by op type (hls4ml's
converters/onnx as the model): `HANDLERS[op_type](reader, node)` maps an ONNX node onto qtool
nodes through the reader (qtool.importers.onnx.model_graph): its values and their layouts
(`input`, `const`, `value`), `alias` for an op that only moves data, `emit` for a qtool node, and
`fail` for a one-line refusal. A family of ops is one module; a new op is one handler."""

from __future__ import annotations

# the families register their handlers as they are imported; a fake-quant pair's two halves too
from qtool.importers.onnx import fake_quant
from qtool.importers.onnx.ops import activation, layout, linear, norm, pool, recurrent  # noqa: F401
from qtool.importers.onnx.ops.registry import HANDLERS

HANDLERS.update(QuantizeLinear=fake_quant.quantize_linear, DequantizeLinear=fake_quant.dequantize_linear)
__all__ = ["HANDLERS"]
