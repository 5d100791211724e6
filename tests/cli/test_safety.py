"""Outputs never destroy what qtool did not write; full disks, read-only places and signals end in
one line with nothing left behind; no input wraps around; JSON is JSON; a stale export is named."""

import json
import os
import shutil
import signal
import stat
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest
from conftest import SAMPLES, has

pytestmark = pytest.mark.skipif(not has("safetensors"), reason="the sample is .safetensors")
MODEL = SAMPLES / "digits_gru.safetensors"


def one_error_line(err: str) -> bool:
    return len(err.strip().splitlines()) == 1 and "Traceback" not in err and "internal error" not in err


def test_export_into_a_firmware_tree_replaces_only_its_own_files(cli, qgru_file, tmp_path):
    src = tmp_path / "fw" / "src"
    src.mkdir(parents=True)
    (src / "main.c").write_text("int main(void) { return 0; }\n")
    (src / "notes.txt").write_text("mine\n")
    os.chmod(src, 0o755)
    code, out, err = cli("export", "c", qgru_file, "-o", src, "--name", "digits")
    assert code == 0, err
    assert (src / "main.c").read_text().startswith("int main") and (src / "notes.txt").read_text() == "mine\n"
    assert stat.S_IMODE(src.stat().st_mode) == 0o755
    ours = {"digits.c", "digits.h", "digits_params.h", "digits_params.c", "qgru.c", "qgru.h"}
    assert {p.name for p in src.iterdir()} == ours | {"main.c", "notes.txt"}
    code, _, err = cli("export", "c", qgru_file, "-o", src, "--name", "digits")  # again: needs --force
    assert code == 2 and "--force" in err and "digits.c" in err and one_error_line(err)
    code, out, err = cli("export", "c", qgru_file, "-o", src, "--name", "digits", "--force")
    assert code == 0 and "replaced" in out and "edited" not in err
    params = src / "digits_params.c"  # a hand edit: a replacement says what it overwrote
    params.write_text(params.read_text().replace("{", "{ /* tuned */", 1))
    code, _, err = cli("export", "c", qgru_file, "-o", src, "--name", "digits")
    assert code == 2 and "digits_params.c edited since qtool wrote it" in err and one_error_line(err)
    code, out, err = cli("export", "c", qgru_file, "-o", src, "--name", "digits", "--force", "--json")
    assert code == 0 and json.loads(out)["edited"] == ["digits_params.c"]
    assert err.strip() == "warning: digits_params.c had been edited since qtool wrote it; this export replaced it"
    assert "tuned" not in params.read_text()
    with open(src / "digits.h", "a") as f:  # a line added after the seal is an edit too
        f.write("#define MINE 1\n")
    code, _, err = cli("export", "c", qgru_file, "-o", src, "--name", "digits", "--force")
    assert code == 0 and "digits.h had been edited since qtool wrote it" in err
    assert {p.name for p in src.iterdir()} == ours | {"main.c", "notes.txt"}
    assert not [p for p in src.iterdir() if p.name.startswith(".")]  # no temporaries
    runtime = {n: (src / n).stat().st_mtime_ns for n in ("qgru.c", "qgru.h")}
    code, _, err = cli("export", "c", qgru_file, "-o", src, "--name", "second")  # the runtime is shared as it is
    assert code == 0, err
    assert {n: (src / n).stat().st_mtime_ns for n in runtime} == runtime and (src / "second.c").is_file()
    for n in ("second.c", "second.h", "second_params.c", "second_params.h"):
        (src / n).unlink()
    (src / "other.c").write_text("/* hand written */\n")  # a file of the export's names, not ours
    code, _, err = cli("export", "c", qgru_file, "-o", src, "--name", "other", "--force")
    assert code == 2 and "not written by qtool" in err and one_error_line(err)
    assert (src / "other.c").read_text() == "/* hand written */\n" and not (src / "other.h").exists()
    assert "or --name)" in err  # another name would help
    fw = tmp_path / "fw2"
    fw.mkdir()
    (fw / "qgru.c").write_text("/* a file of the runtime's name */\n")  # no name renames the runtime's
    code, _, err = cli("export", "c", qgru_file, "-o", fw)
    assert code == 2 and "--name does not rename the runtime's files" in err and one_error_line(err), err
    script = tmp_path / "analyse.py"  # names qtool, but qtool did not write it
    script.write_text("import qtool\nqm = qtool.load('q.h5')\n")
    code, _, err = cli("export", "json", qgru_file, "-o", script, "--force")
    assert code == 2 and "not written by qtool" in err and script.read_text().startswith("import qtool")
    code, _, err = cli("export", "json", qgru_file, "-o", tmp_path / "p.json")
    assert code == 0, err
    code, _, err = cli("export", "json", qgru_file, "-o", tmp_path / "p.json", "--force")  # its own output
    assert code == 0, err


