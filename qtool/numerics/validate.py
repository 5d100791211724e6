"""One validator at the door: every invariant the engines and the C export rely on, proven before
any of them sees a quantized model (docs/numerics.md, "What a valid model guarantees").

The free data of a quantized model are its tensors' quantization (bits, symmetric, zp, exp2_inv)
and its integer weights and biases; everything else (shifts P and CH, compensation, tables) is a
function of them and must equal what `rescale.derive` and `lut.build_lut` give. So a model passes
when:
- every tensor's bits, zero point and exp2_inv are in range for its class, and the ties of the
  integer program hold (h shared by both directions, x of layer l > 0 is h of layer l - 1);
- every integer weight and bias fits its bits, with the shapes of the float model;
- the tables and shifts are exactly the ones derived from the spec (so every shift is in
  [-MAX_LEFT, MAX_RIGHT] and every table has the entries its input's bits index);
- the GEMM sums, after their rescale's left shift, stay below 2^62 (nothing wraps in int64).
"""

from __future__ import annotations

import numpy as np

from qtool.core.model import DIRECTIONS
from qtool.core.qmodel import CellQuant, QuantModel, TensorQ
from qtool.core.tensors import BITS_LIMITS, cell_params, cell_tensors
from qtool.errors import QtoolError
from qtool.numerics.lut import build_lut, cell_gates
from qtool.numerics.qparams import E_MAX, E_MIN, qrange
from qtool.numerics.rescale import CH_SH_R, CH_SH_W, CHANNEL_ROWS, derive_cell

INT64_HEADROOM = 62  # every intermediate stays below 2^62 in magnitude


def _is_int(v) -> bool:
    return isinstance(v, (int, np.integer)) and not isinstance(v, (bool, np.bool_))


def _check_tensor(t: TensorQ, kind: str, per_channel: bool, H: int, where: str) -> None:
    lo_bits, hi_bits = BITS_LIMITS[kind]
    if not _is_int(t.bits) or not lo_bits <= t.bits <= hi_bits:
        raise QtoolError(f"{where}: bits {t.bits} outside {lo_bits}..{hi_bits} for a {kind}")
    if kind != "activation" and not t.symmetric:
        raise QtoolError(f"{where}: a {kind} must be symmetric (zero-point compensation assumes it)")
    qmin, qmax = qrange(t.bits)
    if not _is_int(t.zp) or not qmin <= t.zp <= qmax:
        raise QtoolError(f"{where}: zero point {t.zp} outside the {t.bits}-bit range [{qmin}, {qmax}]")
    if t.symmetric and t.zp != 0:
        raise QtoolError(f"{where}: symmetric but zero point {t.zp} (must be 0)")
    e = np.asarray(t.exp2_inv)
    if e.shape != ((3 * H,) if per_channel else ()) or e.dtype.kind not in "iu":
        raise QtoolError(f"{where}: exp2_inv must be {'[3H] integers' if per_channel else 'one integer'}, "
                         f"got shape {e.shape}, dtype {e.dtype}")
    if e.size and not (E_MIN <= int(e.min()) and int(e.max()) <= E_MAX):
        raise QtoolError(f"{where}: exp2_inv {int(e.min())}..{int(e.max())} outside [{E_MIN}, {E_MAX}]")
    for name, v in (("range_lo", t.lo), ("range_hi", t.hi)):
        if np.shape(v) != e.shape or not np.all(np.isfinite(v)):
            raise QtoolError(f"{where}: {name} must be finite with the shape of exp2_inv")


def _check_ints(a: np.ndarray, shape: tuple, bits: int, where: str) -> None:
    a = np.asarray(a)
    if a.shape != shape:
        raise QtoolError(f"{where}: shape {a.shape}, expected {shape}")
    if a.dtype.kind not in "iu":
        raise QtoolError(f"{where}: dtype {a.dtype}; integer weights must be stored as integers")
    qmin, qmax = qrange(bits)
    if a.size and (int(a.min()) < qmin or int(a.max()) > qmax):
        raise QtoolError(f"{where}: values {int(a.min())}..{int(a.max())} do not fit {bits} bits "
                         f"[{qmin}, {qmax}]")


def _first_difference(got: np.ndarray, want: np.ndarray, names) -> str:
    i = int(np.argwhere(np.asarray(got) != np.asarray(want))[0][0])
    return f"{names[i]} = {np.asarray(got)[i].tolist()}, but the spec gives {np.asarray(want)[i].tolist()}"


def _check_gemm(q_w: np.ndarray, x: TensorQ, shifts: np.ndarray, what: str, where: str) -> None:
    """|sum_k q_w[c, k] (q_x[k] - zp_x)| <= sum_k |q_w[c, k]| * max |q_x - zp_x|, and the rescale
    shifts it left by max(-shift[c], 0): the result must stay below 2^INT64_HEADROOM."""
    qmin, qmax = qrange(x.bits)
    in_max = max(qmax - x.zp, x.zp - qmin)
    bound = [int(s) * in_max << max(-int(sh), 0) for s, sh in
             zip(np.abs(q_w).sum(axis=1, dtype=np.int64), shifts)]
    worst = int(np.argmax(bound)) if bound else 0
    if bound and bound[worst] >= 1 << INT64_HEADROOM:
        raise QtoolError(f"{where}: the GEMM {what} of channel {worst} can reach "
                         f"2^{bound[worst].bit_length()} after its rescale; the model's ranges are "
                         "inconsistent")


