"""C export: the compiled C equals the simulator integer for integer, for every preset, stacked
and bidirectional; streaming equals whole-sequence; names are sanitised; errors are clear."""

import json
import re
import shutil
import subprocess

import numpy as np
import pytest
from conftest import calibrated, random_model
from qtool.exporters.c_export import c_name, encoded, export_c, footprint, render_c, sources
from qtool.exporters.c_types import model_types
from qtool.exporters.c_vectors import render_test_vectors
from qtool.exporters.c_verify import CFLAGS, compare, compile_c, run_c
from test_integer_gru import mixed_config

from qtool.engine.cpu import run_int
from qtool.errors import QtoolError

pytestmark = pytest.mark.skipif(shutil.which("cc") is None, reason="no C compiler")


def model_and_data(layers, dirs, seed, preset, C=5, H=6):
    model = random_model(C=C, H=H, layers=layers, dirs=dirs, seed=seed)
    rng = np.random.RandomState(seed)
    cfg = mixed_config() if preset == "mixed" else None
    qm = calibrated(model, rng.randn(12, 9, C).astype(np.float32),
                    "int8" if preset == "mixed" else preset, config=cfg)
    return qm, rng.randn(5, 11, C).astype(np.float32) * 1.2  # held out, some beyond the range


def simulated(qm, x):
    finals = []
    y = run_int(qm, x, finals=finals)
    return y, np.concatenate(finals, axis=1)


def verify(qm, export_dir, prefix, x, target="host", timeout=600.0) -> dict:
    """The export in `export_dir` run on `x` and compared with the simulator, as qtool.api.verify
    does (the exporter runs the C, the caller the simulator)."""
    return compare(qm, run_c(qm, export_dir, prefix, x, target, timeout), *simulated(qm, x))


def write_test_vectors(qm, out_dir, prefix, x) -> None:
    for name, text in render_test_vectors(qm, prefix, x, run_int(qm, x)).items():
        (out_dir / name).write_text(text)


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
    assert "_W_sum_mul_x_zp[" in (tmp_path / "t_params.c").read_text()
    assert "_sum_mul_" not in (tmp_path / "o_params.c").read_text()
    comp_bytes = sum(4 * cq.CH[1].size * bool(cq.CH[1].any()) + 4 * cq.CH[3].size * bool(cq.CH[3].any())
                     for cells in qm.cells for cq in cells)
    assert fp_t.flash_bytes - fp_o.flash_bytes == comp_bytes == fp_t.offset_saves
    assert fp_t.ram_bytes == fp_o.ram_bytes  # the offset is added as the GEMMs read
    with pytest.raises(QtoolError, match="unknown compensation"):
        export_c(qm, tmp_path, "x", "lazy")


