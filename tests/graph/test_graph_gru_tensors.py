"""A quantized whole model shows each GRU node's own tensors as a GRU alone shows them: `inspect`
a table per GRU (and `--json` its rows) with the grids of its QuantModel, `report` a section per
GRU measured on that GRU's own input (the float model's values at its input edge)."""

import io
import json
import sys

import numpy as np
import pytest
from conftest import has
from rich.console import Console

import qtool
from qtool import api
from qtool.core.graph import Graph, Node
from qtool.core.model import DIRECTIONS
from qtool.core.tensors import cell_names


def _gru_params(rng, C: int, H: int, dirs: int) -> dict:
    return {f"l0.{d}.{w}": rng.normal(0, scale, shape).astype(np.float32)
            for d in DIRECTIONS[:dirs]
            for w, shape, scale in (("W", (3 * H, C), 0.5), ("R", (3 * H, H), 0.5), ("bx", 3 * H, 0.2),
                                    ("br", 3 * H, 0.2))}


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    """Two GRU nodes: a bidirectional reset-before one on the model's input, then a haste one on
    its output (another direction count: not stacked), and a dense head. Calibrated, saved."""
    rng = np.random.default_rng(0)
    g = Graph([Node("enc", "gru", ["x"], ["e"], {"bidirectional": True, "reset_after": False},
                    _gru_params(rng, 4, 5, 2)),
               Node("dec", "gru", ["e"], ["h"], {"return_sequences": False}, _gru_params(rng, 10, 4, 1)),
               Node("head", "dense", ["h"], ["y"], {}, {"W": rng.normal(0, 0.5, (3, 4)).astype(np.float32),
                                                      "b": np.zeros(3, np.float32)})],
              {"x": (None, 4)}, ["y"], name="tiny")
    tmp = tmp_path_factory.mktemp("grus")
    qg = api.calibrate(g, rng.normal(0, 1, (24, 6, 4)).astype(np.float32), method="minmax")
    api.save(qg, tmp / "q.h5")
    np.save(tmp / "test.npy", rng.normal(0, 1, (10, 6, 4)).astype(np.float32))
    qg = api.load(tmp / "q.h5")
    assert qg.grus == ["enc", "dec"]
    return qg, tmp


def _exp2_inv_cell(e) -> str:
    e = np.asarray(e)
    return str(int(e)) if e.ndim == 0 else f"{int(e.min())}..{int(e.max())}"


def _rows_after(lines: list[str], title: str) -> list[list[str]]:
    """The body rows of the table titled `title`, as cells."""
    at = next(i for i, line in enumerate(lines) if line.strip() == title)
    rows = []
    for line in lines[at + 4:]:  # title, top border, header, header rule
        if not line.startswith("│"):
            break
        rows.append([c.strip() for c in line.strip().strip("│").split("│")])
    return rows


def test_inspect_shows_every_grus_tensors_at_80_columns(tiny, cli, monkeypatch):
    from qtool.cli import graph_cmds

    qg, tmp = tiny
    console = Console(width=80, file=io.StringIO())
    monkeypatch.setattr(graph_cmds, "out", console)
    code, _, err = cli("inspect", tmp / "q.h5")
    assert code == 0, err
    text = console.file.getvalue()
    lines = text.splitlines()
    assert all(len(line) <= 80 for line in lines) and "…" not in text
    assert text.index("tiny: int8") < text.index("enc: its tensors") < text.index("dec: its tensors") \
        < text.index("pass prune")
    for name in ("enc", "dec"):
        qm = qg.qparams[name]["qm"]
        want = [[f"{l}.{DIRECTIONS[d]}", t, str(cq.spec[t].bits), _exp2_inv_cell(cq.spec[t].exp2_inv),
                 str(cq.spec[t].zp)]
                for l, cells in enumerate(qm.cells) for d, cq in enumerate(cells) for t in cell_names(cq.form)]
        got = [[r[0], r[1], r[2], r[4], r[5]] for r in _rows_after(lines, f"{name}: its tensors")]
        assert got == want, name
    assert any(r[1] == "rh" for r in _rows_after(lines, "enc: its tensors"))  # reset before: rh, no rRh
    assert any(r[1] == "rRh" for r in _rows_after(lines, "dec: its tensors"))


def test_inspect_json_carries_every_grus_tensors(tiny, cli):
    qg, tmp = tiny
    code, out, err = cli("inspect", tmp / "q.h5", "--json")
    assert code == 0, err
    doc = json.loads(out)
    assert list(doc["gru_tensors"]) == ["enc", "dec"]
    for name, rows in doc["gru_tensors"].items():
        qm = qg.qparams[name]["qm"]
        keys = [(l, DIRECTIONS[d], t) for l, cells in enumerate(qm.cells) for d, cq in enumerate(cells)
                for t in cell_names(cq.form)]
        assert [(r["layer"], r["direction"], r["tensor"]) for r in rows] == keys
        for r in rows:
            s = qm.cells[r["layer"]][DIRECTIONS.index(r["direction"])].spec[r["tensor"]]
            assert r["exp2_inv"] == np.asarray(s.exp2_inv).tolist() and r["zp"] == s.zp and r["bits"] == s.bits
    assert len(doc["gru_tensors"]["enc"]) == 2 * len(cell_names(qg.qparams["enc"]["qm"].cells[0][0].form))


def _section(page: str, i: int) -> str:
    """The page's part about the core's `i`th GRU: from its heading to the next GRU's (or the end)."""
    start = page.index(f'<h2 id="gru{i}">')
    end = page.find(f'<h2 id="gru{i + 1}">', start)
    return page[start:end if end > 0 else len(page)]