def check_cell(cq: CellQuant, C: int, H: int, where: str) -> None:
    """Prove one cell consistent; fills in `cq.lut_error` from the recomputed tables."""
    tensors = cell_tensors(cq.form)
    missing = [t.name for t in tensors if t.name not in cq.spec]
    if missing:
        raise QtoolError(f"{where}: no quantization for {', '.join(missing)}")
    for td in tensors:
        _check_tensor(cq.spec[td.name], td.kind, td.per_channel, H, f"{where}.{td.name}")
    s = cq.spec
    for name, tensor, shape in (("qW", "W", (3 * H, C)), ("qR", "R", (3 * H, H)),
                                ("qbx", "bx", (3 * H,)), ("qbr", "br", (3 * H,))):
        _check_ints(getattr(cq, name), shape, s[tensor].bits, f"{where}.{name}")
    shifts = []
    for lut, func, src, dst in cell_gates(cq.form):
        a, b = s[src], s[dst]
        table, shift, error = build_lut(func, a.bits, int(a.exp2_inv), a.zp, b.bits, int(b.exp2_inv), b.zp)
        got = np.asarray(cq.luts.get(lut, np.zeros(0)))
        if got.shape != table.shape:
            raise QtoolError(f"{where}.{lut}: {got.size} entries, the spec of {src} needs {table.size}")
        if not np.array_equal(got, table):
            raise QtoolError(f"{where}.{lut}: entries differ from {func.split(':')[0]} on the grids of {src} and {dst}")
        cq.lut_error[lut] = error
        shifts.append(shift)
    try:
        P, CH = derive_cell(cq.form, s, cq.qW, cq.qR, cq.qbx, cq.qbr, tuple(shifts))
    except QtoolError as e:
        raise QtoolError(f"{where}: {e}") from None
    if np.shape(cq.P) != P.shape or not np.array_equal(cq.P, P):
        raise QtoolError(f"{where}: P is inconsistent with the spec" if np.shape(cq.P) != P.shape
                         else f"{where}: P[{_first_difference(cq.P, P, cell_params(cq.form))}]")
    if np.shape(cq.CH) != CH.shape or not np.array_equal(cq.CH, CH):
        if np.shape(cq.CH) != CH.shape:
            raise QtoolError(f"{where}: CH has shape {np.shape(cq.CH)}, expected {CH.shape}")
        row = int(np.argwhere(np.asarray(cq.CH) != CH)[0][0])
        raise QtoolError(f"{where}: {CHANNEL_ROWS[row]} is inconsistent with the spec "
                         f"({_first_difference(cq.CH[row], CH[row], range(3 * H))[:80]})")
    _check_gemm(cq.qW, s["x"], CH[CH_SH_W], "W x", where)
    if cq.form.reset_after:
        _check_gemm(cq.qR, s["h"], CH[CH_SH_R], "R h", where)
    else:  # R's z and r rows read h, its g rows rh
        _check_gemm(cq.qR[:2 * H], s["h"], CH[CH_SH_R, :2 * H], "R h", where)
        _check_gemm(cq.qR[2 * H:], s["rh"], CH[CH_SH_R, 2 * H:], "R_g rh", where)


def _same_grid(a: TensorQ, b: TensorQ) -> bool:
    return (a.bits, a.symmetric, a.zp, int(a.exp2_inv)) == (b.bits, b.symmetric, b.zp, int(b.exp2_inv))


def validate(qm: QuantModel, where: str = "quantized model") -> None:
    """Raise QtoolError naming the tensor and the rule, unless `qm` is safe for every engine."""
    model = qm.model
    if len(qm.cells) != model.num_layers or any(len(c) != model.num_directions for c in qm.cells):
        raise QtoolError(f"{where}: the quantized cells do not match the model's layers and directions")
    for l, cells in enumerate(qm.cells):
        for d, cq in enumerate(cells):
            cell = model.layers[l][d]
            check_cell(cq, cell.W.shape[1], cell.R.shape[1], f"{where}: layer{l}.{DIRECTIONS[d]}")
    for l, cells in enumerate(qm.cells):
        for d, cq in enumerate(cells):
            w = f"{where}: layer{l}.{DIRECTIONS[d]}"
            if not _same_grid(cq.spec["h"], cells[0].spec["h"]):
                raise QtoolError(f"{w}.h: both directions of a layer must share h's quantization")
            x_from = cells[0].spec["x"] if l == 0 else qm.cells[l - 1][0].spec["h"]
            if not _same_grid(cq.spec["x"], x_from):
                raise QtoolError(f"{w}.x: must equal " + ("the forward direction's x" if l == 0 else
                                 f"layer{l - 1}'s h (its integers pass through unchanged)"))
