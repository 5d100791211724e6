"""`qtool report`: the numbers its plots are drawn from, the file it writes, and that a browser
renders it (headless Chromium)."""

import json
import os
import shutil
import subprocess
import sys

import numpy as np
import pytest
from conftest import has, random_model

import qtool
from qtool.errors import QtoolError

pytestmark = pytest.mark.skipif(not has("plotly"), reason='plotly is not installed (pip install "qtool[report]")')


@pytest.fixture(scope="module")
def case(tmp_path_factory):
    """A 2-layer bidirectional int8 GRU and held-out data it was not calibrated on."""
    tmp = tmp_path_factory.mktemp("report")
    rng = np.random.default_rng(11)
    model = random_model(C=5, H=8, layers=2, dirs=2, seed=11)
    qm = qtool.calibrate(model, rng.standard_normal((48, 10, 5)).astype(np.float32), method="mse")
    # wider than the calibration data, so that some tensors clip
    test = (1.6 * rng.standard_normal((37, 10, 5))).astype(np.float32)
    q_path = qtool.save(qm, tmp / "q.h5")
    np.save(tmp / "test.npy", test)
    return qm, test, q_path, tmp / "test.npy", tmp


@pytest.fixture(scope="module")
def data(case):
    from qtool.report.data import collect

    qm, test, *_ = case
    return collect(qm, qtool.as_data(test), len(test), keep=3, batch_size=16)  # three chunks


def test_metrics_are_simulates(case, data):
    qm, test, *_ = case
    sim = qtool.simulate(qm, test, backend="cpu", batch_size=16)
    assert data.results["output"] == sim.output
    assert data.results["tensors"] == sim.tensors
    assert data.results["per_step_snr_db"] == sim.per_step_snr_db == [s["snr_db"] for s in data.steps]


def test_histograms_and_clipping_from_the_float_values(case, data):
    """Every activation's histogram holds exactly the float values of the run, and its clipped
    share is the share of values that the rounding rule q = floor(x 2^e + 1/2) + zp puts
    outside [qmin, qmax]."""
    from qtool.numerics.float_gru import run_float
    from qtool.numerics.rescale import qrange

    qm, test, *_ = case
    traces = []
    run_float(qm.model, test, traces)
    views = {v.key: v for v in data.tensors}
    assert len(views) == 2 * 2 * 18
    clipping = 0
    for l, cells in enumerate(traces):
        for d, trace in enumerate(cells):
            for name, values in trace.items():
                v = views[f"layer{l}.{('fwd', 'bwd')[d]}.{name}"]
                s = v.spec
                qmin, qmax = qrange(s.bits)
                q = np.floor(values.astype(np.float64) * 2.0**s.exp2_inv + 0.5) + s.zp
                clipped = np.count_nonzero((q < qmin) | (q > qmax))
                clipping += clipped > 0
                assert v.distance["saturated"] == clipped / values.size, v.key
                assert v.counts.sum() == values.size and v.distance["count"] == values.size
                # the report's float pass runs in other chunks than this one: BLAS may round a
                # GEMM's last bit differently, so extremes agree to float32 precision, not bit for bit
                assert np.allclose(v.data, (values.min(), values.max()), rtol=1e-6, atol=1e-7), v.key
                assert v.edges[0] <= values.min() and values.max() < v.edges[-1]
                lo, hi = v.grid
                assert np.count_nonzero((values < lo) | (values >= hi)) == clipped, v.key
                assert len(v.counts) <= 200
    assert clipping >= 3  # the test data reaches beyond some calibrated grids


def test_weights_in_levels(case, data):
    qm, *_ = case
    for c in data.channels:
        l, d, name = c.key.split(".")
        w = getattr(qm.model.layers[int(l[5:])][("fwd", "bwd").index(d)], name).astype(np.float64)
        levels = w * 2.0 ** qm.cells[int(l[5:])][("fwd", "bwd").index(d)].spec[name].exp2_inv[:, None]
        np.testing.assert_array_equal(c.hi, levels.max(axis=1))
        np.testing.assert_array_equal(c.lo, levels.min(axis=1))
        assert c.grid == (-128.5, 127.5)
        assert np.all(c.lo >= c.grid[0]) and np.all(c.hi < c.grid[1])  # min/max weights never clip
        # min/max per channel fills at least half the grid: one bit at most lost to the power of two
        assert np.all(np.maximum(-c.lo, c.hi) > 127.5 / 2)
    w_views = [v for v in data.tensors if v.name == "W"]
    assert all(v.levels and v.counts.sum() == v.distance["count"] for v in w_views)


def test_traces_are_the_engines(case, data):
    from qtool.engine.cpu import run_int
    from qtool.numerics.float_gru import run_float
    from qtool.numerics.qparams import dequantize

    qm, test, *_ = case
    s = qm.cells[-1][0].spec["h"]
    np.testing.assert_array_equal(data.y_quant, dequantize(run_int(qm, test[:3]), s.exp2_inv, s.zp).astype(np.float32))
    np.testing.assert_allclose(data.y_float, run_float(qm.model, test[:3]), atol=1e-6)
    # per-step SNR from the whole outputs, computed here; the engine's float32 reference differs
    # from numpy's float GRU by float32 rounding (tests/engine/test_fused_metrics.py), hence 1e-5
    y_f, y_q = run_float(qm.model, test).astype(np.float64), dequantize(run_int(qm, test), s.exp2_inv, s.zp)
    snr = 10 * np.log10((y_f**2).sum(axis=(0, 2)) / ((y_q - y_f) ** 2).sum(axis=(0, 2)))
    np.testing.assert_allclose([st["snr_db"] for st in data.steps], snr, rtol=1e-5)
    rms = np.sqrt(((y_q - y_f) ** 2).mean(axis=(0, 2)))
    np.testing.assert_allclose([st["rms_error"] for st in data.steps], rms, rtol=1e-5)