def test_export_into_the_current_directory(qgru_file, tmp_path):
    (tmp_path / "keep.txt").write_text("x")
    res = subprocess.run([sys.executable, "-m", "qtool.cli", "export", "c", str(qgru_file), "-o", ".",
                          "--name", "m"], cwd=tmp_path, capture_output=True, text=True)
    assert res.returncode == 0, res.stderr
    assert (tmp_path / "m.c").is_file() and (tmp_path / "keep.txt").read_text() == "x"
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(".")]


def test_names_that_collide_with_the_runtime_or_inputs_are_refused(cli, qgru_file, tmp_path):
    code, _, err = cli("export", "c", qgru_file, "-o", tmp_path / "c", "--name", "qgru")
    assert code == 2 and "runtime" in err and not (tmp_path / "c").exists()
    data = tmp_path / "data.npy"
    np.save(data, np.load(SAMPLES / "test.npy")[:5])
    before = data.read_bytes()
    code, _, err = cli("simulate", qgru_file, data, "--save", data, "--force")
    assert code == 2 and "also an input" in err and data.read_bytes() == before
    code, _, err = cli("calibrate", qgru_file, data, "-o", qgru_file, "--force")
    assert code == 2 and "also an input" in err


def test_outputs_get_the_permissions_of_a_plain_write(qgru_file, tmp_path):
    old = os.umask(0o027)
    try:
        res = subprocess.run([sys.executable, "-m", "qtool.cli", "export", "json", str(qgru_file), "-o",
                              str(tmp_path / "p.json")], capture_output=True, text=True)
        assert res.returncode == 0, res.stderr
        res = subprocess.run([sys.executable, "-m", "qtool.cli", "export", "c", str(qgru_file), "-o",
                              str(tmp_path / "c")], capture_output=True, text=True)
        assert res.returncode == 0, res.stderr
    finally:
        os.umask(old)
    assert stat.S_IMODE((tmp_path / "p.json").stat().st_mode) == 0o640
    assert stat.S_IMODE((tmp_path / "c").stat().st_mode) == 0o750
    assert {stat.S_IMODE(p.stat().st_mode) for p in (tmp_path / "c").iterdir()} == {0o640}


@pytest.mark.parametrize("limit", ["0", "-5"])
def test_limits_below_one_are_refused(cli, qgru_file, tmp_path, limit):
    for cmd in (["calibrate", MODEL, SAMPLES / "calib.npy", "-o", tmp_path / "q.h5"],
                ["simulate", qgru_file, SAMPLES / "test.npy"]):
        code, out, err = cli(*cmd, "--limit", limit)
        assert code == 2 and "limit" in err and one_error_line(err), err
    assert not (tmp_path / "q.h5").exists()
    from qtool import api
    from qtool.errors import QtoolError

    with pytest.raises(QtoolError, match="limit"):
        api.simulate(qgru_file, SAMPLES / "test.npy", limit=int(limit))


def test_json_is_strict_json_even_for_exact_tensors(cli, tmp_path):
    from qtool import api

    q = tmp_path / "q.h5"
    api.save(api.calibrate(MODEL, SAMPLES / "calib.npy", bits="int16"), q)
    code, out, err = cli("simulate", q, SAMPLES / "test.npy", "--limit", "20", "--json")
    assert code == 0, err

    def no_constants(name):
        raise ValueError(f"not JSON: {name}")
    res = json.loads(out, parse_constant=no_constants)
    exact = [k for k, m in res["tensors"].items() if m["exact"]]
    assert exact and all(res["tensors"][k]["snr_db"] is None for k in exact)  # int16 weights of small rows


def test_verify_names_a_stale_export(cli, qgru_file, tmp_path):
    from qtool import api

    q = tmp_path / "q.h5"
    shutil.copyfile(qgru_file, q)
    assert cli("export", "c", q, "-o", tmp_path / "c", "--name", "digits")[0] == 0
    api.save(api.calibrate(MODEL, SAMPLES / "calib.npy", method="minmax"), q, force=True)
    code, _, err = cli("verify", q, tmp_path / "c", SAMPLES / "test.npy", "--limit", "3")
    assert code == 2 and "made from another model" in err and one_error_line(err)


