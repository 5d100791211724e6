"""`qtool report`: one self-contained HTML page (plotly.js embedded, opens without a server)
that shows what the quantization did: the model and its provenance, the output metrics of
`qtool simulate`, the output's error by time step, float vs integer output traces, and for every
tensor a histogram of its float values against its grid. The data comes from qtool.report.data;
this module only draws it."""

from __future__ import annotations

import html
import json
from collections.abc import Iterable

import numpy as np

from qtool.core.model import DIRECTIONS
from qtool.core.qmodel import QuantModel
from qtool.errors import QtoolError
from qtool.report.data import ChannelView, ReportData, TensorView
from qtool.version import __version__

INSTALL = 'pip install "qtool[report]"'
GRID_FILL, GRID_EDGE = "rgba(46, 160, 67, 0.13)", "rgba(46, 160, 67, 0.8)"
CAL_LINE, FLOAT_BAR = "#d9480f", "#1c7ed6"
COLS = 3  # histograms per row
CSS = """
body { font-family: system-ui, sans-serif; margin: 0 2rem 2rem; color: #212529; }
nav { position: sticky; top: 0; background: #fff; padding: .5rem 0; border-bottom: 1px solid #dee2e6; z-index: 10; }
nav a { margin-right: 1rem; text-decoration: none; color: #1c7ed6; }
table { border-collapse: collapse; margin: .5rem 0 1rem; }
td, th { padding: .15rem .6rem; border-bottom: 1px solid #e9ecef; text-align: right; white-space: nowrap; }
td:first-child, th:first-child, table.tensors td:nth-child(2), table.tensors th:nth-child(2) { text-align: left; }
table.kv td { text-align: left; white-space: normal; word-break: break-all; }
.clip { color: #c92a2a; font-weight: 600; }
.wide { overflow-x: auto; }
.note { color: #495057; max-width: 70rem; }
details { margin: .5rem 0; }
code { font-size: .9em; }
"""


def plotly_modules():
    """plotly's graph objects and make_subplots, or one line that says how to get them."""
    try:
        import plotly.graph_objects as go
        from plotly.offline import get_plotlyjs
        from plotly.subplots import make_subplots
    except ImportError:
        raise QtoolError(f"qtool report draws with plotly, which is not installed: {INSTALL}") from None
    return go, make_subplots, get_plotlyjs


def _e(v) -> str:
    return html.escape(str(v))


def _db(m: dict) -> str:
    return "exact" if m.get("exact") else "-" if m["snr_db"] is None else f"{m['snr_db']:.2f} dB"


def _pct(share: float) -> str:
    """A share in percent; a few clipped values among millions still show (not as 0.00%)."""
    return f"{100 * share:.2f}%" if share == 0 or share >= 1e-4 else f"{100 * share:.2g}%"


def _num(v: float) -> str:
    return f"{v:.4g}"


def _table(rows: Iterable[Iterable], head: Iterable[str] | None = None, cls: str = "") -> str:
    h = "<tr>" + "".join(f"<th>{_e(c)}</th>" for c in head) + "</tr>" if head else ""
    body = "".join("<tr>" + "".join(f"<td>{c}</td>" for c in r) + "</tr>" for r in rows)
    return f'<table class="{cls}">{h}{body}</table>'


def _grid_text(view: TensorView) -> str:
    s = view.spec
    e = np.asarray(s.exp2_inv)
    step = f"2^-{int(e)}" if e.ndim == 0 else f"2^-{int(e.min())}..2^-{int(e.max())} per channel"
    return f"int{s.bits}, {step}, zp {s.zp}"


