"""ONNX `GRU` nodes with `linear_before_reset=1`: W [dirs, 3H, C], R [dirs, 3H, H],
B [dirs, 6H] (Wb then Rb), gates z | r | h (the canonical order). Needs the optional `onnx` package.

Several GRU nodes are stacked in graph order when their shapes chain; each is also available by
its node name.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from qtool.errors import QtoolError
from qtool.importers import stack_layers
from qtool.importers.qdq import dequantized_constants
from qtool.model import GruCell


def _attr(node, name, default):
    from onnx import helper

    for a in node.attribute:
        if a.name == name:
            return helper.get_attribute_value(a)
    return default


def read_onnx(path: Path) -> dict:
    try:
        import onnx
        from onnx import numpy_helper
    except ImportError:
        raise QtoolError("reading ONNX needs the 'onnx' package (pip install onnx)") from None
    try:
        model = onnx.load(str(path))
    except Exception as e:  # protobuf decode errors have several types
        raise QtoolError(f"{path}: not a readable ONNX file ({str(e)[:200]})") from None
    inits = {t.name: numpy_helper.to_array(t) for t in model.graph.initializer}
    for node in model.graph.node:  # constants may also come from Constant nodes
        if node.op_type == "Constant" and node.output:
            value = _attr(node, "value", None)
            if value is not None:
                inits[node.output[0]] = numpy_helper.to_array(value)
    inits.update(dequantized_constants(model.graph, inits))  # QDQ files: DequantizeLinear on constants
    stacks, chain = {}, []
    for i, node in enumerate(n for n in model.graph.node if n.op_type == "GRU"):
        name = node.name or f"GRU_{i}"
        where = f"{path}: GRU node '{name}'"
        if _attr(node, "linear_before_reset", 0) != 1:
            raise QtoolError(f"{where} has linear_before_reset=0; only linear_before_reset=1 (the "
                             "haste/PyTorch formulation) is supported")
        direction = _attr(node, "direction", b"forward")
        direction = direction.decode() if isinstance(direction, bytes) else direction
        if direction not in ("forward", "bidirectional"):
            raise QtoolError(f"{where} has direction '{direction}'; only forward and bidirectional "
                             "are supported")
        acts = [a.decode() if isinstance(a, bytes) else a for a in _attr(node, "activations", [])]
        if any(a.lower() not in ("sigmoid", "tanh") for a in acts) or _attr(node, "clip", None):
            raise QtoolError(f"{where} uses custom activations or clipping; not supported")
        try:
            W, R = inits[node.input[1]], inits[node.input[2]]
        except KeyError as e:
            raise QtoolError(f"{where}: weight {e} is not a constant initializer") from None
        dirs, three_h = R.shape[0], R.shape[1]
        B = inits.get(node.input[3]) if len(node.input) > 3 and node.input[3] else None
        if B is None:
            B = np.zeros((dirs, 2 * three_h), np.float32)
        cells = [GruCell(W[d], R[d], B[d, :three_h], B[d, three_h:]) for d in range(dirs)]
        stacks[name] = [cells]
        chain.append(cells)
    if len(chain) > 1:
        try:
            stacks[""] = stack_layers(chain, str(path))
        except QtoolError:
            pass
    return stacks