@pytest.mark.parametrize("x", [1e18, 1e30, float(np.finfo(np.float32).max), 8e16])
def test_quantize_saturates_instead_of_wrapping(x):
    from qtool.numerics.qparams import quantize

    for bits, zp in ((8, -65), (16, 100)):
        q = quantize(np.array([-x, x, -x], np.float64), 7, zp, bits)
        lo, hi = -(1 << (bits - 1)), (1 << (bits - 1)) - 1
        assert q.tolist() == [lo, hi, lo]
        q32 = quantize(np.array([[-x, x]], np.float32).clip(-3.4e38, 3.4e38), np.array([40]), 0, bits)
        assert q32.tolist() == [[lo, hi]]


def test_huge_inputs_equal_inputs_clipped_to_the_grid(qgru_file):
    from qtool.engine.cpu import run_int
    from qtool.numerics.qparams import grid_range

    qm = __import__("qtool").load(qgru_file)
    rng = np.random.default_rng(1)
    x = rng.standard_normal((16, 8, qm.model.input_size)).astype(np.float32) * 1e18
    s = qm.cells[0][0].spec["x"]
    lo, hi = grid_range(s.exp2_inv, s.zp, s.bits)
    assert np.array_equal(run_int(qm, x), run_int(qm, np.clip(x, lo, hi).astype(np.float32)))


def _mounted_tmpfs(path: Path, size: str, ro: bool = False) -> bool:
    path.mkdir()
    opts = f"size={size}" + (",ro" if ro else "")
    return subprocess.run(["mount", "-t", "tmpfs", "-o", opts, "tmpfs", str(path)],
                          capture_output=True).returncode == 0


@pytest.fixture
def small_disk(tmp_path):
    d = tmp_path / "small"
    if os.geteuid() != 0 or shutil.which("mount") is None or not _mounted_tmpfs(d, "200k"):
        pytest.skip("needs root to mount a small tmpfs")
    yield d
    subprocess.run(["umount", str(d)])


def test_full_disk_is_one_line_and_leaves_nothing(qgru_file, small_disk):
    cases = [
        (["calibrate", MODEL, SAMPLES / "calib.npy", "-o", small_disk / "q.h5"], "no space left"),
        (["simulate", qgru_file, SAMPLES / "test.npy", "--save", small_disk / "s.h5"], "no space left"),
        (["export", "c", qgru_file, "-o", small_disk / "c", "--test-vectors", "--vectors", "64"], "no space left"),
    ]
    for args, msg in cases:
        res = subprocess.run([sys.executable, "-m", "qtool.cli", *map(str, args)], capture_output=True, text=True)
        assert res.returncode == 2 and msg in res.stderr and one_error_line(res.stderr), res.stderr
        leftovers = list(small_disk.rglob("*"))  # no file, no empty folder of ours either
        assert not leftovers, leftovers


def test_read_only_directory(qgru_file, tmp_path):
    d = tmp_path / "ro"
    if os.geteuid() != 0 or not _mounted_tmpfs(d, "1m", ro=True):
        pytest.skip("needs root to mount a read-only tmpfs")
    try:
        res = subprocess.run([sys.executable, "-m", "qtool.cli", "export", "json", str(qgru_file), "-o",
                              str(d / "p.json")], capture_output=True, text=True)
        assert res.returncode == 2 and "read-only" in res.stderr and one_error_line(res.stderr)
        # the long commands refuse before their work (advise takes over 30 s on the sample)
        for args in (["advise", MODEL, SAMPLES / "calib.npy", "--eval", SAMPLES / "test.npy", "--target-snr", "40",
                      "-o", d / "bits.toml"],
                     ["calibrate", MODEL, SAMPLES / "calib.npy", "-o", d / "q.h5"],
                     ["simulate", qgru_file, SAMPLES / "test.npy", "--save", d / "s.h5"]):
            t0 = time.perf_counter()
            res = subprocess.run([sys.executable, "-m", "qtool.cli", *map(str, args)], capture_output=True, text=True)
            assert res.returncode == 2 and "read-only" in res.stderr and one_error_line(res.stderr), res.stderr
            assert time.perf_counter() - t0 < 15, args[0]
        assert not list(d.iterdir())
    finally:
        subprocess.run(["umount", str(d)])


