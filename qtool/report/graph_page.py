"""The HTML report of a whole model: a picture of the graph with each edge's error (an SVG drawn
here, no plotting library), every edge's grid and distances, the passes, and the model's output
metrics; then per GRU node its own tensors as the report of a GRU alone shows them
(qtool.report.html: every tensor's grid, ranges and error, and with plotly their histograms).
One self-contained page."""

from __future__ import annotations

import html

from qtool.core.qgraph import QGraph
from qtool.errors import QtoolError
from qtool.report.data import ReportData
from qtool.version import __version__

BOX_W, BOX_H, GAP_X, GAP_Y = 190, 42, 40, 58


def _e(v) -> str:
    return html.escape(str(v))


def _colour(m: dict | None) -> str:
    """Green from 30 dB, amber from 20 dB, red below: the usual reading of an int8 tensor's SNR."""
    if m is None:
        return "#888"
    snr = None if m["exact"] else m["snr_db"]
    return "#2a7" if snr is None or snr >= 30 else "#d90" if snr >= 20 else "#c33"


def _label(m: dict | None) -> str:
    if m is None:
        return ""
    return "exact" if m["exact"] else f"{m['snr_db']:.1f} dB" if m["snr_db"] is not None else "-"


def layout(qg: QGraph) -> dict[str, tuple[int, int]]:
    """(column, row) of every node and input: its row the longest path from an input."""
    rows: dict[str, int] = {f"input:{e}": 0 for e in qg.graph.inputs}
    writer = {e: f"input:{e}" for e in qg.graph.inputs}
    for node in qg.graph.nodes:
        r = 1 + max((rows[writer[e]] for e in node.inputs if e in writer), default=0)
        rows[node.name] = r
        for e in node.outputs:
            writer[e] = node.name
    cols: dict[int, int] = {}
    place = {}
    for key, r in rows.items():
        place[key] = (cols.get(r, 0), r)
        cols[r] = cols.get(r, 0) + 1
    return place


