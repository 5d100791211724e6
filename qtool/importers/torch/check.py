"""The PyTorch side of the import check: the state dict as read from the file, loaded by PyTorch
itself into an `nn.GRU` (strict: every name and shape as nn.GRU defines them) and run; a QuantGRU
checkpoint whose cells are of another form (`cell_form_l{k}` buffers), which nn.GRU cannot
compute, through `qtool.qat.QuantGRU`'s float forward (`qtool.importers.torch.float_gru`: torch, nn.GRU's
names and r | z | n layout, the forms read here from the buffers by their own names), not through
the importer's reordering or qtool's numpy reference that the check compares it with."""

from __future__ import annotations

import re

import numpy as np

from qtool.importers.checks import one_torch_thread


def run_torch(state: dict, x: np.ndarray) -> np.ndarray:
    """nn.GRU built from `state` (nn.GRU's own parameter names) on batch-first `x [N, T, C]`."""
    import torch  # ImportError: PyTorch is not installed, nothing to check against

    layers = 1 + max(int(re.search(r"_l(\d+)", k)[1]) for k in state)
    gru = torch.nn.GRU(state["weight_ih_l0"].shape[1], state["weight_hh_l0"].shape[1], num_layers=layers,
                       bias="bias_ih_l0" in state, batch_first=True,
                       bidirectional="weight_ih_l0_reverse" in state)
    gru.load_state_dict({k: torch.from_numpy(v) for k, v in state.items()}, strict=True)
    with torch.no_grad(), one_torch_thread():
        return gru(torch.from_numpy(np.ascontiguousarray(x, np.float32)))[0].numpy()


def run_quant_gru_float(state: dict, forms: dict, x: np.ndarray) -> np.ndarray:
    """QuantGRU's float forward of `state` (nn.GRU's names) with the cell forms of `forms` (the
    `cell_form_l{k}[_reverse]` buffers as stored; a cell without one is the haste cell) on
    batch-first `x [N, T, C]`."""
    import torch  # ImportError: PyTorch is not installed, nothing to check against

    from qtool.core.model import HASTE
    from qtool.importers.torch.float_gru import float_gru
    from qtool.importers.torch.forms import decode_form, form_key

    layers = 1 + max(int(re.search(r"_l(\d+)", k)[1]) for k in state)
    dirs = 2 if "weight_ih_l0_reverse" in state else 1
    cells = [[decode_form(forms[form_key(l, d)], form_key(l, d)) if form_key(l, d) in forms else HASTE
              for d in range(dirs)] for l in range(layers)]
    weights = {k: torch.from_numpy(np.ascontiguousarray(v, np.float32)) for k, v in state.items()}
    with torch.no_grad(), one_torch_thread():
        return float_gru(weights, cells, torch.from_numpy(np.ascontiguousarray(x, np.float32))).numpy()