@pytest.mark.parametrize("command", ["calibrate", "advise", "simulate", "report", "import", "export json"])
def test_an_output_into_a_missing_directory(cli, qgru_file, tmp_path, command):
    """A file output into a directory that does not exist creates it (as `-o`'s help says); a run
    that fails leaves no directory behind; `-o ""` names no file."""
    data = SAMPLES / "calib.npy"
    args = {"calibrate": ["calibrate", MODEL, data], "import": ["import", MODEL],
            "advise": ["advise", MODEL, data, "--limit", 40],
            "simulate": ["simulate", qgru_file, data], "report": ["report", qgru_file, data],
            "export json": ["export", "json", qgru_file]}[command]
    flag = "--save" if command == "simulate" else "-o"
    if command == "calibrate":  # data of the wrong width: refused after the output was claimed
        np.save(tmp_path / "wide.npy", np.zeros((4, 8, 9), np.float32))
        code, _, stderr = cli("calibrate", MODEL, tmp_path / "wide.npy", "-o", tmp_path / "no" / "such" / "out.h5")
        assert code == 2 and not (tmp_path / "no").exists(), stderr
    out = tmp_path / "new" / "dir" / {"advise": "out.toml", "report": "out.html", "export json": "out.json"}.get(
        command, "out.h5")
    code, _, stderr = cli(*args, flag, out)
    assert code == 0 and out.is_file(), stderr
    code, _, stderr = cli(*args, flag, "")
    assert code == 2 and "the output path is empty" in stderr and one_error_line(stderr), stderr


@pytest.mark.parametrize("name", ["q.npy", "q.onnx", "q.pt"])
def test_an_output_named_as_a_file_qtool_reads_otherwise_is_refused(cli, qgru_file, tmp_path, name):
    """An HDF5 file named .npy would be read back as data, one named .onnx as a framework's
    model: the name is refused before any work, so that qtool never writes what it cannot read."""
    for args in (["calibrate", MODEL, SAMPLES / "calib.npy", "-o"],
                 ["simulate", qgru_file, SAMPLES / "test.npy", "--save"]):
        code, _, err = cli(*args, tmp_path / name)
        assert code == 2 and f"qtool reads {Path(name).suffix} files as" in err and one_error_line(err), err
        assert not (tmp_path / name).exists()


def test_an_output_of_another_kind_is_never_replaced(cli, qgru_file, tmp_path):
    """`--force` replaces a file qtool wrote for the same kind of output only: a report's page
    never replaces a model, a model never replaces a page; and a page is not named .h5."""
    model = tmp_path / "m.h5"
    shutil.copyfile(qgru_file, model)
    before = model.read_bytes()
    code, _, err = cli("report", model, SAMPLES / "test.npy", "--limit", 5, "-o", tmp_path / "m.h5", "--force")
    assert code == 2 and "also an input" in err  # the model read is the model written: refused first
    shutil.copyfile(qgru_file, tmp_path / "other.h5")
    code, _, err = cli("report", model, SAMPLES / "test.npy", "--limit", 5, "-o", tmp_path / "other.h5", "--force")
    assert code == 2 and "qtool reads .h5 files as models and data" in err and one_error_line(err), err
    page = tmp_path / "page.txt"  # a name that does not say HTML: the file's content does
    assert cli("report", model, SAMPLES / "test.npy", "--limit", 5, "-o", page)[0] == 0
    shown = page.read_bytes()
    code, _, err = cli("import", MODEL, "-o", page, "--force")
    assert code == 2 and "is a text file qtool wrote for another command" in err and one_error_line(err), err
    code, _, err = cli("import", MODEL, "-o", tmp_path / "page.html")  # the name alone says HTML
    assert code == 2 and "qtool reads .html files as HTML" in err and one_error_line(err), err
    assert page.read_bytes() == shown and model.read_bytes() == before


