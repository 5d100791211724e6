"""The C text of an export: NAME.h (API), NAME.c (the model: one step function per cell from
c_runtime/qgru_cell.c.in, or qgru_cell_rb.c.in for a reset-before cell, in the model's integer
types with the cell's scalars literal, the GEMM kernels, the loops and the float wrappers) and
NAME_params.h (the cell type, the tables' declarations). What only a reset-before cell needs (its
kernels, the state's rh buffer, the cell type's reset_after, the indices of its P) is written only
for a model that has one: a haste model's files stay as they were."""

from __future__ import annotations

import re
import unicodedata
from pathlib import Path
from string import Template

import numpy as np
from qtool.exporters.c_types import ModelTypes

from qtool.core.model import DIRECTIONS
from qtool.core.qmodel import QuantModel
from qtool.core.tensors import CHANNEL_ROWS, cell_params, cell_tensors, computed
from qtool.errors import QtoolError
from qtool.numerics import rescale
from qtool.numerics.qparams import qrange
from qtool.version import __version__

RUNTIME = Path(__file__).parent / "c_runtime"
C_KEYWORDS = {"auto", "break", "case", "char", "const", "continue", "default", "do", "double",
              "else", "enum", "extern", "float", "for", "goto", "if", "inline", "int", "long",
              "register", "restrict", "return", "short", "signed", "sizeof", "static", "struct",
              "switch", "typedef", "union", "unsigned", "void", "volatile", "while"}


def c_linkage(header: str) -> str:
    """A header's declarations in `extern "C"` for C++ callers: opened after its first #includes,
    closed before its include guard's #endif."""
    lines = header.split("\n")
    at = next(i for i, line in enumerate(lines) if line.startswith("#include"))
    while lines[at].startswith("#include"):
        at += 1
    end = max(i for i, line in enumerate(lines) if line.startswith("#endif"))
    return "\n".join(lines[:at] + ['#ifdef __cplusplus', 'extern "C" {', '#endif'] + lines[at:end]
                     + ['#ifdef __cplusplus', '}', '#endif'] + lines[end:])


def c_name(name: str) -> str:
    """A safe C identifier prefix: only [A-Za-z0-9_], not starting with a digit, not a keyword, at
    most 48 characters, no "_" at either end (so that c_name(c_name(n)) == c_name(n))."""
    ascii_name = unicodedata.normalize("NFKD", name).encode("ascii", "ignore").decode()  # "évil" -> "evil"
    s = re.sub(r"[^A-Za-z0-9_]", "_", ascii_name).strip("_") or "gru"
    if s[0].isdigit() or s in C_KEYWORDS:
        s = "m_" + s
    return s[:48].rstrip("_")


def comment(text: str) -> str:
    """Text safe inside a /* */ comment: printable ASCII, no comment terminator."""
    text = "".join(ch if 32 <= ord(ch) < 127 else "?" for ch in str(text))
    return text.replace("*/", "* /").replace("/*", "/ *")


def c_values(values: np.ndarray, per_line: int = 16) -> str:
    flat = np.asarray(values).ravel()
    return ",\n".join("    " + ", ".join(str(int(v)) for v in flat[i:i + per_line])
                      for i in range(0, len(flat), per_line))


def c_array(ctype: str, name: str, values: np.ndarray) -> str:
    """A file-local table (test vectors)."""
    return f"static const {ctype} {name}[{np.size(values)}] = {{\n{c_values(values)}\n}};\n"


def c_table(ctype: str, name: str, values: np.ndarray) -> tuple[str, str]:
    """A model table: its `extern` declaration for the header, its one aligned definition."""
    n = np.size(values)
    return (f"extern const {ctype} {name}[{n}];",
            f"const {ctype} {name}[{n}] QGRU_ALIGN QGRU_SECTION = {{\n{c_values(values)}\n}};\n")


def _scale_comments(qm: QuantModel) -> str:
    lines = []
    for l, cells in enumerate(qm.cells):
        for d, cq in enumerate(cells):
            for td in cell_tensors(cq.form):
                s = cq.spec[td.name]
                e = np.asarray(s.exp2_inv)
                scale = (f"2^-{int(e)} = {2.0 ** -int(e):.6g}" if e.ndim == 0 else
                         f"per channel 2^-{int(e.min())}..2^-{int(e.max())}")
                kind = "symmetric" if s.symmetric else f"asymmetric, zp {s.zp}"
                lines.append(f" *   layer{l}.{DIRECTIONS[d]}.{td.name}: int{s.bits}, {kind}, "
                             f"scale {scale}")
    return "\n".join(comment(x) for x in lines)