def svg(qg: QGraph, edges: dict[str, dict], links: dict[str, str] | None = None) -> str:
    """The graph, top to bottom; each edge a line coloured and labelled by its SNR; a node in
    `links` (its name -> an id on the page) links there."""
    links = links or {}
    place = layout(qg)
    writer = {e: f"input:{e}" for e in qg.graph.inputs} | {e: n.name for n in qg.graph.nodes for e in n.outputs}

    def xy(key: str) -> tuple[int, int]:
        c, r = place[key]
        return 10 + c * (BOX_W + GAP_X), 10 + r * (BOX_H + GAP_Y)

    long = sum(place[n.name][1] - place[writer[e]][1] > 1 for n in qg.graph.nodes for e in n.inputs)
    width = 20 + max(c for c, _ in place.values()) * (BOX_W + GAP_X) + BOX_W + 12 * long + 70
    height = 20 + max(r for _, r in place.values()) * (BOX_H + GAP_Y) + BOX_H + GAP_Y
    parts, detour = [], 0
    for node in qg.graph.nodes:
        x1, y1 = xy(node.name)
        for e in node.inputs:
            x0, y0 = xy(writer[e])
            m = edges.get(e)
            style = f'fill="none" stroke="{_colour(m)}" stroke-width="3"'
            if place[node.name][1] - place[writer[e]][1] == 1:  # the next row: straight down
                a, b = (x0 + BOX_W // 2, y0 + BOX_H), (x1 + BOX_W // 2, y1)
                parts.append(f'<path d="M{a[0]},{a[1]} L{b[0]},{b[1]}" {style}><title>{_e(e)}</title></path>')
                at = ((a[0] + b[0]) // 2 + 6, (a[1] + b[1]) // 2 + 4)
            else:  # past the rows between: around their right side
                detour += 1
                side = max(x0, x1) + BOX_W + 12 * detour
                a, b = (x0 + BOX_W, y0 + BOX_H // 2), (x1 + BOX_W, y1 + BOX_H // 2)
                parts.append(f'<path d="M{a[0]},{a[1]} H{side} V{b[1]} H{b[0]}" {style}><title>{_e(e)}</title></path>')
                at = (side + 6, (a[1] + b[1]) // 2)
            parts.append(f'<text x="{at[0]}" y="{at[1]}" class="lbl">{_e(_label(m))}</text>')
    for e in qg.graph.outputs:  # each output: a short stub below its writer, with its error
        x, y = xy(writer[e])
        m = edges.get(e)
        parts.append(f'<path d="M{x + BOX_W // 2},{y + BOX_H} v{GAP_Y // 2}" stroke="{_colour(m)}" stroke-width="3"/>'
                     f'<text x="{x + BOX_W // 2 + 6}" y="{y + BOX_H + GAP_Y // 2}" class="lbl">{_e(e)} '
                     f'{_e(_label(m))}</text>')
    for key in place:
        x, y = xy(key)
        if key.startswith("input:"):
            title, sub, fill = key[6:], "input", "#eef"
        else:
            node = qg.node(key)
            title, sub = key, node.attrs.get("kind") or node.op
            fill = "#fff" if key in qg.core else "#f4f4f4"  # the float tail in grey
        box = (f'<rect x="{x}" y="{y}" width="{BOX_W}" height="{BOX_H}" rx="6" fill="{fill}" stroke="#555"/>'
               f'<text x="{x + 8}" y="{y + 17}" class="name">{_e(title[:26])}</text>'
               f'<text x="{x + 8}" y="{y + 34}" class="op">{_e(sub)}</text>')
        parts.append(f'<a href="#{links[key]}">{box}</a>' if key in links else box)
    return (f'<svg xmlns="http://www.w3.org/2000/svg" width="{width}" height="{height}" '
            f'viewBox="0 0 {width} {height}">{"".join(parts)}</svg>')


CSS = ("body{font-family:system-ui,sans-serif;margin:24px;color:#222}table{border-collapse:collapse;margin:12px 0}"
       "td,th{border:1px solid #ccc;padding:3px 8px;text-align:right}td:first-child,td:nth-child(2){text-align:left}"
       "svg .name{font:13px sans-serif}svg .op{font:12px sans-serif;fill:#555}svg .lbl{font:11px sans-serif}"
       ".note{color:#666}.wide{overflow-x:auto}.clip{color:#c92a2a;font-weight:600}")


def gru_anchor(i: int) -> str:
    """The id of the section of the core's `i`th GRU node (QGraph.grus)."""
    return f"gru{i}"


def gru_sections(qg: QGraph, grus: dict[str, ReportData]) -> tuple[list, bool]:
    """Per GRU node, what the report of that GRU alone shows of its tensors (qtool.report.html):
    the histograms of every layer direction when plotly is installed, and the table of every
    tensor. Returns the sections (qtool.report.html.page_body's) and whether they draw figures."""
    from qtool.report.html import INSTALL, _db, layer_sections, plotly_modules, tensor_table

    try:
        plotly_modules()
        figures = True
    except QtoolError:
        figures = False
    sections = []
    for i, (name, rd) in enumerate(grus.items()):
        qm, anchor = qg.qparams[name]["qm"], gru_anchor(i) + "-"
        node, m = qg.node(name), rd.results["output"]
        sections.append(
            f'<h2 id="{gru_anchor(i)}">GRU {_e(name)}: its tensors</h2><p class="note">This GRU alone, in '
            f"integers against float, on its own input: the float model's values at <code>{_e(node.inputs[0])}</code> "
            f"({rd.samples} sequences), the input it was calibrated on, so each tensor's error is its own and not "
            f"what the layers before it pass on (the edges above measure that). Its output: SNR {_e(_db(m))}, "
            f"cosine {m['cosine']:.6f}, saturated {100 * m['saturated']:.2f}%.</p>")
        if figures:
            sections += layer_sections(qm, rd, anchor, level=3)[0]
        else:
            sections.append(f'<p class="note">Histograms of the tensors need plotly: {_e(INSTALL)}</p>')
        sections.append(f'<div class="wide">{tensor_table(rd.tensors, anchor if figures else None)}</div>')
    return sections, figures and bool(grus)


def render(qg: QGraph, rows: list[dict], sim: dict, data_name: str,
           grus: dict[str, ReportData] | None = None) -> str:
    """The page: `rows` from qtool.api.qgraph_rows with the simulation, `sim` its to_dict(),
    `grus` per GRU node its report data on its own input (qtool.report.data.collect_graph)."""
    from qtool.report.html import page_body, plotly_modules

    grus = grus or {}
    sections, figures = gru_sections(qg, grus)
    gru_body, script = page_body(sections)
    plotly_js = f"<script>{plotly_modules()[2]()}</script>" if figures else ""
    script = f"<script>{script}</script>" if figures else ""
    links = {name: gru_anchor(i) for i, name in enumerate(grus)}
    edges = {**sim["outputs"], **{r["edge"]: r for r in rows}}
    head = ["layer", "op", "bits", "exp2_inv", "zp", "set by", "SNR", "cosine", "saturated"]
    body = "".join(
        "<tr>" + "".join(f"<td>{_e(v)}</td>" for v in (
            r["layer"], r["op"], r["bits"], r["exp2_inv"], r["zp"], r["method"], _label(r),
            f"{r['cosine']:.6f}", f"{100 * r['saturated']:.2f}%")) + "</tr>" for r in rows)
    outputs = "".join(f"<li>{_e(e)}: SNR {_e(_label(m))}, cosine {m['cosine']:.6f}, largest error "
                      f"{m['max_abs_error']:.4g}</li>" for e, m in sim["outputs"].items())
    if "top1_agreement" in sim:
        outputs += f"<li>top-1 agreement with float: {100 * sim['top1_agreement']:.2f}%</li>"
        if "accuracy_quant" in sim:
            outputs += (f"<li>accuracy: integer {100 * sim['accuracy_quant']:.2f}%, float "
                        f"{100 * sim['accuracy_float']:.2f}%</li>")
    passes = "".join(f"<li><b>{_e(n)}</b>: {_e(w)}</li>" for n, w in qg.passes)
    info = qg.info
    return (f'<!DOCTYPE html>\n<html lang="en"><head><meta charset="utf-8">'
            f'<meta name="generator" content="qtool {__version__}"><title>qtool report: {_e(qg.graph.name)}</title>'
            f"<style>{CSS}</style>{plotly_js}</head><body><h1>{_e(qg.graph.name)}</h1>"
            f"<p>{_e(info.get('bits'))}, calibrated ({_e(info.get('method'))}) on {_e(info.get('samples'))} sequences "
            f"of {_e(info.get('data_file'))}; measured on {sim['samples']} sequences of {_e(data_name)}.</p>"
            f"<h2>Output</h2><ul>{outputs}</ul><h2>The graph</h2><p class=note>Each edge: the integer model's "
            "SNR against float there (green from 30 dB, amber from 20, red below); grey boxes run in float after "
            f"the dequantize{'; a GRU links to its tensors, below' if links else ''}.</p>{svg(qg, edges, links)}"
            "<h2>Every edge</h2><table><tr>"
            + "".join(f"<th>{h}</th>" for h in head) + f"</tr>{body}</table><h2>Passes</h2><ul>{passes}</ul>"
            f'{gru_body}<p class="note">Written by qtool {__version__}.</p>{script}</body></html>\n')