def test_a_file_output_named_as_a_folder_and_a_folder_named_as_a_file_are_refused(cli, qgru_file, tmp_path):
    """`-o out/` names a folder (Path would drop the slash and write a file `out`); `export c -o
    c.h5` names a file (a folder of that name would be read as a model): both refused at once."""
    code, _, err = cli("calibrate", MODEL, SAMPLES / "calib.npy", "-o", f"{tmp_path}/out/", "--method", "minmax")
    assert code == 2 and "names a folder; this output is one file" in err and one_error_line(err), err
    assert not (tmp_path / "out").exists()
    code, _, err = cli("export", "c", qgru_file, "-o", tmp_path / "c.h5")
    assert code == 2 and "is named as a .h5 file; this output is a folder" in err and one_error_line(err), err
    assert not (tmp_path / "c.h5").exists()


def test_an_output_that_is_a_device_or_pipe_is_left_alone(cli, tmp_path):
    """`-o /dev/full --force`: qtool looked for its mark at the file's end and read forever; a
    device or a FIFO is never a file qtool wrote, so it is refused at once."""
    fifo = tmp_path / "pipe.h5"
    os.mkfifo(fifo)
    for target in (Path("/dev/full"), fifo):
        code, _, err = cli("calibrate", MODEL, SAMPLES / "calib.npy", "-o", target, "--force", "--method", "minmax")
        assert code == 2 and "was not written by qtool; it is left alone" in err and one_error_line(err), err


def test_an_output_is_named_and_kept_as_its_own_kind(cli, qgru_file, tmp_path):
    """A bits file (TOML) is not named .json, tables (HDF5) not .json, a page not .json: qtool
    would read them back as JSON. `--force` replaces a model with a model only, simulate's
    results with results only, export's tables with tables only."""
    for args in (["advise", MODEL, SAMPLES / "calib.npy", "-o", tmp_path / "bits.json"],
                 ["export", "h5", qgru_file, "-o", tmp_path / "t.json"],
                 ["report", qgru_file, SAMPLES / "test.npy", "-o", tmp_path / "r.json"]):
        code, _, err = cli(*args)
        assert code == 2 and "qtool reads .json files as JSON" in err and one_error_line(err), err
    results, model = tmp_path / "r.h5", tmp_path / "m.h5"
    assert cli("simulate", qgru_file, SAMPLES / "test.npy", "--limit", 3, "--save", results)[0] == 0
    shutil.copyfile(qgru_file, model)
    kept = results.read_bytes(), model.read_bytes()
    code, _, err = cli("calibrate", MODEL, SAMPLES / "calib.npy", "-o", results, "--force", "--method", "minmax")
    assert code == 2 and "holds simulation results qtool wrote; this output is a model" in err, err
    code, _, err = cli("simulate", qgru_file, SAMPLES / "test.npy", "--limit", 3, "--save", model, "--force")
    assert code == 2 and "holds a model qtool wrote; this output is simulation results" in err, err
    code, _, err = cli("export", "h5", qgru_file, "-o", results, "--force")
    assert code == 2 and "this output is parameter tables" in err and one_error_line(err), err
    assert (results.read_bytes(), model.read_bytes()) == kept
    code, _, err = cli("simulate", qgru_file, SAMPLES / "test.npy", "--save", f"{tmp_path}/new/")
    assert code == 2 and "names a folder" in err and not (tmp_path / "new").exists(), err


def test_an_export_without_test_vectors_removes_an_earlier_exports(cli, qgru_file, tmp_path):
    """Test vectors of an earlier export would be compiled with the new model's files (and fail
    for another reason than theirs): an export without them removes those qtool wrote, unedited,
    with the consent a replacement needs; where one was edited, both stay."""
    out = tmp_path / "c"
    assert cli("export", "c", qgru_file, "-o", out, "--test-vectors")[0] == 0
    code, _, err = cli("export", "c", qgru_file, "-o", out)
    assert code == 2 and "gru_test_main.c" in err and (out / "gru_test_main.c").exists(), err
    code, out_text, _ = cli("export", "c", qgru_file, "-o", out, "--force")
    assert code == 0 and "removed gru_test_vectors.h, gru_test_main.c" in out_text
    assert sorted(p.name for p in out.iterdir()) == ["gru.c", "gru.h", "gru_params.c", "gru_params.h", "qgru.c",
                                                     "qgru.h"]
    assert cli("export", "c", qgru_file, "-o", out, "--test-vectors", "--force")[0] == 0
    main = out / "gru_test_main.c"
    main.write_text(main.read_text() + "/* mine */\n")
    code, out_text, _ = cli("export", "c", qgru_file, "-o", out, "--force")
    assert code == 0 and "removed gru_test" not in out_text and main.read_text().endswith("/* mine */\n")
    assert (out / "gru_test_vectors.h").exists()  # kept with the edited main that includes it