def _dot3_source(prefix: str, gemm: str, w_t: str, q_t: str, acc_t: str, dsp: bool) -> str:
    """The GEMM of one unit's three rows: the int8 SMLAD kernel where it applies, else the plain
    loop in the types the bounds chose. Inlined into each cell, where its sizes are constants."""
    which = gemm[0]
    loop = f"""    const {w_t} *w0 = w, *w1 = w + row_step, *w2 = w + 2 * row_step;
    {acc_t} s0 = 0, s1 = 0, s2 = 0;
    int32_t k;
    for (k = 0; k < n; k++) {{
        const {acc_t} v_k = ({acc_t})(v[k] + v_offset);
        s0 += w0[k] * v_k;
        s1 += w1[k] * v_k;
        s2 += w2[k] * v_k;
    }}
    acc[0] = s0;
    acc[1] = s1;
    acc[2] = s2;
"""
    if dsp:
        loop = f"#if QGRU_DSP\n    qgru_dot3_s8_dsp(w, row_step, v, n, v_offset, acc);\n#else\n{loop}#endif\n"
    return f"""/* sum_k w[row][k] * (v[k] + v_offset) for the rows 0, row_step and 2 row_step of w: the z, r
 * and g rows of one unit ({acc_t}: the exported bound holds every partial sum) */
QGRU_INLINE void {prefix}_dot3_{which}(const {w_t} *w, int32_t row_step, const {q_t} *v, int32_t n,
{" " * (len(prefix) + 25)}int32_t v_offset, {acc_t} acc[3])
{{
{loop}}}
"""


def _dot_rows_source(prefix: str, name: str, rows: int, w_t: str, v_t: str, acc_t: str, dsp: bool) -> str:
    """A reset-before cell's GEMM kernels, `_dot3_source` for fewer rows: `rows` 2, the z and r
    rows of one unit (NAME_dot2_W on x, NAME_dot2_R on h); `rows` 1, one row, its sum returned
    (the g row: NAME_dot1_W on x, NAME_dot1_rh on rh). The int8 SMLAD kernel where it applies."""
    sums = [f"s{r}" for r in range(rows)]
    ptrs = ", ".join(["*w0 = w", "*w1 = w + row_step"][:rows])
    loop = (f"    const {w_t} {ptrs};\n"
            f"    {acc_t} {' = 0, '.join(sums)} = 0;\n"
            "    int32_t k;\n"
            "    for (k = 0; k < n; k++) {\n"
            f"        const {acc_t} v_k = ({acc_t})(v[k] + v_offset);\n"
            + "".join(f"        {x} += w{r}[k] * v_k;\n" for r, x in enumerate(sums)) + "    }\n")
    if rows == 1:
        head = (f"QGRU_INLINE {acc_t} {prefix}_dot1_{name}(const {w_t} *w, const {v_t} *v, int32_t n, "
                "int32_t v_offset)")
        loop += "    return s0;\n"
        dsp_call = f"    return {prefix}_dot1_s8_dsp(w, v, n, v_offset);\n"
        what = "sum_k w[k] * (v[k] + v_offset): the g row"
    else:
        pad = " " * len(f"QGRU_INLINE void {prefix}_dot2_{name}(")
        head = (f"QGRU_INLINE void {prefix}_dot2_{name}(const {w_t} *w, int32_t row_step, const {v_t} *v, "
                f"int32_t n,\n{pad}int32_t v_offset, {acc_t} acc[2])")
        loop += "".join(f"    acc[{r}] = {x};\n" for r, x in enumerate(sums))
        dsp_call = f"    {prefix}_dot2_s8_dsp(w, row_step, v, n, v_offset, acc);\n"
        what = "sum_k w[row][k] * (v[k] + v_offset) for the rows 0 and row_step of w: the z and r rows"
    if dsp:
        loop = f"#if QGRU_DSP\n{dsp_call}#else\n{loop}#endif\n"
    return (f"/* {what} of one unit\n * ({acc_t}: the exported bound holds every partial sum) */\n"
            f"{head}\n{{\n{loop}}}\n")


