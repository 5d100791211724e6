"""`qtool export c`: C99 headers with the integer parameters and a portable integer GRU.

`render_c` gives the files by name: qgru.h / qgru.c (the runtime, as stored), NAME_params.h /
NAME_params.c (the tables: declared in the header, defined once), NAME.h / NAME.c (the model:
prefix quantize, integer core, suffix dequantize; streaming and whole-sequence APIs; the cell is
c_runtime/qgru_cell.c.in, or qgru_cell_rb.c.in for a reset-before cell, in the integer types
qtool/numerics/interval.py proves enough), with the footprint, which `footprint` alone computes
from the quantized model (what the advisor counts). Neither writes a file: qtool.api.export_c
writes the rendered files (`export_c` here is a plain writer for tests and scripts). Reads the
quantized model only; never recomputes numerics.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import NamedTuple

import numpy as np
from qtool.exporters.c_source import (
    RUNTIME,
    c_linkage,
    c_name,
    c_table,
    model_c,
    model_h,
    params_h,
    rb_hidden,
    step_extra,
)
from qtool.exporters.c_types import COMPENSATION, SIZES, ModelTypes, int_type, model_types

from qtool.core.model import DIRECTIONS
from qtool.core.qmodel import QuantModel
from qtool.errors import QtoolError
from qtool.io.files import sealed
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


class _Cell(NamedTuple):
    p: str            # the prefix of its tables' names
    tables: list      # (C type, name, values) of every table, in the order defined
    init: str         # its cell_t initializer


def unit_major(q: np.ndarray) -> np.ndarray:
    """Weights [3H][K] (gate blocks z | r | g) as the GEMM kernel reads them, [H][3][K]: unit j's z,
    r and g rows adjacent, K and 2K bytes apart (a load's immediate offset on Arm), and unit j + 1's
    right after them."""
    return np.asarray(q).reshape(3, -1, q.shape[1]).transpose(1, 0, 2)


def _cell(qm: QuantModel, l: int, d: int, prefix: str, ty: ModelTypes) -> _Cell:
    """The tables of one cell and its cell_t initializer."""
    cq = qm.cells[l][d]
    offset = ty.offsets[l][d]
    p = f"{prefix}_l{l}_{DIRECTIONS[d]}"
    rows = {r: cq.CH[i] for i, r in enumerate(CHANNEL_ROWS)}
    reset_after = cq.form.reset_after
    b_pre, b_rab = folded_biases(rows, reset_after)  # a reset-before cell: every bias in b_pre
    tables = [(ty.w_t, "qW", unit_major(cq.qW)), (ty.r_t, "qR", unit_major(cq.qR)), (ty.b_t, "b_pre", b_pre)]
    tables += [(ty.b_t, "b_Rh_add_br", b_rab)] if reset_after else []
    tables += [("int8_t", "sh_W", rows["sh_W"]), ("int8_t", "sh_R", rows["sh_R"])]
    comps = []  # the initializers of the compensation pointers (NULL: none, zero point 0)
    for k, r in (("W", "W_sum_mul_x_zp"), ("R", "R_sum_mul_h_zp")):
        t = int_type([rows[r]], ("int32_t", "int64_t"))
        table = not offset and rows[r].any()
        if table:
            tables.append((t, r, rows[r]))
        comps.append(f"{p}_{r}" if table and t == "int32_t" else "NULL")
        if ty.comp64[k]:
            comps.append(f"{p}_{r}" if table and t == "int64_t" else "NULL")
    tables += [("int32_t", "P", cq.P)] + [(ty.lut_t, k, cq.luts[k]) for k in ("lut_z", "lut_r", "lut_g")]
    H, C = cq.qR.shape[1], cq.qW.shape[1]
    form = f"{int(reset_after)}, " if ty.rh_t else ""  # the member reset_after, in a model with such a cell
    init = (f"    {{{C}, {H}, {int(offset)}, {form}{p}_qW, {p}_qR, {p}_b_pre, "
            f"{p + '_b_Rh_add_br' if reset_after else 'NULL'}, {p}_sh_W, "
            f"{p}_sh_R, {', '.join(comps)}, {p}_P, {p}_lut_z, {p}_lut_r, {p}_lut_g}}")
    return _Cell(p, tables, init)


def _cells(qm: QuantModel, prefix: str, ty: ModelTypes) -> list[_Cell]:
    return [_cell(qm, l, d, prefix, ty) for l, cells in enumerate(qm.cells) for d in range(len(cells))]


def _count(qm: QuantModel, ty: ModelTypes, cells: list[_Cell], passes: dict) -> Footprint:
    """The footprint of the tables `cells` hold (bytes by kind), the streaming RAM and the MACs."""
    fp = Footprint(passes=passes)
    for cq, cell in zip([cq for row in qm.cells for cq in row], cells):
        for t, name, v in cell.tables:
            nbytes = np.size(v) * SIZES[t]
            if name in ("qW", "qR"):
                fp.weight_bytes += nbytes
            elif name.startswith("b_"):
                fp.bias_bytes += nbytes
            elif name.startswith("lut_"):
                fp.table_bytes += nbytes
            else:
                fp.other_bytes += nbytes
            if name in ("W_sum_mul_x_zp", "R_sum_mul_h_zp"):
                fp.offset_saves += nbytes
        fp.int8_weight_bytes += cq.qW.size + cq.qR.size
        H, C = cq.qR.shape[1], cq.qW.shape[1]
        fp.macs_per_step += 3 * H * (C + H)
    hidden = [row[0].hidden_size for row in qm.cells]
    state = sum(h * qm.model.num_directions for h in hidden)
    fp.ram_bytes = (state + max(hidden)) * SIZES[ty.q_t]
    for t, _, _ in step_extra(ty):  # a reset-before cell's rh (and z) buffer, each aligned as C aligns it
        fp.ram_bytes = -(-fp.ram_bytes // SIZES[t]) * SIZES[t] + rb_hidden(qm) * SIZES[t]
    return fp


def _types(qm: QuantModel, compensation: str) -> ModelTypes:
    if compensation not in COMPENSATION:
        raise QtoolError(f"unknown compensation {compensation!r}: use one of {', '.join(COMPENSATION)}")
    return model_types(qm, compensation)


def footprint(qm: QuantModel, compensation: str = "table", fully_integral: bool = True) -> Footprint:
    """The footprint of `qm`'s C export (what `render_c` reports), computed without rendering."""
    ty = _types(qm, compensation)
    return _count(qm, ty, _cells(qm, "m", ty), report(run_passes(qm, fully_integral)))


@dataclass
class CExport:
    """A rendered C export: its files by name (the runtime's as bytes, the generated ones as
    text) and its footprint."""

    prefix: str
    files: dict[str, bytes | str]
    footprint: Footprint

    def encoded(self) -> dict[str, bytes]:
        return encoded(self.files)


def encoded(files: dict[str, bytes | str]) -> dict[str, bytes]:
    """The files as the bytes to write (C sealed: qtool.io.files.sealed), by name in sorted order."""
    return {n: sealed(n, f if isinstance(f, bytes) else f.encode()) for n, f in sorted(files.items())}


def render_c(qm: QuantModel, name: str, compensation: str = "table", fully_integral: bool = True) -> CExport:
    """The C sources for `qm`, their identifiers and files prefixed with c_name(`name`).
    `compensation`: "table" stores the precomputed W_sum_mul_x_zp / R_sum_mul_h_zp; "offset" feeds
    the GEMMs x - zp_x and h - zp_h (a reset-before cell's R_g GEMM rh - zp_rh) instead (no tables;
    see NAME_params.h). Every cell form exports (qtool.core.model.CellForm). `fully_integral`:
    refuse a core with a floating-point operation (in the program after qtool.numerics.passes,
    and in the C rendered)."""
    prefix = c_name(name)
    ty = _types(qm, compensation)
    passes = report(run_passes(qm, fully_integral))
    cells = _cells(qm, prefix, ty)
    fp = _count(qm, ty, cells, passes)
    tables = [c_table(t, f"{cell.p}_{n}", v) for cell in cells for t, n, v in cell.tables]
    inits = [cell.init for cell in cells]
    params_c = (f"/* {prefix}: integer GRU parameters, generated by qtool. Do not edit. */\n"
                f'#include "{prefix}_params.h"\n\n' + "\n".join(d for _, d in tables)
                + f"\nconst {prefix}_cell_t {prefix}_cells[{len(inits)}] QGRU_SECTION = {{\n"
                + ",\n".join(inits) + "\n};\n")
    files: dict[str, bytes | str] = {f: (RUNTIME / f).read_bytes() for f in ("qgru.h", "qgru.c")}
    files[f"{prefix}_params.h"] = c_linkage(params_h(qm, prefix, ty, [d for d, _ in tables]))
    files[f"{prefix}_params.c"] = params_c
    files[f"{prefix}.h"] = c_linkage(model_h(qm, prefix, ty, fp.macs_per_step, fp.ram_bytes))
    files[f"{prefix}.c"] = model_c(qm, prefix, ty, cells)
    if fully_integral:
        from qtool.exporters.c_integral import check_core

        core = ["qgru.h", "qgru.c", f"{prefix}.h", f"{prefix}.c", f"{prefix}_params.c"]
        check_core({n: files[n].decode() if isinstance(files[n], bytes) else files[n] for n in core},
                   {f"{prefix}_quantize_input", f"{prefix}_dequantize_output"})
    return CExport(prefix, files, fp)


def export_c(qm: QuantModel, out_dir: Path, name: str, compensation: str = "table",
             fully_integral: bool = True) -> Footprint:
    """`render_c`, its files written plainly into `out_dir` (which must exist), for tests and
    scripts; qtool.api.export_c writes them atomically and leaves foreign files alone."""
    c = render_c(qm, name, compensation, fully_integral)
    for n, data in c.encoded().items():
        (Path(out_dir) / n).write_bytes(data)
    return c.footprint


def sources(out_dir: Path, prefix: str) -> list[Path]:
    """The C files of an export to compile."""
    return [out_dir / "qgru.c", out_dir / f"{prefix}.c", out_dir / f"{prefix}_params.c"]
