"""A GRU cell's form (qtool.core.model.CellForm) in a PyTorch state dict: what `qtool.qat.QuantGRU`
writes for each cell that is not the haste form, and what the torch importer reads (docs/qat.md,
"Checkpoints"). nn.GRU's layout has no place for it, so it is a buffer beside the weights:

    <P>.cell_form_l{k}[_reverse] = int64 [reset_after, gate, alpha, beta, candidate]

reset_after 0 or 1; gate 0 sigmoid, 1 hard_sigmoid; candidate 0 tanh, 1 relu, 2 linear; alpha and
beta the hard_sigmoid's float64 constants stored as their IEEE 754 bits (0 for sigmoid), so the
form survives `module.float()`, `.half()` and `.to(device)` (integer buffers are never cast) and
comes back exactly. A haste cell has no buffer: a checkpoint without any is what it always was.
A buffer qtool cannot read (another length, dtype or code) is refused, never taken as haste.

numpy only: a `.safetensors` checkpoint is read without PyTorch."""

from __future__ import annotations

import re

import numpy as np

from qtool.core.model import CellForm
from qtool.errors import QtoolError

FORM_KEY = re.compile(r"^(?P<prefix>.*?)cell_form_l(?P<layer>\d+)(?P<rev>_reverse)?$")
# the stored codes: fixed here, whatever qtool.core.model adds later (a new one is a new code)
GATES = ("sigmoid", "hard_sigmoid")
CANDIDATES = ("tanh", "relu", "linear")
FIELDS = "[reset_after, gate, alpha, beta, candidate]"


def form_key(layer: int, direction: int) -> str:
    """The buffer's name in a GRU's state dict (without the module prefix)."""
    return f"cell_form_l{layer}" + ("_reverse" if direction else "")


def _bits(v: float) -> int:
    return int(np.array(v, np.float64).view(np.int64))


def _float(bits) -> float:
    return float(np.array(int(bits), np.int64).view(np.float64))


def encode_form(form: CellForm) -> np.ndarray:
    """The buffer's values (int64 [5]) for a form; decode_form(encode_form(f)) == f exactly."""
    if form.gate not in GATES or form.candidate not in CANDIDATES:
        raise QtoolError(f"a checkpoint cannot store the cell form '{form.describe()}' (gates "
                         f"{', '.join(GATES)}; candidates {', '.join(CANDIDATES)})")
    hard = form.gate == "hard_sigmoid"
    return np.array([int(form.reset_after), GATES.index(form.gate),
                     _bits(form.gate_alpha) if hard else 0, _bits(form.gate_beta) if hard else 0,
                     CANDIDATES.index(form.candidate)], np.int64)


def decode_form(value, where: str) -> CellForm:
    """The form a buffer names; a QtoolError (one line, naming `where`) for anything else."""
    a = np.asarray(value)
    head = f"{where}: cell form buffer"
    if a.dtype.kind not in "iu" or a.shape != (5,):
        raise QtoolError(f"{head} is {a.dtype} {list(a.shape)}; qtool reads int64 {FIELDS} (a QuantGRU "
                         "checkpoint); refusing to guess the cell")
    reset_after, gate, alpha, beta, candidate = (int(v) for v in a)
    if reset_after not in (0, 1) or gate not in range(len(GATES)) or candidate not in range(len(CANDIDATES)):
        raise QtoolError(f"{head} {a.tolist()} names a cell qtool cannot compute (reset_after 0 or 1; gate "
                         f"0 sigmoid, 1 hard_sigmoid; candidate 0 tanh, 1 relu, 2 linear)")
    if GATES[gate] == "sigmoid":
        if alpha or beta:
            raise QtoolError(f"{head} {a.tolist()}: a sigmoid gate has no alpha or beta")
        params = (None, None)
    else:
        params = (_float(alpha), _float(beta))
    try:
        return CellForm(bool(reset_after), GATES[gate], *params, candidate=CANDIDATES[candidate])
    except QtoolError as e:
        raise QtoolError(f"{head}: {e}") from None
