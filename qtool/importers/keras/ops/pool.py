"""Keras' poolings over time (AveragePooling1D, MaxPooling1D and their global forms) and ZeroPadding1D."""

from __future__ import annotations

from typing import TYPE_CHECKING

from qtool.importers.keras.ops.common import channels_last, ints
from qtool.importers.keras.ops.registry import builds

if TYPE_CHECKING:
    from qtool.importers.keras.model_graph import Entry, Reader


POOLS = {"AveragePooling1D": "avg_pool1d", "MaxPooling1D": "max_pool1d",
         "GlobalAveragePooling1D": "global_avg_pool1d", "GlobalMaxPooling1D": "global_max_pool1d"}



@builds(*POOLS)
def _pool(r: Reader, e: Entry, src: list[str]) -> None:
    channels_last(r, e)
    if e.cls.startswith("Global"):
        if e.cfg.get("keepdims"):
            raise r.fail(e, "has keepdims=True; only keepdims=False ([N, C]) is supported")
        r.add(e, POOLS[e.cls], src)
        return
    (pool,) = ints(r, e, "pool_size", 2)
    (stride,) = ints(r, e, "strides", pool) if e.cfg.get("strides") is not None else (pool,)
    padding = e.cfg.get("padding", "valid")
    if padding not in ("valid", "same"):
        raise r.fail(e, f"has padding={padding!r}; supported: 'valid', 'same'")
    r.add(e, POOLS[e.cls], src, {"pool": pool, "stride": stride, "padding": padding})


@builds("ZeroPadding1D")
def _zero_pad(r: Reader, e: Entry, src: list[str]) -> None:
    channels_last(r, e)
    before, after = ints(r, e, "padding", 1, n=2)
    r.add(e, "zero_pad1d", src, {"pad": (before, after)})
