"""The commands' whole-model side: `import`, `calibrate`, `simulate` and `inspect` given a whole
model (a Keras or ONNX file with layers around its GRU, or qtool's whole-model files)."""

from __future__ import annotations

import time
from pathlib import Path

from rich import box
from rich.markup import escape
from rich.table import Table

from qtool.cli.console import Bar, as_flags, emit_json, out, warn, wrote


def _fmt(v, spec: str) -> str:
    return "-" if v is None else format(v, spec)


def qgraph_table(rows: list[dict], title: str, measured: bool) -> Table:
    """A row per edge the integer core writes: layer, op, and its grid (bits, exp2_inv, zp) with
    its shape and how it was set, or measured: its bits, SNR, cosine, share saturated. Fits 80
    columns (long layer names fold, no number does)."""
    from qtool.cli.tables import shape_text

    # no vertical rules: seven columns and a layer's name fit 80 columns (a pipe, a CI log)
    t = Table(title=title, box=box.SIMPLE_HEAD, collapse_padding=True, pad_edge=False)
    t.add_column("layer", overflow="fold", min_width=12, max_width=20)
    t.add_column("op", no_wrap=True)
    # measured: the grid is inspect's (and --json's); 80 columns keep a name whole or in two lines
    cols = ("bits", "SNR dB", "cosine", "sat %") if measured else ("shape", "bits", "exp2_inv", "zp", "set by")
    for col in cols:  # numbers and shapes never fold across lines (a pipe or a CI log gets 80 columns)
        t.add_column(col, justify="left" if col in ("shape", "set by") else "right", overflow="fold",
                     no_wrap=col != "set by", max_width=14 if col == "set by" else None)
    for r in rows:
        if measured:
            snr = "exact" if r["exact"] else _fmt(r["snr_db"], ".1f")
            cells = [str(r["bits"]), snr, f"{r['cosine']:.5f}", f"{100 * r['saturated']:.2f}"]
        else:
            e = str(r["exp2_inv"]) + ("+k" if r.get("channel_shifts") else "")  # per channel: + its shift
            cells = [shape_text(r), str(r["bits"]), e, str(r["zp"]), r["method"].replace("'s calibration", "")]
        t.add_row(r["layer"], r["op"], *cells)
    return t


def both_table(rows: list[dict], fq: dict, title: str) -> Table:
    """Mode both: a row per edge, the integer model's and the fake-quant model's SNR against
    float, and the share of integers the two agree on."""
    t = Table(title=title)
    t.add_column("layer", overflow="fold", max_width=24)
    t.add_column("op", no_wrap=True)
    for col in ("integer SNR", "fake-quant SNR", "same integers"):
        t.add_column(col, justify="right")
    for r in rows:
        f = fq["edges"][r["edge"]]
        snr = ("exact" if r["exact"] else _fmt(r["snr_db"], ".1f"), "exact" if f["exact"] else _fmt(f["snr_db"], ".1f"))
        t.add_row(r["layer"], r["op"], *snr, f"{100 * fq['same_integers'][r['edge']]:.2f}%")
    return t


def passes_lines(qg) -> list[str]:
    return [f"pass {name}: {what}" for name, what in qg.passes]


def check_line(g, path: Path) -> None:
    """What the import of `path` was checked against; for qtool's own file, the check stored in
    it, run when the model was first imported (not again now)."""
    from qtool import api

    stored = api.model_file_format(path) in ("qtool-graph", "qtool-qgraph")
    out.print(("as stored in the file, from its first import: " if stored else "")
              + escape(as_flags(api.describe_check(g.check_result))), highlight=False)


def show_graph(g, path: Path) -> None:
    """The float graph, a row a layer, and what its import was checked against (for qtool's own
    file: the check stored in it, run when the model was first imported)."""
    from qtool.cli.tables import graph_table

    out.print(graph_table(g, f"{g.name} ({g.source}): {len(g.nodes)} layer{'s' * (len(g.nodes) != 1)}"))
    check_line(g, path)
    for note in g.notes:
        out.print(f"note: {escape(note)}", highlight=False)
    if g.ranges is not None:
        out.print(f"{len(g.ranges.edges)} edge(s) carry the {g.ranges.kind} file's grids; `qtool calibrate` takes "
                  "them (--snap), except where an op only moves values (its output keeps its input's grid)",
                  highlight=False)
        for note in g.ranges.notes:
            out.print(f"note: {escape(note)}", highlight=False)