STREAM_MAIN = r"""
#include <stdio.h>
#include "m.h"
static m_state_t a, b;
int main(void)
{
    m_q_t x[7 * M_INPUT_SIZE], y_seq[7 * M_OUTPUT_SIZE], y_step[M_OUTPUT_SIZE];
    m_q_t work[M_SEQUENCE_WORK(7)];
    long t, i, bad = 0;
    for (i = 0; i < 7 * M_INPUT_SIZE; i++) x[i] = (m_q_t)((i * 37) % 200 - 100);
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
    compile_c(sources(tmp_path, "m") + [tmp_path / "main.c"], tmp_path / "s", tmp_path)
    assert subprocess.run([tmp_path / "s"], capture_output=True, text=True).stdout.strip() == "0"


def test_test_vectors_main_passes_and_detects_a_wrong_table(tmp_path):
    qm, x = model_and_data(1, 2, 4, "w8a16")
    export_c(qm, tmp_path, "m")
    write_test_vectors(qm, tmp_path, "m", x[:3])
    compile_c(sources(tmp_path, "m") + [tmp_path / "m_test_main.c"], tmp_path / "t", tmp_path)
    res = subprocess.run([tmp_path / "t"], capture_output=True, text=True)
    assert res.returncode == 0 and res.stdout.startswith("PASS: 0 mismatches in 396 ")
    params = tmp_path / "m_params.c"  # corrupt one weight: the check must notice
    text = params.read_text()
    start = text.index("m_l0_fwd_qR[")
    body = text.index("{", start) + 1
    first = text[body:].lstrip().split(",")[0]
    params.write_text(text[:body] + text[body:].replace(first, str(int(first) + 50), 1))
    compile_c(sources(tmp_path, "m") + [tmp_path / "m_test_main.c"], tmp_path / "t2", tmp_path)
    res = subprocess.run([tmp_path / "t2"], capture_output=True, text=True)
    assert res.returncode == 1 and res.stdout.startswith("FAIL")


def test_test_vectors_of_whole_numbers_compile_and_pass(tmp_path):
    """Zeros (padding, silence, a ReLU's output) and other whole numbers in the inputs are C float
    constants (`0.0f`, `2.0f`; `0f` is not C) that read back as the very floats given."""
    from qtool.exporters.c_vectors import c_float

    qm, x = model_and_data(1, 2, 4, "int8")
    x = x[:3].copy()
    x[0, :4] = 0.0
    x[1, 0, :2] = (2.0, -3.0)
    x[2, 0, :3] = (1e10, 1.5e-7, -0.0)
    export_c(qm, tmp_path, "m")
    write_test_vectors(qm, tmp_path, "m", x)
    compile_c(sources(tmp_path, "m") + [tmp_path / "m_test_main.c"], tmp_path / "t", tmp_path)
    res = subprocess.run([tmp_path / "t"], capture_output=True, text=True)
    assert res.returncode == 0 and res.stdout.startswith("PASS: 0 mismatches"), res.stdout
    assert [c_float(v) for v in (0.0, 2.0, -3.0, 1e10, -0.0)] == ["0.0f", "2.0f", "-3.0f", "1e+10f", "-0.0f"]
    assert all(np.float32(float(c_float(v)[:-1])) == v for v in x.ravel())


@pytest.mark.skipif(shutil.which("clang") is None, reason="clang not installed")
def test_clang_strict_flags(tmp_path):
    qm, x = model_and_data(2, 2, 5, "int16")
    export_c(qm, tmp_path, "m")
    write_test_vectors(qm, tmp_path, "m", x[:2])
    cmd = ["clang", *CFLAGS, f"-I{tmp_path}", *map(str, sources(tmp_path, "m")),
           str(tmp_path / "m_test_main.c"), "-o", str(tmp_path / "t")]
    res = subprocess.run(cmd, capture_output=True, text=True)
    assert res.returncode == 0, res.stderr
    assert subprocess.run([tmp_path / "t"], capture_output=True).returncode == 0


def test_names_cannot_inject_code(tmp_path):
    assert c_name("my-model v2") == "my_model_v2"
    assert c_name("2fast") == "m_2fast" and c_name("int") == "m_int" and c_name("*/") == "gru"
    assert c_name("évier") == "evier" and c_name("日本") == "gru"  # accents dropped, not the letters
    qm, x = model_and_data(1, 1, 6, "int8")
    qm.model.name = 'evil */ #include "/etc/passwd" /*'
    qm.model.source = "x */ int pwned; /*"
    qm.info = {"method": "minmax\n#define X", "data_file": "*/ boom"}
    name = c_name(qm.model.name)
    export_c(qm, tmp_path, name)
    res = verify(qm, tmp_path, name, x)
    assert res["output_mismatches"] == 0
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
    for extra, said in ((["--vectors", "3"], "--vectors goes with --test-vectors"),
                        (["--data", SAMPLES / "test.npy"], "--data goes with --test-vectors")):
        code, _, err = cli("export", "c", q, "-o", tmp_path / "c2", *extra)
        assert code == 2 and said in err and not (tmp_path / "c2").exists(), err
    code, _, err = cli("verify", q, tmp_path / "c", SAMPLES / "test.npy", "--limit", "5")  # finds "digits"
    assert code == 0, err
    assert cli("export", "json", q, "-o", tmp_path / "p.json")[0] == 0
    tables = json.loads((tmp_path / "p.json").read_text())
    from qtool.io.qmodel_file import load_qmodel

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
    # int8 state and per-unit GEMMs: at most 55% of the 2,560 B the int16 runtime needed
    assert fp["ram_bytes"] == (2 * 64 + 64) <= 0.55 * 2560 and fp["flash_bytes"] < 43212
    code, out, err = cli("verify", q, tmp_path / "c", SAMPLES / "test.npy", "--json")
    res = json.loads(out)
    assert code == 0 and res["output_mismatches"] == res["state_mismatches"] == 0 and res["passed"]
    code, _, err = cli("export", "c", q, "-o", tmp_path / "d", "--compensation", "lazy")
    assert code == 2 and "unknown compensation" in err and not (tmp_path / "d").exists()


def test_run_int_finals_are_last_states():
    qm, x = model_and_data(2, 2, 8, "int8")
    finals = []
    y = run_int(qm, x, finals=finals)
    assert len(finals) == 4
    assert np.array_equal(finals[2], y[:, -1, :6]) and np.array_equal(finals[3], y[:, 0, 6:])




QUANT_MAIN = r"""
#include <float.h>
#include <math.h>
#include <stdio.h>
#include "m.h"
int main(void)
{
    static const float x[] = {1e18f, -1e18f, 1e30f, -1e30f, FLT_MAX, -FLT_MAX, INFINITY, -INFINITY,
                              NAN, 0.0f, -0.0f, 1e-30f, -1e-30f, 0.3f, -0.7f, 1.5f, -2.25f, 3.0f};
    m_q_t q[sizeof(x) / sizeof(x[0])];
    size_t i;
    m_quantize_input(x, q, (int32_t)(sizeof(x) / sizeof(x[0])));
    for (i = 0; i < sizeof(x) / sizeof(x[0]); i++) printf("%d\n", (int)q[i]);
    return 0;
}
"""


@pytest.mark.parametrize("preset", ["int8", "int16"])
def test_input_quantizer_saturates_before_converting(tmp_path, preset):
    """+-1e18, +-1e30, +-FLT_MAX and +-inf give qmin/qmax (a float-to-int conversion first would
    wrap); ordinary values give q = clamp(floor(x * 2^e + 0.5) + zp), as the simulator."""
    qm, _ = model_and_data(1, 1, 11, preset)
    export_c(qm, tmp_path, "m")
    (tmp_path / "main.c").write_text(QUANT_MAIN)
    compile_c(sources(tmp_path, "m") + [tmp_path / "main.c"], tmp_path / "q", tmp_path)
    got = [int(v) for v in subprocess.run([tmp_path / "q"], capture_output=True, text=True).stdout.split()]
    s = qm.cells[0][0].spec["x"]
    lo, hi = -(1 << (s.bits - 1)), (1 << (s.bits - 1)) - 1
    assert got[:9] == [hi, lo, hi, lo, hi, lo, hi, lo, lo]  # NaN: qmin, as documented in m.h
    small = np.array([0.0, -0.0, 1e-30, -1e-30, 0.3, -0.7, 1.5, -2.25, 3.0], np.float32)
    expect = np.clip(np.floor(small.astype(np.float64) * 2.0 ** s.exp2_inv + 0.5) + s.zp, lo, hi)
    assert got[9:] == [int(v) for v in expect]


HYGIENE_MAIN = r"""
#include <stdio.h>
#include "m.h"
#include "m_params.h"
#include "m_params.h"
#include "m.h"
int main(void)
{
    int x = 3;
    /* every macro is one expression: x-M_INPUT_ZP must not paste into x--65 */
    printf("%d %d %d\n", x-M_INPUT_ZP, x-M_OUTPUT_ZP, -M_NUM_LAYERS * 2);
    return 0;
}
"""
OTHER_TU = '#include "m_params.h"\nconst void *other(void) { return m_cells; }\n'


def test_header_hygiene_tables_defined_once(tmp_path):
    qm, _ = model_and_data(2, 1, 12, "int8")
    assert qm.cells[0][0].spec["x"].zp < 0  # the case an unparenthesised macro breaks
    export_c(qm, tmp_path, "m")
    (tmp_path / "main.c").write_text(HYGIENE_MAIN)
    (tmp_path / "other.c").write_text(OTHER_TU)  # a second unit including the tables' header
    compile_c(sources(tmp_path, "m") + [tmp_path / "main.c", tmp_path / "other.c"], tmp_path / "h", tmp_path)
    out = subprocess.run([tmp_path / "h"], capture_output=True, text=True).stdout.split()
    zp_x, zp_y = qm.cells[0][0].spec["x"].zp, qm.cells[-1][0].spec["h"].zp
    assert out == [str(3 - zp_x), str(3 - zp_y), "-4"]
    header = (tmp_path / "m_params.h").read_text()
    defs = (tmp_path / "m_params.c").read_text()
    n = defs.count("QGRU_ALIGN QGRU_SECTION = {")  # every table aligned, defined in the .c
    assert n >= 2 * 10 and "= {" not in header and header.count("extern const") == n + 1
    nm = subprocess.run(["nm", str(tmp_path / "h")], capture_output=True, text=True).stdout
    assert nm.count(" m_l0_fwd_qW\n") == 1


def test_types_follow_the_proven_bounds(tmp_path):
    """int8 models store int8 and compute in int32 only; int16 models need int64 GEMM sums
    (sum_k |q_W| * 2^15 > 2^31) and keep int32 elsewhere where it fits."""
    qm8, _ = model_and_data(2, 2, 13, "int8")
    ty = model_types(qm8, "table")
    assert ty.q_t == ty.w_t == ty.lut_t == "int8_t" and set(ty.bits.values()) == {32}
    export_c(qm8, tmp_path, "m")
    code = re.sub(r"/\*.*?\*/", "", (tmp_path / "m.c").read_text(), flags=re.S)
    assert "int64" not in code and "QGRU_SAT32(" in code
    assert "typedef int8_t m_q_t;" in (tmp_path / "m.h").read_text()
    qm16, _ = model_and_data(1, 1, 13, "int16")
    ty = model_types(qm16, "table")
    assert ty.q_t == ty.w_t == "int16_t" and ty.bits["Wx"] == ty.bits["Rh"] == 64
    assert ty.bits["z_pre"] == ty.bits["h"] == 32


def test_bidirectional_step_refuses(tmp_path):
    qm, _ = model_and_data(1, 2, 14, "int8")
    export_c(qm, tmp_path, "m")
    assert "-1\n * (and computes nothing) for a bidirectional model" in (tmp_path / "m.h").read_text()
    (tmp_path / "main.c").write_text('#include <stdio.h>\n#include "m.h"\nstatic m_state_t s;\n'
                                     "int main(void) { m_q_t x[M_INPUT_SIZE] = {0}, y[M_OUTPUT_SIZE];\n"
                                     "m_reset(&s); printf(\"%d\\n\", m_step(&s, x, y)); return 0; }\n")
    compile_c(sources(tmp_path, "m") + [tmp_path / "main.c"], tmp_path / "b", tmp_path)
    assert subprocess.run([tmp_path / "b"], capture_output=True, text=True).stdout.strip() == "-1"


@pytest.mark.parametrize("preset", ["int8", "int16"])
def test_no_signed_overflow_on_extreme_inputs(tmp_path, preset, monkeypatch):
    """Inputs far beyond the calibrated range drive every tensor to its ends; compiled with
    UBSan, any int32 statement whose bound were wrong would stop the program."""
    qm, x = model_and_data(2, 2, 15, preset)
    export_c(qm, tmp_path, "m")
    x = np.sign(x) * 1e6
    probe = subprocess.run(["gcc", "-fsanitize=signed-integer-overflow", "-x", "c", "-", "-o",
                            str(tmp_path / "p")], input="int main(void){return 0;}", text=True,
                           capture_output=True)
    if probe.returncode != 0:
        pytest.skip("gcc without UBSan")
    monkeypatch.setenv("CC", "gcc -fsanitize=signed-integer-overflow,shift -fno-sanitize-recover=all")
    res = verify(qm, tmp_path, "m", x)
    assert res["output_mismatches"] == res["state_mismatches"] == 0


@pytest.mark.parametrize("preset", ["int8", "int16", "mixed"])
@pytest.mark.parametrize("compensation", ["table", "offset"])
def test_render_writes_nothing_and_footprint_is_computed(tmp_path, monkeypatch, preset, compensation):
    """render_c and footprint touch no file system (the advisor counts flash for every candidate);
    footprint alone gives render_c's numbers; the plain writer writes exactly the rendered bytes."""
    import builtins
    import tempfile

    qm, _ = model_and_data(2, 2, 16, preset)
    export_c(qm, tmp_path, "m", compensation)
    real_open = builtins.open

    def read_only(file, mode="r", *args, **kwargs):
        assert not set(mode) & set("wax+"), f"opened {file} with mode {mode}"
        return real_open(file, mode, *args, **kwargs)

    monkeypatch.setattr(builtins, "open", read_only)
    monkeypatch.setattr(tempfile, "mkdtemp", lambda *a, **k: pytest.fail("a temporary directory"))
    c = render_c(qm, "m", compensation)
    fp = footprint(qm, compensation)
    monkeypatch.undo()
    assert fp == c.footprint and fp.flash_bytes > 0
    files = c.encoded()
    assert list(files) == sorted(files) == sorted(p.name for p in tmp_path.iterdir())
    assert all((tmp_path / n).read_bytes() == data for n, data in files.items())


def test_api_export_writes_the_rendered_files_once(tmp_path):
    import qtool

    qm, x = model_and_data(1, 2, 17, "w8a16")
    res = qtool.export_c(qm, tmp_path / "c", name="m", test_vectors=x[:2])
    want = encoded({**render_c(qm, "m").files, **render_test_vectors(qm, "m", x[:2], run_int(qm, x[:2]))})
    assert res.files == sorted(want) == sorted(p.name for p in (tmp_path / "c").iterdir())
    assert all((tmp_path / "c" / n).read_bytes() == data for n, data in want.items())
    assert res.footprint == footprint(qm) and res.name == "m" and res.replaced == []
    ver = qtool.verify(qm, tmp_path / "c", x)
    assert ver.mismatches == 0 and ver.name == "m" and ver.output_values == 5 * 11 * 12
    assert ver.to_dict() == {**verify(qm, tmp_path / "c", "m", x), "name": "m", "mismatches": 0, "passed": True}
    assert list(ver.to_dict()) == ["target", "sequences", "time_steps", "output_values", "output_mismatches",
                                   "state_values", "state_mismatches", "dequantized_mismatches", "name",
                                   "mismatches", "passed"]


def test_c_name_is_idempotent():
    for name in ["a" * 47 + "_b", "7" * 60, "x" * 100, "int", "__a__", "my-model v2", "-" * 5]:
        assert c_name(c_name(name)) == c_name(name) and len(c_name(name)) <= 48
        assert not c_name(name).endswith("_")


def _gemm_rescales(code: str) -> set:
    """The shift of every GEMM rescale the export chose, cell prefixes left out."""
    return {re.sub(r"m_l\d_\w+?_", "", m) for m in re.findall(r"qgru_rshift_\w+\(acc[^,]*, [^)]*\)", code)}


@pytest.mark.parametrize("preset", ["int8", "int16"])
def test_gemm_shifts_of_every_kind_equal_simulator(tmp_path, preset):
    """Each GEMM's rescale follows its per-channel shifts, known at export: a literal where every
    channel has the same, the branch-free right shift where all are >= 1, the general one where
    the signs differ (here made so); each computes the simulator's integers."""
    from qtool.numerics.rescale import CH_SH_R, CH_SH_W

    qm, x = model_and_data(2, 1, 31, preset)
    ch = qm.cells[0][0].CH
    ch[CH_SH_W, ::2] = np.arange(ch.shape[1] // 2) % 3 - 1  # -1, 0, 1: left, none, right
    ch[CH_SH_R] = ch[CH_SH_R].max()
    export_c(qm, tmp_path, "m", "offset")
    n = model_types(qm, "offset").bits["Wx"]
    assert _gemm_rescales((tmp_path / "m.c").read_text()) == {
        f"qgru_rshift_round{n}(acc, sh_W[c])", f"qgru_rshift_round{n}(acc, {int(ch[CH_SH_R, 0])})",
        f"qgru_rshift_right{n}(acc, sh_W[c])", f"qgru_rshift_right{n}(acc, sh_R[c])"}
    res = verify(qm, tmp_path, "m", x)
    assert res["output_mismatches"] == res["state_mismatches"] == 0


SHIFT_MAIN = r"""
#include <stdio.h>
#include "qgru.h"
int main(void)
{
    static const int32_t v32[] = {INT32_MIN, INT32_MIN + 1, -65537, -3, -2, -1, 0, 1, 2, 3, 65535,
                                  INT32_MAX / 2, INT32_MAX - 65536};
    int32_t n, i;
    long bad = 0;
    for (n = 1; n <= 16; n++) {
        for (i = 0; i < (int32_t)(sizeof(v32) / sizeof(v32[0])); i++) {
            const int32_t v = v32[i] + i; /* odd and even values */
            const int64_t w = (int64_t)v * 1000003;
            bad += qgru_rshift_right32(v, n) != qgru_rshift_round32(v, n);
            bad += qgru_rshift_right64(w, n + 20) != qgru_rshift_round64(w, n + 20);
        }
    }
    printf("%ld\n", bad);
    return 0;
}
"""


def test_branch_free_right_shift_equals_rshift_round(tmp_path):
    """qgru_rshift_right (n >= 1 known at export) rounds half up exactly as rshift_round."""
    export_c(model_and_data(1, 1, 32, "int8")[0], tmp_path, "m")
    (tmp_path / "main.c").write_text(SHIFT_MAIN)
    compile_c([tmp_path / "qgru.c", tmp_path / "main.c"], tmp_path / "r", tmp_path)
    assert subprocess.run([tmp_path / "r"], capture_output=True, text=True).stdout.strip() == "0"


def test_cells_read_no_parameter_at_run_time(tmp_path):
    """Every scalar of a cell is a literal in its step function: no P[...] read, no NULL test of
    a compensation table, no run-time sign test of a shift whose sign the export knows."""
    qm, _ = model_and_data(2, 2, 33, "int8")
    export_c(qm, tmp_path, "m")
    code = re.sub(r"/\*.*?\*/", "", (tmp_path / "m.c").read_text(), flags=re.S)
    steps = code[code.index("m_l0_fwd_rescale_Wx"):code.index("m_cell_steps[4]")]
    assert "P[" not in steps and "NULL" not in steps and "cell->" not in steps
    assert "qgru_rshift_round32(acc" not in steps  # the shifts of this model's GEMMs are all >= 1
    assert steps.count("static void m_l") == 4  # one step function per layer and direction


def test_verify_finds_the_export_made_from_its_model_among_several(tmp_path):
    """Several exports in one folder: verify takes the one whose fingerprint is the model's,
    whatever its name, and where none is, says that rather than asking for a name."""
    import qtool

    a, x = model_and_data(1, 1, 3, "int8")
    b, _ = model_and_data(1, 1, 4, "int8")
    stranger, _ = model_and_data(1, 1, 5, "int8")
    qtool.export_c(a, tmp_path, name="first")
    qtool.export_c(b, tmp_path, name="second", force=True)  # the shared runtime files again
    assert qtool.verify(b, tmp_path, x).name == "second"
    assert qtool.verify(a, tmp_path, x).name == "first"
    with pytest.raises(QtoolError, match=r"holds several exports \(first, second\), none made from this model"):
        qtool.verify(stranger, tmp_path, x)
