"""The PyTorch side of the import check: the state dict as read from the file, loaded by PyTorch
itself into an `nn.GRU` (strict: every name and shape as nn.GRU defines them) and run."""

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
