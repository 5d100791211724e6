"""Rich tables for results and file contents; the same data goes to `--json`."""

from __future__ import annotations

import math

import numpy as np
from rich.markup import escape
from rich.table import Table

from qtool.api import DIRECTIONS, QuantModel, cell_params, cell_tensors, op_text, steps_text


def _num(v: float | None, fmt: str = "{:.2f}") -> str:
    if v is None:
        return "-"
    if isinstance(v, float) and math.isinf(v):
        return "inf" if v > 0 else "-inf"
    return fmt.format(v)


def _span(v) -> str:
    a = np.asarray(v)
    if a.ndim == 0:
        return f"{float(a):.4g}"
    return f"{float(a.min()):.4g}..{float(a.max()):.4g}"


def _snr(m: dict) -> str:
    return "exact" if m.get("exact") else _num(m["snr_db"])


def _distance_cells(m: dict) -> tuple[str, ...]:
    return (_snr(m), _num(m["cosine"], "{:.6f}"), _num(m["max_abs_error"], "{:.3g}"),
            f"{100 * m['saturated']:.2f}%")


def _metric_table(title: str, first: str) -> Table:
    t = Table(title=title)
    for col in (first, "SNR dB", "cosine", "max |err|", "saturated"):
        t.add_column(col, justify="left" if col == first else "right")
    return t


def compare_table(rows: list[dict], best: int, title: str) -> Table:
    """One row per calibration method, scored at the output on held-out data."""
    t = _metric_table(title, "method")
    top1 = all("top1_agreement" in m for m in rows)  # a classifier's: how often its class is float's
    if top1:
        t.add_column("top-1", justify="right")
    for i, m in enumerate(rows):
        t.add_row(m["method"] + (" (best)" if i == best else ""), *_distance_cells(m),
                  *([f"{100 * m['top1_agreement']:.2f}%"] if top1 else []), style="bold" if i == best else None)
    return t


SUMMARY_WORST = 5  # tensors shown beside the output and each layer's h


def _snr_key(m: dict) -> float:
    return math.inf if m.get("exact") else (m["snr_db"] if m["snr_db"] is not None else -math.inf)


def distance_table(results: dict, title: str, everything: bool = True) -> Table:
    """The output, then every tensor (`everything`) or a summary: each layer's h and the few
    tensors with the lowest SNR."""
    t = _metric_table(title, "tensor")
    tensors = results["tensors"]
    if everything:
        rows = list(tensors.items())
    else:
        h = [k for k in tensors if k.endswith(".h")]
        worst = sorted((k for k in tensors if k not in h), key=lambda k: _snr_key(tensors[k]))[:SUMMARY_WORST]
        rows = [(k, tensors[k]) for k in h] + [(f"{k} (low)", tensors[k]) for k in worst]
    t.add_row("output", *_distance_cells(results["output"]), style="bold")
    for name, m in rows:
        t.add_row(name, *_distance_cells(m))
    if not everything and len(tensors) > len(rows):
        t.caption = (f"{len(rows)} of {len(tensors)} tensors: each layer's h and the {SUMMARY_WORST} "
                     "lowest SNRs (--tensors all: every one)")
    t.caption_justify = "left"
    return t


def both_table(results: dict, title: str) -> Table:
    """`simulate --mode both`: integer and fake-quant distances from float side by side per tensor,
    and how many integers the two GRUs share."""
    fq = results["fakequant"]
    agree = fq.get("agreement", {})
    t = Table(title=title)
    rows = [("output", results["output"], fq["output"])]
    rows += [(k, m, fq["tensors"][k]) for k, m in results["tensors"].items() if k in fq["tensors"]]
    # the names must stay whole at 80 columns; the numbers' headers wrap instead
    t.add_column("tensor", no_wrap=True, min_width=max(len(r[0]) for r in rows))
    for col in ("integer SNR dB", "fake quant SNR dB", "gap dB", "same integers", "max diff LSB"):
        t.add_column(col, justify="right")
    for name, mi, mf in rows:
        a = agree.get(name)
        both = mi["snr_db"] is not None and mf["snr_db"] is not None
        gap = f"{mi['snr_db'] - mf['snr_db']:+.2f}" if both else "-"
        t.add_row(name, _snr(mi), _snr(mf), gap,
                  f"{100 * a['identical']:.2f}%" if a else "-", str(a["max_lsb"]) if a else "-",
                  style="bold" if name == "output" else None)
    return t


