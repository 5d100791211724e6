"""The fake-quant GRU: the float GRU with every tensor of the tensor table rounded onto its grid
(TVM's simulated quantization), written once over an array backend. numpy runs it here for
`qtool simulate --mode fakequant`; torch runs the very same functions in `qtool.qat` for training.

Two roundings (docs/qat.md):

- "tensor": every tensor is computed in floating point from its fake-quantized inputs and rounded
  once onto its own grid, `qdq(v) = (clamp(floor(v 2^e + 0.5) + zp) - zp) 2^-e` (qtool's rounding
  and saturation, qparams.quantize then dequantize); gate outputs are f(v) rounded onto the output
  grid, which is the exact table's entry.
- "integer": additionally rounds where the integer program rounds: each term of a sum is shifted
  onto the sum's grid and rounded on its own (`rshift_round`) before the terms are added, and gate
  outputs come from the model's own tables (`intops.lut_eval`, interpolated for wide inputs). This
  is the integer GRU computed in floating point: its values are the engine's integers times their
  scales whenever the float sums are exact (always in float64).

The difference between the two is what the integer arithmetic itself costs.

Every cell form (qtool.core.model.CellForm) runs: the haste cell, or the reset-before cell
(`rh = r * h_old` rounded once onto rh's grid, then `Rh_g = R_g rh` rounded once onto Rh's grid
and `g_pre = Wx_g + Rh_g + bx_g + br_g` a sum of four terms, as intops.gru_gates_reset_before and
gru_candidate_reset_before compute them); the gates and the candidate are the form's activations
(lut.cell_gates: "tensor" rounding evaluates `lut.function`, "integer" rounding reads the
model's tables).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from qtool.core.model import HASTE, CellForm
from qtool.core.qmodel import LUT_NAMES, CellQuant, QuantModel, TensorQ
from qtool.core.tensors import BY_NAME, NAMES, cell_params, cell_tensors
from qtool.numerics.intops import lut_eval
from qtool.numerics.lut import cell_gates, function
from qtool.numerics.qparams import dequantize, qrange

ROUNDINGS = ("tensor", "integer")
# tensors whose grids the haste cell reads (weights and biases come fake-quantized as values)
ACTIVATIONS = tuple(n for n in NAMES if BY_NAME[n].kind == "activation")
LUT_SHIFTS = {"lut_z": "lut_shift_z", "lut_r": "lut_shift_r", "lut_g": "lut_shift_g"}  # P's entries


def activations(form: CellForm) -> tuple[str, ...]:
    """The grids a cell of this form reads: its tensor table's activations (rh for Rh_add_br and
    rRh in a reset-before cell)."""
    return tuple(t.name for t in cell_tensors(form) if t.kind == "activation")


def qdq(xp, v, inv, zp, qmin: int, qmax: int):
    """Quantize-dequantize onto the grid of step 1/inv (inv = 2^exp2_inv): q = clamp(floor(v inv +
    0.5) + zp, qmin, qmax), back to (q - zp) / inv. `xp` is numpy or torch."""
    return (xp.clip(xp.floor(v * inv + 0.5) + zp, qmin, qmax) - zp) / inv


def snap(xp, v, inv):
    """One term of a sum shifted onto the sum's grid: round half up to the step 1/inv, no zero
    point, no saturation. For a term t 2^-e_src this is rshift_round(t, e_src - e) 2^-e."""
    return xp.floor(v * inv + 0.5) / inv


@dataclass
class Grid:
    """One tensor's grid: exp2_inv (a number, or an array broadcasting against the values), zp."""

    exp2_inv: object
    zp: object
    bits: int

    @property
    def inv(self):
        return np.ldexp(1.0, np.asarray(self.exp2_inv, np.int64))

    @property
    def qmin(self) -> int:
        return qrange(self.bits)[0]

    @property
    def qmax(self) -> int:
        return qrange(self.bits)[1]

    @classmethod
    def of(cls, t: TensorQ) -> Grid:
        return cls(t.exp2_inv, t.zp, t.bits)


@dataclass
class CellFQ:
    """One layer direction as the fake-quant cell reads it: fake-quantized constants (canonical
    gate order z | r | g), the activation grids, for "integer" rounding the tables, and the form
    the cell computes (its tensors and its gates' functions)."""

    W: object
    R: object
    bx: object
    br: object
    grids: dict
    luts: dict  # lut name -> (table padded by one entry, interpolation shift)
    form: CellForm = HASTE

    @property
    def funcs(self) -> dict[str, str]:
        """Each table's function by name (lut.cell_gates): sigmoid, tanh, relu, linear or
        hard_sigmoid:ALPHA:BETA."""
        return {lut: func for lut, func, _, _ in cell_gates(self.form)}