def test_a_damaged_data_archive_is_one_line(cli, tmp_path):
    """A .npz that is no zip (cut, damaged, another format): one line, not numpy's pickle error
    or an internal error."""
    good = tmp_path / "good.npz"
    np.savez(good, x=np.load(SAMPLES / "calib.npy")[:4])
    for name, data in (("cut.npz", good.read_bytes()[:300]), ("noise.npz", bytes(range(256)) * 8)):
        (tmp_path / name).write_bytes(data)
        code, _, err = cli("calibrate", MODEL, tmp_path / name, "-o", tmp_path / "q.h5")
        assert code == 2 and "not a .npz archive" in err and one_error_line(err), err
    import h5py

    np.savez(tmp_path / "none.npz")
    h5py.File(tmp_path / "none.h5", "w").close()
    for name, said in (("none.npz", "holds no arrays"), ("none.h5", "holds no datasets")):
        code, _, err = cli("calibrate", MODEL, tmp_path / name, "-o", tmp_path / "q.h5")
        assert code == 2 and f"{name}: {said}" in err and one_error_line(err), err


def test_options_that_would_be_ignored_are_refused(cli, qgru_file, tmp_path):
    """An option the command would not use is refused, never dropped: `--time-first`/`--dataset`
    without `--data` in `export c`, `--dataset` for a .npy file (one array); an unknown method is
    refused before an existing output is."""
    for flag in (["--time-first"], ["--dataset", "x"]):
        code, _, err = cli("export", "c", qgru_file, "-o", tmp_path / "c", *flag)
        assert code == 2 and f"{flag[0]} goes with --data" in err and one_error_line(err), err
    code, _, err = cli("simulate", qgru_file, SAMPLES / "test.npy", "--dataset", "x")
    assert code == 2 and "a .npy file holds one array" in err and one_error_line(err), err
    code, _, err = cli("calibrate", MODEL, SAMPLES / "calib.npy", "-o", qgru_file, "--method", "foo")
    assert code == 2 and "unknown method 'foo'" in err and one_error_line(err), err
    for args, said in ((["calibrate", MODEL, SAMPLES / "calib.npy", "-o", tmp_path / "q.h5", "--snap", "nearest"],
                        "--snap rounds the scales a quantized or QAT-trained file holds"),
                       (["calibrate", MODEL, SAMPLES / "calib.npy", "-o", tmp_path / "q.h5",
                         "--method-weights", "ema"], "ema averages ranges over batches of data"),
                       (["inspect", qgru_file, "--graph"],
                        "--graph shows a float model's layers; q.h5 is a quantized")):
        code, _, err = cli(*args)
        assert code == 2 and said in err and one_error_line(err) and not (tmp_path / "q.h5").exists(), err
    code, _, err = cli("export", "c", qgru_file, "-o", tmp_path / "c", "--test-vectors", "--data", SAMPLES / "test.npy",
                       "--vectors", 600)
    assert code == 0 and "600 test vectors asked for: test.npy holds 597 sequences; the test vectors are all 597" \
        in err, err
    assert "outside its grid" not in err
    np.save(tmp_path / "loud.npy", np.load(SAMPLES / "test.npy")[:4] * 100)
    code, _, err = cli("export", "c", qgru_file, "-o", tmp_path / "c2", "--test-vectors",
                       "--data", tmp_path / "loud.npy")
    assert code == 0 and "of the test vectors' values of input 'x' lie outside its grid (saturated)" in err, err


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGHUP, signal.SIGINT])
def test_signals_remove_temporaries(qgru_file, tmp_path, sig):
    # enough work that the signal lands while the results are written, on a fast machine too
    x = np.random.default_rng(0).standard_normal((60000, 24, 8)).astype(np.float32)
    np.save(tmp_path / "big.npy", x)
    p = subprocess.Popen([sys.executable, "-m", "qtool.cli", "simulate", str(qgru_file), str(tmp_path / "big.npy"),
                          "--save", str(tmp_path / "s.h5"), "--no-per-tensor"],
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    deadline = time.time() + 60
    while not list(tmp_path.glob(".s.h5.*")) and time.time() < deadline and p.poll() is None:
        time.sleep(0.05)
    assert p.poll() is None, "finished before the signal"
    p.send_signal(sig)
    _, err = p.communicate(timeout=60)
    assert p.returncode == 128 + sig and "interrupted" in err and one_error_line(err)
    assert not list(tmp_path.glob("*s.h5*"))


@pytest.mark.parametrize("step", ["probe", "temporary"])
def test_a_signal_while_a_file_is_made_is_held_until_it_is_safe(tmp_path, monkeypatch, step):
    """A signal that lands the instant a probe or temporary file exists (a Ctrl-C the moment a run
    starts) is held: it is raised once the probe is gone, or once the temporary is in the care of
    the code that removes it, and nothing is left behind."""
    import tempfile

    from qtool.cli import console as cli
    from qtool.io import files

    real_mkstemp = tempfile.mkstemp
    seen = []

    def mkstemp_then_signal(*args, **kwargs):
        made = real_mkstemp(*args, **kwargs)
        cli.on_signal(signal.SIGINT, sys._getframe())  # as if it landed here
        seen.append(sorted(p.name for p in tmp_path.iterdir()))
        return made

    monkeypatch.setattr(files.tempfile, "mkstemp", mkstemp_then_signal)
    old = {sig: signal.getsignal(sig) for sig in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)}
    signal.signal(signal.SIGINT, cli.on_signal)
    try:
        with pytest.raises(cli.Interrupted):
            if step == "probe":
                files.probe_writable(tmp_path / "r.h5")
            else:
                files.write_bytes(tmp_path / "r.h5", b"data")
    finally:
        for sig, handler in old.items():
            signal.signal(sig, handler)
    assert len(seen) == 1 and len(seen[0]) == 1  # the signal came while the file existed
    assert not list(tmp_path.iterdir())