DOT2_DSP = """/* qgru_dot3_s8_dsp (qgru.h) for the two rows 0 and row_step of w (the z and r rows of one unit) */
QGRU_INLINE void PREFIX_dot2_s8_dsp(const int8_t *w, int32_t row_step, const int8_t *v, int32_t n,
PAD int32_t v_offset, int32_t acc[2])
{
    const int16x2_t off = (int16x2_t)((uint32_t)(uint16_t)v_offset * 0x10001u);
    int32_t s0 = 0, s1 = 0, k;
    for (k = n >> 2; k > 0; k--) {
        const int8x4_t x = qgru_read_s8x4(v);
        const int16x2_t x02 = __sxtab16(off, x);
        const int16x2_t x13 = qgru_sxtab16_ror8(off, x);
        int8x4_t a = qgru_read_s8x4(w);
        s0 = __smlad(__sxtb16(a), x02, s0);
        s0 = __smlad(qgru_sxtb16_ror8(a), x13, s0);
        a = qgru_read_s8x4(w + row_step);
        s1 = __smlad(__sxtb16(a), x02, s1);
        s1 = __smlad(qgru_sxtb16_ror8(a), x13, s1);
        v += 4;
        w += 4;
    }
    for (k = n & 3; k > 0; k--) {
        const int32_t x = *v++ + v_offset;
        s0 += w[0] * x;
        s1 += w[row_step] * x;
        w++;
    }
    acc[0] = s0;
    acc[1] = s1;
}
"""
DOT1_DSP = """/* the same for one row (a unit's g row) */
QGRU_INLINE int32_t PREFIX_dot1_s8_dsp(const int8_t *w, const int8_t *v, int32_t n, int32_t v_offset)
{
    const int16x2_t off = (int16x2_t)((uint32_t)(uint16_t)v_offset * 0x10001u);
    int32_t s0 = 0, k;
    for (k = n >> 2; k > 0; k--) {
        const int8x4_t x = qgru_read_s8x4(v);
        const int8x4_t a = qgru_read_s8x4(w);
        s0 = __smlad(__sxtb16(a), __sxtab16(off, x), s0);
        s0 = __smlad(qgru_sxtb16_ror8(a), qgru_sxtab16_ror8(off, x), s0);
        v += 4;
        w += 4;
    }
    for (k = n & 3; k > 0; k--) {
        s0 += *w++ * (*v++ + v_offset);
    }
    return s0;
}
"""


def _dsp_rows_source(prefix: str, rows: tuple[int, ...]) -> str:
    """The int8 SMLAD kernels of the reset-before cell's GEMMs, qgru_dot3_s8_dsp (qgru.h) for two
    rows and for one (`rows`: those its kernels call), in NAME.c: qgru.h stays as it is."""
    pad = " " * (len(f"QGRU_INLINE void {prefix}_dot2_s8_dsp(") - 1)
    text = {2: DOT2_DSP.replace("PREFIX", prefix).replace("PAD", pad), 1: DOT1_DSP.replace("PREFIX", prefix)}
    return "#if QGRU_DSP\n" + "\n".join(text[r] for r in rows) + "#endif\n"


def _lut_source(prefix: str, lut_t: str) -> str:
    return f"""/* intops.lut_eval: the table at u = q_in - qmin_in; shift > 0: linear interpolation between
 * knots every 2^shift inputs (|b - a| < 2^16 and f < 2^6: int32 is enough, c_bounds.py); shift
 * is the cell's constant, so the exact tables' branch folds away */
QGRU_INLINE int32_t {prefix}_lut_eval(const {lut_t} *table, int32_t u, int32_t shift)
{{
    const int32_t i = u >> shift;
    const int32_t f = u - (i << shift);
    const int32_t a = table[i];
    if (shift == 0) {{
        return a; /* the exact table; f is 0 */
    }}
    return a + qgru_rshift_round32((table[i + 1] - a) * f, shift);
}}
"""


def _literal(v: int) -> str:
    """An integer constant for the cell's expressions: negative ones parenthesised."""
    return f"({v})" if v < 0 else str(v)


def _sat_bits(P: dict, name: str) -> int:
    """The width `name` saturates to: intops clamps every computed tensor to its signed range."""
    lo, hi = P[f"lo_{name}"], P[f"hi_{name}"]
    bits = hi.bit_length() + 1
    if lo != -hi - 1 or hi != (1 << (bits - 1)) - 1:
        raise QtoolError(f"{name} saturates to [{lo}, {hi}], not a signed range")
    return bits


def _gemm_rescale(f: str, k: str, row: str, n: int, shifts: np.ndarray, tables: set,
                  comp: bool | None = None) -> dict:
    """How channel c of one GEMM is rescaled in this cell: its compensation table if it has one
    (`comp`: whether these channels subtract it; by default, whether the cell has it), its shift a
    literal where every channel's is the same, else the per-channel table with the branch-free
    right shift where every channel's is at least 1."""
    lo, hi = int(shifts.min()), int(shifts.max())
    if lo == hi:
        rshift, sh = f"qgru_rshift_round{n}", _literal(lo)
    else:
        rshift = f"qgru_rshift_right{n}" if lo >= 1 else f"qgru_rshift_round{n}"
        sh = f"{f}_sh_{k[0]}[c]"  # k Rg: R's g rows, in R's table
    comp = f" - {f}_{row}[c]" if (row in tables if comp is None else comp) else ""
    return {f"rshift_{k}": rshift, f"sh_{k}": sh, f"comp_{k}": comp}


def step_extra(ty: ModelTypes) -> list[tuple[str, str, str]]:
    """The step functions' parameters after (x, h, h_new) in a model with a reset-before cell:
    (C type, name, member of the state). q_rh: rh of every unit between the two passes; q_z_held:
    z, where some reset-before cell's z_out is wider than q_t (else h_new holds it)."""
    if not ty.rh_t:
        return []
    return [(ty.rh_t, "q_rh", "rh")] + ([(ty.z_t, "q_z_held", "z")] if ty.z_t else [])


