"""Fuzzing qtool's inputs (tests/fuzz_inputs.py): for every mutated quantized model, framework
file and data file, the command either works or ends with exit 2 and one stderr line; never a
traceback, an "internal error", a crash, a temporary file left behind or unbounded memory.

QTOOL_FUZZ_CASES scales the number of quantized-model mutations (default 160)."""

import os
import random
import resource
import shutil

import numpy as np
import pytest
from conftest import GOLDEN, has
from fuzz_inputs import (
    DATASET_DAMAGE,
    damage_bytes,
    data_cases,
    keras_bomb,
    mutate_h5,
    onnx_lie,
    qmodel_cases,
    safetensors_lie,
)

pytestmark = pytest.mark.skipif(not has("safetensors"), reason="the sample is .safetensors")
CASES = int(os.environ.get("QTOOL_FUZZ_CASES", "160"))
RSS_GROWTH_LIMIT_MB = 1024


def peak_rss_mb() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def check(code: int, out: str, err: str, where, case: str) -> None:
    text = out + err
    assert "Traceback" not in text and "internal error" not in text, (case, err)
    assert code in (0, 1, 2), (case, code, err)
    if code == 2:
        assert len(err.strip().splitlines()) == 1, (case, err)
    leftovers = [p.name for p in where.rglob(".*") if p.is_file()]
    assert not leftovers, (case, leftovers)


def test_mutated_quantized_models(cli, qgru_file, tmp_path):
    start = peak_rss_mb()
    x = qgru_file.parent / "x.npy"
    loaded = refused = 0
    for k, (name, target, damage, is_attr) in enumerate(qmodel_cases(qgru_file, 1, CASES)):
        bad = tmp_path / f"m{k}.h5"
        mutate_h5(qgru_file, bad, target, damage, is_attr)
        code, out, err = cli("inspect", bad)
        check(code, out, err, tmp_path, name)
        if code == 2:
            refused += 1
            assert str(bad) in err, (name, err)  # the message names the file (and the tensor)
            bad.unlink()
            continue
        loaded += 1  # a harmless change (a range bound, a name): everything must still work
        for args in (["simulate", bad, x, "--json"], ["export", "c", bad, "-o", tmp_path / f"c{k}"]):
            code, out, err = cli(*args)
            check(code, out, err, tmp_path, name)
            assert code == 0, (name, err)
        bad.unlink()
        shutil.rmtree(tmp_path / f"c{k}", ignore_errors=True)
    assert refused > CASES // 2 and loaded > 0, (refused, loaded)
    assert peak_rss_mb() - start < RSS_GROWTH_LIMIT_MB


@pytest.mark.parametrize("issue_case", [
    ("quant/layer0/fwd/qR", "cut_cols", False, "qR"), ("quant/layer0/fwd/lut_z", "cut_rows", False, "lut_z"),
    ("quant/layer0/fwd/spec/x/exp2_inv", "poke_huge", False, "exp2_inv"),
    ("quant/layer0/fwd/P", "poke_int_max", False, "P"), ("quant/layer0/fwd/spec/h@zp", "zp_1000", True, "zero point"),
    ("quant/layer0/fwd/spec/x@bits", "bits_64", True, "bits"),
    ("quant/layer0/fwd/spec/x@bits", "bits_3", True, "zero point"),
    ("quant/layer0/fwd/qW", "poke_huge", False, "qW"), ("quant/layer0/fwd/qW", "fractions", False, "qW"),
    ("quant@version", "string", True, "version"), ("quant/layer1/fwd/spec/h/exp2_inv", "grow", False, "exp2_inv"),
])
def test_the_reported_corruptions_are_refused_by_name(cli, qgru_file, tmp_path, issue_case):
    target, damage, is_attr, word = issue_case
    bad = tmp_path / "bad.h5"
    mutate_h5(qgru_file, bad, target, damage, is_attr)
    for args in (["inspect", bad], ["simulate", bad, qgru_file.parent / "x.npy", "--no-per-tensor"],
                 ["export", "c", bad, "-o", tmp_path / "c"], ["verify", bad, tmp_path, qgru_file.parent / "x.npy"]):
        code, out, err = cli(*args)
        check(code, out, err, tmp_path, target)
        assert code == 2 and word in err, (args[0], err)
    assert not (tmp_path / "c").exists()


