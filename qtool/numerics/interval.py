"""Static bounds of every intermediate integer of the exported cell, and the C type each needs.

The exported C computes each statement of `qtool/numerics/intops.py` (one tensor of the
formulas of docs/numerics.md: Wx, Rh, z_pre, ..., h) in `int32_t` when every value it can
produce fits, and in `int64_t` otherwise. The proof is interval arithmetic over the quantized model: each input of a
statement ranges over what its producer can emit (a storage range, a table's values, the result
interval of an earlier statement), and every operation maps intervals exactly:

- `a + b`, `a - b`, `a * b`: the extreme corners (a product of two intervals reaches its
  extremes at corners; a sum of functions of independent inputs at the inputs' extremes);
- `rshift_round(v, n) = ((v << l) + 2^(r-1)) >> r` is monotone in v, so its endpoints map
  exactly; the value `(v << l) + 2^(r-1)` before the right shift is recorded too, and the
  shift counts r, l must stay below the type's width;
- `clamp(v, lo, hi)` is monotone.

Every intermediate value each statement evaluates (in the C order of evaluation) is recorded;
a statement is int32 when all of them lie in [-2^31, 2^31) and its shift counts are below 32.
Inputs that two terms share (q_z in old_contrib and new_contrib) are treated as independent,
which can only widen a bound: the proof is sound, not always tight. docs/embedded.md explains
each statement's bound.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from qtool.core.tensors import COMPUTED, COMPUTED_RESET_BEFORE, cell_params
from qtool.errors import QtoolError
from qtool.numerics.lut import GATES
from qtool.numerics.passes import folded_biases
from qtool.numerics.qparams import qrange
from qtool.numerics.rescale import CHANNEL_ROWS

I32 = (-(2**31), 2**31 - 1)
I64 = (-(2**63), 2**63 - 1)

# the statements of the cell (the C cell's integer widths): every computed tensor but the gate
# outputs, which are table lookups (one statement "lut" for the three), and (1 - z) on z_out's grid
STATEMENTS = (*(n for n in COMPUTED if n not in {out for *_, out in GATES}), "one_minus_z", "lut")
# a reset-before cell's: rh for Rh_add_br and rRh
STATEMENTS_RESET_BEFORE = (*(n for n in COMPUTED_RESET_BEFORE if n not in {out for *_, out in GATES}),
                           "one_minus_z", "lut")


@dataclass(frozen=True)
class Iv:
    """A closed integer interval [lo, hi] (Python integers: no overflow in the proof itself)."""

    lo: int
    hi: int

    def __add__(self, o: Iv | int) -> Iv:
        o = iv(o)
        return Iv(self.lo + o.lo, self.hi + o.hi)

    def __sub__(self, o: Iv | int) -> Iv:
        o = iv(o)
        return Iv(self.lo - o.hi, self.hi - o.lo)

    def __mul__(self, o: Iv | int) -> Iv:
        o = iv(o)
        c = (self.lo * o.lo, self.lo * o.hi, self.hi * o.lo, self.hi * o.hi)
        return Iv(min(c), max(c))

    def hull(self, o: Iv) -> Iv:
        return Iv(min(self.lo, o.lo), max(self.hi, o.hi))


def iv(v: Iv | int) -> Iv:
    return v if isinstance(v, Iv) else Iv(int(v), int(v))


@dataclass
class Statement:
    """Every value one statement evaluates, and its largest shift counts."""

    span: Iv | None = None
    shift: int = 0
    notes: list[str] = field(default_factory=list)

    def note(self, v: Iv) -> Iv:
        self.span = v if self.span is None else self.span.hull(v)
        return v

    def fits(self, rng: tuple[int, int], bits: int) -> bool:
        return self.span is None or (rng[0] <= self.span.lo and self.span.hi <= rng[1]
                                     and self.shift < bits)

    @property
    def bits(self) -> int:
        """32 or 64: the narrowest C type in which every value of the statement is exact."""
        if self.fits(I32, 32):
            return 32
        if self.fits(I64, 64):
            return 64
        raise QtoolError(f"an intermediate spans [{self.span.lo}, {self.span.hi}] with shifts up to "
                         f"{self.shift}: beyond int64; the calibrated ranges are inconsistent")


def rshift_round(st: Statement, v: Iv, n: int) -> Iv:
    """intops.rshift_round on an interval, recording the value before the right shift."""
    r, l = max(n, 0), max(-n, 0)
    st.shift = max(st.shift, r, l)
    st.note(v)
    t = st.note(Iv(v.lo << l, v.hi << l) + ((1 << r) >> 1))
    return st.note(Iv(t.lo >> r, t.hi >> r))


def clamp(st: Statement, v: Iv, lo: int, hi: int) -> Iv:
    st.note(v)
    return st.note(Iv(min(max(v.lo, lo), hi), min(max(v.hi, lo), hi)))


def add(st: Statement, *terms: Iv | int) -> Iv:
    """A left-to-right sum, recording every partial sum (the C evaluation order)."""
    acc = st.note(iv(terms[0]))
    for t in terms[1:]:
        acc = st.note(acc + t)
    return acc


def gemm_span(q_w: np.ndarray, v: Iv) -> tuple[np.ndarray, np.ndarray]:
    """Per channel c, the exact range of sum_k q_w[c, k] * v_k over v_k in v. Every partial sum
    of any order lies inside it too, since each term's range contains 0 (v contains 0).
    int64 is exact here: |q_w| <= 2^15 and |v| < 2^17, so a row of fewer than 2^31 terms fits."""
    w = np.asarray(q_w, np.int64)
    a, b = w * v.lo, w * v.hi
    return np.minimum(a, b).sum(axis=1), np.maximum(a, b).sum(axis=1)


def _gemm(st: Statement, q_w, in_spec, sh, comp, offset: bool, P: dict, name: str, blocks) -> list[Iv]:
    """The GEMM and its rescale: acc = sum_k q_w[c, k] v_k (v = q, or q - zp when inputs are
    offset), then rescale(acc - comp[c], sh[c], zp, lo, hi). Returns the hull of the results of
    each block of channels. Channels of one block with one shift are bounded together: every
    step is monotone, so the hull of their intervals maps to the hull of their results (the
    same bounds as channel by channel, without a Python loop over 3H channels)."""
    qmin, qmax = qrange(in_spec.bits)
    v = Iv(qmin - in_spec.zp, qmax - in_spec.zp) if offset else Iv(qmin, qmax)
    st.note(v)
    lo, hi = gemm_span(q_w, v)
    comp = np.zeros_like(lo) if offset else np.asarray(comp, np.int64)
    sh = np.asarray(sh, np.int64)
    out = []
    for blk in blocks:
        res = []
        for n in np.unique(sh[blk]):
            for has_comp in (False, True):
                c = np.flatnonzero((sh[blk] == n) & ((comp[blk] != 0) == has_comp)) + blk.start
                if not c.size:
                    continue
                acc = st.note(Iv(int(lo[c].min()), int(hi[c].max())))
                if has_comp:
                    st.note(Iv(int(comp[c].min()), int(comp[c].max())))
                    acc = st.note(Iv(int((lo[c] - comp[c]).min()), int((hi[c] - comp[c]).max())))
                t = add(st, rshift_round(st, acc, int(n)), P[f"zp_{name}"])
                res.append(clamp(st, t, P[f"lo_{name}"], P[f"hi_{name}"]))
        out.append(_hull(res))
    return out


def _hull(ivs: list[Iv]) -> Iv:
    out = ivs[0]
    for v in ivs[1:]:
        out = out.hull(v)
    return out


def _lut(st: Statement, table: np.ndarray, bits_in: int, shift: int) -> Iv:
    """lut_eval: u = q - qmin in [0, 2^bits), i = u >> shift, f = u - (i << shift),
    a + rshift_round((b - a) * f, shift) with a, b two entries of the table."""
    t = Iv(int(np.min(table)), int(np.max(table)))
    u = st.note(Iv(0, (1 << bits_in) - 1))
    st.note(Iv(0, u.hi >> shift))
    if shift:
        f = st.note(Iv(0, (1 << shift) - 1))
        d = st.note(st.note(t - t) * f)
        st.note(t + rshift_round(st, d, shift))
    return t  # interpolation stays between two entries: the output is within the table's range


def cell_statements(cq, offset: bool) -> dict[str, Statement]:
    """The bound of every statement of one cell (layer direction); `offset`: the GEMMs read
    q - zp (compensation "offset") instead of q minus a compensation table."""
    P = {n: int(v) for n, v in zip(cell_params(cq.form), cq.P)}
    rows = {r: cq.CH[i] for i, r in enumerate(CHANNEL_ROWS)}
    spec = cq.spec
    reset_after = cq.form.reset_after
    st = {s: Statement() for s in (STATEMENTS if reset_after else STATEMENTS_RESET_BEFORE)}
    H = cq.hidden_size
    blk = [slice(0, H), slice(H, 2 * H), slice(2 * H, 3 * H)]
    Wx = _gemm(st["Wx"], cq.qW, spec["x"], rows["sh_W"], rows["W_sum_mul_x_zp"], offset, P, "Wx", blk)
    if reset_after:
        Rh = _gemm(st["Rh"], cq.qR, spec["h"], rows["sh_R"], rows["R_sum_mul_h_zp"], offset, P, "Rh", blk)
    else:  # R's g rows read rh: their own GEMM, after the gates
        zr = slice(0, 2 * H)
        Rh = _gemm(st["Rh"], cq.qR[zr], spec["h"], rows["sh_R"][zr], rows["R_sum_mul_h_zp"][zr], offset, P,
                   "Rh", blk[:2])
    b_pre, b_rab = folded_biases(rows, reset_after)
    b = [Iv(int(b_pre[s].min()), int(b_pre[s].max())) for s in blk]
    lut = st["lut"]
    gates = {}
    for g, k, name in ((0, "z", "z_pre"), (1, "r", "r_pre")):
        s = st[name]
        t = add(s, rshift_round(s, Wx[g] - P["zp_Wx"], P[f"sh_Wx_{name}"]),
                rshift_round(s, Rh[g] - P["zp_Rh"], P[f"sh_Rh_{name}"]), b[g], P[f"zp_{name}"])
        clamp(s, t, P[f"lo_{name}"], P[f"hi_{name}"])
        gates[k] = _lut(lut, cq.luts[f"lut_{k}"], spec[name].bits, P[f"lut_shift_{k}"])
    qmin_h, qmax_h = qrange(spec["h"].bits)
    if reset_after:
        _candidate_pre(st, cq, P, rows, Wx, Rh, b, b_rab, gates)
    else:
        _product(st["rh"], gates["r"] - P["zp_r_out"], Iv(qmin_h, qmax_h) - P["zp_h"], P, "rh", "sh_rh")
        g_rows = slice(2 * H, 3 * H)
        Rh_g = _gemm(st["Rh"], cq.qR[g_rows], spec["rh"], rows["sh_R"][g_rows], rows["R_sum_mul_h_zp"][g_rows],
                     offset, P, "Rh", [slice(0, H)])[0]
        s = st["g_pre"]
        t = add(s, rshift_round(s, Wx[2] - P["zp_Wx"], P["sh_Wx_g_pre"]),
                rshift_round(s, Rh_g - P["zp_Rh"], P["sh_Rh_g_pre"]), b[2], P["zp_g_pre"])
        clamp(s, t, P["lo_g_pre"], P["hi_g_pre"])
    g = _lut(lut, cq.luts["lut_g"], spec["g_pre"].bits, P["lut_shift_g"])
    old = _product(st["old_contrib"], gates["z"] - P["zp_z_out"], Iv(qmin_h, qmax_h) - P["zp_h"], P,
                   "old_contrib", "sh_old_contrib")
    s = st["one_minus_z"]
    omz = clamp(s, add(s, P["q_1_in_z_scale"], iv(0) - gates["z"], P["zp_z_out"]),
                P["lo_z_out"], P["hi_z_out"])
    new = _product(st["new_contrib"], omz - P["zp_z_out"], g - P["zp_g_out"], P, "new_contrib",
                   "sh_new_contrib")
    s = st["h"]
    t = add(s, rshift_round(s, old - P["zp_old_contrib"], P["sh_old_contrib_h"]),
            rshift_round(s, new - P["zp_new_contrib"], P["sh_new_contrib_h"]), P["zp_h"])
    clamp(s, t, P["lo_h"], P["hi_h"])
    return st


def _candidate_pre(st: dict, cq, P: dict, rows: dict, Wx: list, Rh: list, b: list, b_rab, gates: dict) -> None:
    """The haste cell's Rh_add_br, rRh and g_pre."""
    s = st["Rh_add_br"]
    t = add(s, rshift_round(s, Rh[2] - P["zp_Rh"], P["sh_Rh_Rh_add_br"]),
            Iv(int(b_rab.min()), int(b_rab.max())), P["zp_Rh_add_br"])
    rab = clamp(s, t, P["lo_Rh_add_br"], P["hi_Rh_add_br"])
    rrh = _product(st["rRh"], gates["r"] - P["zp_r_out"], rab - P["zp_Rh_add_br"], P, "rRh", "sh_rRh")
    s = st["g_pre"]
    t = add(s, rshift_round(s, Wx[2] - P["zp_Wx"], P["sh_Wx_g_pre"]),
            rshift_round(s, rrh - P["zp_rRh"], P["sh_rRh_g_pre"]), b[2], P["zp_g_pre"])
    clamp(s, t, P["lo_g_pre"], P["hi_g_pre"])


def _product(s: Statement, a: Iv, b: Iv, P: dict, name: str, sh: str) -> Iv:
    """rescale(a * b, sh, zp, lo, hi) of two zero-point-free operands."""
    s.note(a)
    s.note(b)
    t = add(s, rshift_round(s, s.note(a * b), P[sh]), P[f"zp_{name}"])
    return clamp(s, t, P[f"lo_{name}"], P[f"hi_{name}"])


def model_bits(qm, offsets: list[list[bool]]) -> dict[str, int]:
    """Per statement, 32 or 64: the widest any cell of the model needs (one C function serves
    every cell). `offsets[l][d]`: whether that cell's GEMMs read offset inputs."""
    bits = {s: 32 for s in STATEMENTS}
    for l, cells in enumerate(qm.cells):
        for d, cq in enumerate(cells):
            for name, s in cell_statements(cq, offsets[l][d]).items():
                bits[name] = max(bits.get(name, 32), s.bits)
    if bits["lut"] != 32:  # cannot happen for tables of up to 16-bit inputs and outputs
        raise QtoolError("an activation table needs 64-bit interpolation: not supported")
    return bits