@pytest.mark.skipif(not has("plotly"), reason='plotly is not installed (pip install "qtool[report]")')
def test_report_measures_each_gru_on_its_own_input(tiny, cli):
    """Each GRU's section holds what `collect` measures for that GRU alone on the float model's
    values at its input edge: every tensor's SNR, and its histograms (a figure per layer direction
    for its tensors and one for W and R per channel)."""
    from qtool.layers import run
    from qtool.report.data import collect
    from qtool.report.html import _db

    qg, tmp = tiny
    code, out, err = cli("report", tmp / "q.h5", tmp / "test.npy", "-o", tmp / "r.html", "--backend", "cpu")
    assert code == 0, err
    page = (tmp / "r.html").read_text()
    x = np.load(tmp / "test.npy")
    ref = run(qg.graph, x, keep=True)
    assert '<a href="#gru0">' in page and '<a href="#gru1">' in page  # the graph's GRU boxes link down
    for i, name in enumerate(("enc", "dec")):
        qm, node = qg.qparams[name]["qm"], qg.node(name)
        section = _section(page, i)
        assert f"GRU {name}: its tensors" in section and f"<code>{node.inputs[0]}</code>" in section
        rd = collect(qm, qtool.as_data(ref[node.inputs[0]]), len(x))
        assert f"SNR {_db(rd.results['output'])}, cosine {rd.results['output']['cosine']:.6f}" in section
        for v in rd.tensors:
            layer, direction, tensor = v.key.split(".")
            at = section.index(f'<td><a href="#gru{i}-{layer}.{direction}">{layer[5:]}.{direction}</a></td>'
                               f"<td>{tensor}</td>")
            assert f"<td>{_db(v.distance)}</td>" in section[at:section.index("</tr>", at)], v.key
        directions = sum(len(cells) for cells in qm.cells)
        assert section.count('<div id="fig-hist-') == section.count('<div id="fig-chan-') == directions
    assert page.count("Plotly.newPlot(") == 2 * (2 + 1)  # enc's two directions, dec's one


def test_report_without_plotly_still_tables_each_grus_tensors(tiny, monkeypatch, tmp_path):
    qg, tmp = tiny
    for name in [m for m in sys.modules if m == "plotly" or m.startswith("plotly.")] + ["plotly"]:
        monkeypatch.setitem(sys.modules, name, None)  # import plotly... now raises ImportError
    qtool.html_report(qg, tmp / "test.npy", tmp_path / "r.html", backend="cpu")
    page = (tmp_path / "r.html").read_text()
    assert "Plotly" not in page and "<svg" in page
    for i, name in enumerate(("enc", "dec")):
        section = _section(page, i)
        assert f"GRU {name}: its tensors" in section and 'pip install &quot;qtool[report]&quot;' in section
        for t in cell_names(qg.qparams[name]["qm"].cells[0][0].form):
            assert f"<td>{t}</td>" in section, (name, t)


@pytest.mark.parametrize("form", ["haste", "reset_before"])
@pytest.mark.parametrize("method", ["minmax", "mse"])
def test_a_gru_alone_as_a_graph_of_one_gru_node_gives_the_same_integers(form, method):
    """qtool.layers.gru.alone: a GRU alone is the whole model of one gru node. Calibrated by the
    graph path it is the very QuantModel the GRU path builds (the same fingerprint), and it gives
    the same output integers on held-out data."""
    from conftest import random_model

    from qtool.core.model import CellForm, GruModel
    from qtool.layers import check
    from qtool.layers.gru import alone

    m = random_model(C=6, H=12, layers=2, dirs=2, seed=5, scale=0.7)
    if form == "reset_before":
        m = GruModel([[type(c)(c.W, c.R, c.bx, c.br, CellForm(reset_after=False)) for c in cells]
                      for cells in m.layers], m.name, m.source)
    g = check(alone(m))
    assert [n.op for n in g.nodes] == ["gru"] and g.inputs == {"x": (None, 6)}
    x = np.random.default_rng(1).laplace(size=(80, 9, 6)).astype(np.float32)
    qm, qg = api.calibrate(m, x[:48], method=method), api.calibrate(g, x[:48], method=method)
    assert qg.qparams[g.nodes[0].name]["qm"].fingerprint() == qm.fingerprint()
    alone_run = api.simulate(qm, x[48:], outputs=True)
    graph_run = api.simulate(qg, x[48:], outputs=True)
    np.testing.assert_array_equal(graph_run.y_int, alone_run.y_int)
    assert graph_run.outputs["y"].snr_db == pytest.approx(alone_run.output["snr_db"], abs=1e-4)


def test_a_file_of_a_grus_weights_loads_whole_as_one_gru_node():
    """load_model(whole=True) of a state dict: the graph of its one GRU, whose float reference is
    the GRU's own (qtool.numerics.float_gru) on held-out data."""
    from conftest import SAMPLES

    from qtool.layers import run
    from qtool.numerics.float_gru import run_float

    path = SAMPLES / "digits_gru.safetensors"
    g, m = api.load_model(path, whole=True), api.load_model(path)
    assert isinstance(g, Graph) and [n.op for n in g.nodes] == ["gru"] and g.outputs == ["y"]
    x = np.load(SAMPLES / "test.npy")[:16]
    np.testing.assert_allclose(run(g, x)["y"], run_float(m, x), atol=1e-6)