def test_sh_old_contrib_h_of_200_is_refused(cli, qgru_file, tmp_path):
    import h5py

    from qtool.numerics.rescale import PARAMS

    bad = tmp_path / "bad.h5"
    shutil.copyfile(qgru_file, bad)
    with h5py.File(bad, "r+") as f:
        f["quant/layer0/fwd/P"][PARAMS.index("sh_old_contrib_h")] = 200
    code, out, err = cli("simulate", bad, qgru_file.parent / "x.npy")
    assert code == 2 and "sh_old_contrib_h = 200" in err


def framework_files():
    files = [GOLDEN / "torch_single.safetensors", GOLDEN / "torch_stacked.safetensors", GOLDEN / "keras_stack.keras"]
    if has("onnx"):
        files.append(GOLDEN / "onnx_bidir.onnx")
    if has("torch"):
        files += [GOLDEN / "torch_single.pt", GOLDEN / "torch_bidir.pt"]
    return files


def test_mutated_framework_files(cli, tmp_path):
    start = peak_rss_mb()
    rng = random.Random(3)
    for src in framework_files():
        data = src.read_bytes()
        variants = [(f"bytes{k}", damage_bytes(data, rng)) for k in range(12)]
        if src.suffix == ".safetensors":
            variants += [(f"lie{k}", safetensors_lie(data, rng)) for k in range(6)]
        if src.suffix == ".onnx":
            variants += [(f"lie{k}", onnx_lie(src, rng)) for k in range(6)]
        for name, blob in variants:
            bad = tmp_path / f"bad{src.suffix}"
            bad.write_bytes(blob)
            code, out, err = cli("import", bad, "-o", tmp_path / "m.h5", "--force")
            check(code, out, err, tmp_path, f"{src.name}:{name}")
            if code == 0:  # damage the importer cannot see must still give a valid model
                code, out, err = cli("inspect", tmp_path / "m.h5")
                assert code == 0, (src.name, name, err)
    assert peak_rss_mb() - start < RSS_GROWTH_LIMIT_MB


def test_zip_bomb_keras_is_refused_in_bounded_memory(cli, tmp_path):
    bomb = tmp_path / "bomb.keras"
    bomb.write_bytes(keras_bomb())
    assert bomb.stat().st_size < 2 << 20
    start = peak_rss_mb()
    code, out, err = cli("import", bomb, "-o", tmp_path / "m.h5")
    check(code, out, err, tmp_path, "keras bomb")
    assert code == 2 and not (tmp_path / "m.h5").exists()
    assert peak_rss_mb() - start < 128, "the bomb was inflated in memory"


REFUSED = ("npy_huge_shape", "npy_truncated", "npy_complex", "npy_object", "npy_bad_header",
           "npy_long_sequence", "npy_inf", "npz_lying_member", "h5_strings", "h5_huge_declared")
BEYOND_EVERY_GRID = ("npy_1e30", "npy_pm_1e30", "npy_int64_extremes")  # simulate saturates them; calibrate refuses


def test_odd_data_files(cli, qgru_file, tmp_path):
    start = peak_rss_mb()
    good = np.load(qgru_file.parent / "x.npy")
    for name, suffix, write in data_cases(good):
        path = tmp_path / f"{name}{suffix}"
        write(path)
        for args in (["simulate", qgru_file, path, "--limit", "2", "--no-per-tensor"],
                     ["calibrate", qgru_file, path, "-o", tmp_path / "q.h5", "--limit", "2", "--force"]):
            code, out, err = cli(*args)
            check(code, out, err, tmp_path, name)
            if name in REFUSED or (args[0] == "calibrate" and name in BEYOND_EVERY_GRID):
                assert code == 2, (name, args[0], out)
        path.unlink()
    assert peak_rss_mb() - start < RSS_GROWTH_LIMIT_MB


def test_every_damage_kind_is_exercised():
    assert len(DATASET_DAMAGE) >= 10


def test_a_file_named_h5_that_is_no_hdf5_is_said_so(cli, qgru_file, tmp_path):
    """A .h5 that is not HDF5 at all (text, a download error page) is named as such by every
    command that reads a model, not blamed on Keras; one cut short says that."""
    bad = tmp_path / "bad.h5"
    bad.write_text("<html>404</html>")
    for args in (["inspect", bad], ["simulate", bad, qgru_file.parent / "x.npy"],
                 ["calibrate", bad, qgru_file.parent / "x.npy", "-o", tmp_path / "q.h5"]):
        code, out, err = cli(*args)
        assert code == 2 and "not an HDF5 file" in err and "Keras" not in err.split("(")[0], (args[0], err)
    cut = tmp_path / "cut.h5"
    cut.write_bytes(qgru_file.read_bytes()[:100])
    code, _, err = cli("inspect", cut)
    assert code == 2 and "truncated" in err, err
