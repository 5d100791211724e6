"""Keras' GRU, a Bidirectional GRU and an RNN of one GRUCell: one gru node, its cells read by the
GRU importer's own reader."""

from __future__ import annotations

from typing import TYPE_CHECKING

from qtool.core.model import DIRECTIONS
from qtool.importers.keras.ops.registry import builds
from qtool.importers.keras.reader import _cells_keras3, _cells_legacy

if TYPE_CHECKING:
    from qtool.importers.keras.model_graph import Entry, Reader


GRUS = ("GRU", "Bidirectional", "RNN")  # RNN: one GRUCell; Bidirectional: of a GRU



@builds(*GRUS)
def _gru(r: Reader, e: Entry, src: list[str]) -> None:
    g = r.grus.get(e.name)
    if g is None:  # a Bidirectional or RNN of something else
        inner = e.cfg.get("layer") if e.cls == "Bidirectional" else e.cfg.get("cell")
        what = inner.get("class_name") if isinstance(inner, dict) else inner
        raise r.fail(e, f"wraps {what!r}; only a GRU (GRUCell) is supported there")
    inner = ((e.cfg.get("layer") or {}).get("config") or {}) if e.cls == "Bidirectional" else e.cfg
    for key in ("return_state", "time_major"):
        if inner.get(key) or e.cfg.get(key):
            raise r.fail(e, f"has {key}=True; qtool's GRU returns its output only, batch first")
    cells = (_cells_legacy if r.legacy else _cells_keras3)(r.where, r.f, g)
    if any(c.form != cells[0].form for c in cells):
        raise r.fail(e, f"computes different cells in its directions ({cells[0].form.describe()}; "
                     f"{cells[1].form.describe()}); a gru node has one cell form")
    params = {f"l0.{DIRECTIONS[d]}.{k}": getattr(c, k) for d, c in enumerate(cells) for k in ("W", "R", "bx", "br")}
    attrs = {"return_sequences": bool(inner.get("return_sequences", False)), "bidirectional": len(cells) == 2,
             "layers": 1, **cells[0].form.attrs()}
    r.add(e, "gru", src, attrs, params)