def ranges_table(rows: list[dict], title: str) -> Table:
    """The ranges a quantized model file held: where each came from, qtool's power-of-two grid for
    it, and how far the step moved (dB of expected noise; + is coarser)."""
    edges = bool(rows) and "edge" in rows[0]  # a whole model's: by edge
    t = Table(title=title)
    for col in ("edge",) if edges else ("layer", "tensor"):
        t.add_column(col)
    for col in ("from", "bits", "exp2_inv", "zp", "moved dB", "clips"):
        t.add_column(col, justify="left" if col == "from" else "right")
    for r in rows:
        moved = "-" if r["moved_db"] is None else f"{r['moved_db']:+.2f}"
        where = [r["edge"]] if edges else [f"{r['layer']}.{r['direction']}", r["tensor"]]
        t.add_row(*where, r["source"], str(r["bits"]), _span(r["exp2_inv"]), str(r["zp"]), moved,
                  "yes" if r["clips"] else "no")
    return t


def passes_table(rep: dict, title: str) -> Table:
    """What each pass of qtool.numerics.passes removed from the realized program; the partition below."""
    part = rep["partition"]
    caption = (f"partition_conversions: prefix {', '.join(part['prefix'])}; core of {part['core_operations']} "
               f"operations, {'fully integral' if part['core_fully_integral'] else 'NOT integral'}; "
               f"suffix {', '.join(part['suffix'])}")
    t = Table(title=title, caption=caption)
    for col in ("pass", "removed", "per step", "once", "kinds"):
        t.add_column(col, justify="left" if col in ("pass", "kinds") else "right")
    for name, r in rep["passes"].items():
        kinds = sorted({w.split(": ", 1)[1].split(" ", 1)[0] for w in r["what"]})
        t.add_row(name, str(r["operations"]), f"{r['per_step_elements']:,}", f"{r['once_elements']:,}",
                  ", ".join(kinds) or "-")
    return t


def spec_rows(qm: QuantModel) -> list[dict]:
    rows = []
    for l, cells in enumerate(qm.cells):
        for d, cq in enumerate(cells):
            for td in cell_tensors(cq.form):
                s = cq.spec[td.name]
                rows.append({
                    "layer": l, "direction": DIRECTIONS[d], "tensor": td.name, "bits": s.bits,
                    "symmetric": s.symmetric, "per_channel": td.per_channel,
                    "exp2_inv": np.asarray(s.exp2_inv).tolist(), "zp": s.zp,
                    "range": [np.asarray(s.lo).min().item(), np.asarray(s.hi).max().item()],
                })
    return rows


def spec_table(qm: QuantModel, title: str) -> Table:
    """A row per tensor of every layer direction: its grid and range (also a whole model's GRUs,
    one table each). At 80 columns the names stay whole and a long range folds."""
    t = Table(title=title)
    for col in ("layer", "tensor", "bits", "sym", "exp2_inv", "zp", "range"):
        t.add_column(col, justify="left" if col in ("layer", "tensor") else "right",
                     no_wrap=col in ("layer", "tensor"), overflow="fold")
    for l, cells in enumerate(qm.cells):
        for d, cq in enumerate(cells):
            for td in cell_tensors(cq.form):
                s = cq.spec[td.name]
                lo, hi = np.asarray(s.lo), np.asarray(s.hi)
                rng = (f"[{float(lo.min()):.4g}, {float(hi.max()):.4g}]")
                t.add_row(f"{l}.{DIRECTIONS[d]}", td.name, str(s.bits), "y" if s.symmetric else "n",
                          _span(s.exp2_inv), str(s.zp), rng)
    return t


