"""`qtool export c`: C99 headers with the integer parameters and a portable integer GRU.

Writes into DIR: qgru.h / qgru.c (the runtime, copied verbatim), NAME_params.h (const tables),
NAME.h / NAME.c (the model: prefix quantize, integer core, suffix dequantize; streaming and
whole-sequence APIs). Reads the quantized model only; never recomputes numerics.
"""

from __future__ import annotations

import re
import shutil
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from qtool import __version__
from qtool.errors import QtoolError
from qtool.model import DIRECTIONS
from qtool.passes import folded_biases, report, run_passes
from qtool.qmodel import QuantModel
from qtool.qparams import qrange
from qtool.rescale import CHANNEL_ROWS
from qtool.tensors import TENSORS

RUNTIME = Path(__file__).parent / "c_runtime"
C_KEYWORDS = {"auto", "break", "case", "char", "const", "continue", "default", "do", "double",
              "else", "enum", "extern", "float", "for", "goto", "if", "inline", "int", "long",
              "register", "restrict", "return", "short", "signed", "sizeof", "static", "struct",
              "switch", "typedef", "union", "unsigned", "void", "volatile", "while"}


def c_name(name: str) -> str:
    """A safe C identifier prefix: only [A-Za-z0-9_], not starting with a digit, not a keyword."""
    s = re.sub(r"[^A-Za-z0-9_]", "_", name).strip("_") or "gru"
    if s[0].isdigit() or s in C_KEYWORDS:
        s = "m_" + s
    return s[:48]


def comment(text: str) -> str:
    """Text safe inside a /* */ comment: printable ASCII, no comment terminator."""
    text = "".join(ch if 32 <= ord(ch) < 127 else "?" for ch in str(text))
    return text.replace("*/", "* /").replace("/*", "/ *")


def c_array(ctype: str, name: str, values: np.ndarray, per_line: int = 16) -> str:
    flat = np.asarray(values).ravel()
    body = ",\n".join("    " + ", ".join(str(int(v)) for v in flat[i:i + per_line])
                      for i in range(0, len(flat), per_line))
    return f"static const {ctype} {name}[{len(flat)}] QGRU_SECTION = {{\n{body}\n}};\n"


def int_type(values: np.ndarray, choices=("int8_t", "int16_t", "int32_t", "int64_t")) -> str:
    lo, hi = int(np.min(values)), int(np.max(values))
    for t, bits in (("int8_t", 8), ("int16_t", 16), ("int32_t", 32), ("int64_t", 64)):
        if t in choices and -(1 << (bits - 1)) <= lo and hi < (1 << (bits - 1)):
            return t
    raise QtoolError(f"values [{lo}, {hi}] fit none of {choices}")


SIZES = {"int8_t": 1, "int16_t": 2, "int32_t": 4, "int64_t": 8}


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
    passes: dict = field(default_factory=dict)  # what qtool.passes removed, and the partition

    @property
    def flash_bytes(self) -> int:
        return self.weight_bytes + self.bias_bytes + self.table_bytes + self.other_bytes


COMPENSATION = ("table", "offset")


def _input_bound(spec, offset: bool) -> int:
    """Largest |GEMM input|: q on `bits` signed bits, or q - zp when inputs are offset."""
    lo, hi = qrange(spec.bits)
    return max(abs(lo - spec.zp), abs(hi - spec.zp)) if offset else max(-lo, hi)


def _gemm_acc64(q_w: np.ndarray, in_bound: int) -> bool:
    return int(np.abs(q_w).sum(axis=1).max(initial=0)) * in_bound >= 2**31


def offset_inputs(spec: dict, compensation: str) -> bool:
    """Whether a cell compensates zero points by offsetting its GEMM inputs: asked for, needed
    (a zero point is not 0), and possible (every q - zp fits the runtime's int16 buffers)."""
    x, h = spec["x"], spec["h"]
    return (compensation == "offset" and (x.zp != 0 or h.zp != 0)
            and max(_input_bound(x, True), _input_bound(h, True)) < 2**15)


