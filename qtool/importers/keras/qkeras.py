"""QKeras `QGRU` layers (qkeras-v3, Keras 3): the quantizers in the layer's config.

A QGRU runs a Keras GRU (reset_after=True, z | r | g) on `kernel_quantizer(kernel)`,
`recurrent_quantizer(recurrent_kernel)` and `bias_quantizer(bias)`, and quantizes the state it
reads each step with `state_quantizer`. The file stores the float weights; the quantizers are
recomputed here (a fake-quant on a constant folds into it), so qtool's float model is
the GRU QKeras runs. `quantized_bits` is the only quantizer qtool reads:
- alpha None or a number a: levels of step a 2^integer / 2^(bits - keep_negative);
- alpha "auto_po2": a power-of-two scale per output column, found from the weights themselves by
  QKeras' least-squares iteration (ported below, in float32 as QKeras computes it), on the
  symmetric levels -(2^(bits-1) - 1) .. 2^(bits-1) - 1. The file holds no scale: it is a
  function of the weights, so the port must give QKeras' own numbers (the golden test checks).
W and R get their learned ranges per channel (columns of kernel [C, 3H] are qtool's rows), h
the state quantizer's range. Biases are folded only (qtool keeps them on its 32-bit grid).
"""

from __future__ import annotations

from qtool.errors import QtoolError
from qtool.importers.keras.quantizers import grid
from qtool.importers.ranges import Imported, ImportedRange, source_key


def read_qkeras(path, model) -> Imported | None:
    """The QGRU quantizers of a `.keras`/`.h5` file for the GRU stack `model` was imported from
    (the GRUs `importers.import_model` chose, by `model.source`); None without QGRUs."""
    import tempfile

    from qtool.importers.keras.reader import SPOOL_BYTES, _read

    with tempfile.SpooledTemporaryFile(SPOOL_BYTES) as tmp:
        _, grus, raw = _read(path, tmp)
    if not any(dr.quantizers for g in grus for dr in g.dirs):
        return None
    key = source_key(model)  # a GRU's name, or "": the file's GRUs in order (one, or the chained stack)
    chosen = [g for g in grus if g.name == key] if key else grus
    if len(chosen) != model.num_layers:
        raise QtoolError(f"{model.source}: {len(chosen)} Keras GRUs for {model.num_layers} layers")
    out = Imported("QKeras")
    for l, g in enumerate(chosen):
        if not any(dr.quantizers for dr in g.dirs):
            out.notes.append(f"layer {l} is not a QGRU: its ranges come from calibration")
            continue
        for d, (dr, cell) in enumerate(zip(g.dirs, raw[g.name])):
            for name in ("W", "R", "h"):
                c = dr.quantizers[name]
                if c is None:
                    continue
                # auto_po2: the grid QKeras found on the stored (float) weights, per column
                step, qmin, qmax = grid(c, getattr(cell, name).T if name != "h" else None)
                out.add(l, d, name, ImportedRange(qmin * step, qmax * step, f"QGRU '{g.name}' {name}",
                                                  step, c["bits"]))
    return out