def _header(qm: QuantModel, data: ReportData, source: str) -> str:
    m, info = qm.model, qm.info
    model = [("name", _e(m.name)), ("source", _e(m.source or "-")),
             ("layers", f"{m.num_layers}, {'bidirectional' if m.bidirectional else 'unidirectional'}"),
             ("input, hidden", f"{m.input_size}, {m.hidden_size}"),
             ("bits", _e(info.get("bits", "-"))), ("method", _e(info.get("method", "-"))),
             ("fingerprint", f"<code>{qm.fingerprint()}</code>")]
    prov = [(_e(k), f"<code>{_e(v)}</code>") for k, v in info.items() if k not in ("bits", "method")]
    out = data.results["output"]
    metrics = _table([["output", _db(out), f"{out['cosine']:.6f}", f"{out['max_abs_error']:.3g}",
                       _pct(out["saturated"])]], ["", "SNR", "cosine", "max |err|", "saturated"])
    return (f"<h1>qtool report: {_e(m.name)}</h1>"
            f'<p class="note">Integer GRU (dequantized) against the float GRU on {data.samples} sequences '
            f"of <code>{_e(source)}</code>: the numbers of <code>qtool simulate</code>.</p>"
            f"{metrics}<h2 id=\"model\">Model</h2>{_table(model, cls='kv')}"
            f"<details><summary>provenance</summary>{_table(prov, cls='kv')}</details>")


def _steps_figure(data: ReportData):
    go, make_subplots, _ = plotly_modules()
    t = np.arange(len(data.steps))
    fig = make_subplots(rows=1, cols=2, subplot_titles=("output SNR by time step (dB)",
                                                         "output error by time step"))
    snr = [s["snr_db"] for s in data.steps]
    fig.add_trace(go.Scatter(x=t, y=snr, mode="lines+markers", name="SNR (dB)", showlegend=False), 1, 1)
    for key, name in (("max_abs_error", "max |error|"), ("rms_error", "RMS error")):
        fig.add_trace(go.Scatter(x=t, y=[s[key] for s in data.steps], mode="lines+markers", name=name), 1, 2)
    fig.update_xaxes(title_text="time step")
    fig.update_layout(height=360, margin=dict(t=50, b=40), template="plotly_white")
    return fig


def unit_labels(units: np.ndarray, hidden: int, directions: int) -> list[str]:
    return [f"unit {u % hidden}" + (f" {DIRECTIONS[u // hidden]}" if directions > 1 else "") for u in units]


def trace_units(width: int, count: int) -> np.ndarray:
    """`count` output units spread evenly over the output (both directions of a bidirectional GRU)."""
    return np.unique(np.linspace(0, width - 1, min(count, width)).round().astype(int))


def _traces_figure(data: ReportData, qm: QuantModel, units: int):
    go, make_subplots, _ = plotly_modules()
    S, T, width = data.y_float.shape
    picked = trace_units(width, units)
    labels = unit_labels(picked, qm.model.hidden_size, len(qm.cells[0]))
    fig = make_subplots(rows=S, cols=1, shared_xaxes=True, vertical_spacing=min(0.06, 0.5 / S),
                        subplot_titles=[f"sequence {i}" for i in range(S)])
    colors = ("#1c7ed6", "#e8590c", "#2f9e44", "#ae3ec9", "#f59f00", "#0ca678", "#c2255c", "#5c7cfa")
    t = np.arange(T)
    for i in range(S):
        for k, (u, label) in enumerate(zip(picked, labels)):
            c = colors[k % len(colors)]
            first = i == 0
            fig.add_trace(go.Scatter(x=t, y=data.y_float[i, :, u], mode="lines", line=dict(color=c),
                                     name=f"{label} float", legendgroup=label, showlegend=first), i + 1, 1)
            fig.add_trace(go.Scatter(x=t, y=data.y_quant[i, :, u], mode="lines+markers",
                                     line=dict(color=c, dash="dot"), marker=dict(size=5),
                                     name=f"{label} integer", legendgroup=label, showlegend=first), i + 1, 1)
    fig.update_xaxes(title_text="time step", row=S, col=1)
    fig.update_layout(height=170 + 220 * S, margin=dict(t=50, b=40), template="plotly_white")
    return fig