class NumpyOps:
    """The numpy backend: float64 values, no gradients."""

    xp = np

    def qdq(self, v, g: Grid):
        return qdq(np, v, g.inv, g.zp, g.qmin, g.qmax)

    def integer_sum(self, terms: tuple, g: Grid):
        return self.qdq(sum(snap(np, t, g.inv) for t in terms), g)

    def table_gate(self, func: str, v, g_out: Grid, y_table):
        return y_table  # no gradients here: the table's value is all there is

    def act(self, func: str, v):
        return function(func)(v)

    def to_int(self, v):
        return v.astype(np.int64)

    def to_float(self, q):
        return q.astype(np.float64)

    def flip(self, a):
        return a[::-1]

    def concat(self, parts):
        return np.concatenate(parts, axis=-1) if len(parts) > 1 else parts[0]

    def zeros(self, n: int, h: int, like):
        return np.zeros((n, h), np.float64)


def add(ops, terms: tuple, g: Grid, rounding: str):
    """A quantized sum (base operation 2): the float sum rounded once ("tensor"), or each term
    rounded onto the sum's grid first, as the integer program's rshift_round does ("integer")."""
    if rounding == "tensor":
        return ops.qdq(sum(terms), g)
    return ops.integer_sum(terms, g)


def gate(ops, func: str, v, g_in: Grid, g_out: Grid, lut):
    """A gate's or the candidate's activation (`func`, lut.function's name) onto the output grid:
    f(v) rounded ("tensor"), or the table itself."""
    if lut is None:
        return ops.qdq(ops.act(func, v), g_out)
    table, shift = lut
    xp = ops.xp
    u = ops.to_int(xp.floor(v * g_in.inv + 0.5) + (g_in.zp - g_in.qmin))  # q_in - qmin
    y = (ops.to_float(lut_eval(table, u, shift)) - g_out.zp) / g_out.inv
    return ops.table_gate(func, v, g_out, y)


def cell_step(ops, c: CellFQ, Wx, h, rounding: str) -> dict:
    """One time step of the spec's formulas on fake-quantized values; returns every tensor of the
    cell's form."""
    g = c.grids
    H = h.shape[-1]
    func = c.funcs
    lut = {name: (c.luts[name] if rounding == "integer" else None) for name in LUT_NAMES}
    Wx_z, Wx_r, Wx_g = Wx[..., :H], Wx[..., H:2 * H], Wx[..., 2 * H:]
    bx_z, bx_r, bx_g = c.bx[:H], c.bx[H:2 * H], c.bx[2 * H:]
    br_z, br_r, br_g = c.br[:H], c.br[H:2 * H], c.br[2 * H:]
    if c.form.reset_after:
        Rh = ops.qdq(h @ c.R.T, g["Rh"])
    else:  # R's g rows read rh, known only after r: the z and r rows first
        Rh = ops.qdq(h @ c.R[:2 * H].T, g["Rh"])
    Rh_z, Rh_r = Rh[..., :H], Rh[..., H:2 * H]
    z_pre = add(ops, (Wx_z, Rh_z, bx_z, br_z), g["z_pre"], rounding)
    z = gate(ops, func["lut_z"], z_pre, g["z_pre"], g["z_out"], lut["lut_z"])
    r_pre = add(ops, (Wx_r, Rh_r, bx_r, br_r), g["r_pre"], rounding)
    r = gate(ops, func["lut_r"], r_pre, g["r_pre"], g["r_out"], lut["lut_r"])
    if c.form.reset_after:
        Rh_g = Rh[..., 2 * H:]
        Rh_add_br = add(ops, (Rh_g, br_g), g["Rh_add_br"], rounding)
        rRh = ops.qdq(r * Rh_add_br, g["rRh"])  # a product is rounded once, as in the integers
        g_pre = add(ops, (Wx_g, rRh, bx_g), g["g_pre"], rounding)
        own = {"Rh_add_br": Rh_add_br, "rRh": rRh}
    else:
        rh = ops.qdq(r * h, g["rh"])  # the product rounded once onto rh's grid
        Rh_g = ops.qdq(rh @ c.R[2 * H:].T, g["Rh"])  # the g rows' GEMM, onto Rh's grid
        Rh = ops.concat([Rh, Rh_g])
        g_pre = add(ops, (Wx_g, Rh_g, bx_g, br_g), g["g_pre"], rounding)
        own = {"rh": rh}
    g_out = gate(ops, func["lut_g"], g_pre, g["g_pre"], g["g_out"], lut["lut_g"])
    old_contrib = ops.qdq(z * h, g["old_contrib"])
    one_minus_z = ops.qdq(1.0 - z, g["z_out"])  # (1 - z) in z_out's own grid
    new_contrib = ops.qdq(one_minus_z * g_out, g["new_contrib"])
    h_new = add(ops, (old_contrib, new_contrib), g["h"], rounding)
    return {"Rh": Rh, "z_pre": z_pre, "r_pre": r_pre, "g_pre": g_pre, "z_out": z, "r_out": r,
            "g_out": g_out, **own, "old_contrib": old_contrib, "new_contrib": new_contrib, "h": h_new}