def graph_summary(g) -> dict:
    """A float whole model for --json: every layer, its check, its notes."""
    from qtool.cli.tables import graph_rows

    return {"name": g.name, "source": g.source, "inputs": {k: list(v) for k, v in g.inputs.items()},
            "outputs": g.outputs, "layers": graph_rows(g), "check": g.check_result, "notes": g.notes,
            "ranges": g.ranges.to_json() if g.ranges is not None else None}


def show_graph_file(g, path: Path, as_json: bool) -> None:
    """What `qtool inspect` shows of a float whole model: every layer, its check, its notes."""
    if as_json:
        emit_json(graph_summary(g))
        return
    show_graph(g, path)


def calibrate_graph(model_path: Path, data_path: Path, output: Path, *, bits: str, method: str,
                    method_weights: str, percentile: float, batch_size: int, limit, dataset, time_first: bool,
                    check: bool, snap: str, force: bool, as_json: bool, verbose: bool = False) -> None:
    from qtool import api
    from qtool.cli.tables import lut_table, ranges_table, spec_table

    t0 = time.perf_counter()
    with Bar("calibrating", 1) as bar:
        qg = api.calibrate(model_path, data_path, bits=bits, method=method, method_weights=method_weights,
                           percentile=percentile, batch_size=batch_size, limit=limit, dataset=dataset,
                           time_first=time_first,
                           check=check, snap=snap, progress=bar.update)
    warn(qg.info.get("notes", []))
    g = qg.graph
    api.save(qg, output, force, inputs=[model_path, data_path])
    elapsed = time.perf_counter() - t0
    rows = api.qgraph_rows(qg)
    if as_json:
        emit_json({"output": str(output), "seconds": elapsed, "passes": dict(qg.passes), "edges": rows,
                   "check": g.check_result, **{k: v for k, v in qg.info.items() if k != "edge_methods"}})
        return
    info = qg.info
    if g.check_result is not None:
        check_line(g, model_path)
    weights = f", weights {method_weights}" if method_weights != "minmax" else ""
    out.print(qgraph_table(rows, f"{g.name}: {info['bits']}, {method}{weights}, {info['samples']} sequences", False))
    for name in qg.grus if verbose else []:  # each GRU's tensors and tables, as a GRU alone's --verbose
        out.print(spec_table(qg.qparams[name]["qm"], f"{escape(name)}: its tensors"))
        out.print(lut_table(qg.qparams[name]["qm"]))
    for line in passes_lines(qg):
        out.print(escape(line), highlight=False)
    if "imported" in info:
        imp = info["imported"]
        used = [r for r in imp["rows"] if r["used"]]
        out.print(ranges_table(used, f"grids from the {imp['kind']} file (snap {imp['snap']}; every other edge: "
                                     f"calibrated on {data_path.name})"))
        notes = imp["notes"] + [f"{r['source']} is not used: {r['why']}" for r in imp["rows"] if not r["used"]]
        for note in dict.fromkeys(notes):
            out.print(f"note: {escape(note)}", highlight=False)
    if "auto" in info:
        a = info["auto"]
        scores = ", ".join(f"{m} {v:.2f} dB" for m, v in a["output_snr_db"].items())
        on = f"the last {a['held_out']} sequences" if a["held_out"] else "the calibration data (too few to hold out)"
        out.print(f"auto: output SNR on {on}: {scores} -> {a['chosen']}")
    out.print(f"calibrated in {elapsed:.2f} s -> {escape(str(output))}")


