"""Fake-quant state in PyTorch checkpoints (`.pt`/`.pth`, `.safetensors`): torch.ao FakeQuantize
and observer buffers for a GRU's tensors, and qtool's own QAT checkpoints (QuantGRU.state_dict()).

torch.ao cannot prepare an nn.GRU for QAT itself (prepare_qat attaches only an output
FakeQuantize, which fails on the GRU's tuple output), so its quantizers live in modules the user
names. Accepted names, next to the GRU's weights `<P>.weight_ih_l0` (docs/qat.md):

- `<P>.<slot>_fake_quant.<leaf>`, slot = `weight_ih_l{k}`, `weight_hh_l{k}`, `bias_ih_l{k}`,
  `bias_hh_l{k}` (W, R, bx, br) or `<tensor>_l{k}` for any tensor of the tensor table
  (docs/numerics.md; `x_l0`, `h_l1`, `z_pre_l0`, ...), with `_reverse` for the backward direction;
- `<P>.activation_post_process.<leaf>`: the output FakeQuantize, h of the last layer.

Leaves: a FakeQuantize's `scale` and `zero_point` (per tensor, or per output row in PyTorch's r | z
| n order), with `fake_quant_enabled` (0: ignored) and optional `quant_min`/`quant_max` (default
torch.ao's: qint8 [-128, 127] for weights, quint8 [0, 255] for activations, qint8 when a zero
point is negative); a bare observer's `min_val`/`max_val`; qtool's own `exp2_inv`, `zero_point`,
`bits`, `symmetric`, `range_lo`, `range_hi`. Observer statistics next to a scale, histograms and
flags are training state: ignored, with a note.

Quantizers name tensors of their cell's form (`rh_l{k}` in a reset-before cell, whose form a
QuantGRU checkpoint holds in `cell_form_l{k}`, qtool.importers.torch.forms); one of a tensor the
cell does not compute is refused (slots.check_slots). A QuantGRU relu or linear candidate's tied
g_out (no quantizer of its own) is g_pre's grid; a QuantGRU bias grid is refit to the bias.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from qtool.core.model import DIRECTIONS, HASTE, GruModel
from qtool.core.qmodel import TensorQ
from qtool.errors import QtoolError
from qtool.importers.ranges import Imported, ImportedRange, learned_range, source_key
from qtool.importers.torch.forms import decode_form, form_key
from qtool.importers.torch.slots import ALIASES, SLOT, check_slots, slot_name
from qtool.importers.torch.state_dict import key_prefix, load_tensors, rzn_to_zrg
from qtool.numerics.qparams import choose_qparams, qrange

LEFTOVERS = ("observer_enabled", "eps", "histogram", "min_val", "max_val")


def _slots(tensors: dict, prefix: str) -> dict[tuple, dict]:
    """Quantizer leaves grouped by (tensor, layer, direction) for the GRU at `prefix`."""
    out: dict[tuple, dict] = {}
    for key, value in tensors.items():
        m = SLOT.match(key)
        if not m or m["prefix"] != prefix:
            continue
        if m["output"]:
            slot = ("h", None, 0)  # the GRU's output: h of the last layer
        else:
            slot = (ALIASES.get(m["alias"], m["alias"]), int(m["layer"]), int(bool(m["rev"])))
        out.setdefault(slot, {})[m["leaf"]] = np.asarray(value)
    return out


def _canonical(v: np.ndarray) -> np.ndarray:
    """A per-row vector in PyTorch's r | z | n order, in qtool's z | r | g."""
    return rzn_to_zrg(v.reshape(-1)) if np.size(v) > 1 else v.reshape(())


def _own(leaves: dict, name: str, where: str, values: np.ndarray | None = None) -> ImportedRange:
    """qtool's own quantizer (QuantGRU): the grid as trained, no snapping, as
    `QuantGRU.to_quant_model` takes it (TensorQuantizer.tensor_q: the recorded range clipped to
    the grid). A bias's grid follows its values (`values`, z | r | g): its exp2_inv is the
    calibration rule on the current biases, as `to_quant_model` refits it, not the value stored
    at the last forward pass (training steps the biases after it)."""
    bits = int(leaves["bits"])
    e = np.floor(_canonical(leaves["exp2_inv"]).astype(np.float64) + 0.5).astype(np.int64)
    if values is not None:
        e = np.array([choose_qparams(v, v, bits, True)[0] for v in np.asarray(values, np.float64)], np.int64)
    zp = int(np.floor(float(leaves["zero_point"]) + 0.5))
    lo, hi = _canonical(leaves["range_lo"]), _canonical(leaves["range_hi"])
    qmin, qmax = qrange(bits)
    lo, hi = np.maximum(lo, np.ldexp(float(qmin - zp), -e)), np.minimum(hi, np.ldexp(float(qmax - zp), -e))
    t = TensorQ(bits, bool(leaves["symmetric"]), e if e.ndim else int(e), zp, lo if e.ndim else float(lo),
                hi if e.ndim else float(hi))
    return ImportedRange(t.lo, t.hi, f"{where} (qtool QAT)", exact=t)


def _check_forms(path: Path, tensors: dict, prefix: str, model: GruModel) -> None:
    """The checkpoint's cell forms are the model's: ranges of one form are never put on another."""
    for l, row in enumerate(model.layers):
        for d, cell in enumerate(row):
            key = prefix + form_key(l, d)
            form = decode_form(tensors[key], f"{path}: '{key}'") if key in tensors else HASTE
            if form != cell.form:
                raise QtoolError(f"{path}: the checkpoint's layer {l} {DIRECTIONS[d]} cell is {form.describe()}, "
                                 f"the model's {cell.form.describe()}; its quantizers are for the checkpoint's "
                                 "cell (import the model from the checkpoint itself)")


def _fake_quant(leaves: dict, name: str, where: str) -> ImportedRange:
    scale, zp = _canonical(leaves["scale"]).astype(np.float64), _canonical(leaves["zero_point"])
    if "quant_min" in leaves and "quant_max" in leaves:
        qmin, qmax = int(leaves["quant_min"]), int(leaves["quant_max"])
    elif name in ("W", "R", "bx", "br") or np.any(zp < 0):
        qmin, qmax = -128, 127
    else:
        qmin, qmax = 0, 255
    bits = int(qmax - qmin).bit_length()
    lo, hi = learned_range(scale, zp, qmin, qmax)
    desc = f"scale {float(scale):.6g}" if scale.ndim == 0 else "per channel"
    return ImportedRange(lo if lo.ndim else float(lo), hi if hi.ndim else float(hi),
                         f"{where} ([{qmin}, {qmax}], {desc})", scale if scale.ndim else float(scale), bits)


def read_fake_quant(path: Path, fmt: str, model: GruModel) -> Imported | None:
    """The quantizers of the GRU the float import chose; None when the checkpoint holds none."""
    prefix = key_prefix(source_key(model))
    tensors = load_tensors(path, fmt, keep=lambda k: True)
    _check_forms(path, tensors, prefix, model)
    check_slots(tensors, prefix, model.layers, str(path))
    slots = _slots(tensors, prefix)
    if not slots:
        return None
    own = any("exp2_inv" in leaves for leaves in slots.values())
    imported = Imported("qtool QAT" if own else "torch.ao fake-quant")
    ignored: set[str] = set()
    for (name, layer, d), leaves in sorted(slots.items(), key=lambda kv: (kv[0][1] or 0, kv[0][2], kv[0][0])):
        if layer is None:
            where, layer = f"'{prefix}activation_post_process'", model.num_layers - 1
        else:
            where = f"'{prefix}{slot_name(name, layer, d)}_fake_quant'"
        if layer >= model.num_layers or d >= model.num_directions:
            raise QtoolError(f"{path}: quantizer {where} is for a cell the GRU does not have "
                             f"({model.num_layers} layer(s), {model.num_directions} direction(s))")
        if "exp2_inv" in leaves:
            values = getattr(model.layers[layer][d], name) if name in ("bx", "br") else None
            imported.add(layer, d, name, _own(leaves, name, where, values))
        elif "scale" in leaves:
            if "fake_quant_enabled" in leaves and not np.all(leaves["fake_quant_enabled"]):
                imported.notes.append(f"{where}: fake-quant disabled; ignored")
                continue
            if name in ("bx", "br"):
                imported.notes.append(f"{where}: biases keep their values on qtool's 32-bit grid")
                continue
            imported.add(layer, d, name, _fake_quant(leaves, name, where))
        elif "min_val" in leaves and "max_val" in leaves:
            lo, hi = _canonical(leaves["min_val"]), _canonical(leaves["max_val"])
            imported.add(layer, d, name, ImportedRange(lo if lo.ndim else float(lo), hi if hi.ndim else float(hi),
                                                       f"{where} (observer min/max)"))
        else:
            raise QtoolError(f"{path}: quantizer {where} has neither scale/zero_point, min_val/max_val "
                             "nor exp2_inv")
        if "scale" in leaves:
            ignored |= {leaf.rsplit(".", 1)[-1] for leaf in leaves} & set(LEFTOVERS)
    if ignored and not own:
        imported.notes.append(f"training state ignored: {', '.join(sorted(ignored))}")
    if own:
        _tied_g_out(prefix, model, imported)
    return imported


def _tied_g_out(prefix: str, model: GruModel, imported: Imported) -> None:
    """A QuantGRU cell whose relu or linear candidate has g_out on g_pre's grid has one quantizer
    for both (QuantGRU's tie, calibration's): g_out is g_pre's grid (slots.check_slots refused a
    tanh cell without g_out)."""
    for l, row in enumerate(model.layers):
        for d, cell in enumerate(row):
            pre = imported.ranges.get((l, d, "g_pre"))
            if cell.form.candidate == "tanh" or pre is None or pre.exact is None or (l, d, "g_out") in imported.ranges:
                continue
            where = f"'{prefix}{slot_name('g_pre', l, d)}_fake_quant'"
            imported.ranges[(l, d, "g_out")] = ImportedRange(pre.lo, pre.hi, f"{where} (qtool QAT, g_out tied "
                                                             "to g_pre)", exact=pre.exact)