def _cell_arrays(qm: QuantModel, l: int, d: int, prefix: str, fp: Footprint,
                 compensation: str) -> tuple[str, str]:
    """The const arrays of one cell and its qgru_cell_t initializer."""
    cq = qm.cells[l][d]
    offset = offset_inputs(cq.spec, compensation)
    p = f"{prefix}_l{l}_{DIRECTIONS[d]}"
    out = []
    w_t = "int8_t" if cq.spec["W"].bits <= 8 else "int16_t"
    r_t = "int8_t" if cq.spec["R"].bits <= 8 else "int16_t"
    out.append(c_array(w_t, f"{p}_qW", cq.qW))
    out.append(c_array(r_t, f"{p}_qR", cq.qR))
    fp.weight_bytes += cq.qW.size * SIZES[w_t] + cq.qR.size * SIZES[r_t]
    fp.int8_weight_bytes += cq.qW.size + cq.qR.size
    rows = {r: cq.CH[i] for i, r in enumerate(CHANNEL_ROWS)}
    b_pre, b_rh = folded_biases(rows)
    b_t = int_type(np.concatenate([b_pre, b_rh]), ("int8_t", "int16_t", "int32_t"))
    for name, v in (("b_pre", b_pre), ("b_Rh_add_br", b_rh)):
        out.append(c_array(b_t, f"{p}_{name}", v))
        fp.bias_bytes += v.size * SIZES[b_t]
    comps = {}
    for r in ("sh_W", "sh_R"):
        out.append(c_array("int8_t", f"{p}_{r}", rows[r]))
        fp.other_bytes += rows[r].size
    for r in ("W_sum_mul_x_zp", "R_sum_mul_h_zp"):
        if offset or not rows[r].any():  # offset inputs, or zero point 0: no table
            comps[r] = ("NULL", "NULL")
            continue
        t = int_type(rows[r], ("int32_t", "int64_t"))
        comps[r] = (f"{p}_{r}", "NULL") if t == "int32_t" else ("NULL", f"{p}_{r}")
        out.append(c_array(t, f"{p}_{r}", rows[r]))
        fp.other_bytes += rows[r].size * SIZES[t]
        fp.offset_saves += rows[r].size * SIZES[t] * offset_inputs(cq.spec, "offset")
    out.append(c_array("int32_t", f"{p}_P", cq.P))
    fp.other_bytes += cq.P.size * 4
    for lut in ("lut_z", "lut_r", "lut_g"):
        out.append(c_array("int16_t", f"{p}_{lut}", cq.luts[lut]))
        fp.table_bytes += cq.luts[lut].size * 2
    H, C = cq.qR.shape[1], cq.qW.shape[1]
    fp.macs_per_step += 3 * H * (C + H)
    acc64 = int(_gemm_acc64(cq.qW, _input_bound(cq.spec["x"], offset))
                or _gemm_acc64(cq.qR, _input_bound(cq.spec["h"], offset)))
    init = (f"    {{{C}, {H}, {SIZES[w_t]}, {SIZES[r_t]}, {acc64}, {int(offset)}, {p}_qW, {p}_qR, {SIZES[b_t]}, "
            f"{p}_b_pre, {p}_b_Rh_add_br, {p}_sh_W, {p}_sh_R, "
            f"{comps['W_sum_mul_x_zp'][0]}, {comps['W_sum_mul_x_zp'][1]}, "
            f"{comps['R_sum_mul_h_zp'][0]}, {comps['R_sum_mul_h_zp'][1]}, {p}_P, "
            f"{p}_lut_z, {p}_lut_r, {p}_lut_g}}")
    return "\n".join(out), init


def _scale_comments(qm: QuantModel) -> str:
    lines = []
    for l, cells in enumerate(qm.cells):
        for d, cq in enumerate(cells):
            for td in TENSORS:
                s = cq.spec[td.name]
                e = np.asarray(s.exp2_inv)
                scale = (f"2^-{int(e)} = {2.0 ** -int(e):.6g}" if e.ndim == 0 else
                         f"per channel 2^-{int(e.min())}..2^-{int(e.max())}")
                kind = "symmetric" if s.symmetric else f"asymmetric, zp {s.zp}"
                lines.append(f" *   layer{l}.{DIRECTIONS[d]}.{td.name}: int{s.bits}, {kind}, "
                             f"scale {scale}")
    return "\n".join(comment(x) for x in lines)