def show_graph_simulation(sim, qg, data_path: Path, mode: str, save: Path | None, as_json: bool, t0: float) -> None:
    """What `qtool simulate` measured of a whole model: every edge, the outputs, a classifier's
    top-1 agreement (and with labels both accuracies)."""
    from qtool import api

    res = sim.to_dict()
    warn(sim.notes)
    if as_json:
        emit_json({**res, "edges": api.qgraph_rows(qg, sim), "seconds": time.perf_counter() - t0})
        return
    title = f"{mode} vs float on {sim.samples} sequences of {data_path.name}"
    if mode == "both":
        title = title.replace("both", "integer and fake-quant")
        out.print(both_table(api.qgraph_rows(qg, sim), res["fakequant"], title))
    else:
        out.print(qgraph_table(api.qgraph_rows(qg, sim), title, True))
    core = {e: res["edges"][e] for e in qg.core_outputs if e not in res["outputs"]}  # before a float tail
    if len(qg.core_outputs) > 1 and mode != "fakequant":  # the figure auto and advise measure
        m = sim.output
        snr = "exact" if m["exact"] else f"{m['snr_db']:.2f} dB"
        out.print(f"the integer core's {len(qg.core_outputs)} outputs together: SNR {snr}, cosine {m['cosine']:.6f}",
                  highlight=False)
    for who, outputs in (("", {**core, **res["outputs"]}),
                         ("fake-quant ", res.get("fakequant", {}).get("outputs", {}))):
        for edge, m in outputs.items():
            snr = "exact" if m["exact"] else f"{m['snr_db']:.2f} dB"
            what = (f"integer core's output {escape(edge)}" if edge in core else f"output {escape(edge)}"
                    + (" (after the float tail)" if core and edge not in qg.core_outputs else ""))
            out.print(f"{who}{what}: SNR {snr}, cosine {m['cosine']:.6f}, largest error "
                      f"{m['max_abs_error']:.4g}", highlight=False)
    model = "fake-quant" if mode == "fakequant" else "integer"
    for who, part in ((model, res), ("fake-quant", res.get("fakequant", {}))):
        if "top1_agreement" in part:
            frames = " of frames" if res.get("classified") == "frames" else ""
            line = f"{who} top-1 agreement with float: {100 * part['top1_agreement']:.2f}%{frames}"
            if "accuracy_quant" in part:
                line += (f"; accuracy: {who} {100 * part['accuracy_quant']:.2f}%, "
                         f"float {100 * res['accuracy_float']:.2f}%")
            out.print(line)
    where = (f"GRUs on CUDA ({escape(sim.backend_reason)}), the other layers on the CPU" if sim.backend == "cuda"
             else f"every layer on the CPU ({escape(sim.backend_reason)})")
    saved = f"; saved outputs -> {escape(str(save))}" if save else ""
    out.print(f"{where}; {time.perf_counter() - t0:.2f} s{saved}")


def show_qgraph(qg, as_json: bool) -> None:
    """What `qtool inspect` shows of a quantized whole model: every edge's grid, each GRU's
    tensors, the passes."""
    from qtool import api
    from qtool.cli.tables import provenance_table, spec_rows, spec_table

    rows = api.qgraph_rows(qg)
    grus = {n: qg.qparams[n]["qm"] for n in qg.grus}
    if as_json:
        emit_json({"name": qg.graph.name, "source": qg.graph.source, "fingerprint": qg.fingerprint(),
                   "core": qg.core, "tail": qg.tail,
                   "passes": dict(qg.passes), "edges": rows, "quant": qg.info,
                   "gru_tensors": {n: spec_rows(qm) for n, qm in grus.items()}})
        return
    info = qg.info
    weights = f", weights {info['method_weights']}" if "method_weights" in info else ""
    out.print(qgraph_table(rows, f"{qg.graph.name}: {info.get('bits')}, {info.get('method')}{weights}, "
                                 f"{info.get('samples')} sequences of {info.get('data_file')}", False))
    for name, qm in grus.items():  # each GRU's own tensors, as `inspect` shows a GRU alone
        out.print(spec_table(qm, f"{escape(name)}: its tensors"))
    for line in passes_lines(qg):
        out.print(escape(line), highlight=False)
    if qg.tail:
        out.print(f"float tail (after the dequantize): {', '.join(qg.tail)}")
    out.print(provenance_table(qg))


