"""The torch backend of qtool.numerics.fakequant: the same grid math (`fakequant.qdq`) with straight-through
gradients for the values and learned-step-size gradients for the grids.

A grid's exp2_inv and zero point are float parameters rounded in the forward pass (half up, as
everywhere in qtool), so the grid is always a power-of-two step with an integer zero point; the
rounding passes gradients straight through. Gradients of y = qdq(v) (LSQ, Esser et al. 2020, with
the step s = 2^-exp2_inv, so ds/dexp2_inv = -ln 2 s):

- dy/dv = 1 where v is inside the grid's range, 0 where it saturates;
- dy/ds = round(v / s) - v / s inside (the rounding error), q_end - zp where it saturates;
- dy/dzp = 0 inside, -s where it saturates (the window slides);

the grid gradients scaled by 1 / sqrt(values x qmax), as LSQ does, so their size does not grow
with the tensor.

The activations are the cell form's (qtool.numerics.lut.cell_gates names them): sigmoid, tanh,
relu, linear and hard_sigmoid clip(alpha v + beta, 0, 1); a table's gradient is the float
function's slope (relu: 1 above 0; hard_sigmoid: alpha where it does not clip).
"""

from __future__ import annotations

import math

import torch

from qtool.numerics.fakequant import qdq, snap
from qtool.numerics.qparams import qrange


def ste_round(p: torch.Tensor) -> torch.Tensor:
    """floor(p + 0.5) in the forward pass, the identity in the backward pass."""
    return p + (torch.floor(p + 0.5) - p).detach()


def _reduce(grad: torch.Tensor, shape: torch.Size) -> torch.Tensor:
    """Sum a broadcast gradient back to a parameter's shape."""
    while grad.dim() > len(shape):
        grad = grad.sum(0)
    for i, n in enumerate(shape):
        if n == 1 and grad.shape[i] != 1:
            grad = grad.sum(i, keepdim=True)
    return grad