def export_c(qm: QuantModel, out_dir: Path, name: str, compensation: str = "table",
             fully_integral: bool = True) -> Footprint:
    """Write the C sources for `qm` into `out_dir` (which must exist). `compensation`: "table"
    stores the precomputed W_sum_mul_x_zp / R_sum_mul_h_zp; "offset" feeds the GEMMs x - zp_x
    and h - zp_h instead (no tables; see qgru.h). `fully_integral`: refuse a core with a
    floating-point operation (in the program after qtool.passes, and in the C written)."""
    if compensation not in COMPENSATION:
        raise QtoolError(f"unknown compensation {compensation!r}: use one of {', '.join(COMPENSATION)}")
    prefix = c_name(name)
    P = prefix.upper()
    model = qm.model
    fp = Footprint(passes=report(run_passes(qm, fully_integral)))
    arrays, inits = [], []
    for l, cells in enumerate(qm.cells):
        for d in range(len(cells)):
            a, i = _cell_arrays(qm, l, d, prefix, fp, compensation)
            arrays.append(a)
            inits.append(i)
    L, D = model.num_layers, model.num_directions
    hidden = [cells[0].hidden_size for cells in qm.cells]
    widths = [model.input_size] + [h * D for h in hidden]
    max3h, max_w = 3 * max(hidden), max(widths)
    state = sum(h * D for h in hidden)
    x_spec, y_spec = qm.cells[0][0].spec["x"], qm.cells[-1][0].spec["h"]
    offset = any(offset_inputs(cq.spec, compensation) for cells in qm.cells for cq in cells)
    off_fields = (f"    int16_t x_off[{P}_MAX_WIDTH];\n    int16_t h_off[{P}_MAX_HIDDEN];\n"
                  if offset else "")
    fp.ram_bytes = state * 2 + max3h * (2 + 8) + max_w * 2 + (max_w + max(hidden)) * 2 * offset
    info = qm.info
    provenance = "\n".join(comment(f" * {k}: {v}") for k, v in (
        ("model", f"{model.name} ({model.source})"), ("calibration", info.get("method")),
        ("bits", info.get("bits")), ("calibration data", f"{info.get('data_file')}, "
                                                          f"{info.get('samples')} sequences"),
        ("generated by", f"qtool {__version__}")))
    guard = f"{P}_PARAMS_H"
    params_h = f"""/*
 * {prefix}: integer GRU parameters, generated by qtool. Do not edit.
{provenance}
 *
 * Every tensor's quantization (value = (q - zp) * scale):
{_scale_comments(qm)}
 */
#ifndef {guard}
#define {guard}

#include "qgru.h"

{chr(10).join(arrays)}
static const qgru_cell_t {prefix}_cells[{L * D}] = {{
{("," + chr(10)).join(inits)}
}};

#endif /* {guard} */
"""
    model_h = f"""/*
 * {prefix}: integer-only GRU generated by qtool {__version__}. Do not edit.
 * Three parts (as TVM's partition_conversions): {prefix}_quantize_input (prefix, float in),
 * the integer core ({prefix}_step / {prefix}_run_sequence, fully integral), and
 * {prefix}_dequantize_output (suffix, float out).
 */
#ifndef {P}_H
#define {P}_H

#include <stdint.h>

#define {P}_INPUT_SIZE {model.input_size}
#define {P}_HIDDEN_SIZE {model.hidden_size}
#define {P}_OUTPUT_SIZE {model.output_size}
#define {P}_NUM_LAYERS {L}
#define {P}_NUM_DIRECTIONS {D}
#define {P}_STATE_SIZE {state} /* int16 values: every layer's and direction's h */
#define {P}_MAX_3H {max3h}
#define {P}_MAX_WIDTH {max_w}
#define {P}_MAX_HIDDEN {max(hidden)}
#define {P}_MACS_PER_STEP {fp.macs_per_step}
/* int16 elements of the work buffer {prefix}_run_sequence needs for T time steps */
#define {P}_SEQUENCE_WORK(T) (2 * (T) * {P}_MAX_WIDTH)
#define {P}_INPUT_EXP2_INV {int(x_spec.exp2_inv)}
#define {P}_INPUT_ZP {x_spec.zp}
#define {P}_OUTPUT_EXP2_INV {int(y_spec.exp2_inv)}
#define {P}_OUTPUT_ZP {y_spec.zp}

/* Caller-owned state and scratch: allocate statically. */
typedef struct {{
    int16_t h[{P}_STATE_SIZE];
    int16_t q_Wx[{P}_MAX_3H];
    int64_t acc_Rh[{P}_MAX_3H];
    int16_t layer_io[{P}_MAX_WIDTH];
{off_fields}}} {prefix}_state_t;

/* h = 0 for every layer (q = zp_h). */
void {prefix}_reset({prefix}_state_t *s);
/* prefix: q = clamp(floor(x * 2^exp2_inv_x + 0.5) + zp_x), n values */
void {prefix}_quantize_input(const float *x, int16_t *x_q, int32_t n);
/* suffix: y = (q - zp_h) * 2^-exp2_inv_h, n values */
void {prefix}_dequantize_output(const int16_t *y_q, float *y, int32_t n);
/* core, streaming: one time step, x_q [INPUT_SIZE] -> y_q [OUTPUT_SIZE]; returns -1 for a
 * bidirectional model (it needs the whole sequence) */
int {prefix}_step({prefix}_state_t *s, const int16_t *x_q, int16_t *y_q);
/* core, whole sequence: x_q [T][INPUT_SIZE] -> y_q [T][OUTPUT_SIZE]; work holds
 * {P}_SEQUENCE_WORK(T) int16 values; s->h ends with every layer's final state */
void {prefix}_run_sequence({prefix}_state_t *s, const int16_t *x_q, int32_t T, int16_t *y_q,
                           int16_t *work);

#endif /* {P}_H */
"""
    hidden_list = ", ".join(str(h) for h in hidden)
    width_list = ", ".join(str(w) for w in widths)
    model_c = f"""/* {prefix}: generated by qtool {__version__}. Do not edit. */
#include <math.h>
#include <string.h>

#include "{prefix}.h"
#include "{prefix}_params.h"

static const int32_t {prefix}_hidden[{L}] = {{{hidden_list}}};
static const int32_t {prefix}_width[{L + 1}] = {{{width_list}}};

void {prefix}_reset({prefix}_state_t *s)
{{
    int32_t l, d, j, off = 0;
    for (l = 0; l < {P}_NUM_LAYERS; l++) {{
        for (d = 0; d < {P}_NUM_DIRECTIONS; d++) {{
            for (j = 0; j < {prefix}_hidden[l]; j++) {{
                s->h[off++] = (int16_t){prefix}_cells[l * {P}_NUM_DIRECTIONS + d].P[QGRU_ZP_H];
            }}
        }}
    }}
}}

void {prefix}_quantize_input(const float *x, int16_t *x_q, int32_t n)
{{
    int32_t i;
    const double scale = ldexp(1.0, {P}_INPUT_EXP2_INV);
    const int32_t zp = {P}_INPUT_ZP;
    const int64_t lo = {-(1 << (x_spec.bits - 1))};
    const int64_t hi = {(1 << (x_spec.bits - 1)) - 1};
    for (i = 0; i < n; i++) {{
        int64_t q = (int64_t)floor((double)x[i] * scale + 0.5) + zp;
        x_q[i] = (int16_t)qgru_clamp(q, lo, hi);
    }}
}}

void {prefix}_dequantize_output(const int16_t *y_q, float *y, int32_t n)
{{
    int32_t i;
    for (i = 0; i < n; i++) {{
        y[i] = (float)ldexp((double)(y_q[i] - {P}_OUTPUT_ZP), -{P}_OUTPUT_EXP2_INV);
    }}
}}

static qgru_scratch_t {prefix}_scratch({prefix}_state_t *s)
{{
    qgru_scratch_t sc;
    sc.q_Wx = s->q_Wx;
    sc.acc_Rh = s->acc_Rh;
    sc.x_off = {"s->x_off" if offset else "NULL"};
    sc.h_off = {"s->h_off" if offset else "NULL"};
    return sc;
}}

int {prefix}_step({prefix}_state_t *s, const int16_t *x_q, int16_t *y_q)
{{
    int32_t l, off = 0;
    const int16_t *in = x_q;
    if ({P}_NUM_DIRECTIONS != 1) {{
        return -1;
    }}
    for (l = 0; l < {P}_NUM_LAYERS; l++) {{
        qgru_cell_step(&{prefix}_cells[l], in, s->h + off, {prefix}_scratch(s));
        in = s->h + off;
        off += {prefix}_hidden[l];
    }}
    memcpy(y_q, in, sizeof(int16_t) * {P}_OUTPUT_SIZE);
    return 0;
}}

void {prefix}_run_sequence({prefix}_state_t *s, const int16_t *x_q, int32_t T, int16_t *y_q,
                           int16_t *work)
{{
    int32_t l, d, t, off = 0;
    const int16_t *in = x_q;
    int16_t *bufs[2];
    bufs[0] = work;
    bufs[1] = work + (int32_t)T * {P}_MAX_WIDTH;
    {prefix}_reset(s);
    for (l = 0; l < {P}_NUM_LAYERS; l++) {{
        const int32_t H = {prefix}_hidden[l], C = {prefix}_width[l];
        const int32_t out_w = {prefix}_width[l + 1];
        int16_t *out = (l == {P}_NUM_LAYERS - 1) ? y_q : bufs[l % 2];
        for (d = 0; d < {P}_NUM_DIRECTIONS; d++) {{
            int16_t *h = s->h + off + d * H;
            for (t = 0; t < T; t++) {{
                const int32_t tt = d == 0 ? t : T - 1 - t; /* backward runs reversed */
                qgru_cell_step(&{prefix}_cells[l * {P}_NUM_DIRECTIONS + d], in + tt * C, h,
                               {prefix}_scratch(s));
                memcpy(out + tt * out_w + d * H, h, sizeof(int16_t) * H);
            }}
        }}
        in = out;
        off += H * {P}_NUM_DIRECTIONS;
    }}
}}
"""
    for f in ("qgru.h", "qgru.c"):
        shutil.copyfile(RUNTIME / f, out_dir / f)
    (out_dir / f"{prefix}_params.h").write_text(params_h)
    (out_dir / f"{prefix}.h").write_text(model_h)
    (out_dir / f"{prefix}.c").write_text(model_c)
    if fully_integral:
        from exporters.c_integral import check_core

        check_core(out_dir, ["qgru.c", f"{prefix}.c"], {f"{prefix}_quantize_input", f"{prefix}_dequantize_output"})
    return fp
