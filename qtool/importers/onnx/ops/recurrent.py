"""Recurrent ops: the ONNX GRU node (its cells read by qtool.importers.onnx.gru), a gru layer."""

from __future__ import annotations

from qtool.importers.onnx.ops.registry import handles


@handles("GRU")
def gru(r, node) -> None:
    from qtool.core.model import DIRECTIONS
    from qtool.importers.onnx.gru import _cells, _check_attributes
    from qtool.importers.onnx.gru import _check_inputs as _gru_inputs

    edge, lay = r.input(node)
    if len(lay.axes) == 3 and isinstance(lay.axes[0], int) and lay.axes[1] in ("NT", "N"):
        raise r.fail(node, f"runs along an axis of {lay.cdims[lay.axes[0]]} of a map ({lay.describe()}: its "
                           "frequencies, say), not along time: a dual-path RNN's GRU within each frame, which "
                           "qtool does not read yet (its GRUs run along time)")
    if len(lay.axes) != 3 or lay.axes[:2] != ("T", "N") or not lay.holds_channels(2):
        raise r.fail(node, f"reads X as {lay.describe()}; ONNX's GRU reads [T, N, C] (time-first)",
                        layout=True)
    where = f"{r.where}: GRU {r.label(node)}"
    dirs = _check_attributes(node, where)
    _gru_inputs(r.g, node, where)
    cells = _cells(r.g, node, dirs, where)
    if any(c.form != cells[0].form for c in cells):
        raise r.fail(node, f"computes different cells in its directions ({cells[0].form.describe()}; "
                        f"{cells[1].form.describe()}); a gru node has one cell form")
    H = cells[0].R.shape[1]
    params = {f"l0.{DIRECTIONS[d]}.{w}": getattr(c, w) for d, c in enumerate(cells) for w in ("W", "R", "bx", "br")}
    attrs = {"layers": 1, "bidirectional": dirs == 2, **cells[0].form.attrs()}
    seq = lay.replace(axes=("T", 0, "N", 1), cdims=(dirs, H))  # Y: [T, dirs, N, H]
    last = lay.replace(axes=(0, "N", 1), cdims=(dirs, H))  # Y_h: [dirs, N, H]
    if r.used(node, 0):
        y = r.emit(node, "gru", [edge], seq, {**attrs, "return_sequences": True}, params)
    if r.used(node, 1):
        if r.used(node, 0) and dirs == 1:
            r.emit(node, "last_step", [y.outputs[0]], last, out=1, source="GRU (Y_h)")
        else:
            r.emit(node, "gru", [edge], last, {**attrs, "return_sequences": False}, dict(params), out=1)