def _lsq(ctx, gy, needs_e: bool, needs_zp: bool):
    """Gradients of y = qdq(v) saved by `_save`: straight-through for v, LSQ for exp2_inv and zp."""
    v, e, zp, inv, t = ctx.saved_tensors[:5]
    qmin, qmax = ctx.bounds
    inside = (t >= qmin) & (t <= qmax)
    s = 1.0 / inv
    scale = 1.0 / math.sqrt(max(v.numel() // max(e.numel(), 1), 1) * qmax)
    dy_ds = torch.where(inside, (t - zp) - v * inv, t.clamp(qmin, qmax) - zp)
    ge = _reduce(gy * dy_ds * (-math.log(2.0)) * s, e.shape) * scale if needs_e else None
    gzp = _reduce(torch.where(inside, 0.0, -s) * gy, zp.shape) * scale if needs_zp else None
    return gy * inside, ge, gzp


def _save(ctx, v, e, zp, inv, qmin: int, qmax: int, *extra) -> None:
    ctx.save_for_backward(v, e, zp, inv, torch.floor(v * inv + 0.5) + zp, *extra)  # t: before saturation
    ctx.bounds = (qmin, qmax)


def hard_sigmoid_params(func: str) -> tuple[float, float]:
    """(alpha, beta) of a table function named `hard_sigmoid:ALPHA:BETA` (lut.hard_sigmoid_name)."""
    alpha, beta = (float(v) for v in func.split(":")[1:])
    return alpha, beta


def activation(func: str, v: torch.Tensor) -> torch.Tensor:
    """A table's function (lut.function's names) in torch, differentiable: what "tensor" rounding
    rounds onto the output grid."""
    if func == "sigmoid":
        return torch.sigmoid(v)
    if func == "tanh":
        return torch.tanh(v)
    if func == "relu":
        return torch.relu(v)
    if func == "linear":
        return v
    if func.startswith("hard_sigmoid:"):
        alpha, beta = hard_sigmoid_params(func)
        return torch.clamp(alpha * v + beta, 0.0, 1.0)
    raise ValueError(f"unknown activation {func!r}")


def slope(func: str, v: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(f(v), f'(v)) of a table's function, without autograd; at a kink the slope torch's autograd
    gives `activation` there (relu 0 at 0, torch.clamp alpha at hard_sigmoid's ends)."""
    if func == "sigmoid":
        f = torch.sigmoid(v)
        return f, f * (1.0 - f)
    if func == "tanh":
        f = torch.tanh(v)
        return f, 1.0 - f * f
    if func == "relu":
        return torch.relu(v), (v > 0).to(v.dtype)
    if func == "linear":
        return v, torch.ones_like(v)
    if func.startswith("hard_sigmoid:"):
        alpha, beta = hard_sigmoid_params(func)
        u = alpha * v + beta
        return torch.clamp(u, 0.0, 1.0), ((u >= 0) & (u <= 1)).to(v.dtype) * alpha
    raise ValueError(f"unknown activation {func!r}")


class FakeQuant(torch.autograd.Function):
    """y = qdq(v) on the grid (exp2_inv, zp)."""

    @staticmethod
    def forward(ctx, v, e, zp, qmin: int, qmax: int):
        inv = torch.exp2(e).to(v.dtype)
        _save(ctx, v, e, zp, inv, qmin, qmax)
        return qdq(torch, v, inv, zp, qmin, qmax)

    @staticmethod
    def backward(ctx, gy):
        return (*_lsq(ctx, gy, *ctx.needs_input_grad[1:3]), None, None)


class IntegerSum(torch.autograd.Function):
    """The integer program's sum: each term rounded onto the sum's grid (fakequant.snap), added,
    saturated. One node instead of the rounded and the float sums: its gradients are those of
    qdq(sum of the terms), each term receiving the sum's."""

    @staticmethod
    def forward(ctx, e, zp, qmin: int, qmax: int, *terms):
        v = sum(terms)
        inv = torch.exp2(e).to(v.dtype)
        _save(ctx, v, e, zp, inv, qmin, qmax)
        ctx.shapes = [t.shape for t in terms]
        return qdq(torch, sum(snap(torch, t, inv) for t in terms), inv, zp, qmin, qmax)

    @staticmethod
    def backward(ctx, gy):
        gv, ge, gzp = _lsq(ctx, gy, *ctx.needs_input_grad[:2])
        return (ge, gzp, None, None, *(_reduce(gv, shape) for shape in ctx.shapes))


class TableGate(torch.autograd.Function):
    """A gate output from its table (the integer program's value); gradients of qdq(f(v)) on the
    output grid: f'(v) where f(v) is inside the grid, LSQ for the output grid. `func` is the
    table's function by name (lut.cell_gates), or a bool: tanh (True) or sigmoid (False)."""

    @staticmethod
    def forward(ctx, v, e_out, zp_out, qmin: int, qmax: int, y_table, func):
        if isinstance(func, bool):
            func = "tanh" if func else "sigmoid"
        f, df = slope(func, v)
        inv = torch.exp2(e_out).to(v.dtype)
        _save(ctx, f, e_out, zp_out, inv, qmin, qmax, df)
        return y_table.to(v.dtype)

    @staticmethod
    def backward(ctx, gy):
        gf, ge, gzp = _lsq(ctx, gy, *ctx.needs_input_grad[1:3])
        df = ctx.saved_tensors[5]
        return gf * df, ge, gzp, None, None, None, None


class TorchGrid:
    """A grid for the torch backend: exp2_inv and zp as tensors (rounded, straight-through)."""

    def __init__(self, exp2_inv: torch.Tensor, zp: torch.Tensor, bits: int):
        self.exp2_inv, self.zp, self.bits = exp2_inv, zp, bits
        self.qmin, self.qmax = qrange(bits)

    @property
    def inv(self) -> torch.Tensor:
        return torch.exp2(self.exp2_inv.detach())


class TorchOps:
    """fakequant's backend protocol in torch: values carry gradients through FakeQuant, and the
    integer rounding's sums and tables through IntegerSum and TableGate."""

    xp = torch

    def qdq(self, v, g: TorchGrid):
        return FakeQuant.apply(v, g.exp2_inv, g.zp.to(v.dtype), g.qmin, g.qmax)

    def integer_sum(self, terms: tuple, g: TorchGrid):
        return IntegerSum.apply(g.exp2_inv, g.zp.to(terms[0].dtype), g.qmin, g.qmax, *terms)

    def table_gate(self, func: str, v, g_out: TorchGrid, y_table):
        return TableGate.apply(v, g_out.exp2_inv, g_out.zp.to(v.dtype), g_out.qmin, g_out.qmax,
                               y_table.detach(), func)

    def act(self, func: str, v):
        return activation(func, v)

    def to_int(self, v):
        return v.detach().to(torch.int64)

    def to_float(self, q):
        return q.to(torch.get_default_dtype())

    def flip(self, a):
        return torch.flip(a, (0,))

    def concat(self, parts):
        return torch.cat(parts, dim=-1) if len(parts) > 1 else parts[0]

    def zeros(self, n: int, h: int, like):
        return like.new_zeros((n, h))