def run_direction(ops, c: CellFQ, x, rounding: str, trace: dict | None = None):
    """One direction over time-first `x [T, N, C]` (on x's grid); returns `h [T, N, H]`. With
    `trace`, every tensor is stored in it as a list over time steps."""
    Wx = ops.qdq(x @ c.W.T, c.grids["Wx"])  # all time steps at once, as the spec's Step 1
    h = ops.zeros(x.shape[1], c.R.shape[1], x)
    hs = []
    if trace is not None:
        trace["x"], trace["Wx"] = x, Wx
    for t in range(x.shape[0]):
        step = cell_step(ops, c, Wx[t], h, rounding)
        h = step["h"]
        hs.append(h)
        if trace is not None:
            for k, v in step.items():
                trace.setdefault(k, []).append(v)
    return ops.xp.stack(hs)


def run_layers(ops, cells: list, x, rounding: str, traces: list | None = None, between=None,
               finals: list | None = None):
    """The whole stack on time-first `x [T, N, C]`: returns the last layer's `h [T, N, H * D]`.
    The input of layer l > 0 is layer l - 1's h, already on its grid (the tie). `between(l, seq)`
    may transform the sequence between layers (training-time dropout); `finals` receives each
    layer's and direction's final state `[N, H]`, in order."""
    seq = ops.qdq(x, cells[0][0].grids["x"])
    for l, layer in enumerate(cells):
        if l and between is not None:
            seq = between(l, seq)
        outs, row = [], []
        for d, c in enumerate(layer):
            tr = {} if traces is not None else None
            h = run_direction(ops, c, seq if d == 0 else ops.flip(seq), rounding, tr)
            if finals is not None:
                finals.append(h[-1])
            outs.append(h if d == 0 else ops.flip(h))
            row.append(tr)
        if traces is not None:
            traces.append(row)
        seq = ops.concat(outs)
    return seq


def numpy_cell(cq: CellQuant) -> CellFQ:
    """A quantized model's cell for the numpy backend: the constants are its integer weights
    dequantized (the fake-quant on constants, folded), the tables and the form its own."""
    s = cq.spec
    params = cell_params(cq.form)
    luts = {n: (np.append(cq.luts[n], cq.luts[n][-1]), int(cq.P[params.index(LUT_SHIFTS[n])]))
            for n in LUT_NAMES}
    return CellFQ(dequantize(cq.qW, s["W"].exp2_inv, 0), dequantize(cq.qR, s["R"].exp2_inv, 0),
                  dequantize(cq.qbx, s["bx"].exp2_inv, 0), dequantize(cq.qbr, s["br"].exp2_inv, 0),
                  {n: Grid.of(s[n]) for n in activations(cq.form)}, luts, cq.form)


def run_fakequant(qm: QuantModel, x: np.ndarray, traces: list | None = None,
                  rounding: str = "tensor") -> np.ndarray:
    """The fake-quant GRU on batch-first float `x [N, T, C]` in float64; returns `y [N, T, H * D]`
    on the output grid. `traces[l][d]` receives every tensor `[T, N, width]`, named as in the
    tensor table of each cell's form (docs/numerics.md), like `float_gru.run_float`'s traces."""
    if rounding not in ROUNDINGS:
        raise ValueError(f"rounding must be one of {ROUNDINGS}")
    cells = [[numpy_cell(cq) for cq in layer] for layer in qm.cells]
    seq = np.asarray(x, np.float64).transpose(1, 0, 2)
    raw: list | None = [] if traces is not None else None
    y = run_layers(NumpyOps(), cells, seq, rounding, raw)
    if traces is not None:
        traces.clear()
        traces.extend([{k: np.stack(v) if isinstance(v, list) else v for k, v in tr.items()}
                       for tr in row] for row in raw)
    return np.ascontiguousarray(y.transpose(1, 0, 2))


def to_int(v: np.ndarray, t: TensorQ) -> np.ndarray:
    """The integers of values on t's grid: q = v 2^exp2_inv + zp (exact for on-grid values)."""
    return (np.floor(np.asarray(v, np.float64) * np.ldexp(1.0, t.exp2_inv) + 0.5) + t.zp).astype(np.int64)