def test_a_signal_inside_llvmlite_is_asked_again_after_it():
    """A signal that lands in llvmlite's ctypes callbacks (numba compiling or reading its cache)
    must not raise there: ctypes swallows the exception and LLVM crashes on its half-built state
    (a segfault under mpiexec). The handler returns and the signal comes again once outside."""
    from qtool.cli import console as cli

    old = {sig: signal.getsignal(sig) for sig in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)}
    signal.signal(signal.SIGINT, cli.on_signal)
    try:
        fake_callback = compile("handler(signal.SIGINT, sys._getframe())",
                                os.path.join(os.sep, "site", "llvmlite", "binding", "executionengine.py"), "exec")
        exec(fake_callback, {"handler": cli.on_signal, "signal": signal, "sys": sys})  # returns
        with pytest.raises(cli.Interrupted):
            deadline = time.monotonic() + 5
            while time.monotonic() < deadline:
                time.sleep(0.01)  # the signal is sent again, outside llvmlite: raised here
        assert signal.getsignal(signal.SIGTERM) is signal.SIG_IGN  # one stop: the next is ignored
    finally:
        for sig, handler in old.items():
            signal.signal(sig, handler)


SIGNAL_IN_DEL = """
import os, signal, time
from qtool.cli.console import Interrupted, stop_on_signals

class Collected:
    def __del__(self):
        os.kill(os.getpid(), signal.SIGINT)
        time.sleep(0.5)  # the handler runs here, where Python drops what it raises

stop_on_signals()
try:
    Collected()
    time.sleep(5)
    print("ran on")
except Interrupted:
    print("stopped")
"""


def test_a_signal_python_drops_in_a_destructor_is_sent_again():
    """A stop signal whose Interrupted is raised inside a `__del__` or a weakref callback (the
    garbage collector runs them anywhere) is dropped by Python with an "Exception ignored"
    message: the handler is armed again and the signal sent again, so the run still stops."""
    p = subprocess.run([sys.executable, "-c", SIGNAL_IN_DEL], capture_output=True, text=True, timeout=60)
    assert p.stdout.split() == ["stopped"], p.stderr
    assert "Exception ignored" not in p.stderr


SIGNAL_WHILE_STARTING = """
import os, signal, sys
class SignalOnImport:  # the signal arrives while the commands' modules are imported
    @staticmethod
    def find_spec(name, path=None, target=None):
        if name == "typer":
            os.kill(os.getpid(), signal.SIGINT)
from qtool.cli import main
sys.meta_path.insert(0, SignalOnImport)
main(["--version"])
"""