def _cell_source(qm: QuantModel, l: int, d: int, f: str, prefix: str, ty: ModelTypes, tables: set) -> str:
    """The step function of layer l, direction d (`f`: its tables' prefix; `tables`: the names it
    has), its scalars literals: c_runtime/qgru_cell.c.in, or qgru_cell_rb.c.in for a
    reset-before cell."""
    cq = qm.cells[l][d]
    reset_after = cq.form.reset_after
    P = {n: int(v) for n, v in zip(cell_params(cq.form), cq.P)}
    rows = {r: cq.CH[i] for i, r in enumerate(CHANNEL_ROWS)}
    offset = ty.offsets[l][d]
    H = cq.hidden_size
    subs = {n: _literal(v) for n, v in P.items()}
    subs.update({f"bits_{n}": str(_sat_bits(P, n)) for n in computed(cq.form)})
    subs.update({f"n_{n}": str(b) for n, b in ty.bits.items()})
    subs.update({f"t_{n}": f"int{b}_t" for n, b in ty.bits.items()})
    subs.update(_gemm_rescale(f, "W", "W_sum_mul_x_zp", ty.bits["Wx"], rows["sh_W"], tables))
    extra = step_extra(ty)
    subs.update(extra_params="".join(f", {t} *{n}" for t, n, _ in extra), extra_unused="")
    if reset_after:
        subs.update(_gemm_rescale(f, "R", "R_sum_mul_h_zp", ty.bits["Rh"], rows["sh_R"], tables))
        subs.update(extra_unused="".join(f"    (void){n}; /* a reset-before cell's */\n" for _, n, _ in extra))
    else:  # R's z and r rows multiply h, its g rows rh: each their own shifts and compensation
        comp = rows["R_sum_mul_h_zp"]
        has = "R_sum_mul_h_zp" in tables
        zr, g = slice(0, 2 * H), slice(2 * H, 3 * H)
        subs.update(_gemm_rescale(f, "R", "R_sum_mul_h_zp", ty.bits["Rh"], rows["sh_R"][zr], tables,
                                  has and bool(comp[zr].any())))
        subs.update(_gemm_rescale(f, "Rg", "R_sum_mul_h_zp", ty.bits["Rh"], rows["sh_R"][g], tables,
                                  has and bool(comp[g].any())))
        subs.update(rh_t=ty.rh_t, rh_offset=_literal(-P["zp_rh"] if offset else 0),
                    z_held="q_z_held" if ty.z_t else "h_new", z_t=ty.z_t or ty.q_t)
    subs.update(f=f, p=prefix, layer=l, direction=DIRECTIONS[d], C=cq.qW.shape[1], H=H,
                q_t=ty.q_t, acc_W_t=ty.acc("Wx"), acc_R_t=ty.acc("Rh"),
                x_offset=_literal(-P["zp_x"] if offset else 0),
                h_offset=_literal(-P["zp_h"] if offset else 0))
    template = "qgru_cell.c.in" if reset_after else "qgru_cell_rb.c.in"
    return Template((RUNTIME / template).read_text()).substitute(subs)


CELLS_COMMENT = """/* The cells, one step function each, their scalars (P) literals that the compiler folds. A
 * step mirrors qtool/numerics/intops.py gru_cell statement by statement; each statement
 * computes in the integer type its exported bound needs (int32_t or int64_t:
 * qtool/numerics/interval.py, docs/embedded.md). Unit j needs only its own three rows of W x and
 * R h, so nothing is buffered but the new state: every unit reads the old h, so h_new [H]
 * collects the new one until the end. */
"""
CELLS_COMMENT_RESET_BEFORE = """/* {cells}A reset-before cell's step mirrors intops.gru_gates_reset_before and
 * gru_candidate_reset_before statement by statement. Its g rows of R multiply rh = r * h_old,
 * which needs every unit's r, so it makes two passes over the units: the first computes z, r and
 * rh of every unit from their z and r rows of W x and R h (rh into the state's buffer rh, z
 * held until the second pass), the second the g rows of W x and R rh, the candidate and the new
 * state. Nothing else is buffered: h_new [H] collects the new state until the end. */
"""
CELLS_GENERAL = """The cells, one step function each, their scalars (P) literals that the compiler folds;
 * each statement computes in the integer type its exported bound needs (int32_t or int64_t:
 * qtool/numerics/interval.py, docs/embedded.md).
 * """