def show_graph_export(res, qg, output: Path, name: str | None, as_json: bool) -> None:
    """What `qtool export c` wrote of a quantized whole model: the files, and per layer its flash,
    the RAM NAME_step keeps and its multiply-accumulates per frame."""
    fp = res.footprint
    state = {} if fp.streaming else {"state_bytes": None}  # RAM NAME_step keeps: only a model that streams has one
    summary = {"directory": str(output), "name": res.name, "files": res.files, "replaced": res.replaced,
               "edited": res.edited, "removed": res.removed, "fingerprint": res.fingerprint,
               "flash_bytes": fp.flash_bytes,
               "ram_bytes": fp.ram_bytes if fp.streaming else None, "macs_per_step": fp.macs_per_step,
               "macs_per_sequence": fp.macs_per_sequence,
               "streaming": fp.streaming, "streaming_refusal": fp.streaming_refusal,
               "layers": [{**vars(x), **state} for x in fp.layers],
               "inputs": list(qg.graph.inputs), "outputs": qg.core_outputs,
               "sequence_work": dict(zip(("steps", "bytes"), fp.work_at)), "notes": res.notes}
    if as_json:
        emit_json(summary)
        wrote(res, output, as_json, name)
        return
    t = Table(title=f"{res.name}: footprint by layer")
    t.add_column("layer", overflow="fold", max_width=24)
    t.add_column("op", no_wrap=True)
    ram = fp.streaming  # the RAM NAME_step keeps: only a model that streams has one
    once = fp.macs_per_sequence  # layers on a vector: a column of their own, once per sequence
    for col in ("flash B", *(("RAM B",) if ram else ()), "MACs/frame", *(("MACs/seq",) if once else ())):
        t.add_column(col, justify="right", no_wrap=True)

    def macs(x) -> tuple[str, ...]:  # a layer's footprint, or the model's (its total)
        frame, seq = getattr(x, "macs_per_frame", None), x.macs_per_sequence
        frame = x.macs_per_step if frame is None else frame
        return (f"{frame:,.1f}" if frame % 1 else f"{frame:,.0f}", *((f"{seq:,}",) if once else ()))
    for x in fp.layers:
        op = qg.node(x.name).attrs.get("kind") or x.op  # an activation by its kind, as the other tables
        t.add_row(escape(x.name), op, f"{x.flash_bytes:,}", *((f"{x.state_bytes:,}",) if ram else ()), *macs(x))
    t.add_row("total", "", f"{fp.flash_bytes:,}", *((f"{fp.ram_bytes:,}",) if ram else ()), *macs(fp), style="bold")
    out.print(t)
    out.print("MACs/frame: per frame of the input" + (", each layer at its own rate (after a stride or a pool "
              "of 2, every other frame)" if fp.strided else "") +
              ("; MACs/seq: the layers on a vector, once per sequence" if once else ""))
    work = (f" at {fp.work_at[0]} steps (the calibration's) {fp.work_at[1]:,} B;" if fp.work_at else "")
    out.print(f"{res.name}_run_sequence runs whole sequences in a work buffer of {res.name}_sequence_work(T) bytes"
              f"{work} {res.name.upper()}_SEQUENCE_WORK_MAX(T) is a constant at least that, for static allocation; "
              + (f"{res.name}_step runs one frame at a time (RAM above: what it keeps)" if fp.streaming
                 else f"no {res.name}_step: {escape(fp.streaming_refusal)}"))
    if len(qg.graph.inputs) > 1:
        given = ", ".join(f"{escape(e)} (x{j or ''}_q [T][{res.name.upper()}_INPUT{j or ''}_SIZE], "
                          f"{res.name}_quantize_input{j or ''})" for j, e in enumerate(qg.graph.inputs))
        out.print(f"inputs: {given}")
    if len(qg.core_outputs) > 1:
        extra = ", ".join(f"{escape(e)} ({res.name}_output{k})" for k, e in enumerate(qg.core_outputs[1:], 1))
        out.print(f"outputs: {escape(qg.core_outputs[0])} ({res.name}_run_sequence's y_q), {extra}")
    wrote(res, output, name=name)
