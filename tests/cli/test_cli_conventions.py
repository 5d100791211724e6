"""The command line follows typer/click conventions and prints what a user wants to read."""

import h5py
import numpy as np
import pytest
from conftest import has, random_model

import qtool


def test_version_help_and_no_arguments(cli):
    code, out, _ = cli("--version")
    assert code == 0 and out.strip() == f"qtool {qtool.__version__}"
    code, out, _ = cli()
    assert code == 0 and "calibrate" in out and "simulate" in out
    for cmd in (["calibrate"], ["simulate"], ["import"], ["export", "c"], ["verify"], ["precompile"]):
        code, out, _ = cli(*cmd, "--help")
        assert code == 0 and "<bool>" not in out and "[src]" not in out, cmd
    code, out, _ = cli("--help")
    assert "--install-completion" in out
    code, _, err = cli("simulate", "--bogus")
    assert code == 2 and len(err.strip().splitlines()) == 1 and "--bogus" in err
    code, _, err = cli("precompile", "--preset", "int9")
    assert code == 2 and "unknown preset 'int9'" in err and len(err.strip().splitlines()) == 1


def test_every_help_fits_80_columns_uncut(cli, monkeypatch):
    """At 80 columns no flag of any command is cut to 'flag…' (help text wraps; names must not),
    and the help column keeps room to read: at least 36 characters (a flag pair's negative name
    had squeezed it to 22)."""
    monkeypatch.setenv("COLUMNS", "80")
    commands = [["import"], ["calibrate"], ["advise"], ["simulate"], ["report"], ["inspect"], ["verify"],
                ["precompile"], ["export", "c"], ["export", "json"], ["export", "h5"]]
    for cmd in commands:
        code, out, _ = cli(*cmd, "--help")
        assert code == 0 and "…" not in out and max(map(len, out.splitlines())) <= 80, (cmd, out)
        wrapped = [ln for ln in out.splitlines() if ln.startswith("│ ") and ln[1:].strip("│ ")
                   and not ln[1:].lstrip().startswith("-")]  # a help text's second lines: where it starts
        assert 80 - max(len(ln) - len(ln[1:].lstrip()) for ln in wrapped) >= 36, (cmd, out)


def test_a_flag_and_its_opposite_together_are_refused(cli, tmp_path):
    for args in (["simulate", tmp_path / "q.h5", tmp_path / "t.npy", "--per-tensor", "--no-per-tensor"],
                 ["export", "c", tmp_path / "q.h5", "-o", tmp_path / "c", "--fully-integral", "--allow-float"]):
        code, _, err = cli(*args)
        assert code != 0 and "give one" in err and len(err.strip().splitlines()) == 1, err


def test_the_cli_starts_without_numpy():
    """`qtool --help` and `--version` stay quick: numpy (and all the numerics) load on first use."""
    import subprocess
    import sys

    code = "import sys, qtool.cli.app; sys.exit('numpy' in sys.modules)"
    assert subprocess.run([sys.executable, "-c", code]).returncode == 0


@pytest.fixture(scope="module")
def bidir(tmp_path_factory):
    d = tmp_path_factory.mktemp("bi")
    model = random_model(C=4, H=5, layers=2, dirs=2, seed=2)
    rng = np.random.default_rng(2)
    x = np.maximum(rng.standard_normal((40, 6, 4)), 0).astype(np.float32)  # ReLU-fed: many exact zeros
    qtool.save(qtool.calibrate(model, x[:30]), d / "q.h5")
    np.save(d / "test.npy", x[30:])
    return d


def test_simulate_prints_a_summary_fwd_before_bwd(cli, bidir):
    code, out, err = cli("simulate", bidir / "q.h5", bidir / "test.npy")
    assert code == 0, err
    assert "layer0.fwd.h" in out and "layer1.bwd.h" in out and "--tensors all" in out
    assert len([ln for ln in out.splitlines() if "layer" in ln]) <= 4 + 5 + 1
    code, out, _ = cli("simulate", bidir / "q.h5", bidir / "test.npy", "--tensors", "all")
    rows = [ln.split()[1] for ln in out.splitlines() if ln.startswith("│ layer")]
    assert len(rows) == 2 * 2 * 18 and rows.index("layer0.fwd.x") < rows.index("layer0.bwd.x")
    assert rows.index("layer0.bwd.br") < rows.index("layer1.fwd.x")


def test_relu_zeros_at_the_grid_end_are_not_saturated(bidir):
    res = qtool.simulate(bidir / "q.h5", bidir / "test.npy")
    x = np.load(bidir / "test.npy")
    assert (x == 0).mean() > 0.3  # the grid of x starts at 0: zeros map to qmin exactly
    assert res.tensors["layer0.fwd.x"]["saturated"] == 0.0