@pytest.fixture(scope="module")
def page(case, tmp_path_factory):
    """The report as the command line writes it."""
    from qtool.cli.app import main

    _, _, q_path, test_path, tmp = case
    out = tmp / "report.html"
    try:
        main(["report", str(q_path), str(test_path), "-o", str(out), "--backend", "cpu", "--sequences", "2"])
    except SystemExit as e:
        assert e.code in (0, None)
    return out


def test_page_is_one_offline_file(case, data, page):
    from qtool.io.files import HEAD_BYTES, TEXT_MARKS

    qm, *_ = case
    text = page.read_text()
    assert any(m in page.read_bytes()[:HEAD_BYTES] for m in TEXT_MARKS)  # so that --force may replace it later
    assert "<script src" not in text and "<link" not in text  # nothing fetched from anywhere
    assert text.count("Plotly.newPlot(") == 2 + 2 * 4  # steps, traces; histograms and channels x 4
    for v in data.tensors:
        assert f">{v.name}<" in text
    assert qm.fingerprint() in text and "sequence 1" in text and "sequence 2" not in text


def test_cli_writes_once_and_refuses_what_it_did_not_write(case, page, cli):
    _, _, q_path, test_path, tmp = case
    assert page.read_bytes().startswith(b"<!DOCTYPE html>")
    assert sorted(p.name for p in tmp.iterdir()) == ["q.h5", "report.html", "test.npy"]  # no temporaries
    before = page.stat().st_mtime_ns
    code, _, err = cli("report", q_path, test_path, "-o", page, "--limit", "4")
    assert code == 2 and "use --force" in err and page.stat().st_mtime_ns == before
    foreign = tmp / "notes.html"
    foreign.write_text("<html>mine</html>")
    code, _, err = cli("report", q_path, test_path, "-o", foreign, "--force", "--limit", "4")
    assert code == 2 and "not written by qtool" in err and foreign.read_text() == "<html>mine</html>"
    foreign.unlink()
    code, out, err = cli("report", q_path, test_path, "-o", page, "-f", "--limit", "30", "--sequences", "30",
                         "--backend", "cpu", "--json")
    assert code == 0, err
    res = json.loads(out)
    assert res["samples"] == 30 and res["bytes"] == page.stat().st_size and page.stat().st_mtime_ns != before


def test_failure_leaves_nothing(case, cli, monkeypatch, tmp_path):
    import qtool.report.html

    _, _, q_path, test_path, _ = case

    def broken(*a, **k):
        raise RuntimeError("drawing failed")

    monkeypatch.setattr(qtool.report.html, "render", broken)
    code, _, err = cli("report", q_path, test_path, "-o", tmp_path / "r.html", "--limit", "2", "--backend", "cpu")
    assert code == 1 and "drawing failed" in err and list(tmp_path.iterdir()) == []


def test_without_plotly_one_line(case, cli, monkeypatch, tmp_path):
    _, _, q_path, test_path, _ = case
    for name in [m for m in sys.modules if m == "plotly" or m.startswith("plotly.")] + ["plotly"]:
        monkeypatch.setitem(sys.modules, name, None)  # import plotly... now raises ImportError
    code, out, err = cli("report", q_path, test_path, "-o", tmp_path / "r.html")
    assert code == 2 and out == ""
    assert err.strip().splitlines() == ['error: qtool report draws with plotly, which is not installed: '
                                        'pip install "qtool[report]"']
    assert list(tmp_path.iterdir()) == []
    with pytest.raises(QtoolError, match=r"qtool\[report\]"):
        qtool.html_report(q_path, test_path, tmp_path / "r.html")


CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")


@pytest.mark.skipif(CHROMIUM is None, reason="Chromium is not installed (Debian: apt-get install chromium)")
def test_renders_in_a_browser(page, tmp_path):
    """Headless Chromium opens the file with no server and no network; every plot is drawn."""
    Image = pytest.importorskip("PIL.Image", reason="pillow reads the screenshot (pip install pillow)")

    png = tmp_path / "shot.png"
    cmd = [CHROMIUM, "--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
           "--disable-background-networking", "--disable-component-update", "--disable-sync",
           f"--user-data-dir={tmp_path / 'profile'}", f"--screenshot={png}", "--dump-dom",
           "--window-size=1400,2000", page.as_uri()]
    dom = subprocess.run(cmd, capture_output=True, text=True, timeout=180, check=True,
                         env={**os.environ, "HOME": str(tmp_path)}).stdout
    figures = page.read_text().count("Plotly.newPlot(")
    assert dom.count('class="plot js-plotly-plot"') == figures  # plotly.js ran on every figure
    assert dom.count('class="main-svg"') >= figures
    assert dom.count('class="trace bars"') == 4 * (18 + 2)  # every tensor's histogram, W and R per channel
    img = np.asarray(Image.open(png).convert("RGB"), np.float64)
    assert img.shape == (2000, 1400, 3)
    assert img.std() > 20  # not a blank page
    assert np.mean(img.min(axis=2) < 200) > 0.02  # some ink: text, lines, markers
    blue = np.all(np.abs(img - [28, 126, 214]) < 40, axis=2)  # the float traces and bars' colour
    assert blue.sum() > 500
