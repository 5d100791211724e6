"""The float GRU of every cell form in torch, on nn.GRU's own parameter names and layout: the
reference a QuantGRU checkpoint's import is checked against (`check.py`), and QuantGRU's float
forward (qtool.qat)."""

from __future__ import annotations

import torch

from qtool.core.model import CellForm


def float_gru(weights: dict, forms: list[list[CellForm]], x: torch.Tensor) -> torch.Tensor:
    """The float GRU of every cell form in torch, from nn.GRU's own parameters (`weight_ih_l0`,
    ..., gate order r | z | n; no biases: zero) on batch-first `x [N, T, C]`; `forms[l][d]` is each
    cell's. Written from CellForm's definition (docs/numerics.md, "Float GRU") with PyTorch's
    names and layout, apart from qtool's importer and its numpy reference: the import check of a
    QuantGRU checkpoint runs it against them."""
    seq = x
    for l, row in enumerate(forms):
        outs = []
        for d, form in enumerate(row):
            sfx = f"_l{l}" + ("_reverse" if d else "")
            w_ih, w_hh = (weights[k + sfx].to(x.dtype) for k in ("weight_ih", "weight_hh"))
            H = w_hh.shape[1]
            b_ih, b_hh = (weights[k + sfx].to(x.dtype) if k + sfx in weights else x.new_zeros(3 * H)
                          for k in ("bias_ih", "bias_hh"))
            if form.gate == "sigmoid":
                gate = torch.sigmoid
            else:
                alpha, beta = form.gate_alpha, form.gate_beta
                gate = lambda v, a=alpha, b=beta: torch.clamp(a * v + b, 0.0, 1.0)  # noqa: E731
            candidate = {"tanh": torch.tanh, "relu": torch.relu, "linear": lambda v: v}[form.candidate]
            xs = torch.flip(seq, (1,)) if d else seq
            gx = xs @ w_ih.T + b_ih  # [N, T, 3H]: r | z | n
            h = x.new_zeros((x.shape[0], H))
            hs = []
            for t in range(xs.shape[1]):
                x_r, x_z, x_n = gx[:, t].split(H, dim=-1)
                if form.reset_after:  # n = candidate(W_n x + b_in + r * (R_n h + b_hn))
                    h_r, h_z, h_n = (h @ w_hh.T + b_hh).split(H, dim=-1)
                    r, z = gate(x_r + h_r), gate(x_z + h_z)
                    n = candidate(x_n + r * h_n)
                else:  # n = candidate(W_n x + b_in + R_n (r * h) + b_hn)
                    h_r, h_z = (h @ w_hh[:2 * H].T + b_hh[:2 * H]).split(H, dim=-1)
                    r, z = gate(x_r + h_r), gate(x_z + h_z)
                    n = candidate(x_n + (r * h) @ w_hh[2 * H:].T + b_hh[2 * H:])
                h = (1.0 - z) * n + z * h
                hs.append(h)
            y = torch.stack(hs, 1)
            outs.append(torch.flip(y, (1,)) if d else y)
        seq = torch.cat(outs, -1)
    return seq
