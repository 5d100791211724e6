"""End-to-end CLI runs on the bundled sample, and every kind of bad input: one line, non-zero
exit, no traceback, no partial output."""

import json
import shutil

import h5py
import numpy as np
import pytest
from conftest import SAMPLES, has

pytestmark = pytest.mark.skipif(not has("safetensors"), reason="the sample is .safetensors")
MODEL = SAMPLES / "digits_gru.safetensors"


@pytest.fixture(scope="module")
def qmodel(tmp_path_factory):
    from qtool.cli.app import main

    d = tmp_path_factory.mktemp("q")
    with pytest.raises(SystemExit) as e:
        main(["import", str(MODEL), "-o", str(d / "m.h5")])
    assert e.value.code in (0, None)
    with pytest.raises(SystemExit) as e:
        main(["calibrate", str(d / "m.h5"), str(SAMPLES / "calib.npy"), "-o", str(d / "q.h5")])
    assert e.value.code in (0, None)
    return d / "q.h5"


def test_import_calibrate_simulate_json_and_save(cli, qmodel, tmp_path):
    code, out, err = cli("simulate", qmodel, SAMPLES / "test.npy", "--json", "--save",
                         tmp_path / "r.h5")
    assert code == 0, err
    res = json.loads(out)
    assert res["output"]["cosine"] > 0.99 and res["samples"] == 597
    assert "layer1.fwd.g_pre" in res["tensors"] and len(res["per_step_snr_db"]) == 8
    with h5py.File(tmp_path / "r.h5") as f:
        y, yq, yi = f["float/y"][()], f["quant/y"][()], f["quant/y_int"][()]
    assert y.shape == yq.shape == yi.shape == (597, 8, 64)
    assert yi.dtype == np.int32 and np.abs(yq - y).max() < 1.0


def test_calibrate_json_holds_objects_not_encoded_text(cli, tmp_path):
    """--json gives the bits config as an object (the model file keeps it as JSON text)."""
    from qtool import api

    code, out, err = cli("calibrate", SAMPLES / "digits_gru.safetensors", SAMPLES / "calib.npy", "-o",
                         tmp_path / "q.h5", "--method", "minmax", "--bits", "w8a16", "--json")
    assert code == 0, err
    doc = json.loads(out)
    assert doc["bits_config"]["h"]["bits"] == 16 and doc["bits_config"]["W"]["bits"] == 8
    assert doc["bits_config"] == json.loads(api.load(tmp_path / "q.h5").info["bits_config"])


def test_tables_and_inspect(cli, qmodel, tmp_path):
    code, out, _ = cli("simulate", qmodel, SAMPLES / "test.npy", "--limit", "50")
    assert code == 0 and "output" in out and "SNR dB" in out
    code, out, _ = cli("inspect", qmodel)
    assert code == 0 and "exp2_inv" in out and "lut_g" in out
    code, out, _ = cli("inspect", qmodel, "--json")
    info = json.loads(out)
    assert info["quantized"] and info["quant"]["method"].startswith("auto") and info["quant"]["samples"] == 400
    code, out, _ = cli("import", SAMPLES / "digits_gru.safetensors", "-o", tmp_path / "m.h5", "--json")
    got = json.loads(out)
    assert code == 0 and got["output"] == str(tmp_path / "m.h5") and got["left_out"] == ["head (2 tensors)"]
    assert (got["num_layers"], got["input_size"], got["hidden_size"]) == (2, 8, 64)
    assert got["check"]["checked"] == has("torch")  # checked against PyTorch where it is installed
    code, out, _ = cli("inspect", SAMPLES / "digits_gru.safetensors", "--json")  # a GRU and a dense head
    assert code == 0 and json.loads(out)["notes"] == [
        "took the GRU (gru); left out, not quantized: head (2 tensors) (qtool quantizes the GRU alone)"]
    code, out, err = cli("export")  # a group alone: its help, as `qtool` alone
    assert code == 0 and "qtool export [OPTIONS] COMMAND" in out and not err.strip()


def test_calibrate_directly_from_source_with_presets_and_ema(cli, tmp_path):
    for bits in ("w8a16", "int16"):
        code, out, err = cli("calibrate", MODEL, SAMPLES / "calib.npy", "-o", tmp_path / "q.h5",
                             "--bits", bits, "--method", "ema", "--force", "--json")
        assert code == 0, err
        rows = json.loads(out)["tensors"]
        assert {r["bits"] for r in rows if r["tensor"] == "g_pre"} == {16}


