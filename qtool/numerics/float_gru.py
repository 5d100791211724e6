"""The float GRU (docs/numerics.md, "Float GRU"), in numpy: the reference every integer result is
measured against. Each cell computes its own form (qtool.core.model.CellForm); the haste form:

    z = sigmoid(Wx_z + Rh_z + bx_z + br_z)
    r = sigmoid(Wx_r + Rh_r + bx_r + br_r)
    g = tanh(Wx_g + r * (Rh_g + br_g) + bx_g)
    h = z * h_old + (1 - z) * g

and with reset_after False (the reset gate before the recurrent matmul), z and r as above and

    rh = r * h_old
    g = tanh(Wx_g + R_g rh + bx_g + br_g)

sigmoid may be hard_sigmoid clip(alpha v + beta, 0, 1) and tanh relu or linear (the cell's form).
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np

from qtool.core.model import CellForm, GruCell, GruModel
from qtool.core.tensors import ACTIVATIONS, TENSORS_RESET_BEFORE

# Tensors that the float run can record per time step, named as in the tensor table
# (docs/numerics.md).
TRACED = ACTIVATIONS
# What a reset-before cell records: no Rh_add_br or rRh; rh = r * h_old, and Rh's g block is
# R_g rh (the recurrent GEMM reads rh there)
TRACED_RESET_BEFORE = tuple(t.name for t in TENSORS_RESET_BEFORE if t.kind == "activation")


def traced(form: CellForm) -> tuple[str, ...]:
    """The tensors a cell of this form records per time step."""
    return TRACED if form.reset_after else TRACED_RESET_BEFORE


def sigmoid(v: np.ndarray) -> np.ndarray:
    with np.errstate(over="ignore"):  # exp(-v) overflows to inf for v << 0: sigmoid is 0 there
        return 1.0 / (1.0 + np.exp(-v))


def gate_function(form: CellForm) -> Callable[[np.ndarray], np.ndarray]:
    """z's and r's activation: sigmoid, or hard_sigmoid clip(alpha v + beta, 0, 1) in float32."""
    if form.gate == "sigmoid":
        return sigmoid
    alpha, beta = np.float32(form.gate_alpha), np.float32(form.gate_beta)
    return lambda v: np.clip(alpha * v + beta, np.float32(0), np.float32(1))


def candidate_function(form: CellForm) -> Callable[[np.ndarray], np.ndarray]:
    """g's activation: tanh, relu or linear."""
    return {"tanh": np.tanh, "relu": lambda v: np.maximum(v, np.float32(0)), "linear": lambda v: v}[form.candidate]


def run_direction(cell: GruCell, x: np.ndarray, trace: dict | None = None) -> np.ndarray:
    """Run one direction over time-first `x [T, N, C]`; returns `h [T, N, H]`.

    With `trace` (a dict), every tensor of `traced(cell.form)` is stored in it as `[T, N, width]`; arrays of
    the right shape already in it are reused (no fresh pages for every batch).
    """
    if not cell.form.haste:
        return _run_form(cell, x, trace)
    T, N, _ = x.shape
    H = cell.R.shape[1]
    Wx = x @ cell.W.T  # all time steps at once, as the spec's Step 1
    bx_z, bx_r, bx_g = np.split(cell.bx, 3)
    br_z, br_r, br_g = np.split(cell.br, 3)
    h = np.zeros((N, H), np.float32)
    hs = np.empty((T, N, H), np.float32)
    if trace is not None:
        for k in TRACED:
            shape = (T, N, 3 * H if k in ("Wx", "Rh") else H)
            if k != "x" and (k not in trace or trace[k].shape != shape):
                trace[k] = np.empty(shape, np.float32)
        trace["x"] = x
    for t in range(T):
        Rh = h @ cell.R.T
        Wx_z, Wx_r, Wx_g = np.split(Wx[t], 3, axis=1)
        Rh_z, Rh_r, Rh_g = np.split(Rh, 3, axis=1)
        z_pre = Wx_z + Rh_z + bx_z + br_z
        r_pre = Wx_r + Rh_r + bx_r + br_r
        z, r = sigmoid(z_pre), sigmoid(r_pre)
        Rh_add_br = Rh_g + br_g
        rRh = r * Rh_add_br
        g_pre = Wx_g + rRh + bx_g
        g = np.tanh(g_pre)
        old_contrib = z * h
        new_contrib = (1.0 - z) * g
        h = old_contrib + new_contrib
        hs[t] = h
        if trace is not None:
            for k, v in (("h", h), ("Wx", Wx[t]), ("Rh", Rh), ("z_pre", z_pre), ("r_pre", r_pre),
                         ("g_pre", g_pre), ("z_out", z), ("r_out", r), ("g_out", g),
                         ("Rh_add_br", Rh_add_br), ("rRh", rRh), ("old_contrib", old_contrib),
                         ("new_contrib", new_contrib)):
                trace[k][t] = v
    return hs


