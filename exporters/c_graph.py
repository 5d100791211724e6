"""`qtool export c` of a whole model: every node of the integer core in C, assembled into one
program (docs/embedded.md, "Whole models").

Each layer module's `c_code` (qtool.layers.c) gives the node's tables and its one-frame function;
each GRU is its own export (qtool.exporters.c_export, prefix NAME_<node>) called as a unit. This
module writes the drivers around them:

- NAME_run_sequence: layer by layer over whole sequences, every edge in a caller's work buffer
  (`NAME_edge_layout` says where, so a test can read every layer's integers);
- NAME_step: one input frame at a time, for models whose every layer is causal: ring buffers
  hold what windows need, each GRU its state; a frame in gives the frames that complete;
- NAME_quantize_input, NAME_dequantize_output (float, outside the integer core), NAME_argmax for
  a classifier, NAME_output_tail for a float tail (softmax, L2 normalization; needs libm).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from fractions import Fraction

import numpy as np
from qtool.exporters.c_export import RUNTIME, encoded, render_c
from qtool.exporters.c_source import c_linkage, c_name, c_table, comment, dequantize_c, float_wrappers, quantize_c
from qtool.exporters.c_types import SIZES, act_type

from qtool.core.qgraph import MODEL_OPS, QGraph
from qtool.errors import QtoolError
from qtool.layers import input_map, layer
from qtool.layers.c import CNode, Window, ctype, lit, requantize_expr
from qtool.version import __version__


@dataclass
class LayerFootprint:
    name: str
    op: str
    flash_bytes: int
    state_bytes: int  # what NAME_step keeps of this layer (rings, sums, GRU state, its frame)
    macs_per_frame: float  # per frame of the model's input: a layer after a pool of 2 runs every other frame
    macs_per_sequence: int = 0  # a layer on a vector (after the last step or a global pool) runs once per sequence


@dataclass
class GraphFootprint:
    layers: list[LayerFootprint] = field(default_factory=list)
    streaming: bool = True
    streaming_refusal: str = ""
    work_at: tuple = ()  # (T, NAME_sequence_work(T)) at the calibration's number of steps, when known
    strided: bool = False  # some layer runs at another rate than the input's frames (a stride, a pool)

    @property
    def flash_bytes(self) -> int:
        return sum(x.flash_bytes for x in self.layers)

    @property
    def ram_bytes(self) -> int:
        return sum(x.state_bytes for x in self.layers)

    @property
    def macs_per_step(self) -> float:
        """Multiply-accumulates per frame of the input, once every layer runs at its own rate."""
        return sum(x.macs_per_frame for x in self.layers)

    @property
    def macs_per_sequence(self) -> int:
        """Multiply-accumulates of the layers that run once per sequence (on a vector)."""
        return sum(x.macs_per_sequence for x in self.layers)


@dataclass
class _Node:
    name: str
    f: str            # its C prefix
    op: str
    ins: list[int]    # edge indexes
    out: int
    cn: CNode
    gru: object = None  # a GRU: its CExport
    qm: object = None
    dual: tuple = ("time", 1, "fc")  # a GRU over a map: (along, F, order) (qtool.layers.gru.dual_path)

    @property
    def region(self) -> bool:
        """Whether the node has a region of its own in the work buffer (a GRU along time's work; one
        along frequency keeps a frame's work in the state)."""
        return self.gru is not None and self.dual[0] == "time"


@dataclass
class GraphExport:
    prefix: str
    files: dict[str, bytes | str]
    footprint: GraphFootprint
    edges: list[str]  # every edge of the core, in NAME_edge_layout's order

    layout: tuple = ()  # for verify: ([(edge, C type, width, is sequence)], output index, streams, sources,
    #                     the other outputs' indexes)
    gru_work: list = field(default_factory=list)  # per GRU: (input edge, its work's values per step, value bytes)
    inputs: int = 1  # the model's inputs: the first edges (the caller's arrays, not in the work buffer)

    def work_bytes(self, steps: dict[str, int]) -> int:
        """What NAME_sequence_work returns, from every edge's steps (NAME_edge_layout's sum)."""
        edges = self.layout[0]
        at = sum((steps[e] * w * SIZES[t] + 3) & ~3 for e, t, w, _ in edges[self.inputs:])
        return at + sum((steps[e] * per * size + 3) & ~3 for e, per, size in self.gru_work)

    def encoded(self) -> dict[str, bytes]:
        return encoded(self.files)


def check_exportable(qg: QGraph) -> None:
    """What the C export takes: inputs that are sequences; a float tail after the first output only."""
    first = qg.core_outputs[0]
    tail_reads = {e for n in qg.tail for e in qg.node(n).inputs} - {e for n in qg.tail for e in qg.node(n).outputs}
    if tail_reads - {first}:
        raise QtoolError(f"the C export runs a float tail after the first output ({first}) only; this model has "
                         f"one after {', '.join(sorted(tail_reads - {first}))} too")
    vectors = [e for e, shape in qg.graph.inputs.items() if len(shape) != 2]
    if vectors and len(qg.graph.inputs) == 1:
        raise QtoolError("the C export takes a model whose input is a sequence [T, C]")
    if vectors:
        raise QtoolError(f"the C export takes a model whose inputs are sequences [T, C]; {', '.join(vectors)} "
                         f"{'is' if len(vectors) == 1 else 'are'} not")


def suffix(j: int) -> str:
    """Input j's mark in its C names: none for input 0 (as a model of one input has them: x_q,
    NAME_in_t, NAME_INPUT_SIZE), j for the others (x1_q, NAME_in1_t, NAME_INPUT1_SIZE ...)."""
    return str(j) if j else ""


def input_arrays(qg: QGraph, x: np.ndarray | dict[str, np.ndarray]) -> list[np.ndarray]:
    """The export's inputs `[N, T, C]` in the model's order: one array, or a dict of one per input."""
    return [x[e] for e in qg.graph.inputs] if isinstance(x, dict) else [x]


def _nodes(qg: QGraph, prefix: str, edges: list[str], fully_integral: bool, compensation: str) -> list[_Node]:
    out, used = [], set()
    for name in qg.core:
        node = qg.node(name)
        f = f"{prefix}_{c_name(name)}"
        if node.op in MODEL_OPS:  # a GRU's own export takes a C prefix of at most 48 characters: the same one
            f, k = c_name(f), 1
            while f in used:
                k += 1
                f = c_name(f"{f[:44]}_{k}")
        while f in used:
            f += "_"
        used.add(f)
        if len(node.outputs) != 1:
            raise QtoolError(f"node {node.label}: the C export takes nodes of one output")
        g_in = [qg.grids[e] for e in node.inputs]
        g_out = [qg.grids[e] for e in node.outputs]
        widths = [qg.graph.shapes[e][-1] for e in node.inputs]
        ins = [edges.index(e) for e in node.inputs]
        edges.append(node.outputs[0])
        if node.op in MODEL_OPS:  # its own C, as `qtool export c` writes a GRU alone
            qm = qg.qparams[name]["qm"]
            sub = render_c(qm, f, compensation, fully_integral)
            dual = layer(node.op, node.label).dual_path(node)
            out.append(_Node(name, f, node.op, ins, len(edges) - 1,
                             CNode(node.op, macs=sub.footprint.macs_per_step * dual[1]), sub, qm, dual))
            continue
        cn = layer(node.op, node.label).c_code(node, qg.qparams[name], g_in, g_out, f, widths)
        out.append(_Node(name, f, node.op, ins, len(edges) - 1, cn))
    return out


def layer_flash(cn: CNode, in_width: int, in_type: str) -> int:
    """Flash of a layer around the GRU as its C stores it: its const tables at their C types
    (weights, biases with the compensation folded in, shifts, activation tables) and, for a window
    that pads with values, one frame of its input's zero point."""
    flash = sum(np.size(v) * SIZES[t] for t, _, v in cn.tables)
    if cn.kind == "window" and cn.window.pad_value:
        flash += in_width * SIZES[in_type]
    return int(flash)


def node_flash(qg: QGraph, name: str) -> int:
    """`layer_flash` of core node `name` (not a GRU), from its C as `qtool export c` writes it."""
    node = qg.node(name)
    g_in, g_out = [qg.grids[e] for e in node.inputs], [qg.grids[e] for e in node.outputs]
    widths = [qg.graph.shapes[e][-1] for e in node.inputs]
    cn = layer(node.op, node.label).c_code(node, qg.qparams[name], g_in, g_out, "f", widths)
    return layer_flash(cn, widths[0], ctype(g_in[0]))


@dataclass
class _Stream:
    """How NAME_step runs: each window's padding in the stream, `(left, right)` steps and whether
    they are values (the zero point) rather than absent; the zero_pad1d nodes folded into the
    window after them (their padding becomes the window's, the node passes frames on)."""

    pads: dict = field(default_factory=dict)  # node index -> ((left, right), values)
    folded: set = field(default_factory=set)  # node indexes
    refusal: str = ""


def _stream_plan(qg: QGraph, nodes: list[_Node]) -> _Stream:
    """Why NAME_step cannot give what the whole sequence gives (`refusal`), else how it runs.
    Left padding is the ring's first rows at reset; right padding is what NAME_finish pushes
    when the stream ends. A zero_pad1d whose only reader is a window op without padding of its
    own becomes that window's (value) padding."""
    plan, readers = _Stream(), {}
    for i, n in enumerate(nodes):
        for e in n.ins:
            readers.setdefault(e, []).append(i)
    for i, n in enumerate(nodes):
        label, w = qg.node(n.name).label, n.cn.window
        if n.qm is not None and n.qm.model.num_directions != 1 and n.dual[0] == "time":
            plan.refusal = f"node {label} is bidirectional: its backward half reads the sequence from its end"
        elif n.cn.kind == "pad" and w.pads != (0, 0):
            nxt = readers.get(n.out, [])
            target = nodes[nxt[0]] if len(nxt) == 1 and n.out != _out_index(qg, nodes) else None
            if target is None or target.cn.kind != "window" or target.cn.window.pads not in ((0, 0), "valid"):
                plan.refusal = (f"node {label} pads the sequence with {w.pads} steps, and no window right "
                                "after it takes them as its own")
            else:
                plan.folded.add(i)
                plan.pads[nxt[0]] = (w.pads, True)
        elif n.cn.kind == "window" and i not in plan.pads:
            if w.pads == "same" and w.stride > 1:
                plan.refusal = (f"node {label} has 'same' padding with stride {w.stride}: it depends on the "
                                "sequence's length")
            else:
                total = w.span - 1
                pads = (total // 2, total - total // 2) if w.pads == "same" else w.pads
                plan.pads[i] = (pads, w.pad_value)
                if pads[1] and not w.pad_value:
                    plan.refusal = f"node {label} pools over steps after the sequence's end"
        if i in plan.pads and plan.pads[i][0][0] >= nodes[i].cn.window.span:
            plan.refusal = (f"node {qg.node(nodes[i].name).label} pads more steps before the sequence than "
                            "its window spans")
        if plan.refusal:
            return plan
    return plan


def _out_index(qg: QGraph, nodes: list[_Node]) -> int:
    return next(n.out for n in nodes if qg.node(n.name).outputs[0] == qg.core_outputs[0])


def render_graph_c(qg: QGraph, name: str, fully_integral: bool = True, compensation: str = "table") -> GraphExport:
    """The C sources of the whole model `qg`, their identifiers and files prefixed with c_name(`name`);
    its GRUs compensate zero points by `compensation` (qtool.exporters.c_export.render_c)."""
    check_exportable(qg)
    prefix = c_name(name)
    edges = list(qg.graph.inputs)
    nodes = _nodes(qg, prefix, edges, fully_integral, compensation)
    out_edge = qg.core_outputs[0]
    if any(e in qg.graph.inputs for e in qg.core_outputs):
        raise QtoolError("an output of the model is its input: there is nothing to export for it")
    plan = _stream_plan(qg, nodes)
    refusal = plan.refusal
    m = _Model(qg, prefix, edges, nodes, edges.index(out_edge), plan)
    files: dict[str, bytes | str] = {f: (RUNTIME / f).read_bytes() for f in ("qgru.h", "qgru.c", "qlayers.h")}
    for n in nodes:
        if n.gru is not None:
            files.update({k: v for k, v in n.gru.files.items() if k not in files})
    tables = [c_table(t, nm, v) for n in nodes for t, nm, v in n.cn.tables] + m.pad_rows()
    files[f"{prefix}_params.h"] = c_linkage(m.params_h([d for d, _ in tables]))
    files[f"{prefix}_params.c"] = (f"/* {prefix}: integer parameters of the layers, generated by qtool. Do not "
                                   f'edit. */\n#include "{prefix}_params.h"\n\n' + "\n".join(d for _, d in tables))
    files[f"{prefix}.h"] = c_linkage(m.header())
    files[f"{prefix}.c"] = m.source()
    if fully_integral:
        from qtool.exporters.c_integral import check_core

        texts = {k: v.decode() if isinstance(v, bytes) else v for k, v in files.items() if k.endswith((".c", ".h"))}
        floats = {f"{p}_{s}" for p in [prefix] + [n.f for n in nodes if n.gru is not None]
                  for s in ("quantize_input", "dequantize_output", "output_tail")}
        floats |= {f"{prefix}_dequantize_output{k}" for k in range(1, len(m.extra) + 1)}
        floats |= {f"{prefix}_quantize_input{j}" for j in range(1, m.n_in)}
        check_core(texts, floats)
    layout = ([(e, t, w, sq) for e, t, w, sq in zip(edges, m.t, m.width, m.seq)], m.out, not refusal,
              sorted(n for n in files if n.endswith(".c")), m.extra)
    gru_work = [(edges[n.ins[0]], _gru_work_per_step(n.qm) + n.qm.model.output_size + m.width[n.ins[0]],
                 SIZES[act_type(n.qm)]) for n in nodes if n.region]
    return GraphExport(prefix, files, m.footprint(tables), edges, layout, gru_work, m.n_in)


def _gru_work_per_step(qm) -> int:
    """The GRU export's NAME_SEQUENCE_WORK(T) / T (c_source.model_h)."""
    hidden = [cells[0].hidden_size for cells in qm.cells]
    return 2 * max([qm.model.input_size] + [h * qm.model.num_directions for h in hidden])


class _Model:
    """The C text of the model around its nodes' functions."""

    def __init__(self, qg: QGraph, prefix: str, edges: list[str], nodes: list[_Node], out: int, plan: _Stream):
        self.qg, self.p, self.P, self.edges, self.nodes, self.out = qg, prefix, prefix.upper(), edges, nodes, out
        self.plan, self.refusal = plan, plan.refusal
        self.grid = [qg.grids[e] for e in edges]
        self.t = [ctype(g) for g in self.grid]
        self.width = [qg.graph.shapes[e][-1] for e in edges]
        self.seq = [len(qg.graph.shapes[e]) == 2 for e in edges]
        self.tail = [qg.node(n) for n in qg.tail]
        self.extra = [edges.index(e) for e in qg.core_outputs[1:]]  # outputs 1, 2, ...: edge indexes
        self.n_in = len(qg.graph.inputs)  # inputs 0, 1, ...: the first edges

    # ---- the inputs: the first one's names as a model of one input has them, then x1_q, in1_t ...
    def x(self, j: int) -> str:
        return f"x{suffix(j)}_q"

    def in_t(self, j: int) -> str:
        return f"{self.p}_in{suffix(j)}_t"

    def in_params(self) -> str:
        """The inputs as a function's parameters."""
        return ", ".join(f"const {self.in_t(j)} *{self.x(j)}" for j in range(self.n_in))

    def in_args(self, value: str = "") -> str:
        """The inputs as a call's arguments (each `value` where given)."""
        return ", ".join(value or self.x(j) for j in range(self.n_in))

    # ---- pieces --------------------------------------------------------------------------
    def pad_rows(self) -> list[tuple[str, str]]:
        """A zero-point frame for each conv1d that pads: what its padded taps read."""
        rows = []
        for i, n in enumerate(self.nodes):
            w = n.cn.window
            if n.cn.kind == "window" and (w.pad_value or self.plan.pads.get(i, (0, False))[1]):
                e = n.ins[0]
                rows.append(c_table(self.t[e], f"{n.f}_zp_row", np.full(self.width[e], self.grid[e].zp)))
        return rows

    def params_h(self, decls: list[str]) -> str:
        guard = f"{self.P}_PARAMS_H"
        return f"""/* {self.p}: integer parameters of the layers around the GRU(s), generated by qtool. Do not edit.
 * Every edge's quantization (value = (q - zp) * 2^-exp2_inv):
{chr(10).join(comment(f" *   {e}: int{g.bits}, exp2_inv {int(g.exp2_inv)}, zp {g.zp}")
              for e, g in zip(self.edges, self.grid))}
 */
#ifndef {guard}
#define {guard}

#include "qlayers.h"

{chr(10).join(decls)}

#endif /* {guard} */
"""

    # ---- the header ------------------------------------------------------------------------
    def state_fields(self) -> list[str]:
        out = []
        for n in self.nodes:
            cn, e_in, e = n.cn, n.ins[0], n.out
            if n.gru is not None:
                along, F, _ = n.dual
                many = f"[{F}]" if along == "time" and F > 1 else ""  # a state per frequency
                out.append(f"    {n.f}_state_t {c_name(n.name)}{many}; /* {comment(n.name)} */")
                out.append(f"    {n.f}_q_t {c_name(n.name)}_y[{n.f.upper()}_OUTPUT_SIZE];")
                if along == "freq":  # run_sequence's work over a frame's F positions, and their input and output
                    out.append(f"    {n.f}_q_t {c_name(n.name)}_work[{self.freq_work(n)}];")
            if cn.kind == "window":
                out.append(f"    {self.t[e_in]} {c_name(n.name)}_ring[{cn.window.span * self.width[e_in]}];")
                out.append(f"    int32_t {c_name(n.name)}_at[4]; /* next row, rows held, frames to skip, first step */")
            if cn.kind == "reduce":
                out.append(f"    {cn.acc_t} {c_name(n.name)}_acc[{self.width[e_in]}];")
                out.append(f"    int32_t {c_name(n.name)}_count;")
            out.append(f"    {self.t[e]} e{e}[{self.width[e]}]; /* {comment(self.edges[e])}: its latest frame */")
        out.append(f"    int32_t valid[{len(self.edges)}]; /* a vector edge holds a value */")
        if not self.refusal:
            out += [f"    int32_t frames{k}; /* frames output {k} completed since reset */"
                    for k in range(1, len(self.extra) + 1)]
            out.append(f"    int32_t flushed; /* rows of padding after the end {self.p}_flush has pushed */")
        return out

    def frames_comment(self) -> str:
        """How a feature map's frames hold it, input and outputs (the import's words), as header lines."""
        lines = [] if self.n_in == 1 else [f"Inputs: {', '.join(self.edges[:self.n_in])} (x_q, x1_q ...: "
                                           f"{self.P}_INPUT_SIZE, {self.P}_INPUT1_SIZE ...), the same steps each"]
        for j, edge in enumerate(self.edges[:self.n_in]):
            frame = input_map(self.qg.graph, edge)
            if frame is not None:
                order, F, C = frame
                which = "Input" if self.n_in == 1 else f"Input {j} ({edge})"
                lines.append(f"{which} frames: {C} channels x {F} frequencies, channel-major" if order == "cf" else
                             f"{which} frames: {F} frequencies x {C} channels, frequency-major")
        lines += [n for n in self.qg.graph.notes if n.startswith("output '")]
        return "".join(f" * {comment(line)}.\n" for line in lines)

    def header(self) -> str:
        P, p = self.P, self.p
        gin, gout = self.grid[0], self.grid[self.out]
        subs = "".join(f'#include "{n.f}.h"\n' for n in self.nodes if n.gru is not None)
        out_seq = self.seq[self.out]
        classes = self.width[self.out] if not out_seq and self.width[self.out] >= 2 else 0
        frame_in = "one input frame x_q [INPUT_SIZE]" if self.n_in == 1 else "one frame of each input"
        ins = "x_q [T][INPUT_SIZE]" if self.n_in == 1 else "x_q, x1_q ... [T][INPUTj_SIZE]"
        ins_at = "0: the input, in x_q" if self.n_in == 1 else f"0 to {self.n_in - 1}: the inputs, in x_q ..."
        others = " Outputs 1, 2 ...: read them after each call, as after a step.\n *" if self.extra else ""
        stream = (f"""/* core, streaming: {frame_in}; returns 1 when it completes an output frame
 * (written to y_q [OUTPUT_SIZE]{"" if out_seq else ": the output as if the sequence ended here"}), else 0.
 * A stream of T frames gives the frames {p}_run_sequence gives for them. */
int {p}_step({p}_state_t *s, {self.in_params()}, {p}_out_t *y_q);
/* the end of the stream, one row of the padding after the sequence's end a call: returns 1 when
 * it completes an output frame (written to y_q [OUTPUT_SIZE]), 0 when not, -1 when every row is
 * pushed.{others} Then {p}_reset before the next stream. */
int {p}_flush({p}_state_t *s, {p}_out_t *y_q);
/* the end of the stream at once: {p}_flush until -1, the frames it completes (at most
 * {P}_FINISH_FRAMES) written to y_q [FINISH_FRAMES][OUTPUT_SIZE]; returns how many */
int32_t {p}_finish({p}_state_t *s, {p}_out_t *y_q);
""" if not self.refusal else f"""/* No {p}_step: {comment(self.refusal)}. Run whole sequences. */
""")
        tail_names = f", float tail: {comment(', '.join(n.name for n in self.tail))}" if self.tail else ""
        step_name = "" if self.refusal else f", {p}_step"
        tail = (f"/* the float tail ({comment(', '.join(n.op for n in self.tail))}) over `frames` dequantized "
                "output frames, in place; uses expf/sqrtf: link with -lm */\n"
                f"void {p}_output_tail(float *y, int32_t frames);\n"
                if self.tail else "")
        argmax = ("/* integer argmax of a classifier's output: the first class of the largest integer */\n"
                  f"int32_t {p}_argmax(const {p}_out_t *y_q);\n" if classes else "")
        return f"""/*
 * {p}: a whole model in integers, generated by qtool {__version__}. Do not edit.
 * {comment(self.qg.graph.name)}: {len(self.nodes)} integer layers{tail_names}.
 * Output: {comment(self.edges[self.out])}{f" (then {len(self.extra)} more: {P}_OUTPUTk below)" if self.extra else ""}.
{self.frames_comment()} * Three parts: {p}_quantize_input (float in), the integer core ({p}_run_sequence{step_name}),
 * {p}_dequantize_output (float out). Define QGRU_NO_FLOAT to leave the float parts out.
 */
#ifndef {P}_H
#define {P}_H

#include <stdint.h>
#include "qgru.h"
{subs}
#define {P}_INPUT_SIZE ({self.width[0]})
#define {P}_OUTPUT_SIZE ({self.width[self.out]})
#define {P}_OUTPUT_IS_SEQUENCE ({int(out_seq)}) /* else one vector per sequence */
#define {P}_NUM_EDGES ({len(self.edges)})
#define {P}_LAYOUT_SIZE ({len(self.edges) + len(self.nodes)}) /* the entries of {p}_edge_layout's arrays */
#define {P}_STREAMING ({int(not self.refusal)})
#define {P}_FINISH_FRAMES ({self.finish_frames()}) /* the most frames {p}_finish gives */
#define {P}_MAX_STEPS ({self.max_steps()}) /* the longest sequence the integer sums are proved for */
#define {P}_MODEL_FINGERPRINT "{self.qg.fingerprint()}"
#define {P}_INPUT_EXP2_INV ({int(gin.exp2_inv)}){self.input_shift_comment()}
#define {P}_INPUT_ZP ({gin.zp})
#define {P}_OUTPUT_EXP2_INV ({int(gout.exp2_inv)})
#define {P}_OUTPUT_ZP ({gout.zp})
{f"#define {P}_NUM_CLASSES ({classes})" + chr(10) if classes else ""}
typedef {self.t[0]} {p}_in_t;
typedef {self.t[self.out]} {p}_out_t;
{self.extra_inputs_header()}
/* Caller-owned state: allocate statically. */
typedef struct {{
{chr(10).join(self.state_fields())}
}} {p}_state_t;

void {p}_reset({p}_state_t *s);
#ifndef QGRU_NO_FLOAT
/* prefix: q = clamp(floor(x * 2^exp2_inv + 0.5) + zp), n values */
void {p}_quantize_input(const float *x, {p}_in_t *x_q, int32_t n);
{"".join(f"void {p}_quantize_input{j}(const float *x, {self.in_t(j)} *x_q, int32_t n);{chr(10)}"
         for j in range(1, self.n_in))}/* suffix: y = (q - zp) * 2^-exp2_inv, n values */
void {p}_dequantize_output(const {p}_out_t *y_q, float *y, int32_t n);
{tail}#endif
/* bytes of the work buffer {p}_run_sequence needs for T steps (-1: T is too short or too long) */
int32_t {p}_sequence_work(int32_t T);
/* a constant at least {p}_sequence_work(T), for a static work buffer:
 * static uint32_t work[({P}_SEQUENCE_WORK_MAX(T) + 3) / 4]; */
{self.work_max_macro()}
/* where {p}_run_sequence leaves edge e ({ins_at}) in work: steps[e] frames of
 * NUM_EDGES' widths at byte offset[e]; `steps` and `offset` hold LAYOUT_SIZE entries (after the
 * edges, the GRUs' own work); returns the work's bytes, or -1 */
int32_t {p}_edge_layout(int32_t T, int32_t *steps, int32_t *offset);
/* core, whole sequence: {ins} -> y_q [steps][OUTPUT_SIZE]; `work`, 4-byte aligned,
 * holds {p}_sequence_work(T) bytes; returns the output's steps (1 for a vector), or -1 when T
 * does not fit the model */
int32_t {p}_run_sequence({p}_state_t *s, {self.in_params()}, int32_t T, {p}_out_t *y_q, void *work);
{stream}{argmax}{self.extra_header()}
#endif /* {P}_H */
"""

    def extra_inputs_header(self) -> str:
        """Inputs 1, 2, ... of a model of several: each one's width, grid and type."""
        P, parts = self.P, []
        for j in range(1, self.n_in):
            g = self.grid[j]
            parts.append(f"""
/* input {j}: {comment(self.edges[j])}, a sequence */
#define {P}_INPUT{j}_SIZE ({self.width[j]})
#define {P}_INPUT{j}_EXP2_INV ({int(g.exp2_inv)}){self.input_shift_comment(j)}
#define {P}_INPUT{j}_ZP ({g.zp})
typedef {self.t[j]} {self.in_t(j)};
""")
        return "".join(parts)

    def extra_header(self) -> str:
        """Outputs 1, 2, ... of a model of several: each one's grid and type, where NAME_run_sequence
        leaves it in the work buffer, its latest frame in the state (streaming), its float suffix."""
        P, p, parts = self.P, self.p, []
        for k, e in enumerate(self.extra, 1):
            g = self.grid[e]
            latest = (f"/* streaming: its latest frame, and how many frames it has completed since {p}_reset (a step\n"
                      f" * or a {p}_flush completes at most one: read it after each) */\n"
                      f"const {p}_out{k}_t *{p}_latest{k}(const {p}_state_t *s);\n"
                      f"int32_t {p}_frames{k}(const {p}_state_t *s);\n" if not self.refusal else "")
            parts.append(f"""
/* output {k}: {comment(self.edges[e])}, {"a sequence" if self.seq[e] else "one vector per sequence"} */
#define {P}_OUTPUT{k}_SIZE ({self.width[e]})
#define {P}_OUTPUT{k}_IS_SEQUENCE ({int(self.seq[e])})
#define {P}_OUTPUT{k}_EXP2_INV ({int(g.exp2_inv)})
#define {P}_OUTPUT{k}_ZP ({g.zp})
typedef {self.t[e]} {p}_out{k}_t;
/* after {p}_run_sequence over T steps: output {k} in `work`, [*steps][OUTPUT{k}_SIZE] (NULL: T does not fit) */
const {p}_out{k}_t *{p}_output{k}(const void *work, int32_t T, int32_t *steps);
{latest}#ifndef QGRU_NO_FLOAT
void {p}_dequantize_output{k}(const {p}_out{k}_t *y_q, float *y, int32_t n);
#endif
""")
        return "".join(parts)

    def extra_source(self) -> str:
        P, p, parts = self.P, self.p, []
        for k, e in enumerate(self.extra, 1):
            latest = ("" if self.refusal else f"""
const {p}_out{k}_t *{p}_latest{k}(const {p}_state_t *s)
{{
    return s->e{e};
}}

int32_t {p}_frames{k}(const {p}_state_t *s)
{{
    return s->frames{k};
}}
""")
            parts.append(f"""
const {p}_out{k}_t *{p}_output{k}(const void *work, int32_t T, int32_t *steps)
{{
    int32_t st[{P}_LAYOUT_SIZE], offset[{P}_LAYOUT_SIZE];
    if ({p}_edge_layout(T, st, offset) < 0) {{
        return NULL;
    }}
    *steps = st[{e}];
    return (const {p}_out{k}_t *)(const void *)((const unsigned char *)work + offset[{e}]);
}}
{latest}
#ifndef QGRU_NO_FLOAT
{dequantize_c(f"{p}_dequantize_output{k}", f"{p}_out{k}_t", f"{P}_OUTPUT{k}_ZP", self.grid[e])}#endif
""")
        return "".join(parts)

    def finish_frames(self) -> int:
        if self.refusal:
            return 0
        return max(1, sum(pads[1] for (pads, _) in self.plan.pads.values()))

    def max_steps(self) -> int:
        most = [n.cn.max_steps for n in self.nodes if n.cn.max_steps]
        return min(most + [(1 << 30)])

    # ---- the source ----------------------------------------------------------------------
    def steps_code(self) -> list[str]:
        """C statements computing steps[e] for every edge from T (return -1 where it fails)."""
        lines = [f"    steps[{j}] = T;" for j in range(self.n_in)]
        for n in self.nodes:
            a, e, w = n.ins[0], n.out, n.cn.window
            if not self.seq[e]:
                need = "1" if (n.cn.kind in ("last",) or n.qm is not None) and self.seq[a] else "0"
                lines.append(f"    if (steps[{a}] < {need}) {{\n        return -1;\n    }}\n    steps[{e}] = 1;")
                continue
            if n.cn.kind == "pad":
                lines.append(f"    steps[{e}] = steps[{a}] + {w.pads[0] + w.pads[1]};")
            elif n.cn.kind == "window":
                pads = self.pads_c(w, f"steps[{a}]")
                lines.append(f"""    {{
        int32_t left, right;
{pads}
        if (steps[{a}] + left + right < {w.span}) {{
            return -1;
        }}
        steps[{e}] = (steps[{a}] + left + right - {w.span}) / {w.stride} + 1;
    }}""")
            else:
                lines.append(f"    steps[{e}] = steps[{a}];")
                for b in n.ins[1:]:
                    lines.append(f"    if (steps[{b}] != steps[{a}]) {{\n        return -1;\n    }}")
        return lines

    @staticmethod
    def pads_c(w: Window, T: str) -> str:
        if w.pads != "same":
            return (f"        left = {w.pads[0]};\n        right = {w.pads[1]};\n"
                    "        (void)left;\n        (void)right;")
        # qtool.layers.same_pads: ceil(T / stride) outputs, the odd zero after
        return f"""        {{
            int32_t total = ((({T}) + {w.stride - 1}) / {w.stride} - 1) * {w.stride} + {w.span} - ({T});
            total = total < 0 ? 0 : total;
            left = total / 2;
            right = total - left;
            (void)right;
        }}"""

    def steps_bounds(self) -> list[tuple[Fraction, Fraction] | None]:
        """Per edge, (r, c) with its steps at most r * T + c for every input length T (None: a
        vector): a window of stride s takes at most (steps + pads - span) / s + 1, 'same' at most
        steps / s + 1, a pad adds its steps, every other op keeps its input's."""
        bounds: list = [(Fraction(1), Fraction(0))] * self.n_in + [None] * (len(self.edges) - self.n_in)
        for n in self.nodes:
            ins = [bounds[i] for i in n.ins if bounds[i] is not None]
            if not ins or not self.seq[n.out]:
                continue
            r, c = max(ins)
            if n.cn.kind in ("window", "pad"):
                w = n.cn.window
                if w.pads == "same":
                    r, c = r / w.stride, c / w.stride + 1
                else:
                    pads = 0 if w.pads == "valid" else sum(w.pads)
                    r, c = r / w.stride, (c + pads - w.span) / w.stride + 1
            bounds[n.out] = (r, c)
        return bounds

    def work_max_macro(self) -> str:
        """NAME_SEQUENCE_WORK_MAX(T): a constant expression at least NAME_sequence_work(T), for a
        work buffer allocated statically: each edge's steps bounded by `steps_bounds` (ceil(r T + c)
        at most ceil(r T) + ceil(c)), each region rounded up to 4 bytes."""
        def steps(e: int) -> str:
            r, c = self.steps_bounds()[e]
            whole = "(T)" if r.numerator == 1 else f"{r.numerator} * (T)"
            part = whole if r.denominator == 1 else f"({whole} + {r.denominator - 1}) / {r.denominator}"
            return f"({part} + {math.ceil(c)})"

        terms = [f"{self.width[e] * SIZES[self.t[e]]} * {steps(e)} + 3" if self.seq[e] else
                 f"{self.width[e] * SIZES[self.t[e]] + 3}" for e in range(self.n_in, len(self.edges))]
        terms += [f"({n.f.upper()}_SEQUENCE_WORK({steps(n.ins[0])}) + {steps(n.ins[0])} * "
                  f"{n.qm.model.output_size + self.width[n.ins[0]]}) * (int32_t)sizeof({n.f}_q_t) + 3"
                  for n in self.nodes if n.region]
        return f"#define {self.P}_SEQUENCE_WORK_MAX(T) ({' + '.join(f'({t})' for t in terms) or '0'})"

    def layout_code(self) -> str:
        lines = [f"int32_t {self.p}_edge_layout(int32_t T, int32_t *steps, int32_t *offset)", "{",
                 "    int32_t at = 0;", f"    if (T < 1 || T > {self.P}_MAX_STEPS) {{\n        return -1;\n    }}"]
        lines += self.steps_code()
        lines += [f"    offset[{j}] = -1;" for j in range(self.n_in)]
        for e in range(self.n_in, len(self.edges)):
            size = f"steps[{e}] * {self.width[e] * SIZES[self.t[e]]}"
            lines.append(f"    offset[{e}] = at;\n    at += ({size} + 3) & ~3;")
        # a GRU's own work (its run_sequence) and, where its types or grids differ, its input and output
        for i, n in enumerate(self.nodes):
            if n.region:
                lines.append(f"    offset[{len(self.edges) + i}] = at;\n"
                             f"    at += (({n.f.upper()}_SEQUENCE_WORK(steps[{n.ins[0]}]) + steps[{n.ins[0]}] * "
                             f"{n.qm.model.output_size + self.width[n.ins[0]]}) * (int32_t)sizeof({n.f}_q_t)"
                             " + 3) & ~3;")
        lines.append("    return at;\n}")
        return "\n".join(lines)

    def ptr(self, e: int) -> str:
        # through void *: the regions are 4-byte aligned in a 4-byte aligned work buffer
        return self.x(e) if e < self.n_in else f"(({self.t[e]} *)(void *)((unsigned char *)work + offset[{e}]))"

    def sequence_node(self, i: int, n: _Node) -> str:
        """One node of NAME_run_sequence, over whole sequences."""
        a, e, cn = n.ins[0], n.out, n.cn
        X = [self.ptr(b) for b in n.ins]
        Y = self.ptr(e)
        Wi = [self.width[b] for b in n.ins]
        Wo = self.width[e]
        head = f"    /* {comment(self.qg.node(n.name).label)} */\n"
        if cn.kind == "frame":
            args = [f"{x} + t * {w}" if self.seq[b] else x for x, w, b in zip(X, Wi, n.ins)]
            steps = f"steps[{e}]" if self.seq[e] else "1"
            call = f"{n.f}({', '.join(args)}, {Y} + t * {Wo});"
            return head + f"    for (t = 0; t < {steps}; t++) {{\n        {call}\n    }}\n"
        if cn.kind == "last":
            return head + f"    {n.f}({X[0]} + (steps[{a}] - 1) * {Wi[0]}, {Y});\n"
        if cn.kind == "pad":
            L, R = cn.window.pads
            zp = self.grid[e].zp
            return head + f"""    for (t = 0; t < steps[{e}]; t++) {{
        if (t < {L} || t >= {L} + steps[{a}]) {{
            int32_t c;
            for (c = 0; c < {Wo}; c++) {{
                {Y}[t * {Wo} + c] = {lit(zp)};
            }}
        }} else {{
            {n.f}({X[0]} + (t - {L}) * {Wi[0]}, {Y} + t * {Wo});
        }}
    }}
"""
        if cn.kind == "reduce":
            return head + f"""    for (t = 0; t < steps[{a}]; t++) {{
        {n.f}_add(s->{c_name(n.name)}_acc, {X[0]} + t * {Wi[0]}, t);
    }}
    {n.f}_out(s->{c_name(n.name)}_acc, steps[{a}], {Y});
"""
        if cn.kind == "window":
            w = cn.window
            pad = f"{n.f}_zp_row" if w.pad_value else "NULL"
            return head + f"""    {{
        int32_t left, right;
{self.pads_c(w, f"steps[{a}]")}
        for (t = 0; t < steps[{e}]; t++) {{
            const {self.t[a]} *rows[{w.taps}];
            int32_t j, n_real = 0;
            for (j = 0; j < {w.taps}; j++) {{
                const int32_t r = t * {w.stride} + j * {w.dilation} - left;
                rows[j] = (r >= 0 && r < steps[{a}]) ? {X[0]} + r * {Wi[0]} : {pad};
                n_real += r >= 0 && r < steps[{a}];
            }}
            {n.f}(rows, n_real, {Y} + t * {Wo});
        }}
    }}
"""
        return head + self.gru_sequence(i, n, X[0], Y)

    def freq_work(self, n: _Node) -> int:
        """Values of a GRU along frequency's work in the state: its run_sequence over F positions
        (NAME_SEQUENCE_WORK(F)), then their input and output."""
        F, C, DH = n.dual[1], self.width[n.ins[0]] // n.dual[1], n.qm.model.output_size
        return _gru_work_per_step(n.qm) * F + F * (C + DH)

    def at(self, n: _Node, f: str, c: str) -> str:
        """Where channel c of frequency f lies in a frame of the GRU's input map."""
        F, C = n.dual[1], self.width[n.ins[0]] // n.dual[1]
        return f"{f} * {C} + {c}" if n.dual[2] == "fc" else f"{c} * {F} + {f}"

    def gru_frames(self) -> str:
        """A GRU along frequency, one frame: its F positions a sequence, from a zero state."""
        out = []
        for i, n in enumerate(self.nodes):
            if n.gru is None or n.dual[0] != "freq":
                continue
            k, a, e, q_t = c_name(n.name), n.ins[0], n.out, f"{n.f}_q_t"
            F, C, DH = n.dual[1], self.width[a] // n.dual[1], n.qm.model.output_size
            h = n.qm.cells[-1][0].spec["h"]
            out.append(f"""/* {comment(self.qg.node(n.name).label)}: one frame, its {F} frequencies a sequence */
static void {self.p}_gru_frame_{i}({self.p}_state_t *s, const {self.t[a]} *x, {self.t[e]} *y)
{{
    {q_t} *gwork = s->{k}_work;
    {q_t} *gx = gwork + {n.f.upper()}_SEQUENCE_WORK({F});
    {q_t} *gy = gx + {F * C};
    int32_t f, c;
    for (f = 0; f < {F}; f++) {{
        for (c = 0; c < {C}; c++) {{
            gx[f * {C} + c] = ({q_t})x[{self.at(n, "f", "c")}];
        }}
    }}
    {n.f}_run_sequence(&s->{k}, gx, {F}, gy, gwork);
    for (c = 0; c < {F * DH}; c++) {{
        y[c] = {requantize_expr("gy[c]", h, self.grid[e])};
    }}
}}
""")
        return "\n".join(out)

    def gru_per_freq(self, i: int, n: _Node, X: str, Y: str) -> str:
        """A GRU along time on each frequency of a map: a sequence (and a state) per frequency."""
        a, e, q_t, sub, k = n.ins[0], n.out, f"{n.f}_q_t", n.f, c_name(n.name)
        F, C, DH = n.dual[1], self.width[a] // n.dual[1], n.qm.model.output_size
        h = n.qm.cells[-1][0].spec["h"]
        region = f"((void *)((unsigned char *)work + offset[{len(self.edges) + i}]))"
        return f"""    {{
        {q_t} *gwork = ({q_t} *){region};
        {q_t} *gy = gwork + {sub.upper()}_SEQUENCE_WORK(steps[{a}]);
        {q_t} *gin = gy + steps[{a}] * {DH};
        int32_t f, c;
        for (f = 0; f < {F}; f++) {{
            for (t = 0; t < steps[{a}]; t++) {{
                for (c = 0; c < {C}; c++) {{
                    gin[t * {C} + c] = ({q_t}){X}[t * {self.width[a]} + {self.at(n, "f", "c")}];
                }}
            }}
            {sub}_run_sequence(&s->{k}[f], gin, steps[{a}], gy, gwork);
            for (t = 0; t < steps[{a}]; t++) {{
                for (c = 0; c < {DH}; c++) {{
                    {Y}[t * {self.width[e]} + f * {DH} + c] = {requantize_expr(f"gy[t * {DH} + c]", h, self.grid[e])};
                }}
            }}
        }}
    }}
"""

    def gru_sequence(self, i: int, n: _Node, X: str, Y: str) -> str:
        if n.dual[0] == "freq":
            return (f"    for (t = 0; t < steps[{n.ins[0]}]; t++) {{\n        {self.p}_gru_frame_{i}(s, {X} + t * "
                    f"{self.width[n.ins[0]]}, {Y} + t * {self.width[n.out]});\n    }}\n")
        if n.dual[1] > 1:
            return self.gru_per_freq(i, n, X, Y)
        a, e = n.ins[0], n.out
        q_t, sub = f"{n.f}_q_t", n.f
        qm = n.qm
        H, D = qm.model.hidden_size, qm.model.num_directions
        h = qm.cells[-1][0].spec["h"]
        region = f"((void *)((unsigned char *)work + offset[{len(self.edges) + i}]))"
        lines = []
        if act_type(qm) != self.t[a]:  # the GRU computes in its own type: its input copied into it
            lines.append(f"""    {{
        {q_t} *xin = ({q_t} *){region} + {sub.upper()}_SEQUENCE_WORK(steps[{a}]) + steps[{a}] * {H * D};
        for (t = 0; t < steps[{a}] * {self.width[a]}; t++) {{
            xin[t] = ({q_t}){X}[t];
        }}
        gx = xin;
    }}""")
        else:
            lines.append(f"    gx = {X};")
        lines.append(f"""    {{
        {q_t} *gwork = ({q_t} *){region};
        {q_t} *gy = gwork + {sub.upper()}_SEQUENCE_WORK(steps[{a}]); /* its output, after its own work */
        int32_t c;
        (void)c;
        {sub}_run_sequence(&s->{c_name(n.name)}, ({"const " + q_t} *)gx, steps[{a}], gy, gwork);""")
        if self.seq[e]:
            lines.append(f"""        for (t = 0; t < steps[{a}] * {H * D}; t++) {{
            {Y}[t] = {requantize_expr('gy[t]', h, self.grid[e])};
        }}""")
        else:  # the final states: forward after the last step, backward at step 0
            last = f"gy[(steps[{a}] - 1) * {H * D} + c]"
            first = f"gy[{H} + c]"
            lines.append(f"""        for (c = 0; c < {H}; c++) {{
            {Y}[c] = {requantize_expr(last, h, self.grid[e])};
        }}""")
            if D == 2:
                lines.append(f"""        for (c = 0; c < {H}; c++) {{
            {Y}[{H} + c] = {requantize_expr(first, h, self.grid[e])};
        }}""")
        lines.append("    }")
        return "\n".join(lines) + "\n"

    def run_sequence(self) -> str:
        p = self.p
        body = "".join(self.sequence_node(i, n) for i, n in enumerate(self.nodes))
        grus = any(n.gru is not None and n.dual[1] == 1 for n in self.nodes)
        out_bytes = f"steps[{self.out}] * {self.width[self.out] * SIZES[self.t[self.out]]}"
        return f"""int32_t {p}_run_sequence({p}_state_t *s, {self.in_params()}, int32_t T, {p}_out_t *y_q, void *work)
{{
    int32_t steps[{self.P}_LAYOUT_SIZE], offset[{self.P}_LAYOUT_SIZE], t;
{"    const void *gx;" + chr(10) if grus else ""}    if ({p}_edge_layout(T, steps, offset) < 0) {{
        return -1;
    }}
    {p}_reset(s);
{body}    memcpy(y_q, {self.ptr(self.out)}, (size_t)({out_bytes}));
    return steps[{self.out}];
}}
"""

    def reset(self) -> str:
        lines = []
        for n in self.nodes:
            k = c_name(n.name)
            if n.gru is not None and n.dual[0] == "time" and n.dual[1] > 1:
                lines.append(f"    for (i = 0; i < {n.dual[1]}; i++) {{\n        {n.f}_reset(&s->{k}[i]);\n    }}")
            elif n.gru is not None:
                lines.append(f"    {n.f}_reset(&s->{k});")
            if n.cn.kind == "window" and not self.refusal:
                (left, _), values = self.plan.pads[self.nodes.index(n)]
                a = n.ins[0]
                lines.append(f"    s->{k}_at[0] = {left}; s->{k}_at[1] = {left}; s->{k}_at[2] = 0; s->{k}_at[3] = 0;")
                if values:
                    lines.append(f"    for (i = 0; i < {self.width[a] * n.cn.window.span}; i++) {{\n"
                                 f"        s->{k}_ring[i] = {lit(self.grid[a].zp)};\n    }}")
            if n.cn.kind == "reduce":
                lines.append(f"    s->{k}_count = 0;")
        lines.append(f"    for (i = 0; i < {self.P}_NUM_EDGES; i++) {{\n        s->valid[i] = 0;\n    }}")
        if not self.refusal:
            lines += [f"    s->frames{k} = 0;" for k in range(1, len(self.extra) + 1)] + ["    s->flushed = 0;"]
        return f"""void {self.p}_reset({self.p}_state_t *s)
{{
    int32_t i;
{chr(10).join(lines)}
}}
"""

    def step_node(self, i: int, n: _Node) -> str:
        """One node of NAME_step: it runs when its inputs have a new frame (a vector input: when
        one of them is new and every one holds a value)."""
        k, a, e, cn = c_name(n.name), n.ins[0], n.out, n.cn
        X = [self.x(b) if b < self.n_in else f"s->e{b}" for b in n.ins]
        Y = f"s->e{e}"
        if all(self.seq[b] for b in n.ins):
            cond = " && ".join(f"fresh[{b}]" for b in n.ins)
        else:
            cond = ("(" + " || ".join(f"fresh[{b}]" for b in n.ins) + ") && "
                    + " && ".join(f"s->valid[{b}]" for b in n.ins))
        head = f"    /* {comment(self.qg.node(n.name).label)} */\n    if (from <= {i} && {cond}) {{\n"
        done = f"        fresh[{e}] = 1;\n        s->valid[{e}] = 1;\n{self.count(e)}    }}\n"
        if cn.kind in ("frame", "last", "pad"):
            return head + f"        {n.f}({', '.join(X)}, {Y});\n" + done
        if cn.kind == "reduce":
            return head + (f"        {n.f}_add(s->{k}_acc, {X[0]}, s->{k}_count);\n"
                           f"        s->{k}_count++;\n        {n.f}_out(s->{k}_acc, s->{k}_count, {Y});\n") + done
        if cn.kind == "window":
            return head + f"        {self.p}_push_{i}(s, {X[0]}, fresh);\n    }}\n"
        qm = n.qm
        h = qm.cells[-1][0].spec["h"]
        along, F, _ = n.dual
        if along == "freq":
            return head + f"        {self.p}_gru_frame_{i}(s, {X[0]}, {Y});\n" + done
        if F > 1:
            C, DH = self.width[a] // F, qm.model.output_size
            return head + f"""        {n.f}_q_t xin[{C}];
        int32_t f, c;
        for (f = 0; f < {F}; f++) {{
            for (c = 0; c < {C}; c++) {{
                xin[c] = ({n.f}_q_t){X[0]}[{self.at(n, "f", "c")}];
            }}
            (void){n.f}_step(&s->{k}[f], xin, s->{k}_y);
            for (c = 0; c < {DH}; c++) {{
                {Y}[f * {DH} + c] = {requantize_expr(f"s->{k}_y[c]", h, self.grid[e])};
            }}
        }}
""" + done
        conv = X[0] if act_type(qm) == self.t[a] else None
        lines = []
        if conv is None:
            lines.append(f"        {n.f}_q_t xin[{self.width[a]}];\n        int32_t c;\n"
                         f"        for (c = 0; c < {self.width[a]}; c++) {{\n"
                         f"            xin[c] = ({n.f}_q_t){X[0]}[c];\n        }}")
            conv = "xin"
        else:
            lines.append("        int32_t c;")
        lines.append(f"        (void){n.f}_step(&s->{k}, {conv}, s->{k}_y);")
        lines.append(f"        for (c = 0; c < {self.width[e]}; c++) {{\n"
                     f"            {Y}[c] = {requantize_expr(f's->{k}_y[c]', h, self.grid[e])};\n        }}")
        return head + "\n".join(lines) + "\n" + done

    def push(self, i: int, n: _Node) -> str:
        """A window's frame into its ring; the window's output frame once the ring holds the
        window and `stride` frames passed since the last one. Rows before `left` are padding:
        the zero point (values) or absent (NULL: pooling's own padding)."""
        k, a, e, w = c_name(n.name), n.ins[0], n.out, n.cn.window
        C = self.width[a]
        (left, _), values = self.plan.pads[i]
        real = "1" if values else f"at[3] + j * {w.dilation} >= {left}"
        return f"""/* {comment(self.qg.node(n.name).label)}: one frame into its ring */
static void {self.p}_push_{i}({self.p}_state_t *s, const {self.t[a]} *frame, int32_t *fresh)
{{
    int32_t *at = s->{k}_at; /* next row, rows held, frames to skip, the window's first step */
    memcpy(s->{k}_ring + at[0] * {C}, frame, sizeof(s->{k}_ring[0]) * {C});
    at[0] = at[0] + 1 == {w.span} ? 0 : at[0] + 1;
    if (at[1] < {w.span}) {{
        at[1]++;
    }}
    if (at[1] == {w.span} && at[2] > 0) {{
        at[2]--;
    }} else if (at[1] == {w.span}) {{
        const {self.t[a]} *rows[{w.taps}];
        int32_t j, n_real = 0;
        for (j = 0; j < {w.taps}; j++) {{
            const int32_t row = (at[0] + j * {w.dilation}) % {w.span};
            const int32_t is_real = {real};
            rows[j] = is_real ? s->{k}_ring + row * {C} : NULL;
            n_real += is_real;
        }}
        {n.f}(rows, n_real, s->e{e});
        at[2] = {w.stride - 1};
        at[3] = at[3] + {w.stride} > {left} ? {left} : at[3] + {w.stride};
        fresh[{e}] = 1;
        s->valid[{e}] = 1;
{self.count(e)}    }}
}}
"""

    def count(self, e: int) -> str:
        """Output k's frame count (NAME_framesK) where edge e is output k = 1, 2, ...: the line that
        counts its new frame."""
        return f"        s->frames{self.extra.index(e) + 1}++;\n" if e in self.extra else ""

    def step(self) -> str:
        """NAME_step, NAME_flush, NAME_finish and what they share: the ring pushes and the nodes run
        from one of them on."""
        if self.refusal:
            return ""
        p, P = self.p, self.P
        pushes = "".join(self.push(i, n) for i, n in enumerate(self.nodes) if n.cn.kind == "window")
        body = "".join(self.step_node(i, n) for i, n in enumerate(self.nodes))
        pads = [(i, n, self.plan.pads[i][0][1]) for i, n in enumerate(self.nodes)
                if n.cn.kind == "window" and self.plan.pads[i][0][1]]
        ends, first = [], 0  # NAME_flush: each right padding, in graph order, one row a call
        for i, n, rows in pads:
            branch = "if" if not ends else "} else if"
            ends.append(f"""    {branch} (r < {first + rows}) {{ /* {comment(n.name)}: its right padding */
        {p}_push_{i}(s, {n.f}_zp_row, fresh);
        {p}_run_nodes(s, fresh, {self.in_args("NULL")}, {i + 1});
""")
            first += rows
        flush = ("".join(ends) + "    } else {\n        return -1;\n    }\n") if ends else \
            "    (void)s;\n    (void)y_q;\n    (void)fresh;\n    (void)r;\n    return -1;\n"
        tail = f"""    s->flushed++;
    if (!fresh[{self.out}]) {{
        return 0;
    }}
    memcpy(y_q, s->e{self.out}, sizeof(s->e{self.out}));
    return 1;
""" if ends else ""
        return f"""{pushes}
/* every node from `from` on whose inputs have a new frame (`fresh`) */
static void {p}_run_nodes({p}_state_t *s, int32_t *fresh, {self.in_params()}, int32_t from)
{{
{body}}}

int {p}_step({p}_state_t *s, {self.in_params()}, {p}_out_t *y_q)
{{
    int32_t fresh[{P}_NUM_EDGES] = {{{", ".join(["1"] * self.n_in)}}}; /* the edges with a new frame in this step */
    {p}_run_nodes(s, fresh, {self.in_args()}, 0);
    if (!fresh[{self.out}]) {{
        return 0;
    }}
    memcpy(y_q, s->e{self.out}, sizeof(s->e{self.out}));
    return 1;
}}

int {p}_flush({p}_state_t *s, {p}_out_t *y_q)
{{
    int32_t fresh[{P}_NUM_EDGES] = {{0}}, r = {"s->flushed" if ends else "0"};
{flush}{tail}}}

int32_t {p}_finish({p}_state_t *s, {p}_out_t *y_q)
{{
    int32_t frames = 0;
    int r;
    while ((r = {p}_flush(s, y_q + frames * {P}_OUTPUT_SIZE)) >= 0) {{
        frames += r;
    }}
    return frames;
}}
"""

    def input_shift_comment(self, j: int = 0) -> str:
        """A grid per channel of input j: its shifts as an initializer macro (for a fixed-point front
        end with QGRU_NO_FLOAT too) and what they mean."""
        shifts = self.qg.graph.input_shifts.get(self.edges[j])
        if not shifts:
            return ""
        k = suffix(j)
        return (f"\n/* a grid per input channel: channel c's is 2^-(INPUT{k}_EXP2_INV + INPUT{k}_SHIFTS[c]); "
                f"{self.p}_quantize_input{k}\n * takes whole frames (x[0] is channel 0) */\n"
                f"#define {self.P}_INPUT{k}_SHIFTS {{{', '.join(map(str, shifts))}}}")

    def floats(self) -> str:
        p, shifts = self.p, self.qg.graph.input_shifts
        wrappers = float_wrappers(p, f"{p}_in_t", f"{p}_out_t", self.grid[0], self.grid[self.out],
                                  shifts.get(self.edges[0], ()))
        wrappers += "".join("\n" + quantize_c(f"{p}_quantize_input{j}", self.in_t(j), f"{self.P}_INPUT{j}_ZP",
                                               self.grid[j], shifts.get(self.edges[j], ()), f"{p}_input{j}_scale")
                            for j in range(1, self.n_in))
        return f"#ifndef QGRU_NO_FLOAT\n{wrappers}{self.tail_code() if self.tail else ''}#endif\n"

    def tail_code(self) -> str:
        C = self.width[self.out]
        steps = []
        for node in self.tail:
            if node.op == "softmax":
                steps.append(f"""        {{ /* {comment(node.label)} */
            float m = v[0], sum = 0.0f;
            for (c = 1; c < {C}; c++) {{
                m = v[c] > m ? v[c] : m;
            }}
            for (c = 0; c < {C}; c++) {{
                v[c] = expf(v[c] - m);
                sum += v[c];
            }}
            for (c = 0; c < {C}; c++) {{
                v[c] /= sum;
            }}
        }}""")
            else:
                eps = float(node.attrs.get("epsilon", 1e-12))
                steps.append(f"""        {{ /* {comment(node.label)} */
            float sum = 0.0f, norm;
            for (c = 0; c < {C}; c++) {{
                sum += v[c] * v[c];
            }}
            norm = sqrtf(sum);
            norm = norm > {eps!r}f ? norm : {eps!r}f;
            for (c = 0; c < {C}; c++) {{
                v[c] /= norm;
            }}
        }}""")
        return f"""
void {self.p}_output_tail(float *y, int32_t frames)
{{
    int32_t t, c;
    for (t = 0; t < frames; t++) {{
        float *v = y + t * {C};
{chr(10).join(steps)}
    }}
}}
"""

    def argmax(self) -> str:
        if self.seq[self.out] or self.width[self.out] < 2:
            return ""
        return f"""
int32_t {self.p}_argmax(const {self.p}_out_t *y_q)
{{
    int32_t c, best = 0;
    for (c = 1; c < {self.width[self.out]}; c++) {{
        best = y_q[c] > y_q[best] ? c : best;
    }}
    return best;
}}
"""

    def source(self) -> str:
        p = self.p
        funcs = "\n".join(n.cn.code for n in self.nodes if n.cn.code)
        return f"""/* {p}: generated by qtool {__version__}. Do not edit. */
#include <string.h>
{"#include <math.h>" + chr(10) if self.tail else ""}
#include "{p}.h"
#include "{p}_params.h"

/* The layers, one function each: one output frame (the integer semantics of qtool/layers). */
{funcs}
{self.reset()}
{self.floats()}
{self.layout_code()}

int32_t {p}_sequence_work(int32_t T)
{{
    int32_t steps[{self.P}_LAYOUT_SIZE], offset[{self.P}_LAYOUT_SIZE];
    return {p}_edge_layout(T, steps, offset);
}}

{self.gru_frames()}{self.run_sequence()}
{self.step()}{self.argmax()}{self.extra_source()}"""

    def footprint(self, tables) -> GraphFootprint:
        bounds = self.steps_bounds()
        fp = GraphFootprint(streaming=not self.refusal, streaming_refusal=self.refusal,
                            strided=any(b is not None and b[0] != 1 for b in bounds))
        for n in self.nodes:
            e, a = n.out, n.ins[0]
            state = self.width[e] * SIZES[self.t[e]]
            if n.gru is not None:
                flash = n.gru.footprint.flash_bytes
                along, F, _ = n.dual
                state += (n.gru.footprint.ram_bytes * (F if along == "time" else 1)
                          + n.qm.model.output_size * SIZES[act_type(n.qm)])
                state += self.freq_work(n) * SIZES[act_type(n.qm)] if along == "freq" else 0
            else:
                flash = layer_flash(n.cn, self.width[a], self.t[a])
                if n.cn.kind == "window":
                    state += n.cn.window.span * self.width[a] * SIZES[self.t[a]] + 16
                if n.cn.kind == "reduce":
                    state += self.width[a] * SIZES[n.cn.acc_t] + 4
            state += 4  # its output edge's `valid` flag
            fp.layers.append(LayerFootprint(n.name, n.op, int(flash), int(state), *self._macs(n, bounds)))
        return fp

    def _macs(self, n: _Node, bounds: list) -> tuple[float, int]:
        """(per input frame, per sequence): a layer writing a sequence runs at its output's rate, one
        reducing a sequence to a vector at its input's, a layer on vectors once per sequence."""
        rate = bounds[n.out] or bounds[n.ins[0]]
        if rate is None:
            return 0, int(n.cn.macs)
        macs = float(n.cn.macs * rate[0])
        return (int(macs) if macs.is_integer() else macs), 0
