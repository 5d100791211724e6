"""The registry of ONNX op handlers (qtool.importers.onnx.ops): op type -> handler(reader, node)."""

from __future__ import annotations

from collections.abc import Callable

HANDLERS: dict[str, Callable] = {}


def handles(*ops: str) -> Callable:
    """Register the decorated function as the handler of ONNX `ops`."""
    def register(f: Callable) -> Callable:
        for op in ops:
            HANDLERS[op] = f
        return f
    return register