def bad_data(tmp_path):
    good = np.load(SAMPLES / "test.npy")[:10]
    nan = good.copy()
    nan[3, 2, 1] = np.nan
    cases = {
        "shape.npy": (np.zeros((10, 8)), "must be 3-D"),
        "features.npy": (np.zeros((4, 8, 5), np.float32), "feature size 5"),
        "nan.npy": (nan, "sequence 3 contains NaN"),
        "strings.npy": (np.array([[["a"]]]), "numeric"),
    }
    for name, (arr, _) in cases.items():
        np.save(tmp_path / name, arr)
    (tmp_path / "empty.npy").write_bytes(b"")
    cases["empty.npy"] = (None, "empty")
    (tmp_path / "corrupt.h5").write_bytes(b"\x89HDF\r\n\x1a\n" + b"garbage" * 10)
    cases["corrupt.h5"] = (None, "cannot read data file")
    (tmp_path / "data.csv").write_text("1,2\n")
    cases["data.csv"] = (None, "unknown data format")
    return cases


def test_bad_data_one_line_no_output(cli, qmodel, tmp_path):
    for name, (_, msg) in bad_data(tmp_path).items():
        for cmd in (["calibrate", MODEL, tmp_path / name, "-o", tmp_path / "out.h5"],
                    ["simulate", qmodel, tmp_path / name, "--save", tmp_path / "out.h5"]):
            code, out, err = cli(*cmd)
            assert code == 2, (name, err)
            assert msg in err and "Traceback" not in err + out, (name, err)
            assert len(err.strip().splitlines()) == 1, err
            assert not (tmp_path / "out.h5").exists()
            assert not list(tmp_path.glob(".out.h5*"))  # no temporary left behind


def test_a_quantized_file_calibrated_again_is_said(cli, qmodel, tmp_path):
    """calibrate and advise take the float model a quantized file holds; they say so."""
    said = f"note: {qmodel.name} is a quantized model already: its float model was calibrated again"
    code, out, err = cli("calibrate", qmodel, SAMPLES / "calib.npy", "-o", tmp_path / "again.h5", "--method", "minmax",
                         "--json")
    assert code == 0 and said in err, err
    assert json.loads(out)["notes"][0].startswith(f"{qmodel.name} is a quantized model already")
    code, out, err = cli("advise", qmodel, SAMPLES / "calib.npy", "--limit", 40)
    assert code == 0 and said in err, err
    code, out, err = cli("calibrate", MODEL, SAMPLES / "calib.npy", "-o", tmp_path / "q.h5", "--method", "minmax")
    assert code == 0 and "quantized model already" not in err, err


def test_bad_model_files(cli, tmp_path):
    (tmp_path / "corrupt.h5").write_bytes(b"not hdf5 at all")
    (tmp_path / "empty.h5").write_bytes(b"")
    (tmp_path / "x.onnx").write_bytes(b"\x00\x01garbage")
    (tmp_path / "x.pt").write_bytes(b"garbage")
    from qtool import api

    api.save(api.load_model(MODEL, check=False), tmp_path / "q0.h5")  # a model where the data go
    cases = [
        (["inspect", tmp_path / "corrupt.h5"], "not an HDF5 file"),
        (["inspect", tmp_path / "missing.h5"], "model file not found"),
        (["simulate", tmp_path / "missing.h5", SAMPLES / "test.npy"], "model file not found"),
        (["export", "c", tmp_path / "missing.h5", "-o", tmp_path / "c"], "model file not found"),
        (["export", "c", tmp_path / "corrupt.h5", "-o", tmp_path / "c"], "not an HDF5 file"),
        (["simulate", tmp_path / "corrupt.h5", SAMPLES / "test.npy"], "not an HDF5 file"),
        (["inspect", tmp_path / "empty.h5"], "is empty (0 bytes), not a model file"),
        (["simulate", MODEL, SAMPLES / "test.npy"], "a safetensors file, not a quantized model"),
        (["import", tmp_path / "x.weird", "-o", tmp_path / "m.h5"], "not found"),
        (["import", SAMPLES / "calib.npy", "-o", tmp_path / "m.h5", "--format", "nope"], "unknown format"),
        (["calibrate", MODEL, SAMPLES / "calib.npy", "-o", tmp_path / "q.h5", "--bits", "int3"],
         "neither a preset"),
        (["calibrate", MODEL, SAMPLES / "calib.npy", "-o", tmp_path / "q.h5", "--method", "magic"],
         "unknown method"),
        (["calibrate", MODEL, tmp_path, "-o", tmp_path / "q.h5"], f"{tmp_path} is a directory, not a data file"),
        (["calibrate", MODEL, SAMPLES / "calib.npy", "-o", tmp_path / "q.h5", "--method", "minmax", "--percentile",
          "99"], "--percentile goes with the percentile method (auto and per-edge try it too); minmax takes none"),
    ]
    if has("onnx"):
        cases.append((["import", tmp_path / "x.onnx", "-o", tmp_path / "m.h5"], "not a readable ONNX"))
    if has("torch"):
        cases.append((["import", tmp_path / "x.pt", "-o", tmp_path / "m.h5"],
                      "not a PyTorch file (neither torch.save's zip archive nor a pickle)"))
        cases.append((["import", SAMPLES / "digits.onnx", "--format", "torch", "-o", tmp_path / "m.h5"],
                      "digits.onnx: not a PyTorch file"))
    cases += [(["calibrate", MODEL, tmp_path / "q0.h5", "-o", tmp_path / "q.h5"], "a qtool model file (qtool-gru), "
               "not data; the model comes first")]
    for args, msg in cases:
        code, out, err = cli(*args)
        assert code == 2 and msg in err and "Traceback" not in err, (args, err)
        assert not (tmp_path / "m.h5").exists() and not (tmp_path / "q.h5").exists()


