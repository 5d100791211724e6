"""Recurrent ops: the ONNX GRU node (its cells read by qtool.importers.onnx.gru), a gru layer."""

from __future__ import annotations

from qtool.importers.onnx.ops.registry import handles


def _dual_path(r, node, lay) -> tuple[str, int, str] | None:
    """(along, F, order) of a GRU over a feature map (qtool.layers.gru.dual_path) that a dual-path RNN
    runs: along its frequencies with batch and time merged (`[F, N * T, C]`), or along time with batch
    and frequencies merged (`[T, N * F, C]`); None for a GRU over a sequence."""
    axes = lay.axes
    if len(axes) != 3 or not isinstance(axes[2], int) or len(lay.cdims) != 2:
        return None
    if isinstance(axes[0], int) and axes[1] == "NT":
        f, along = axes[0], "freq"
    elif axes[0] == "T" and isinstance(axes[1], tuple) and axes[1][0] == "N":
        f, along = axes[1][1], "time"
    else:
        return None
    return along, lay.cdims[f], "fc" if f < axes[2] else "cf"


@handles("GRU")
def gru(r, node) -> None:
    from qtool.core.model import DIRECTIONS
    from qtool.importers.onnx.gru import _cells, _check_attributes
    from qtool.importers.onnx.gru import _check_inputs as _gru_inputs

    edge, lay = r.input(node)
    dual = _dual_path(r, node, lay)
    if dual is None and (len(lay.axes) != 3 or lay.axes[:2] != ("T", "N") or not lay.holds_channels(2)):
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
    if dual is not None:  # the frequencies F the edge's first factor, then each one's [dirs, H]
        along, F, order = dual
        if r.used(node, 1):
            raise r.fail(node, f"gives its final states (Y_h) along {'frequency' if along == 'freq' else 'time'} "
                               "of each frame's map; qtool's GRUs over a map give their sequence")
        attrs.update(along=along, freq=F, order=order)
        seq = lay.replace(axes=(0, 1, "NT", 2) if along == "freq" else ("T", 1, ("N", 0), 2), cdims=(F, dirs, H))
    if r.used(node, 0):
        y = r.emit(node, "gru", [edge], seq, {**attrs, "return_sequences": True}, params)
    if r.used(node, 1):
        if r.used(node, 0) and dirs == 1:
            r.emit(node, "last_step", [y.outputs[0]], last, out=1, source="GRU (Y_h)")
        else:
            r.emit(node, "gru", [edge], last, {**attrs, "return_sequences": False}, dict(params), out=1)