def lut_table(qm: QuantModel) -> Table:
    t = Table(title="activation tables")
    for col in ("layer", "table", "entries", "interpolation shift", "max error (LSB)"):
        t.add_column(col, justify="left" if col in ("layer", "table") else "right")
    for l, cells in enumerate(qm.cells):
        for d, cq in enumerate(cells):
            for name, shift_idx in (("lut_z", "z"), ("lut_r", "r"), ("lut_g", "g")):
                shift = int(cq.P[cell_params(cq.form).index(f"lut_shift_{shift_idx}")])
                t.add_row(f"{l}.{DIRECTIONS[d]}", name, str(len(cq.luts[name])), str(shift),
                          f"{cq.lut_error[name]:g}")
    return t


def auto_lines(auto: dict, per_layer: bool = True) -> list[str]:
    """What `--method auto` chose: the winner and each candidate's output SNR on the held-out
    sequences, a note if any, then (`per_layer`) each layer's methods."""
    snr = auto["held_out_snr_db"]
    lines = [f"method auto: {auto['winner']}" + (
        f" (held-out output SNR {_num(snr.get(auto['winner']))} dB; "
        + ", ".join(f"{k} {_num(v)}" for k, v in snr.items() if k != auto["winner"]) + ")" if snr else "")]
    if auto.get("note"):
        lines.append(f"  {auto['note']}")
    by_layer: dict[int, list[str]] = {}
    for r in auto["tensors"] if per_layer else []:
        by_layer.setdefault(r["layer"], []).append(f"{r['tensor']} {r['method']}")
    lines += [f"  layer {l}: " + ", ".join(v) for l, v in sorted(by_layer.items())]
    return lines


def _step(exp2_inv) -> str:
    """A grid's step 2^-exp2_inv as written: 2^-3, or 2^1 for a negative exp2_inv (not 2^--1)."""
    e = int(exp2_inv)
    return f"2^-{e}" if e >= 0 else f"2^{-e}"


def calibration_summary(qm: QuantModel, title: str) -> Table:
    """One row per layer direction: the grids of its input and state, and its tables' error."""
    t = Table(title=title)
    for col in ("layer", "x grid", "h grid", "h range", "LUT max error (LSB)"):  # a row fits 80 columns
        t.add_column(col, justify="left" if col == "layer" else "right", no_wrap=col != "LUT max error (LSB)")
    for l, cells in enumerate(qm.cells):
        for d, cq in enumerate(cells):
            x, h = cq.spec["x"], cq.spec["h"]
            t.add_row(f"{l}.{DIRECTIONS[d]}", f"int{x.bits} {_step(x.exp2_inv)} zp {x.zp}",
                      f"int{h.bits} {_step(h.exp2_inv)} zp {h.zp}", f"[{float(h.lo):.3g}, {float(h.hi):.3g}]",
                      f"{max(cq.lut_error.values()):g}")
    return t


def layer_rows(model) -> list[dict]:
    return [{"layer": l, "direction": DIRECTIONS[d], "W": list(c.W.shape), "R": list(c.R.shape),
             "bx": list(c.bx.shape), "br": list(c.br.shape), "cell": c.form.describe()}
            for l, cells in enumerate(model.layers) for d, c in enumerate(cells)]


def graph_rows(graph) -> list[dict]:
    """A row a layer; `reads` names the layers (or graph inputs) whose outputs it reads; `steps`
    its output's steps against the input's T (None: a vector)."""
    writer = {e: n.name for n in graph.nodes for e in n.outputs}
    steps = steps_text(graph)
    return [{"layer": n.name, "op": n.op, "kind": n.attrs.get("kind") or op_text(n), "source": n.source,
             "inputs": list(n.inputs),
             "reads": [writer.get(e, e) for e in n.inputs],
             "shape": list(graph.shapes[n.outputs[0]]) if n.outputs else [],
             "steps": steps.get(n.outputs[0]) if n.outputs else None}
            for n in graph.nodes]