def test_missing_optional_package(cli, tmp_path, monkeypatch):
    import sys

    monkeypatch.setitem(sys.modules, "onnx", None)
    code, _, err = cli("import", tmp_path / "m.onnx", "-o", tmp_path / "m.h5")
    assert code == 2 and "not found" in err
    (tmp_path / "m.onnx").write_bytes(b"x")
    code, _, err = cli("import", tmp_path / "m.onnx", "-o", tmp_path / "m.h5")
    assert code == 2 and "needs the 'onnx' package" in err


def test_no_prompt_without_terminal_and_no_clobber(cli, qmodel, tmp_path):
    code, _, err = cli("calibrate", MODEL)
    assert code == 2 and "missing DATA" in err
    (tmp_path / "q.h5").write_bytes(b"keep me")
    for force in ([], ["--force"]):  # a file qtool did not write is never replaced
        code, _, err = cli("calibrate", MODEL, SAMPLES / "calib.npy", "-o", tmp_path / "q.h5", *force)
        assert code == 2 and "not written by qtool" in err
        assert (tmp_path / "q.h5").read_bytes() == b"keep me"
    shutil.copyfile(qmodel, tmp_path / "mine.h5")  # one qtool wrote: replaced with --force only
    code, _, err = cli("calibrate", MODEL, SAMPLES / "calib.npy", "-o", tmp_path / "mine.h5")
    assert code == 2 and "--force" in err
    code, _, err = cli("calibrate", MODEL, SAMPLES / "calib.npy", "-o", tmp_path / "mine.h5", "--force")
    assert code == 0, err


def test_prompts_at_a_terminal(qmodel, tmp_path, monkeypatch):
    from typer.testing import CliRunner

    from qtool.cli import app as cli_mod
    from qtool.cli import console

    monkeypatch.setattr(console, "interactive", lambda: True)
    runner = CliRunner()
    res = runner.invoke(cli_mod.app, ["calibrate", str(MODEL)],
                        input=f"{SAMPLES / 'calib.npy'}\n{tmp_path / 'q.h5'}\n")
    assert res.exit_code == 0, res.output
    assert "calibration data file" in res.output and (tmp_path / "q.h5").exists()
    res = runner.invoke(cli_mod.app, ["calibrate", str(MODEL), str(SAMPLES / "calib.npy"),
                                      "-o", str(tmp_path / "q.h5")], input="n\n")
    assert res.exit_code != 0 and "Overwrite?" in res.output and "was not overwritten" in str(res.exception)


def test_compare_scores_each_method_like_a_separate_run(cli, tmp_path):
    """--compare calibrates all methods in one float pass; each row must equal what calibrate
    --method M followed by simulate gives on the same held-out data."""
    code, out, err = cli("calibrate", MODEL, SAMPLES / "calib.npy", "--compare", "minmax,mse",
                         "--eval", SAMPLES / "test.npy", "-o", tmp_path / "best.h5", "--json")
    assert code == 0, err
    res = json.loads(out)
    rows = {r["method"]: r for r in res["methods"]}
    for m in ("minmax", "mse"):
        code, _, err = cli("calibrate", MODEL, SAMPLES / "calib.npy", "--method", m, "-o", tmp_path / f"{m}.h5")
        assert code == 0, err
        code, out, err = cli("simulate", tmp_path / f"{m}.h5", SAMPLES / "test.npy", "--json", "--no-per-tensor")
        assert code == 0, err
        assert json.loads(out)["output"] == pytest.approx({k: v for k, v in rows[m].items() if k != "method"})
    best = max(rows.values(), key=lambda r: r["snr_db"])["method"]
    assert res["best"] == best
    code, out, _ = cli("inspect", tmp_path / "best.h5", "--json")
    assert json.loads(out)["quant"]["method"] == best


