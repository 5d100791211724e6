"""`qtool export c`: C99 headers with the integer parameters and a portable integer GRU.

Writes into DIR: qgru.h / qgru.c (the runtime, copied verbatim), NAME_params.h / NAME_params.c
(the tables: declared in the header, defined once), NAME.h / NAME.c (the model: prefix quantize,
integer core, suffix dequantize; streaming and whole-sequence APIs; the cell is
c_runtime/qgru_cell.c.in in the integer types qtool/numerics/interval.py proves enough). Reads the
quantized model only; never recomputes numerics.
"""

from __future__ import annotations

import shutil
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
from qtool.exporters.c_source import RUNTIME, c_name, c_table, model_c, model_h, params_h
from qtool.exporters.c_types import COMPENSATION, SIZES, ModelTypes, int_type, model_types

from qtool.core.model import DIRECTIONS
from qtool.core.qmodel import QuantModel
from qtool.errors import QtoolError
from qtool.numerics.passes import folded_biases, report, run_passes
from qtool.numerics.rescale import CHANNEL_ROWS


@dataclass
class Footprint:
    weight_bytes: int = 0      # qW, qR
    bias_bytes: int = 0        # the folded bias terms
    table_bytes: int = 0       # LUTs
    other_bytes: int = 0       # shifts, compensation, P
    ram_bytes: int = 0         # streaming state + scratch
    macs_per_step: int = 0
    int8_weight_bytes: int = 0  # the bare int8 weight bytes (W and R at 1 byte each)
    offset_saves: int = 0      # compensation table bytes that compensation="offset" would drop
    passes: dict = field(default_factory=dict)  # what qtool.numerics.passes removed, and the partition

    @property
    def flash_bytes(self) -> int:
        return self.weight_bytes + self.bias_bytes + self.table_bytes + self.other_bytes


def _cell_tables(qm: QuantModel, l: int, d: int, prefix: str, ty: ModelTypes,
                 fp: Footprint) -> tuple[list[tuple[str, str]], str]:
    """The tables of one cell (declaration, definition) and its cell_t initializer."""
    cq = qm.cells[l][d]
    offset = ty.offsets[l][d]
    p = f"{prefix}_l{l}_{DIRECTIONS[d]}"
    rows = {r: cq.CH[i] for i, r in enumerate(CHANNEL_ROWS)}
    b_pre, b_rab = folded_biases(rows)
    tables = [(ty.w_t, "qW", cq.qW), (ty.r_t, "qR", cq.qR), (ty.b_t, "b_pre", b_pre),
              (ty.b_t, "b_Rh_add_br", b_rab), ("int8_t", "sh_W", rows["sh_W"]),
              ("int8_t", "sh_R", rows["sh_R"])]
    comps = []  # the initializers of the compensation pointers (NULL: none, zero point 0)
    for k, r in (("W", "W_sum_mul_x_zp"), ("R", "R_sum_mul_h_zp")):
        t = int_type([rows[r]], ("int32_t", "int64_t"))
        table = not offset and rows[r].any()
        if table:
            tables.append((t, r, rows[r]))
            fp.offset_saves += rows[r].size * SIZES[t]
        comps.append(f"{p}_{r}" if table and t == "int32_t" else "NULL")
        if ty.comp64[k]:
            comps.append(f"{p}_{r}" if table and t == "int64_t" else "NULL")
    tables += [("int32_t", "P", cq.P)] + [(ty.lut_t, k, cq.luts[k]) for k in ("lut_z", "lut_r", "lut_g")]
    out = []
    for t, name, v in tables:
        out.append(c_table(t, f"{p}_{name}", v))
        nbytes = np.size(v) * SIZES[t]
        if name in ("qW", "qR"):
            fp.weight_bytes += nbytes
        elif name.startswith("b_"):
            fp.bias_bytes += nbytes
        elif name.startswith("lut_"):
            fp.table_bytes += nbytes
        else:
            fp.other_bytes += nbytes
    fp.int8_weight_bytes += cq.qW.size + cq.qR.size
    H, C = cq.qR.shape[1], cq.qW.shape[1]
    fp.macs_per_step += 3 * H * (C + H)
    init = (f"    {{{C}, {H}, {int(offset)}, {p}_qW, {p}_qR, {p}_b_pre, {p}_b_Rh_add_br, {p}_sh_W, "
            f"{p}_sh_R, {', '.join(comps)}, {p}_P, {p}_lut_z, {p}_lut_r, {p}_lut_g}}")
    return out, init


def export_c(qm: QuantModel, out_dir: Path, name: str, compensation: str = "table",
             fully_integral: bool = True) -> Footprint:
    """Write the C sources for `qm` into `out_dir` (which must exist). `compensation`: "table"
    stores the precomputed W_sum_mul_x_zp / R_sum_mul_h_zp; "offset" feeds the GEMMs x - zp_x
    and h - zp_h instead (no tables; see NAME_params.h). `fully_integral`: refuse a core with a
    floating-point operation (in the program after qtool.numerics.passes, and in the C written)."""
    if compensation not in COMPENSATION:
        raise QtoolError(f"unknown compensation {compensation!r}: use one of {', '.join(COMPENSATION)}")
    prefix = c_name(name)
    ty = model_types(qm, compensation)
    fp = Footprint(passes=report(run_passes(qm, fully_integral)))
    tables, inits = [], []
    for l, cells in enumerate(qm.cells):
        for d in range(len(cells)):
            t, i = _cell_tables(qm, l, d, prefix, ty, fp)
            tables += t
            inits.append(i)
    hidden = [cells[0].hidden_size for cells in qm.cells]
    state = sum(h * qm.model.num_directions for h in hidden)
    fp.ram_bytes = (state + max(hidden)) * SIZES[ty.q_t]
    params_c = (f"/* {prefix}: integer GRU parameters, generated by qtool. Do not edit. */\n"
                f'#include "{prefix}_params.h"\n\n' + "\n".join(d for _, d in tables)
                + f"\nconst {prefix}_cell_t {prefix}_cells[{len(inits)}] QGRU_SECTION = {{\n"
                + ",\n".join(inits) + "\n};\n")
    for f in ("qgru.h", "qgru.c"):
        shutil.copyfile(RUNTIME / f, out_dir / f)
    (out_dir / f"{prefix}_params.h").write_text(params_h(qm, prefix, ty, [d for d, _ in tables]))
    (out_dir / f"{prefix}_params.c").write_text(params_c)
    (out_dir / f"{prefix}.h").write_text(model_h(qm, prefix, ty, fp.macs_per_step, fp.ram_bytes))
    (out_dir / f"{prefix}.c").write_text(model_c(qm, prefix, ty))
    if fully_integral:
        from qtool.exporters.c_integral import check_core

        check_core(out_dir, ["qgru.h", "qgru.c", f"{prefix}.h", f"{prefix}.c", f"{prefix}_params.c"],
                   {f"{prefix}_quantize_input", f"{prefix}_dequantize_output"})
    return fp


def sources(out_dir: Path, prefix: str) -> list[Path]:
    """The C files of an export to compile."""
    return [out_dir / "qgru.c", out_dir / f"{prefix}.c", out_dir / f"{prefix}_params.c"]