def _trace_arrays(trace: dict, names: tuple[str, ...], x: np.ndarray, H: int) -> None:
    """Arrays `[T, N, width]` in `trace` for every tensor of `names` (kept where they fit)."""
    T, N, _ = x.shape
    for k in [k for k in trace if k not in names]:
        del trace[k]  # a haste cell's arrays in a reused trace
    for k in names:
        shape = (T, N, 3 * H if k in ("Wx", "Rh") else H)
        if k != "x" and (k not in trace or trace[k].shape != shape):
            trace[k] = np.empty(shape, np.float32)
    trace["x"] = x


def _run_form(cell: GruCell, x: np.ndarray, trace: dict | None) -> np.ndarray:
    """run_direction for a cell that is not the haste form: its gate and candidate activations,
    and with reset_after False the reset gate on h before R_g's GEMM."""
    form = cell.form
    gate, candidate = gate_function(form), candidate_function(form)
    T, N, _ = x.shape
    H = cell.R.shape[1]
    Wx = x @ cell.W.T
    R_zr, R_g = cell.R[:2 * H], cell.R[2 * H:]
    bx_z, bx_r, bx_g = np.split(cell.bx, 3)
    br_z, br_r, br_g = np.split(cell.br, 3)
    h = np.zeros((N, H), np.float32)
    hs = np.empty((T, N, H), np.float32)
    if trace is not None:
        _trace_arrays(trace, traced(form), x, H)
    for t in range(T):
        Wx_z, Wx_r, Wx_g = np.split(Wx[t], 3, axis=1)
        Rh_z, Rh_r = np.split(h @ R_zr.T, 2, axis=1)
        z_pre = Wx_z + Rh_z + bx_z + br_z
        r_pre = Wx_r + Rh_r + bx_r + br_r
        z, r = gate(z_pre), gate(r_pre)
        tensors = {"z_pre": z_pre, "r_pre": r_pre}
        if form.reset_after:
            Rh_g = h @ R_g.T
            Rh_add_br = Rh_g + br_g
            rRh = r * Rh_add_br
            g_pre = Wx_g + rRh + bx_g
            tensors.update(Rh_add_br=Rh_add_br, rRh=rRh)
        else:
            rh = r * h
            Rh_g = rh @ R_g.T  # the recurrent GEMM of the candidate reads r * h, not h
            g_pre = Wx_g + Rh_g + bx_g + br_g
            tensors.update(rh=rh)
        g = candidate(g_pre)
        old_contrib = z * h
        new_contrib = (1.0 - z) * g
        h = old_contrib + new_contrib
        hs[t] = h
        if trace is not None:
            tensors.update(h=h, Wx=Wx[t], Rh=np.concatenate([Rh_z, Rh_r, Rh_g], axis=1), g_pre=g_pre,
                           z_out=z, r_out=r, g_out=g, old_contrib=old_contrib, new_contrib=new_contrib)
            for k, v in tensors.items():
                trace[k][t] = v
    return hs


def run_float(model: GruModel, x: np.ndarray, traces: list | None = None) -> np.ndarray:
    """Run the whole model on batch-first `x [N, T, C]`; returns `y [N, T, H * directions]`.

    With `traces` (a list), `traces[l][d]` receives the trace dict of layer l, direction d (a
    list filled by an earlier call is refilled, reusing its arrays).
    """
    reuse = traces[:] if traces else []
    if traces is not None:
        traces.clear()
    seq = np.ascontiguousarray(np.asarray(x, np.float32).transpose(1, 0, 2))  # [T, N, C]
    for cells in model.layers:
        outs, layer_traces = [], []
        for d, cell in enumerate(cells):
            trace = None if traces is None else (reuse[len(traces)][d] if len(reuse) > len(traces) else {})
            inp = seq if d == 0 else seq[::-1]
            h = run_direction(cell, np.ascontiguousarray(inp), trace)
            outs.append(h if d == 0 else h[::-1])
            layer_traces.append(trace)
        if traces is not None:
            traces.append(layer_traces)
        seq = np.concatenate(outs, axis=2) if len(outs) > 1 else outs[0]
    return np.ascontiguousarray(seq.transpose(1, 0, 2))