def _cells_source(qm: QuantModel, prefix: str, ty: ModelTypes, cells: list) -> str:
    """The GEMM kernels, the table lookup and every cell's step function, then the table of
    them (layer-major) the loops call. The kernels are those of the model's cell forms."""
    where = [(l, d) for l, row in enumerate(qm.cells) for d in range(len(row))]  # as `cells`
    steps = [_cell_source(qm, l, d, c.p, prefix, ty, {n for _, n, _ in c.tables})
             for (l, d), c in zip(where, cells)]
    q = f"{prefix}_q_t"
    extra = "".join(f", {t} *" for t, _, _ in step_extra(ty))
    table = (f"/* every cell's step, layer by layer, directions inner */\n"
             f"static void (*const {prefix}_cell_steps[{len(cells)}])(const {q} *, {q} *, {q} *{extra}) = {{\n"
             + ",\n".join(f"    {c.p}_cell_step" for c in cells) + "\n};\n")
    forms = {cq.form.reset_after for row in qm.cells for cq in row}
    kernels = []
    if True in forms:
        kernels += [_dot3_source(prefix, "Wx", ty.w_t, ty.q_t, ty.acc("Wx"), ty.dsp("Wx")),
                    _dot3_source(prefix, "Rh", ty.r_t, ty.q_t, ty.acc("Rh"), ty.dsp("Rh"))]
    comments = [CELLS_COMMENT] if True in forms else []
    if False in forms:
        dsp = [ty.dsp("Wx"), ty.dsp("Rh"), ty.dsp("rh")]
        rows = tuple(r for r, used in ((2, dsp[0] or dsp[1]), (1, dsp[0] or dsp[2])) if used)
        kernels += [_dsp_rows_source(prefix, rows)] if rows else []
        kernels += [_dot_rows_source(prefix, "W", 2, ty.w_t, ty.q_t, ty.acc("Wx"), dsp[0]),
                    _dot_rows_source(prefix, "W", 1, ty.w_t, ty.q_t, ty.acc("Wx"), dsp[0]),
                    _dot_rows_source(prefix, "R", 2, ty.r_t, ty.q_t, ty.acc("Rh"), dsp[1]),
                    _dot_rows_source(prefix, "rh", 1, ty.r_t, ty.rh_t, ty.acc("Rh"), dsp[2])]
        comments.append(CELLS_COMMENT_RESET_BEFORE.format(cells="" if comments else CELLS_GENERAL))
    return "\n".join([*kernels, _lut_source(prefix, ty.lut_t), "".join(comments), *steps, table])


def _provenance(qm: QuantModel) -> str:
    model, info = qm.model, qm.info
    return "\n".join(comment(f" * {k}: {v}") for k, v in (
        ("model", f"{model.name} ({model.source})"), ("calibration", info.get("method")),
        ("bits", info.get("bits")), ("calibration data", f"{info.get('data_file')}, "
                                                          f"{info.get('samples')} sequences"),
        ("generated by", f"qtool {__version__}")))


def rb_params_enum() -> str:
    """The indices of a reset-before cell's P (rescale.RB_*, qtool.core.tensors.PARAMS_RESET_BEFORE),
    as qgru.h's enum has the haste cell's; guarded, so that the headers of several models go
    into one translation unit."""
    names = sorted((v, k) for k, v in vars(rescale).items() if k.startswith("RB_") and isinstance(v, int))
    assert [v for v, _ in names] == list(range(len(names)))
    lines, line = [], "   "
    for _, k in names:
        if len(line) + len(k) + 8 > 100:
            lines.append(line)
            line = "   "
        line += f" QGRU_{k},"
    lines.append(line)
    return ("/* Indices of a reset-before cell's P (qtool/numerics/rescale.py RB_*: RH is Rh, RH_PROD is rh) */\n"
            "#ifndef QGRU_RB_PARAMS\n#define QGRU_RB_PARAMS\nenum {\n" + "\n".join(lines)
            + "\n    QGRU_RB_NUM_PARAMS\n};\n#endif\n\n")


RB_STRUCT_COMMENT = """ * A reset-before cell (reset_after = 0; the haste cell has 1): R's g rows multiply
 * rh = r * h_old, so their sh_R and R_sum_mul_h_zp entries are rh's (zp_rh * sum_k qR[c][k]), and
 * with offset_inputs = 1 that GEMM reads (rh - zp_rh); b_pre holds both biases of every block,
 * b_Rh_add_br is NULL, and P holds QGRU_RB_NUM_PARAMS scalars in the order of QGRU_RB_*."""