def _subplot_title(v: TensorView) -> str:
    d = v.distance
    clip = f"clipped {_pct(d['saturated'])}"
    if d["saturated"] > 0:
        clip = f"<span style='color:#c92a2a'>{clip}</span>"
    grid = "" if v.grid_in_view else " (grid beyond view)"
    return f"<b>{v.name}</b>  {_grid_text(v)}{grid}<br>{_db(d)}, {clip}"


def _axis(n: int, axis: str) -> str:
    return axis if n == 1 else f"{axis}{n}"


def _marks(v: TensorView, n: int) -> list[dict]:
    """Shapes on subplot n: the grid shaded, the calibrated range dashed."""
    x, y = _axis(n, "x"), _axis(n, "y") + " domain"
    out = []
    if v.grid_in_view:
        out.append(dict(type="rect", x0=v.grid[0], x1=v.grid[1], y0=0, y1=1, xref=x, yref=y,
                        fillcolor=GRID_FILL, line=dict(color=GRID_EDGE, width=1), layer="below"))
    for at in v.calibrated or ():
        out.append(dict(type="line", x0=at, x1=at, y0=0, y1=1, xref=x, yref=y,
                        line=dict(color=CAL_LINE, dash="dash", width=1)))
    return out


def _tensor_figure(views: list[TensorView]):
    """Small multiples: every tensor of one layer direction, its grid shaded, the calibrated
    range dashed. A log count axis (the default) shows the few clipped values in the tails."""
    go, make_subplots, _ = plotly_modules()
    rows = -(-len(views) // COLS)
    fig = make_subplots(rows=rows, cols=COLS, subplot_titles=[_subplot_title(v) for v in views],
                        vertical_spacing=0.32 / rows, horizontal_spacing=0.05)
    # added in one go: plotly's add_vrect/add_vline and per-axis updates revalidate the whole
    # layout on every call
    fig.add_traces([go.Bar(x=(v.edges[:-1] + v.edges[1:]) / 2, y=v.counts, width=np.diff(v.edges),
                           marker_color=FLOAT_BAR, marker_line_width=0, name=v.name, showlegend=False,
                           hovertemplate="%{x:.4g}: %{y} values<extra></extra>") for v in views],
                   rows=[i // COLS + 1 for i in range(len(views))], cols=[i % COLS + 1 for i in range(len(views))])
    fig.update_layout({f"{_axis(i + 1, 'xaxis')}.title": dict(text="levels (value / channel step)", standoff=2)
                       for i, v in enumerate(views) if v.levels})
    fig.update_layout({f"{_axis(i + 1, 'xaxis')}.range": [v.edges[0], v.edges[-1]] for i, v in enumerate(views)})
    fig.layout.shapes = [s for i, v in enumerate(views) for s in _marks(v, i + 1)]
    fig.update_yaxes(type="log", dtick=1)  # a tick per decade; log shows the clipped tails
    fig.update_annotations(font_size=11)
    axes = [k for k in fig.layout if k.startswith("yaxis")]
    scale = [dict(label=f"{kind} counts", method="relayout",
                  args=[{**{f"{a}.type": kind for a in axes}, **{f"{a}.dtick": dtick for a in axes}}])
             for kind, dtick in (("log", 1), ("linear", None))]
    height = 250 * rows + 60
    fig.update_layout(height=height, margin=dict(t=90, b=30, l=50, r=20), template="plotly_white", bargap=0,
                      updatemenus=[dict(type="buttons", direction="left", x=0, y=1 + 55 / height,
                                        xanchor="left", yanchor="bottom", buttons=scale)])
    return fig


def _channel_figure(views: list[ChannelView]):
    """Per output channel, a bar from the float minimum to the maximum, in levels of the
    channel's own step, over the grid (the same for every channel in levels)."""
    go, make_subplots, _ = plotly_modules()
    fig = make_subplots(rows=1, cols=len(views), horizontal_spacing=0.06,
                        subplot_titles=[f"{v.name} per output channel, in levels of its step" for v in views])
    shapes = []
    for k, v in enumerate(views):
        ch = np.arange(v.lo.size)
        x, y = _axis(k + 1, "x"), _axis(k + 1, "y")
        first = k == 0
        fig.add_trace(go.Bar(x=ch, y=v.hi - v.lo, base=v.lo, marker_color=FLOAT_BAR, marker_line_width=0,
                             name="float range", showlegend=first, legendgroup="float",
                             customdata=np.stack([np.ldexp(v.lo, -v.exp2_inv), np.ldexp(v.hi, -v.exp2_inv),
                                                  v.exp2_inv], axis=1),
                             hovertemplate="channel %{x}: [%{customdata[0]:.4g}, %{customdata[1]:.4g}], "
                                           "step 2^-%{customdata[2]}<extra></extra>"), 1, k + 1)
        for edge in (v.calibrated_hi, v.calibrated_lo):
            fig.add_trace(go.Scatter(x=ch, y=edge, mode="markers", name="calibrated", legendgroup="calibrated",
                                     marker=dict(symbol="line-ew", size=4, line=dict(color=CAL_LINE, width=1.5)),
                                     hoverinfo="skip", showlegend=first and edge is v.calibrated_hi), 1, k + 1)
        shapes.append(dict(type="rect", x0=-0.5, x1=v.lo.size - 0.5, y0=v.grid[0], y1=v.grid[1], xref=x, yref=y,
                           fillcolor=GRID_FILL, line=dict(color=GRID_EDGE, width=1), layer="below"))
        H = v.lo.size // 3
        for j, gate in enumerate("zrg"):
            fig.add_annotation(x=(j + 0.5) * H, y=1, yref=y + " domain", xref=x, text=f"<b>{gate}</b>",
                               showarrow=False, yanchor="top", bgcolor="rgba(255, 255, 255, 0.8)")
            if j:
                shapes.append(dict(type="line", x0=j * H - 0.5, x1=j * H - 0.5, y0=0, y1=1, xref=x,
                                   yref=y + " domain", line=dict(color="#868e96", width=1)))
        fig.update_xaxes(title_text="output channel", range=[-0.5, v.lo.size - 0.5], row=1, col=k + 1)
        fig.update_yaxes(range=[v.grid[0] * 1.08, v.grid[1] * 1.08], row=1, col=k + 1)
    fig.layout.shapes = shapes
    fig.update_layout(height=360, margin=dict(t=60, b=40), template="plotly_white", bargap=0)
    return fig


def tensor_table(views: list[TensorView], anchor: str | None = "") -> str:
    """Every tensor's grid, ranges, SNR and clipped share; each row links to its layer's section
    (`anchor` prefixes the ids, as in `layer_sections`; None: no links, a page without them)."""
    rows = []
    for v in views:
        layer, direction, _ = v.key.split(".")
        d = v.distance
        clip = _pct(d["saturated"])
        cal = "-" if v.calibrated is None else f"[{_num(v.calibrated[0])}, {_num(v.calibrated[1])}]"
        unit = " levels" if v.levels else ""
        where = f"{layer[5:]}.{direction}"
        link = where if anchor is None else f'<a href="#{_e(anchor)}{layer}.{direction}">{where}</a>'
        rows.append([link, _e(v.name),
                     _e(_grid_text(v)), f"[{_num(v.grid[0])}, {_num(v.grid[1])}){unit}", cal,
                     f"[{_num(v.data[0])}, {_num(v.data[1])}]{unit}", _db(d),
                     f'<span class="clip">{clip}</span>' if d["saturated"] else clip])
    return _table(rows, ["layer", "tensor", "grid", "holds without clipping", "calibrated range",
                         "float values seen", "SNR", "clipped"], cls="tensors")


TENSORS_NOTE = ("Bars: the float values (the reference the integers are measured "
                "against); green: the values the grid holds, [(qmin - zp - 1/2) s, (qmax - zp + 1/2) s); "
                "dashed: the calibrated range; clipped: the share of values outside the grid. "
                "W, R, bx, br are per output channel and shown in units of their channel's step. "
                "The pre-activations z_pre, r_pre, g_pre are calibrated to where their sigmoid or tanh "
                "saturates on its output grid: what is clipped beyond costs nothing.")


def layer_sections(qm: QuantModel, data: ReportData, anchor: str = "", level: int = 2) -> tuple[list, list[str]]:
    """Per layer direction of `qm`: its heading (`<h{level}>`), its tensors' histograms against
    their grids and its weights per channel; as the sections `page_body` takes, and the layers'
    tags (`layer0.fwd`). `anchor` prefixes every id, so that one page holds several GRUs."""
    sections, layers = [], []
    for l, cells in enumerate(qm.cells):
        for d in range(len(cells)):
            tag = f"layer{l}.{DIRECTIONS[d]}"
            layers.append(tag)
            views = [v for v in data.tensors if v.key.startswith(tag + ".")]
            sections += [f'<h{level} id="{_e(anchor)}{tag}">Layer {l}, {DIRECTIONS[d]}: tensors</h{level}>'
                         f'<p class="note">{TENSORS_NOTE}</p>',
                         (f"hist-{anchor}{tag}", _tensor_figure(views)),
                         (f"chan-{anchor}{tag}",
                          _channel_figure([c for c in data.channels if c.key.startswith(tag + ".")]))]
    return sections, layers


def page_body(sections: list) -> tuple[str, str]:
    """The page's HTML from sections (HTML strings, or (div id, plotly figure)), and the script
    that draws the figures into their divs."""
    figures, body = [], []  # (div id, figure)
    for part in sections:
        if isinstance(part, str):
            body.append(part)
            continue
        div, fig = part
        figures.append((div, fig))
        body.append(f'<div id="fig-{div}" class="plot"></div>')
    config = json.dumps({"responsive": True, "displaylogo": False})
    script = "\n".join(f"Plotly.newPlot({json.dumps('fig-' + div)}, {{...{fig.to_json()}, config: {config}}});"
                       for div, fig in figures)
    return "".join(body), script


def render(qm: QuantModel, data: ReportData, source: str, units: int = 4) -> str:
    """The whole page as one string."""
    _, _, get_plotlyjs = plotly_modules()
    sections = [_header(qm, data, source),
                '<h2 id="steps">Output error by time step</h2>', ("steps", _steps_figure(data)),
                f'<h2 id="traces">Float vs integer output, first {len(data.y_float)} sequences</h2>'
                '<p class="note">Solid: the float GRU; dotted: the integer GRU, dequantized.</p>',
                ("traces", _traces_figure(data, qm, units))]
    per_layer, layers = layer_sections(qm, data)
    sections += per_layer
    sections += ['<h2 id="tensors">All tensors</h2>', f'<div class="wide">{tensor_table(data.tensors)}</div>']
    body, script = page_body(sections)
    nav = "".join(f'<a href="#{a}">{_e(t)}</a>' for a, t in (
        ("model", "model"), ("steps", "error by step"), ("traces", "traces"),
        *((t, t[5:]) for t in layers), ("tensors", "all tensors")))
    return (f'<!DOCTYPE html>\n<html lang="en"><head><meta charset="utf-8">'
            f'<meta name="generator" content="qtool {__version__}">'
            f"<title>qtool report: {_e(qm.model.name)}</title><style>{CSS}</style>"
            f"<script>{get_plotlyjs()}</script></head><body><nav>{nav}</nav>{body}"
            f'<p class="note">Written by qtool {__version__}.</p><script>{script}</script></body></html>\n')
