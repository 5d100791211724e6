"""The compiler passes that turn the fake-quant GRU into the integer program, as named steps over
an explicit program (fake-quant folding, redundant dequantize/quantize removal and TVM's
partition_conversions: docs/qat.md).

`realize(qm)` writes the program as simulated quantization leaves it: the input quantized, every
constant behind a fake-quant, the bias terms shifted at every step, a dequantize/quantize pair
wherever one layer hands its h to the next, the output dequantized. Each pass returns the
operations it removed:

- `fold_constants`: a fake-quant on a constant becomes the constant's integers (qW, qR, qbx, qbr
  in the model file), and the per-step shifts of the bias terms, rshift_round(qbx, sh_bx) and
  rshift_round(qbr, sh_br), become the folded per-channel constants b_pre and b_Rh_add_br (a
  reset-before cell, whose g block adds both biases to g_pre: b_pre alone);
- `elide_requantize`: a dequantize/quantize pair whose shift is 0 and whose zero points agree is
  the identity (x of layer l + 1 is h of layer l: calibration ties them), so the integers pass
  through; any other pair would be a requantize, which qtool's engines do not run;
- `drop_zero_tables`: a zero-point compensation table that is all zeros (its zero point is 0);
- `partition_conversions`: split into prefix (quantize the input), core and suffix (dequantize
  the output); with `fully_integral`, a core holding a floating-point operation is refused.

The C export runs them (`run_passes`) and reports what each removed; it reads the folded bias
tables from `folded_biases`.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from qtool.core.model import DIRECTIONS
from qtool.core.qmodel import QuantModel
from qtool.errors import QtoolError
from qtool.numerics.intops import rshift_round_all
from qtool.numerics.rescale import CHANNEL_ROWS

PASSES = ("fold_constants", "elide_requantize", "drop_zero_tables")


@dataclass(frozen=True)
class Op:
    """One operation of the program: `count` element operations, once or at every time step."""

    kind: str  # quantize, dequantize, fake_quant, constant, gemm, rescale, add, lut, mul, requantize
    where: str  # "input", "layer0.fwd", "layer0 -> layer1", "output"
    what: str
    integral: bool
    count: int = 1
    per_step: bool = False


@dataclass
class Program:
    ops: list[Op]
    removed: dict[str, list[Op]] = field(default_factory=dict)
    prefix: list[Op] = field(default_factory=list)
    suffix: list[Op] = field(default_factory=list)


def _cell_ops(qm: QuantModel, l: int, d: int) -> list[Op]:
    cq = qm.cells[l][d]
    where = f"layer{l}.{DIRECTIONS[d]}"
    H, C = cq.hidden_size, cq.qW.shape[1]
    ops = [Op("fake_quant", where, n, False, getattr(cq, "q" + n).size) for n in ("W", "R", "bx", "br")]
    ops += [Op("constant", where, n, True, 3 * H) for n in ("W_sum_mul_x_zp", "R_sum_mul_h_zp")]
    if not cq.form.reset_after:
        return ops + _reset_before_ops(cq.form, where, H, C)
    ops += [Op("gemm", where, "Wx = W x", True, 3 * H * C, True), Op("rescale", where, "Wx", True, 3 * H, True),
            Op("gemm", where, "Rh = R h", True, 3 * H * H, True), Op("rescale", where, "Rh", True, 3 * H, True)]
    ops += [Op("rescale", where, f"{b} -> {dst}", True, H, True)
            for b, dst in (("bx_z", "z_pre"), ("br_z", "z_pre"), ("bx_r", "r_pre"), ("br_r", "r_pre"),
                           ("bx_g", "g_pre"), ("br_g", "Rh_add_br"))]
    ops += [Op("add", where, "z_pre", True, H, True), Op("lut", where, f"z_out = {cq.form.gate}(z_pre)", True, H, True),
            Op("add", where, "r_pre", True, H, True),
            Op("lut", where, f"r_out = {cq.form.gate}(r_pre)", True, H, True),
            Op("add", where, "Rh_add_br", True, H, True), Op("mul", where, "rRh = r Rh_add_br", True, H, True),
            Op("add", where, "g_pre", True, H, True),
            Op("lut", where, f"g_out = {cq.form.candidate}(g_pre)", True, H, True),
            Op("mul", where, "old_contrib = z h", True, H, True), Op("add", where, "1 - z", True, H, True),
            Op("mul", where, "new_contrib = (1 - z) g", True, H, True), Op("add", where, "h", True, H, True)]
    return ops


def _reset_before_ops(form, where: str, H: int, C: int) -> list[Op]:
    """The per-step operations of a reset-before cell (intops.gru_gates_reset_before, the g rows'
    GEMM on rh, gru_candidate_reset_before): rh = r h_old feeds R's g rows, and both biases of
    every block go to its pre-activation (no Rh_add_br, no rRh)."""
    ops = [Op("gemm", where, "Wx = W x", True, 3 * H * C, True), Op("rescale", where, "Wx", True, 3 * H, True),
           Op("gemm", where, "Rh_zr = R_zr h", True, 2 * H * H, True), Op("rescale", where, "Rh_zr", True, 2 * H, True)]
    ops += [Op("rescale", where, f"{b}_{g} -> {g}_pre", True, H, True) for g in "zrg" for b in ("bx", "br")]
    ops += [Op("add", where, "z_pre", True, H, True), Op("lut", where, f"z_out = {form.gate}(z_pre)", True, H, True),
            Op("add", where, "r_pre", True, H, True), Op("lut", where, f"r_out = {form.gate}(r_pre)", True, H, True),
            Op("mul", where, "rh = r h", True, H, True),
            Op("gemm", where, "Rh_g = R_g rh", True, H * H, True), Op("rescale", where, "Rh_g", True, H, True),
            Op("add", where, "g_pre", True, H, True),
            Op("lut", where, f"g_out = {form.candidate}(g_pre)", True, H, True),
            Op("mul", where, "old_contrib = z h", True, H, True), Op("add", where, "1 - z", True, H, True),
            Op("mul", where, "new_contrib = (1 - z) g", True, H, True), Op("add", where, "h", True, H, True)]
    return ops


def realize(qm: QuantModel) -> Program:
    """The integer program as simulated quantization leaves it, before any pass."""
    model = qm.model
    ops = [Op("quantize", "input", "x", False, model.input_size, True)]
    for l, row in enumerate(qm.cells):
        if l:
            for d, cq in enumerate(qm.cells[l - 1]):
                between = f"layer{l - 1}.{DIRECTIONS[d]} -> layer{l}"
                ops += [Op("dequantize", between, "h", False, cq.hidden_size, True),
                        Op("quantize", between, "x", False, cq.hidden_size, True)]
        for d in range(len(row)):
            ops += _cell_ops(qm, l, d)
    ops.append(Op("dequantize", "output", "y", False, model.output_size, True))
    return Program(ops)


def folded_biases(rows: dict[str, np.ndarray], reset_after: bool = True) -> tuple[np.ndarray, np.ndarray]:
    """The bias terms of `intops.gru_cell` are constants per channel: fold them at export.
    b_pre [3H]: rshift_round(qbx, sh_bx), plus rshift_round(qbr, sh_br) for the z and r blocks
    (the g block's br enters Rh_add_br instead); b_Rh_add_br [H]: rshift_round(qbr_g, sh_br_g).
    A reset-before cell (`reset_after` False) adds both biases of every block to its
    pre-activation (b_Rh_add_br is then unused)."""
    bx = rshift_round_all(np.asarray(rows["qbx"], np.int64), np.asarray(rows["sh_bx"], np.int64))
    br = rshift_round_all(np.asarray(rows["qbr"], np.int64), np.asarray(rows["sh_br"], np.int64))
    H = bx.size // 3
    b_pre = bx.copy()
    b_pre[:2 * H if reset_after else 3 * H] += br[:2 * H if reset_after else 3 * H]
    return b_pre, br[2 * H:]


def fold_constants(p: Program, qm: QuantModel) -> list[Op]:
    """Fake-quant on constants -> integer tables; per-step bias shifts -> folded bias tables."""
    removed = [op for op in p.ops if op.kind == "fake_quant"
               or (op.kind == "rescale" and op.what.startswith(("bx_", "br_")))]
    folded = []
    for l, row in enumerate(qm.cells):
        for d, cq in enumerate(row):
            where, H = f"layer{l}.{DIRECTIONS[d]}", cq.hidden_size
            folded += [Op("constant", where, n, True, getattr(cq, "q" + n).size) for n in ("W", "R")]
            folded.append(Op("constant", where, "b_pre", True, 3 * H))
            if cq.form.reset_after:  # a reset-before cell folds every bias into b_pre
                folded.append(Op("constant", where, "b_Rh_add_br", True, H))
    p.ops = folded + [op for op in p.ops if op not in removed]
    return removed


def elide_requantize(p: Program, qm: QuantModel) -> list[Op]:
    """Dequantize/quantize pairs between layers: identities (shift 0, equal zero points) go; any
    other is refused, because qtool's engines hand the integers from layer to layer unchanged."""
    removed = []
    for l in range(1, len(qm.cells)):
        for d, src in enumerate(qm.cells[l - 1]):
            h, x = src.spec["h"], qm.cells[l][0].spec["x"]
            shift = int(x.exp2_inv) - int(h.exp2_inv)
            between = f"layer{l - 1}.{DIRECTIONS[d]} -> layer{l}"
            if shift != 0 or h.zp != x.zp or h.bits != x.bits:
                raise QtoolError(f"{between}: x of layer {l} (int{x.bits}, exp2_inv {x.exp2_inv}, zp {x.zp}) "
                                 f"differs from h of layer {l - 1} (int{h.bits}, exp2_inv {h.exp2_inv}, zp "
                                 f"{h.zp}); the integer GRU passes h on unchanged (calibrate ties them)")
            removed += [op for op in p.ops if op.where == between]
    p.ops = [op for op in p.ops if op not in removed]
    return removed


def drop_zero_tables(p: Program, qm: QuantModel) -> list[Op]:
    """Compensation tables that are all zeros (zero point 0) need not be stored or subtracted."""
    removed = []
    for l, row in enumerate(qm.cells):
        for d, cq in enumerate(row):
            for name in ("W_sum_mul_x_zp", "R_sum_mul_h_zp"):
                if not cq.CH[CHANNEL_ROWS.index(name)].any():
                    removed += [op for op in p.ops if op.where == f"layer{l}.{DIRECTIONS[d]}" and op.what == name]
    p.ops = [op for op in p.ops if op not in removed]
    return removed


def partition_conversions(p: Program, fully_integral: bool = True) -> None:
    """Prefix (input conversion), core, suffix (output conversion), as TVM partitions a
    quantized module; with `fully_integral`, refuse a core with a floating-point operation."""
    p.prefix = [op for op in p.ops if op.where == "input"]
    p.suffix = [op for op in p.ops if op.where == "output"]
    core = [op for op in p.ops if op.where not in ("input", "output")]
    p.ops = core
    floats = [op for op in core if not op.integral]
    if fully_integral and floats:
        op = floats[0]
        raise QtoolError(f"the integer core would contain a floating-point operation: {op.kind} of {op.what} "
                         f"in {op.where} ({len(floats)} such operations; {', '.join(PASSES)} remove them)")


def run_passes(qm: QuantModel, fully_integral: bool = True, passes: tuple[str, ...] = PASSES) -> Program:
    """Realize the program, run the passes in order, partition it; `p.removed` says what went."""
    p = realize(qm)
    steps = {"fold_constants": fold_constants, "elide_requantize": elide_requantize,
             "drop_zero_tables": drop_zero_tables}
    for name in passes:
        p.removed[name] = steps[name](p, qm)
    partition_conversions(p, fully_integral)
    return p


def report(p: Program) -> dict:
    """What each pass removed, and the partition: for tables and --json."""
    def summary(ops: list[Op]) -> dict:
        return {"operations": len(ops), "per_step_elements": sum(op.count for op in ops if op.per_step),
                "once_elements": sum(op.count for op in ops if not op.per_step),
                "what": [f"{op.where}: {op.kind} {op.what}" for op in ops]}

    return {"passes": {name: summary(ops) for name, ops in p.removed.items()},
            "partition": {"prefix": [f"{op.kind} {op.what}" for op in p.prefix],
                          "suffix": [f"{op.kind} {op.what}" for op in p.suffix],
                          "core_operations": len(p.ops),
                          "core_fully_integral": all(op.integral for op in p.ops)}}
