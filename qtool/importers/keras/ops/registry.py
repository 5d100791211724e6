"""The registry of Keras layer builders (qtool.importers.keras.ops): class name -> builder(reader,
layer, sources)."""

from __future__ import annotations

from collections.abc import Callable

BUILDERS: dict[str, Callable] = {}


def builds(*classes: str) -> Callable:
    """Register the decorated function as the builder of Keras layer `classes`."""
    def register(f: Callable) -> Callable:
        for cls in classes:
            BUILDERS[cls] = f
        return f
    return register
