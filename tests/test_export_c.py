"""C export: the compiled C equals the simulator integer for integer, for every preset, stacked
and bidirectional; streaming equals whole-sequence; names are sanitised; errors are clear."""

import json
import shutil
import subprocess

import numpy as np
import pytest
from conftest import calibrated, random_model
from test_integer_gru import mixed_config

from exporters.c_export import c_name, export_c
from exporters.c_vectors import write_test_vectors
from exporters.c_verify import CFLAGS, compile_c, verify
from qtool.engine_cpu import run_int
from qtool.errors import QtoolError

pytestmark = pytest.mark.skipif(shutil.which("cc") is None, reason="no C compiler")


def model_and_data(layers, dirs, seed, preset, C=5, H=6):
    model = random_model(C=C, H=H, layers=layers, dirs=dirs, seed=seed)
    rng = np.random.RandomState(seed)
    cfg = mixed_config() if preset == "mixed" else None
    qm = calibrated(model, rng.randn(12, 9, C).astype(np.float32),
                    "int8" if preset == "mixed" else preset, config=cfg)
    return qm, rng.randn(5, 11, C).astype(np.float32) * 1.2  # held out, some beyond the range


@pytest.mark.parametrize("compensation", ["table", "offset"])
@pytest.mark.parametrize("preset", ["int8", "w8a16", "int16", "mixed"])
@pytest.mark.parametrize("layers,dirs", [(1, 1), (2, 1), (2, 2)])
def test_c_equals_simulator(tmp_path, preset, layers, dirs, compensation):
    qm, x = model_and_data(layers, dirs, layers * 10 + dirs, preset)
    export_c(qm, tmp_path, "m", compensation)
    res = verify(qm, tmp_path, "m", x)
    assert res["output_values"] == 5 * 11 * 6 * dirs
    assert res["output_mismatches"] == res["state_mismatches"] == res["dequantized_mismatches"] == 0


def test_offset_compensation_drops_the_tables(tmp_path):
    qm, _ = model_and_data(2, 1, 3, "int8")
    assert any(cq.spec["x"].zp != 0 for cells in qm.cells for cq in cells)
    fp_t = export_c(qm, tmp_path, "t", "table")
    fp_o = export_c(qm, tmp_path, "o", "offset")
    assert "_sum_mul_" in (tmp_path / "t_params.h").read_text()
    assert "_sum_mul_" not in (tmp_path / "o_params.h").read_text()
    comp_bytes = sum(4 * cq.CH[1].size * bool(cq.CH[1].any()) + 4 * cq.CH[3].size * bool(cq.CH[3].any())
                     for cells in qm.cells for cq in cells)
    assert fp_t.flash_bytes - fp_o.flash_bytes == comp_bytes
    with pytest.raises(QtoolError, match="unknown compensation"):
        export_c(qm, tmp_path, "x", "lazy")


STREAM_MAIN = r"""
#include <stdio.h>
#include "m.h"
static m_state_t a, b;
int main(void)
{
    int16_t x[7 * M_INPUT_SIZE], y_seq[7 * M_OUTPUT_SIZE], y_step[M_OUTPUT_SIZE];
    int16_t work[M_SEQUENCE_WORK(7)];
    long t, i, bad = 0;
    for (i = 0; i < 7 * M_INPUT_SIZE; i++) x[i] = (int16_t)((i * 37) % 200 - 100);
    m_run_sequence(&a, x, 7, y_seq, work);
    m_reset(&b);
    for (t = 0; t < 7; t++) {
        if (m_step(&b, x + t * M_INPUT_SIZE, y_step) != 0) return 2;
        for (i = 0; i < M_OUTPUT_SIZE; i++) bad += y_step[i] != y_seq[t * M_OUTPUT_SIZE + i];
    }
    for (i = 0; i < M_STATE_SIZE; i++) bad += a.h[i] != b.h[i];
    printf("%ld\n", bad);
    return 0;
}
"""