def test_calibrate_is_short_by_default(cli, bidir, tmp_path):
    args = ("calibrate", bidir / "q.h5", bidir / "test.npy", "-o", tmp_path / "q.h5", "--force")
    code, out, _ = cli(*args)
    assert code == 0 and len(out.splitlines()) < 20 and "--verbose" in out
    code, out, _ = cli(*args, "--verbose")
    assert code == 0 and "old_contrib" in out and "lut_g" in out


def test_inspect_shows_shapes_and_provenance(cli, bidir):
    code, out, _ = cli("inspect", bidir / "q.h5")
    assert code == 0 and "15x4" in out and "fingerprint" in out and "created" in out
    assert "{" not in out  # no Python dict reprs


@pytest.mark.skipif(not has("safetensors"), reason="the sample is .safetensors")
def test_saved_results_and_storage_types(cli, bidir, tmp_path):
    code, _, err = cli("simulate", bidir / "q.h5", bidir / "test.npy", "--save", tmp_path / "r.h5")
    assert code == 0, err
    with h5py.File(tmp_path / "r.h5") as f:
        assert f.attrs["format"] == "qtool-results" and f.attrs["samples"] == 10
        assert f.attrs["qmodel_fingerprint"] == qtool.load(bidir / "q.h5").fingerprint()
        assert len(f.attrs["data_sha256"]) == 64
    with h5py.File(bidir / "q.h5") as f:
        assert f["quant/layer0/fwd/qW"].dtype == np.int8 and f["quant/layer0/fwd/lut_z"].dtype == np.int16


def test_a_long_run_says_its_phases_in_a_log(tmp_path):
    """Outside a terminal (a log, a pipe, CI) the progress bar does not show: each phase of a run
    is a timestamped line on stderr, and the output and an error stay as they are."""
    import os
    import re
    import subprocess
    import sys

    from conftest import ROOT, SAMPLES

    env = {**os.environ, "QTOOL_PROGRESS_LINES": "1", "PYTHONPATH": str(ROOT)}
    done = subprocess.run([sys.executable, "-m", "qtool.cli", "calibrate", str(SAMPLES / "digits_gru.safetensors"),
                           str(SAMPLES / "calib.npy"), "-o", str(tmp_path / "q.h5")], env=env, capture_output=True,
                          text=True)
    assert done.returncode == 0, done.stderr
    lines = [ln for ln in done.stderr.splitlines() if re.match(r"\d\d:\d\d:\d\d GRU auto: ", ln)]
    assert any("least-error method" in ln for ln in lines) and any("single methods" in ln for ln in lines)
    assert not re.search(r"\d\d:\d\d:\d\d (GRU )?auto: ", done.stdout)  # the phases stay off the output


def test_a_phase_said_again_within_seconds_is_one_line(capsys, monkeypatch):
    """An advisor's search calibrates each candidate with the same phases: in a log, a line the
    last 10 s printed is not printed again (hundreds of lines for a whole model's search)."""
    import logging

    from qtool.cli import console

    monkeypatch.setenv("QTOOL_PROGRESS_LINES", "1")
    clock = iter([0.0, 1.0, 2.0, 11.5])
    monkeypatch.setattr(console.time, "monotonic", lambda: next(clock))
    lines = console.PhaseLines()
    for text in ("GRU auto: folds", "GRU auto: folds", "advise: simulation 2", "GRU auto: folds"):
        lines.emit(logging.LogRecord("qtool", logging.INFO, __file__, 0, text, None, None))
    said = [ln.split(" ", 1)[1] for ln in capsys.readouterr().err.splitlines()]
    assert said == ["GRU auto: folds", "advise: simulation 2", "GRU auto: folds"]


def test_a_failed_command_under_json_prints_its_error_as_json(cli):
    """A script reading --json's stdout gets one object either way: the error and the exit code
    (the error line stays on stderr); without --json stdout stays empty."""
    import json

    from conftest import SAMPLES

    code, out, err = cli("simulate", "missing.h5", SAMPLES / "test.npy", "--json")
    assert code == 2 and json.loads(out) == {"error": "model file not found: missing.h5", "exit_code": 2}
    assert err.strip() == "error: model file not found: missing.h5"
    code, out, _ = cli("simulate", "missing.h5", SAMPLES / "test.npy", "--json", "--bogus")
    assert code == 2 and json.loads(out)["error"].startswith("No such option: --bogus")
    code, out, _ = cli("simulate", "missing.h5", SAMPLES / "test.npy")
    assert code == 2 and out == ""