def params_h(qm: QuantModel, prefix: str, ty: ModelTypes, decls: list[str]) -> str:
    guard = f"{prefix.upper()}_PARAMS_H"
    n = sum(len(c) for c in qm.cells)
    rb = bool(ty.rh_t)
    rb_enum, rb_comment = (rb_params_enum(), "\n" + RB_STRUCT_COMMENT) if rb else ("", "")
    return f"""/*
 * {prefix}: integer GRU parameters, generated by qtool. Do not edit.
{_provenance(qm)}
 *
 * Every tensor's quantization (value = (q - zp) * scale):
{_scale_comments(qm)}
 *
 * The tables are defined once, in {prefix}_params.c (QGRU_ALIGN, QGRU_SECTION: see qgru.h).
 */
#ifndef {guard}
#define {guard}

#include <stddef.h>
#include "qgru.h"

{rb_enum}/* One direction of one layer, for the application: the model's code ({prefix}.c) reads the tables
 * by name, with the scalars P and the tables' presence compiled in. Weights unit-major
 * [H][3][C] and [H][3][H]: unit j's z, r and g rows (rows j, H + j, 2H + j of the model's
 * [3H][C]) one after the other, as the GEMMs read them.
 * Zero-point compensation, two exact ways: with offset_inputs = 0, the precomputed tables
 * W_sum_mul_x_zp / R_sum_mul_h_zp (NULL when the zero point is 0) are subtracted from the raw
 * sums; with offset_inputs = 1 there are no tables and the GEMMs read (x - zp_x) and (h - zp_h)
 * instead: sum_k W[c][k] (x[k] - zp_x) = sum_k W[c][k] x[k] - W_sum_mul_x_zp[c], the same integer.{rb_comment} */
typedef struct {{
    int32_t input_size;
    int32_t hidden_size;
    int32_t offset_inputs;
{"    int32_t reset_after;" + chr(10) if rb else ""}\
    const {ty.w_t} *qW;
    const {ty.r_t} *qR;
    const {ty.b_t} *b_pre;       /* [3H] rshift_round(qbx, sh_bx) (+ rshift_round(qbr, sh_br) for z, r) */
    const {ty.b_t} *b_Rh_add_br; /* [H] rshift_round(qbr_g, sh_br_g) */
    const int8_t *sh_W;        /* exp2_inv_W[c] + exp2_inv_x - exp2_inv_Wx */
    const int8_t *sh_R;
    const int32_t *W_sum_mul_x_zp; /* zp_x * sum_k qW[c][k]; NULL: none */
{"    const int64_t *W_sum_mul_x_zp64; /* the same, where it needs 64 bits */" + chr(10) if ty.comp64["W"] else ""}\
    const int32_t *R_sum_mul_h_zp;
{"    const int64_t *R_sum_mul_h_zp64;" + chr(10) if ty.comp64["R"] else ""}\
    const int32_t *P;          /* QGRU_NUM_PARAMS scalars */
    const {ty.lut_t} *lut_z;
    const {ty.lut_t} *lut_r;
    const {ty.lut_t} *lut_g;
}} {prefix}_cell_t;

{chr(10).join(decls)}
extern const {prefix}_cell_t {prefix}_cells[{n}];

#endif /* {guard} */
"""


def rb_hidden(qm: QuantModel) -> int:
    """The widest reset-before cell's H: the length of the state's rh (and z) buffer; 0: none."""
    return max([cq.hidden_size for row in qm.cells for cq in row if not cq.form.reset_after], default=0)


def _state_buffers(qm: QuantModel, ty: ModelTypes) -> str:
    """The state's buffers of a model with a reset-before cell (NAME_state_t's members after h_new)."""
    what = {"rh": "rh = r * h_old of a reset-before cell's units, its g rows' GEMM input",
            "z": "z of a reset-before cell's units between its two passes (wider than h_new)"}
    return "".join(f"    {t} {m}[{rb_hidden(qm)}]; /* {what[m]} */\n" for t, _, m in step_extra(ty))