def test_streaming_equals_sequence(tmp_path):
    qm, _ = model_and_data(2, 1, 3, "int8")
    export_c(qm, tmp_path, "m")
    (tmp_path / "main.c").write_text(STREAM_MAIN)
    compile_c([tmp_path / "qgru.c", tmp_path / "m.c", tmp_path / "main.c"], tmp_path / "s", tmp_path)
    assert subprocess.run([tmp_path / "s"], capture_output=True, text=True).stdout.strip() == "0"


def test_test_vectors_main_passes_and_detects_a_wrong_table(tmp_path):
    qm, x = model_and_data(1, 2, 4, "w8a16")
    export_c(qm, tmp_path, "m")
    write_test_vectors(qm, tmp_path, "m", x[:3])
    compile_c([tmp_path / "qgru.c", tmp_path / "m.c", tmp_path / "m_test_main.c"], tmp_path / "t", tmp_path)
    res = subprocess.run([tmp_path / "t"], capture_output=True, text=True)
    assert res.returncode == 0 and res.stdout.startswith("PASS: 0 mismatches in 396 ")
    params = tmp_path / "m_params.h"  # corrupt one weight: the check must notice
    text = params.read_text()
    start = text.index("m_l0_fwd_qR[")
    body = text.index("{", start) + 1
    first = text[body:].lstrip().split(",")[0]
    params.write_text(text[:body] + text[body:].replace(first, str(int(first) + 50), 1))
    compile_c([tmp_path / "qgru.c", tmp_path / "m.c", tmp_path / "m_test_main.c"], tmp_path / "t2", tmp_path)
    res = subprocess.run([tmp_path / "t2"], capture_output=True, text=True)
    assert res.returncode == 1 and res.stdout.startswith("FAIL")


@pytest.mark.skipif(shutil.which("clang") is None, reason="clang not installed")
def test_clang_strict_flags(tmp_path):
    qm, x = model_and_data(2, 2, 5, "int16")
    export_c(qm, tmp_path, "m")
    write_test_vectors(qm, tmp_path, "m", x[:2])
    cmd = ["clang", *CFLAGS, f"-I{tmp_path}", str(tmp_path / "qgru.c"), str(tmp_path / "m.c"),
           str(tmp_path / "m_test_main.c"), "-o", str(tmp_path / "t"), "-lm"]
    assert subprocess.run(cmd, capture_output=True).returncode == 0
    assert subprocess.run([tmp_path / "t"], capture_output=True).returncode == 0


def test_names_cannot_inject_code(tmp_path):
    assert c_name("my-model v2") == "my_model_v2"
    assert c_name("2fast") == "m_2fast" and c_name("int") == "m_int" and c_name("*/") == "gru"
    qm, x = model_and_data(1, 1, 6, "int8")
    qm.model.name = 'evil */ #include "/etc/passwd" /*'
    qm.model.source = "x */ int pwned; /*"
    qm.info = {"method": "minmax\n#define X", "data_file": "*/ boom"}
    name = c_name(qm.model.name)
    export_c(qm, tmp_path, name)
    res = verify(qm, tmp_path, name, x)
    assert res["output_mismatches"] == 0
    import re

    for f in tmp_path.iterdir():
        code = re.sub(r"/\*.*?\*/", "", f.read_text(), flags=re.S)  # what the compiler sees
        assert "int pwned" not in code and "/etc/passwd" not in code and "boom" not in code


def test_missing_compiler_is_one_clear_error(tmp_path, monkeypatch):
    qm, x = model_and_data(1, 1, 7, "int8")
    export_c(qm, tmp_path, "m")
    monkeypatch.setenv("CC", "/nonexistent/cc")
    with pytest.raises(QtoolError, match="no C compiler found"):
        verify(qm, tmp_path, "m", x)