def test_a_signal_while_starting_is_one_line():
    """A Ctrl-C in the first tenths of a second, while the entry point imports the commands, ends
    the run with the exit status of a stop and one line, not a KeyboardInterrupt traceback."""
    p = subprocess.run([sys.executable, "-c", SIGNAL_WHILE_STARTING], capture_output=True, text=True, timeout=60)
    assert p.returncode == 128 + signal.SIGINT, p.stderr
    assert p.stderr.splitlines() == ["interrupted (SIGINT) while starting; nothing was written"]


@pytest.mark.parametrize("args,code", [(("inspect", MODEL), 0), (("inspect", "no-such-file.h5"), 2)])
def test_a_finished_command_keeps_its_exit_status(cli, args, code):
    """Once a command has written its output or said its error, a stop signal (a Ctrl-C as it
    exits) has nothing left to stop: it is ignored, and the exit status stays the command's."""
    assert cli(*args)[0] == code
    assert all(signal.getsignal(sig) is signal.SIG_IGN for sig in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP))


def test_two_runs_writing_one_output_leave_one_runs_file(tmp_path):
    """Two calibrations of different methods writing the same -o at once: the file is one run's
    whole output (each writes a private temporary and renames it), never a mix."""
    from h5compare import h5_contents

    def cmd(method, out):
        return [sys.executable, "-m", "qtool.cli", "calibrate", str(MODEL), str(SAMPLES / "calib.npy"), "-o", str(out),
                "--method", method, "--force"]

    for method in ("minmax", "mse"):
        subprocess.run(cmd(method, tmp_path / f"{method}.h5"), check=True, capture_output=True)
    runs = [subprocess.Popen(cmd(m, tmp_path / "both.h5"), stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
            for m in ("minmax", "mse")]
    assert [r.wait() for r in runs] == [0, 0]
    got = h5_contents(tmp_path / "both.h5")
    assert sum(_equal(got, h5_contents(tmp_path / f"{m}.h5")) for m in ("minmax", "mse")) == 1
    assert [p.name for p in tmp_path.iterdir() if p.name.startswith(".")] == []  # no temporary left


def _equal(a: dict, b: dict) -> bool:
    return a.keys() == b.keys() and all(np.array_equal(np.asarray(a[k]), np.asarray(b[k])) for k in a)


def test_a_name_that_is_no_c_prefix_is_said_when_it_changes(cli, qgru_file, tmp_path):
    code, out, err = cli("export", "c", qgru_file, "-o", tmp_path / "c", "--name", "1bad-name")
    assert code == 0 and "warning: --name '1bad-name' is no C identifier prefix" in err and "'m_1bad_name'" in err
    code, out, err = cli("export", "c", qgru_file, "-o", tmp_path / "d", "--name", "digits")
    assert code == 0 and "warning" not in err


def test_an_eof_error_inside_a_command_is_no_ctrl_d(cli, qgru_file, monkeypatch):
    """click takes any EOFError for Ctrl-D at a prompt ("interrupted", 130); one raised by a
    reader inside a command is a bug's one line (exit 1, and --json's error object)."""
    from qtool import api

    def cut(*a, **k):
        raise EOFError("Ran out of input")

    monkeypatch.delenv("QTOOL_DEBUG", raising=False)
    monkeypatch.setattr(api, "inspect", cut)
    code, out, err = cli("inspect", qgru_file, "--json")
    assert code == 1 and "internal error: EOFError: Ran out of input" in err and "interrupted" not in err, err
    assert json.loads(out)["exit_code"] == 1


def test_feature_maps_for_a_model_of_sequences_are_refused(cli, qgru_file, tmp_path):
    """4-D data `[N, T, A, B]` whose A * B is the input size are not flattened in a guessed order
    for a model that reads sequences `[N, T, C]`: one line, for every command that reads data."""
    x = np.load(SAMPLES / "test.npy")[:4]
    np.save(tmp_path / "maps.npy", x.reshape(*x.shape[:2], 4, 2))
    for args in (["simulate", qgru_file, tmp_path / "maps.npy"],
                 ["calibrate", MODEL, tmp_path / "maps.npy", "-o", tmp_path / "q.h5"],
                 ["export", "c", qgru_file, "-o", tmp_path / "c", "--test-vectors", "--data", tmp_path / "maps.npy"]):
        code, _, err = cli(*args)
        assert code == 2 and "are feature maps [N, T, A, B]; the model reads sequences [N, T, 8]" in err, err
        assert one_error_line(err) and not (tmp_path / "q.h5").exists() and not (tmp_path / "c").exists()