def model_h(qm: QuantModel, prefix: str, ty: ModelTypes, macs: int, ram: int) -> str:
    P = prefix.upper()
    model = qm.model
    L, D = model.num_layers, model.num_directions
    hidden = [cells[0].hidden_size for cells in qm.cells]
    max_w = max([model.input_size] + [h * D for h in hidden])
    x_spec, y_spec = qm.cells[0][0].spec["x"], qm.cells[-1][0].spec["h"]
    return f"""/*
 * {prefix}: integer-only GRU generated by qtool {__version__}. Do not edit.
 * Three parts (as TVM's partition_conversions): {prefix}_quantize_input (prefix, float in),
 * the integer core ({prefix}_step / {prefix}_run_sequence, fully integral), and
 * {prefix}_dequantize_output (suffix, float out). The float wrappers use single precision
 * only (no double, no libm); define QGRU_NO_FLOAT to leave them out.
 */
#ifndef {P}_H
#define {P}_H

#include <stdint.h>

#define {P}_INPUT_SIZE ({model.input_size})
#define {P}_HIDDEN_SIZE ({model.hidden_size})
#define {P}_OUTPUT_SIZE ({model.output_size})
#define {P}_NUM_LAYERS ({L})
#define {P}_NUM_DIRECTIONS ({D})
#define {P}_STATE_SIZE ({sum(h * D for h in hidden)}) /* every layer's and direction's h */
#define {P}_MAX_WIDTH ({max_w})
#define {P}_MAX_HIDDEN ({max(hidden)})
#define {P}_MACS_PER_STEP ({macs})
/* the quantized model this export computes (qtool's fingerprint: qtool verify checks it) */
#define {P}_MODEL_FINGERPRINT "{qm.fingerprint()}"
/* {P}_q_t elements of the work buffer {prefix}_run_sequence needs for T time steps */
#define {P}_SEQUENCE_WORK(T) (2 * (T) * {P}_MAX_WIDTH)
#define {P}_INPUT_EXP2_INV ({int(x_spec.exp2_inv)})
#define {P}_INPUT_ZP ({x_spec.zp})
#define {P}_OUTPUT_EXP2_INV ({int(y_spec.exp2_inv)})
#define {P}_OUTPUT_ZP ({y_spec.zp})

/* The storage of every activation and state integer (x, h, y). */
typedef {ty.q_t} {prefix}_q_t;

/* Caller-owned state and scratch ({ram} bytes): allocate statically. */
typedef struct {{
    {prefix}_q_t h[{P}_STATE_SIZE];
    {prefix}_q_t h_new[{P}_MAX_HIDDEN];
{_state_buffers(qm, ty)}}} {prefix}_state_t;

/* h = 0 for every layer (q = zp_h). */
void {prefix}_reset({prefix}_state_t *s);
#ifndef QGRU_NO_FLOAT
/* prefix: q = clamp(floor(x * 2^exp2_inv_x + 0.5) + zp_x), n values; saturates before the
 * conversion (+-1e30, +-inf give qmin/qmax; NaN gives qmin) */
void {prefix}_quantize_input(const float *x, {prefix}_q_t *x_q, int32_t n);
/* suffix: y = (q - zp_h) * 2^-exp2_inv_h, n values (exact in single precision) */
void {prefix}_dequantize_output(const {prefix}_q_t *y_q, float *y, int32_t n);
#endif
/* core, streaming: one time step, x_q [INPUT_SIZE] -> y_q [OUTPUT_SIZE]; returns 0, or -1
 * (and computes nothing) for a bidirectional model, which needs the whole sequence */
int {prefix}_step({prefix}_state_t *s, const {prefix}_q_t *x_q, {prefix}_q_t *y_q);
/* core, whole sequence: x_q [T][INPUT_SIZE] -> y_q [T][OUTPUT_SIZE]; work holds
 * {P}_SEQUENCE_WORK(T) values; s->h ends with every layer's final state */
void {prefix}_run_sequence({prefix}_state_t *s, const {prefix}_q_t *x_q, int32_t T,
                           {prefix}_q_t *y_q, {prefix}_q_t *work);

#endif /* {P}_H */
"""


def _float_literal(e: int) -> str:
    """2^e as an exact single-precision literal."""
    return f"0x1p{e:+d}f"


def float_wrappers(prefix: str, in_t: str, out_t: str, x_spec, y_spec, shifts: tuple = ()) -> str:
    """NAME_quantize_input and NAME_dequantize_output (the float prefix and suffix of the core)
    for an input on `x_spec`'s grid stored as `in_t`, an output on `y_spec`'s as `out_t`; with
    `shifts`, input channel c is on the grid 2^-(exp2_inv + shifts[c]) (a grid per channel)."""
    P = prefix.upper()
    return (quantize_c(f"{prefix}_quantize_input", in_t, f"{P}_INPUT_ZP", x_spec, shifts, f"{prefix}_input_scale")
            + "\n" + dequantize_c(f"{prefix}_dequantize_output", out_t, f"{P}_OUTPUT_ZP", y_spec))


def quantize_c(name: str, in_t: str, zp: str, x_spec, shifts: tuple = (), scales: str = "") -> str:
    """A float prefix: q = clamp(floor(x * 2^exp2_inv + 0.5) + zp) over n values of `x_spec`'s grid
    (`zp`: its macro); with `shifts`, channel c's grid is 2^-(exp2_inv + shifts[c]), from the table
    `scales`."""
    qmin, qmax = qrange(x_spec.bits)
    e = int(x_spec.exp2_inv)
    scale, table = _float_literal(e), ""
    if shifts:
        scale = f"{scales}[i % {len(shifts)}]"
        table = (f"/* 2^(exp2_inv + shift) of each input channel: its own power-of-two grid */\n"
                 f"static const float {scales}[{len(shifts)}] = {{"
                 + ", ".join(_float_literal(e + k) for k in shifts) + "};\n\n")
    return f"""{table}void {name}(const float *x, {in_t} *x_q, int32_t n)
{{
    int32_t i;
    for (i = 0; i < n; i++) {{
        /* x * 2^exp2_inv is exact; + 0.5 is too for the values that do not saturate */
        float v = x[i] * {scale} + 0.5f;
        int32_t q;
        if (!(v >= {float(qmin - x_spec.zp)!r}f)) {{ /* saturate before converting; NaN too */
            v = {float(qmin - x_spec.zp)!r}f;
        }}
        if (v > {float(qmax - x_spec.zp)!r}f) {{
            v = {float(qmax - x_spec.zp)!r}f;
        }}
        q = (int32_t)v; /* truncation; floor: */
        if ((float)q > v) {{
            q -= 1;
        }}
        x_q[i] = ({in_t})(q + {zp});
    }}
}}
"""