def shape_text(row: dict) -> str:
    """`[T/2, 32]` for a sequence (its steps against the input's T), `[12]` for a vector."""
    return "[" + ", ".join(row.get("steps") or "T" if d is None else str(d) for d in row["shape"]) + "]"


def graph_table(graph, title: str) -> Table:
    """The whole model, a row a layer: its op, what it reads, its output's shape (`T` for any
    number of steps)."""
    t = Table(title=title)
    for col in ("layer", "op", "reads", "output"):  # the framework's class names: --json
        # an activation shows its kind (relu, sigmoid, ...); a shape never folds across lines
        t.add_column(col, justify="left", overflow="fold", no_wrap=col == "output")
    for r in graph_rows(graph):
        t.add_row(r["layer"], r["kind"] or r["op"], ", ".join(r["reads"]), shape_text(r))
    return t


def shapes_table(model, title: str) -> Table:
    t = Table(title=title)
    rows = layer_rows(model)
    forms = any(r["cell"] != "the haste form" for r in rows)  # a column only where a cell differs
    for col in ("layer", "W", "R", "bx", "br", "hidden", *(("cell",) if forms else ())):
        t.add_column(col, justify="left" if col in ("layer", "cell") else "right", overflow="fold")
    for r in rows:
        t.add_row(f"{r['layer']}.{r['direction']}", *("x".join(map(str, r[k])) for k in ("W", "R", "bx", "br")),
                  str(r["R"][1]), *((r["cell"],) if forms else ()))
    return t


def provenance_table(qm) -> Table:
    """Where a quantized model (a GRU alone or a whole model) came from: its fingerprint and
    every plain fact of its info (the tables in it have tables of their own)."""
    t = Table(title="provenance", show_header=False)
    t.add_column("key", style="bold")
    t.add_column("value", overflow="fold")
    t.add_row("fingerprint", qm.fingerprint())
    for k, v in qm.info.items():
        # a loaded file's info holds its fingerprint too
        if k not in ("bits_config", "fingerprint") and not isinstance(v, (dict, list)):
            t.add_row(k, str(v))
    return t


def footprint_table(summary: dict, title: str) -> Table:
    t = Table(title=title)
    t.add_column("what")
    t.add_column("bytes", justify="right")
    for k in ("weight_bytes", "bias_bytes", "table_bytes", "other_bytes", "flash_bytes", "ram_bytes"):
        t.add_row(k.replace("_bytes", "").replace("other", "shifts, compensation, params"), f"{summary[k]:,}")
    return t


def verify_lines(res) -> list[str]:
    """What `qtool verify` compared, part by part (a GRU alone's outputs and states; a whole
    model's edges, run whole and frame by frame), and the dequantized outputs."""
    head = f"{res.target}: {res.sequences} sequences x {res.time_steps} steps"
    if res.edges is None:
        return [f"{head}: {res.output_mismatches} mismatches in {res.output_values:,} output integers, "
                f"{res.state_mismatches} in {res.state_values:,} final-state integers, "
                f"{res.dequantized_mismatches} in the dequantized outputs"]
    bad = ", ".join(f"{escape(e)}: {n}" for e, n in res.edges.items() if n)
    lines = [f"{head}, whole: {res.edge_mismatches} mismatches in {res.edge_values:,} integers of "
             f"{len(res.edges)} edges" + (f" ({bad})" if bad else "")]
    lines.append(f"frame by frame ({res.name}_step): {res.stream_mismatches} mismatches in "
                 f"{res.stream_values:,} output integers" if res.streaming
                 else f"frame by frame: not exported ({res.name}_step: see {res.name}.h)")
    return [*lines, f"dequantized outputs: {res.dequantized_mismatches} mismatches"]