def test_cli_export_verify_and_tables(cli, tmp_path):
    from conftest import SAMPLES, has

    if not has("safetensors"):
        pytest.skip("the sample is .safetensors")
    q = tmp_path / "q.h5"
    assert cli("calibrate", SAMPLES / "digits_gru.safetensors", SAMPLES / "calib.npy", "-o", q,
               "--bits", "w8a16")[0] == 0
    code, out, err = cli("export", "c", q, "-o", tmp_path / "c", "--name", "digits", "--json",
                         "--test-vectors", "--data", SAMPLES / "test.npy")
    assert code == 0, err
    fp = json.loads(out)
    assert fp["weight_bytes"] == 3 * 64 * (8 + 64) + 3 * 64 * (64 + 64)  # int8 W and R
    assert fp["macs_per_step"] == fp["weight_bytes"]
    code, out, err = cli("verify", q, tmp_path / "c", SAMPLES / "test.npy", "--name", "digits", "--json")
    res = json.loads(out)
    assert code == 0 and res["output_mismatches"] == 0 and res["output_values"] == 597 * 8 * 64
    code, _, err = cli("export", "c", q, "-o", tmp_path / "c", "--name", "digits")
    assert code == 2 and "--force" in err
    code, _, err = cli("verify", q, tmp_path / "c", SAMPLES / "test.npy", "--limit", "5")  # finds "digits"
    assert code == 0, err
    assert cli("export", "json", q, "-o", tmp_path / "p.json")[0] == 0
    tables = json.loads((tmp_path / "p.json").read_text())
    from qtool.qmodel import load_qmodel

    cq = load_qmodel(q).cells[1][0]
    cell = tables["cells"][1]
    assert cell["tensors"]["g_pre"]["exp2_inv"] == cq.spec["g_pre"].exp2_inv
    assert cell["shifts"]["sh_rRh"] == int(cq.P[list(cell["shifts"]).index("sh_rRh")])
    assert cli("export", "h5", q, "-o", tmp_path / "p.h5")[0] == 0
    import h5py

    with h5py.File(tmp_path / "p.h5") as f:
        assert f["layer1/fwd/tensors/g_pre"].attrs["bits"] == 16


def test_cli_offset_compensation_on_the_sample_meets_the_flash_goal(cli, tmp_path):
    from conftest import SAMPLES, has

    if not has("safetensors"):
        pytest.skip("the sample is .safetensors")
    q = tmp_path / "q.h5"
    assert cli("calibrate", SAMPLES / "digits_gru.safetensors", SAMPLES / "calib.npy", "-o", q)[0] == 0
    code, out, err = cli("export", "c", q, "-o", tmp_path / "c", "--compensation", "offset", "--json")
    assert code == 0, err
    fp = json.loads(out)
    assert fp["other_bytes"] == 2 * 2 * 3 * 64 + 2 * 56 * 4  # shifts and P only: no compensation
    assert fp["flash_vs_int8_weights_and_tables"] <= 1.05
    code, out, err = cli("verify", q, tmp_path / "c", SAMPLES / "test.npy", "--json")
    res = json.loads(out)
    assert code == 0 and res["output_mismatches"] == res["state_mismatches"] == 0
    code, _, err = cli("export", "c", q, "-o", tmp_path / "d", "--compensation", "lazy")
    assert code == 2 and "unknown compensation" in err and not (tmp_path / "d").exists()


def test_run_int_finals_are_last_states():
    qm, x = model_and_data(2, 2, 8, "int8")
    finals = []
    y = run_int(qm, x, finals=finals)
    assert len(finals) == 4
    assert np.array_equal(finals[2], y[:, -1, :6]) and np.array_equal(finals[3], y[:, 0, 6:])


@pytest.mark.skipif(shutil.which("arm-none-eabi-gcc") is None, reason="arm-none-eabi-gcc not installed")
def test_cortex_m4_cross_compile(tmp_path):
    qm, _ = model_and_data(2, 2, 9, "w8a16")
    export_c(qm, tmp_path, "m")
    for src in ("qgru.c", "m.c"):
        res = subprocess.run(["arm-none-eabi-gcc", "-mcpu=cortex-m4", "-mthumb", "-Os", *CFLAGS,
                              "-c", str(tmp_path / src), "-o", str(tmp_path / f"{src}.o")],
                             capture_output=True, text=True)
        assert res.returncode == 0, res.stderr