def dequantize_c(name: str, out_t: str, zp: str, y_spec) -> str:
    """A float suffix: y = (q - zp) * 2^-exp2_inv over n values of `y_spec`'s grid (`zp`: its macro)."""
    return f"""void {name}(const {out_t} *y_q, float *y, int32_t n)
{{
    int32_t i;
    for (i = 0; i < n; i++) {{
        y[i] = (float)(y_q[i] - {zp}) * {_float_literal(-int(y_spec.exp2_inv))};
    }}
}}
"""


def model_c(qm: QuantModel, prefix: str, ty: ModelTypes, cells: list) -> str:
    """NAME.c; `cells`: c_export's, each with its tables' prefix and names."""
    P = prefix.upper()
    model = qm.model
    L = model.num_layers
    hidden = [cells[0].hidden_size for cells in qm.cells]
    widths = [model.input_size] + [h * model.num_directions for h in hidden]
    x_spec, y_spec = qm.cells[0][0].spec["x"], qm.cells[-1][0].spec["h"]
    qmin, qmax = qrange(x_spec.bits)
    q = f"{prefix}_q_t"
    extra = "".join(f", s->{m}" for _, _, m in step_extra(ty))
    return f"""/* {prefix}: generated by qtool {__version__}. Do not edit. */
#include <string.h>

#include "{prefix}.h"
#include "{prefix}_params.h"

static const int32_t {prefix}_hidden[{L}] = {{{", ".join(map(str, hidden))}}};
static const int32_t {prefix}_width[{L + 1}] = {{{", ".join(map(str, widths))}}};

{_cells_source(qm, prefix, ty, cells)}
void {prefix}_reset({prefix}_state_t *s)
{{
    int32_t l, d, j, off = 0;
    for (l = 0; l < {P}_NUM_LAYERS; l++) {{
        for (d = 0; d < {P}_NUM_DIRECTIONS; d++) {{
            for (j = 0; j < {prefix}_hidden[l]; j++) {{
                s->h[off++] = ({q}){prefix}_cells[l * {P}_NUM_DIRECTIONS + d].P[QGRU_ZP_H];
            }}
        }}
    }}
}}

#ifndef QGRU_NO_FLOAT
{float_wrappers(prefix, q, q, x_spec, y_spec)}#endif

int {prefix}_step({prefix}_state_t *s, const {q} *x_q, {q} *y_q)
{{
    int32_t l, off = 0;
    const {q} *in = x_q;
    if ({P}_NUM_DIRECTIONS != 1) {{
        return -1;
    }}
    for (l = 0; l < {P}_NUM_LAYERS; l++) {{
        {prefix}_cell_steps[l](in, s->h + off, s->h_new{extra});
        in = s->h + off;
        off += {prefix}_hidden[l];
    }}
    memcpy(y_q, in, sizeof({q}) * {P}_OUTPUT_SIZE);
    return 0;
}}

void {prefix}_run_sequence({prefix}_state_t *s, const {q} *x_q, int32_t T, {q} *y_q, {q} *work)
{{
    int32_t l, d, t, off = 0;
    const {q} *in = x_q;
    {q} *bufs[2];
    bufs[0] = work;
    bufs[1] = work + T * {P}_MAX_WIDTH;
    {prefix}_reset(s);
    for (l = 0; l < {P}_NUM_LAYERS; l++) {{
        const int32_t H = {prefix}_hidden[l], C = {prefix}_width[l];
        const int32_t out_w = {prefix}_width[l + 1];
        {q} *out = (l == {P}_NUM_LAYERS - 1) ? y_q : bufs[l % 2];
        for (d = 0; d < {P}_NUM_DIRECTIONS; d++) {{
            {q} *h = s->h + off + d * H;
            for (t = 0; t < T; t++) {{
                const int32_t tt = d == 0 ? t : T - 1 - t; /* backward runs reversed */
                {prefix}_cell_steps[l * {P}_NUM_DIRECTIONS + d](in + tt * C, h, s->h_new{extra});
                memcpy(out + tt * out_w + d * H, h, sizeof({q}) * (size_t)H);
            }}
        }}
        in = out;
        off += H * {P}_NUM_DIRECTIONS;
    }}
}}
"""
