"""DequantizeLinear and QuantizeLinear parameters: integer types, their bounds, and the dequantization of
constants (a fake-quant on a constant folds into it)."""

from __future__ import annotations

import numpy as np

from qtool.errors import QtoolError
from qtool.importers.onnx.fold import attr

# ONNX TensorProto data types of quantized integers: (bits, signed)
INT_TYPES = {2: (8, False), 3: (8, True), 4: (16, False), 5: (16, True)}


def bounds(elem_type: int) -> tuple[int, int, int]:
    """(bits, qmin, qmax) of an ONNX integer type."""
    if elem_type not in INT_TYPES:
        raise QtoolError(f"quantized ONNX type {elem_type} is not supported (int8, uint8, int16, uint16)")
    bits, signed = INT_TYPES[elem_type]
    return (bits, -(1 << (bits - 1)), (1 << (bits - 1)) - 1) if signed else (bits, 0, (1 << bits) - 1)


def broadcast(param: np.ndarray, shape: tuple, axis: int) -> np.ndarray:
    """A DequantizeLinear scale or zero point (scalar, or 1-D along `axis`) against its input."""
    param = np.asarray(param)
    if param.ndim == 0 or param.size == 1:
        return np.broadcast_to(param.reshape(()), shape)
    view = [1] * len(shape)
    view[axis % len(shape)] = param.size
    return np.broadcast_to(param.reshape(view), shape)


def dequantizer(node, consts: dict, where: str) -> tuple[np.ndarray, np.ndarray, int]:
    """(scale, zero point, ONNX integer type) of a QuantizeLinear/DequantizeLinear node."""
    if attr(node, "block_size", 0):
        raise QtoolError(f"{where}: blocked quantization (block_size) is not supported")
    try:
        scale = consts[node.input[1]]
    except KeyError:
        raise QtoolError(f"{where}: the scale of '{node.name}' is not a constant") from None
    zp_name = node.input[2] if len(node.input) > 2 else ""
    if zp_name and zp_name not in consts:
        raise QtoolError(f"{where}: the zero point of '{node.name}' is not a constant")
    zp = consts[zp_name] if zp_name else np.zeros((), np.uint8)
    return np.asarray(scale, np.float64), zp, np_type(zp)


def np_type(a: np.ndarray) -> int:
    return {np.dtype(np.uint8): 2, np.dtype(np.int8): 3, np.dtype(np.uint16): 4,
            np.dtype(np.int16): 5}.get(np.asarray(a).dtype, 0)


def dequantize_node(node, consts: dict) -> np.ndarray:
    q = consts[node.input[0]]
    scale, zp, _ = dequantizer(node, consts, "DequantizeLinear")
    axis = attr(node, "axis", 1)
    return ((q.astype(np.float64) - broadcast(zp, q.shape, axis)) * broadcast(scale, q.shape, axis)
            ).astype(np.float32)


def dequantized_constants(graph, consts: dict) -> dict:
    """Outputs of DequantizeLinear nodes on constant integers, as float constants."""
    return {n.output[0]: dequantize_node(n, consts) for n in graph.node
            if n.op_type == "DequantizeLinear" and n.input[0] in consts}
