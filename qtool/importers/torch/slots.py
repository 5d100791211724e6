"""The names torch.ao quantizers take beside a GRU's weights in a state dict (docs/qat.md): the
tensors of every cell form's table (`rh` of a reset-before cell too), longest names first so that
`rh_l0_fake_quant` is rh's slot, not `h` under a module prefix `r`."""

from __future__ import annotations

import re

from qtool.core.model import DIRECTIONS
from qtool.core.tensors import ALL_NAMES
from qtool.errors import QtoolError

ALIASES = {"weight_ih": "W", "weight_hh": "R", "bias_ih": "bx", "bias_hh": "br"}


_TENSOR = "|".join(sorted([*ALIASES, *(n for n in ALL_NAMES if n not in ("W", "R", "bx", "br"))], key=len,
                          reverse=True))


SLOT = re.compile(rf"^(?P<prefix>(?:.*?\.)??)(?:(?P<alias>{_TENSOR})_l(?P<layer>\d+)(?P<rev>_reverse)?_fake_quant"
                  rf"|(?P<output>activation_post_process))\.(?P<leaf>.+)$")


def slot_name(name: str, layer: int, direction: int) -> str:
    """A quantizer's stem in a checkpoint (`weight_ih_l0`, `rh_l1_reverse`) for a tensor of the table."""
    alias = {v: k for k, v in ALIASES.items()}.get(name, name)
    return f"{alias}_l{layer}{'_reverse' if direction else ''}"


def check_slots(keys, prefix: str, layers: list, where: str) -> None:
    """The quantizers under `prefix` (a GRU's, `layers[l][d]` its cells) name tensors of their
    cell's form; else the checkpoint was written for another cell (a QuantGRU checkpoint whose
    `cell_form_l{k}` buffer is missing or says another form) and reading it would make another
    network: refused in one line. A QuantGRU quantizer of g_pre (`exp2_inv`) without one of g_out
    is a relu or linear candidate's tie, which a tanh cell never has."""
    from qtool.core.tensors import cell_names
    from qtool.importers.torch.forms import form_key

    own, seen = set(), set()
    for key in keys:
        m = SLOT.match(key)
        if not m or m["prefix"] != prefix or m["output"]:
            continue
        name, l, d = ALIASES.get(m["alias"], m["alias"]), int(m["layer"]), int(bool(m["rev"]))
        if l >= len(layers) or d >= len(layers[l]):
            continue  # no such cell: said where the ranges are placed
        seen.add((name, l, d))
        own |= {(name, l, d)} if m["leaf"] == "exp2_inv" else set()
        form = layers[l][d].form
        if name not in cell_names(form):
            hint = (f" (a reset-before cell's tensor, but the checkpoint has no '{prefix}{form_key(l, d)}' "
                    "saying so)" if name == "rh" and form.reset_after else "")
            raise QtoolError(f"{where}: quantizer '{prefix}{slot_name(name, l, d)}_fake_quant' is for {name}, "
                             f"which the layer {l} {DIRECTIONS[d]} cell ({form.describe()}) does not "
                             f"compute{hint}; refusing to read the checkpoint as another network")
    for name, l, d in sorted(own):
        if name == "g_pre" and ("g_out", l, d) not in seen and layers[l][d].form.candidate == "tanh":
            raise QtoolError(f"{where}: QuantGRU quantizer '{prefix}{slot_name(name, l, d)}_fake_quant' has no "
                             "g_out beside it, as a relu or linear candidate's checkpoint has, but the layer "
                             f"{l} {DIRECTIONS[d]} cell is {layers[l][d].form.describe()} (no "
                             f"'{prefix}{form_key(l, d)}'); refusing to read the checkpoint as another network")
