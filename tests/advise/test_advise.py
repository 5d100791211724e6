"""`qtool advise` end to end on a small GRU: the bits file it writes, re-run independently
through `calibrate --bits` and `simulate`, reaches the target with the flash it reported and no
more flash than a preset that reaches it; bad input gives one line, a non-zero exit, no file."""

import json

import numpy as np
import pytest
from conftest import random_model

from qtool.core.model import open_h5, write_model


@pytest.fixture(scope="module")
def files(tmp_path_factory):
    d = tmp_path_factory.mktemp("advise")
    with open_h5(d / "m.h5", "w") as f:
        write_model(f, random_model(C=6, H=12, layers=2, seed=5, scale=0.7))
    rng = np.random.default_rng(0)
    for name, n in (("calib", 96), ("test", 64)):
        x = rng.laplace(0.0, 1.0, (n, 12, 6))
        np.save(d / f"{name}.npy", np.where(rng.random(x.shape) < 0.002, 8 * x, x).astype(np.float32))
    return d


@pytest.fixture(scope="module")
def target_run(files):
    """One search: the target sits 6 dB above what all-int8 measures (int8 misses it)."""
    from qtool.cli.app import main

    def run(*args):
        try:
            main([str(a) for a in args])
        except SystemExit as e:
            assert e.code in (0, None), e.code

    import contextlib
    import io

    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        run("advise", files / "m.h5", files / "calib.npy", "--eval", files / "test.npy", "--json")
    rule = json.loads(out.getvalue())
    target = round(rule["presets"]["int8"]["snr_db"] + 6.0, 1)
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        run("advise", files / "m.h5", files / "calib.npy", "--eval", files / "test.npy",
            "--target-snr", target, "-o", files / "bits.toml", "--json")
    return target, json.loads(out.getvalue())


def test_the_bits_file_reproduces_the_reported_snr_and_flash(cli, files, target_run):
    target, res = target_run
    assert res["bits_file"] == str(files / "bits.toml") and res["mode"] == "target"
    assert res["measured_snr_db"] >= target and res["simulations"] > 0
    code, _, err = cli("calibrate", files / "m.h5", files / "calib.npy", "--bits", files / "bits.toml",
                       "-o", files / "q.h5")
    assert code == 0, err
    code, out, err = cli("simulate", files / "q.h5", files / "test.npy", "--json")
    assert code == 0, err
    snr = json.loads(out)["output"]["snr_db"]
    assert snr == pytest.approx(res["measured_snr_db"], abs=1e-9) and snr >= target
    code, out, err = cli("export", "c", files / "q.h5", "-o", files / "c", "--json")
    assert code == 0, err
    assert json.loads(out)["flash_bytes"] == res["flash_bytes"]


def test_the_search_spends_no_more_flash_than_a_preset(target_run):
    target, res = target_run
    presets = res["presets"]
    assert presets["int8"]["snr_db"] < target  # int8 misses: something was promoted
    reaching = [p["flash_bytes"] for p in presets.values() if p["snr_db"] >= target]
    assert res["flash_bytes"] <= min(reaching)
    if presets["int16"]["snr_db"] > target:
        assert res["flash_bytes"] < presets["int16"]["flash_bytes"]
    assert 0 < res["int16_tensors"] < res["unit_count"] == 31  # the sample's units (docs/advisor.md)


def test_report_rows_and_json(target_run):
    _, res = target_run
    rows = res["tensors"]
    assert len(rows) == 2 * 18  # every tensor of the tensor table, per layer
    keys = {"layer", "direction", "tensor", "mu", "sigma", "M", "p_zero_8", "p_zero_16", "predicted_seed_db",
            "predicted_grid_db", "measured_snr_db", "bits", "method"}
    assert all(keys <= set(r) for r in rows)
    for r in rows:
        assert 0 <= r["p_zero_16"] <= r["p_zero_8"] <= 1 and r["M"] >= abs(r["mu"])
    assert {r["bits"] for r in rows if r["tensor"] in ("bx", "br")} == {32}
    assert {r["bits"] for r in rows} >= {8, 16}


def test_budget_gives_the_best_measured_snr_within_it(cli, files, target_run):
    _, res = target_run
    budget = (res["presets"]["int8"]["flash_bytes"] + res["presets"]["int16"]["flash_bytes"]) // 2
    code, out, err = cli("advise", files / "m.h5", files / "calib.npy", "--eval", files / "test.npy",
                         "--max-flash", budget, "--json")
    assert code == 0, err
    got = json.loads(out)
    assert got["flash_bytes"] <= budget and got["measured_snr_db"] >= got["presets"]["int8"]["snr_db"]


def test_estimates_are_seeded(cli, files):
    runs = []
    for s in (1, 1, 2):
        code, out, err = cli("advise", files / "m.h5", files / "calib.npy", "--seed", s, "--json")
        assert code == 0, err
        runs.append([(r["mu"], r["sigma"]) for r in json.loads(out)["tensors"]])
    assert runs[0] == runs[1] and runs[0] != runs[2]


@pytest.mark.parametrize("extra,message", [
    (("--target-snr", "30"), "--target-snr needs --eval"),
    (("--eval", "TEST", "--target-snr", "300"), "no configuration reaches 300 dB"),
    (("--eval", "TEST", "--max-flash", "100"), "below the all-int8 flash"),
    (("--eval", "TEST", "--target-snr", "300", "--max-flash", "100"), "below the all-int8 flash"),
    (("--max-flash", "100"), "--max-flash needs --eval"),
])
def test_bad_input_is_one_line_and_writes_nothing(cli, files, extra, message):
    args = [files / "test.npy" if a == "TEST" else a for a in extra]
    out_file = files / "never.toml"
    code, out, err = cli("advise", files / "m.h5", files / "calib.npy", *args, "-o", out_file)
    assert code == 2 and message in err and len(err.strip().splitlines()) == 1, err
    assert "Traceback" not in err and not out_file.exists()
    if "no configuration" in message:
        assert "best measured is" in err


def test_limit_bounds_the_held_out_data_as_the_calibration(cli, files):
    """`--limit 20`: the first 20 sequences calibrate and the first 20 of --eval measure, as
    `calibrate --limit 20` and `simulate --limit 20` of its bits file do."""
    bits = files / "limit.toml"
    code, out, err = cli("advise", files / "m.h5", files / "calib.npy", "--eval", files / "test.npy",
                         "--limit", 20, "-o", bits, "--json")
    assert code == 0, err
    res = json.loads(out)
    assert res["measured_on"].startswith("20 test sequences")
    code, _, err = cli("calibrate", files / "m.h5", files / "calib.npy", "--bits", bits, "--limit", 20,
                       "-o", files / "limit.h5")
    assert code == 0, err
    code, out, err = cli("simulate", files / "limit.h5", files / "test.npy", "--limit", 20, "--json")
    assert code == 0, err
    assert json.loads(out)["output"]["snr_db"] == pytest.approx(res["measured_snr_db"], abs=1e-9)