def test_compare_limit_bounds_the_scoring_and_shared_sequences_are_said(cli, tmp_path):
    """--limit N calibrates on N sequences and scores on N, and says so; --eval holding some of
    the calibration sequences (a copy, or a file built from the same data) warns how many of the
    scored ones are not held out."""
    calib, test = np.load(SAMPLES / "calib.npy"), np.load(SAMPLES / "test.npy")
    copy = tmp_path / "copy.npy"
    copy.write_bytes((SAMPLES / "calib.npy").read_bytes())
    code, out, err = cli("calibrate", MODEL, SAMPLES / "calib.npy", "--compare", "minmax", "--eval", copy,
                         "--limit", 7, "--json")
    assert code == 0, err
    assert "every held-out sequence is also in the calibration data" in err
    assert json.loads(out)["scored_sequences"] == 7
    code, sim, err = cli("calibrate", MODEL, SAMPLES / "calib.npy", "--method", "minmax", "--limit", 7,
                         "-o", tmp_path / "q.h5")
    assert code == 0, err
    code, sim, err = cli("simulate", tmp_path / "q.h5", copy, "--limit", 7, "--json", "--no-per-tensor")
    assert code == 0, err
    row = json.loads(out)["methods"][0]
    assert json.loads(sim)["output"] == pytest.approx({k: v for k, v in row.items() if k != "method"})
    mixed = tmp_path / "mixed.npy"  # calibration sequences 3..9, then held-out ones: 3..6 are within --limit 7
    np.save(mixed, np.concatenate([calib[3:10], test[:5]]))
    code, out, err = cli("calibrate", MODEL, SAMPLES / "calib.npy", "--compare", "minmax", "--eval", mixed,
                         "--limit", 7)
    assert code == 0 and "4 of the 7 held-out sequences are also in the calibration data" in err, err
    assert "scored on 7 of mixed.npy" in " ".join(out.split())
    code, _, err = cli("calibrate", MODEL, SAMPLES / "calib.npy", "--compare", "minmax", "--eval",
                       SAMPLES / "test.npy", "--limit", 7, "--json")
    assert code == 0 and "held-out" not in err


def test_compare_and_method_errors(cli, tmp_path):
    for args, msg in ((("--compare", "minmax,kl"), "--compare needs --eval"),
                      (("--compare", "minmax,nope", "--eval", SAMPLES / "test.npy"), "unknown method 'nope'"),
                      (("--compare", "mse,mse", "--eval", SAMPLES / "test.npy"), "distinct methods"),
                      (("--method-weights", "bogus", "-o", tmp_path / "q.h5"), "unknown --method-weights 'bogus'"),
                      (("--method", "kl", "--compare", "minmax,mse", "--eval", SAMPLES / "test.npy"),
                       "--method and --compare")):
        code, out, err = cli("calibrate", MODEL, SAMPLES / "calib.npy", *args)
        assert code == 2 and msg in err and "Traceback" not in err + out
    assert not (tmp_path / "q.h5").exists()


def test_weight_methods_and_per_tensor_methods(cli, tmp_path):
    """--method-weights mse picks, per output channel, a scale at least as fine as min/max and
    finer on some channels; a config file sets a method per tensor."""
    cfg = tmp_path / "bits.json"
    cfg.write_text(json.dumps({"preset": "int8", "tensors": {"h": {"method": "mse"}}}))
    specs = {}
    for name, args in (("mm", ()), ("w", ("--method-weights", "mse")), ("cfg", ("--bits", cfg))):
        code, _, err = cli("calibrate", MODEL, SAMPLES / "calib.npy", "-o", tmp_path / f"{name}.h5", *args)
        assert code == 0, err
        from qtool.io.qmodel_file import load_qmodel

        specs[name] = load_qmodel(tmp_path / f"{name}.h5")
    for l in range(2):
        a, b = specs["mm"].cells[l][0].spec, specs["w"].cells[l][0].spec
        for t in ("W", "R"):
            assert (b[t].exp2_inv >= a[t].exp2_inv).all() and (b[t].exp2_inv > a[t].exp2_inv).any()
        assert b["Wx"].exp2_inv == a["Wx"].exp2_inv  # activations untouched
    assert "h mse" in specs["cfg"].info["method"]
    assert specs["cfg"].cells[0][0].spec["h"].exp2_inv >= specs["mm"].cells[0][0].spec["h"].exp2_inv
    cfg.write_text(json.dumps({"tensors": {"bx": {"method": "mse"}}}))
    code, _, err = cli("calibrate", MODEL, SAMPLES / "calib.npy", "-o", tmp_path / "x.h5", "--bits", cfg)
    assert code == 2 and "keeps its min/max range" in err
