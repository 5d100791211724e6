"""The float GRU, haste formulation (docs/numerics.md, "Float GRU"), in numpy: the reference
every integer result is measured against.

    z = sigmoid(Wx_z + Rh_z + bx_z + br_z)
    r = sigmoid(Wx_r + Rh_r + bx_r + br_r)
    g = tanh(Wx_g + r * (Rh_g + br_g) + bx_g)
    h = z * h_old + (1 - z) * g
"""

from __future__ import annotations

import numpy as np

from qtool.core.model import GruCell, GruModel
from qtool.core.tensors import ACTIVATIONS

# Tensors that the float run can record per time step, named as in the tensor table
# (docs/numerics.md).
TRACED = ACTIVATIONS


def sigmoid(v: np.ndarray) -> np.ndarray:
    with np.errstate(over="ignore"):  # exp(-v) overflows to inf for v << 0: sigmoid is 0 there
        return 1.0 / (1.0 + np.exp(-v))


def run_direction(cell: GruCell, x: np.ndarray, trace: dict | None = None) -> np.ndarray:
    """Run one direction over time-first `x [T, N, C]`; returns `h [T, N, H]`.

    With `trace` (a dict), every tensor of TRACED is stored in it as `[T, N, width]`; arrays of
    the right shape already in it are reused (no fresh pages for every batch).
    """
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
