"""The C export of the other GRU cell forms (qtool.core.model.CellForm): the reset-before cell
(Keras reset_after=False, ONNX linear_before_reset=0: two passes over the units with R's g rows
on rh = r * h_old between them) and other activation tables (hard_sigmoid gates, relu and linear
candidates), alone, stacked, bidirectional and mixed with haste cells. Compiled warning-free on
the host (and the emulated Cortex-M4), the C computes every integer `run_int` computes."""

import json
import re
import shutil
import subprocess

import numpy as np
import pytest
from conftest import calibrated, random_model
from qtool.exporters import c_target
from qtool.exporters.c_export import export_c, footprint, render_c, sources
from qtool.exporters.c_types import SIZES, model_types
from qtool.exporters.c_verify import CFLAGS, compile_c
from test_export_c import STREAM_MAIN, verify, write_test_vectors

from qtool.core.model import CellForm, GruCell, GruModel
from qtool.core.tensors import PARAMS_RESET_BEFORE, TensorConfig, preset_config

pytestmark = pytest.mark.skipif(shutil.which("cc") is None, reason="no C compiler")
needs_qemu = pytest.mark.skipif(bool(c_target.missing_tools()), reason=f"needs {c_target.PACKAGES} (Debian packages)")

RESET_BEFORE = CellForm(reset_after=False)
FORMS = {
    "reset_before": RESET_BEFORE,
    "reset_before_hard_sigmoid_relu": CellForm(reset_after=False, gate="hard_sigmoid", gate_alpha=0.2,
                                               gate_beta=0.5, candidate="relu"),
    "hard_sigmoid_linear": CellForm(gate="hard_sigmoid", gate_alpha=1 / 6, gate_beta=0.5, candidate="linear"),
}
HASTE = CellForm()


def with_forms(model: GruModel, *forms: CellForm) -> GruModel:
    """`model` with layer l's cells of form forms[l % len(forms)]."""
    return GruModel([[GruCell(c.W, c.R, c.bx, c.br, forms[l % len(forms)]) for c in cells]
                     for l, cells in enumerate(model.layers)], name="forms")


def model_and_data(forms, layers, dirs, preset="int8", config=None, seed=None, C=5, H=6):
    seed = layers * 10 + dirs if seed is None else seed
    model = with_forms(random_model(C=C, H=H, layers=layers, dirs=dirs, seed=seed), *forms)
    rng = np.random.RandomState(seed)
    qm = calibrated(model, rng.randn(12, 9, C).astype(np.float32), preset, config=config)
    return qm, rng.randn(5, 11, C).astype(np.float32) * 1.2  # held out, some beyond the range


def exact(res: dict) -> bool:
    return res["output_mismatches"] == res["state_mismatches"] == res["dequantized_mismatches"] == 0


@pytest.mark.parametrize("compensation", ["table", "offset"])
@pytest.mark.parametrize("preset", ["int8", "w8a16", "int16"])
@pytest.mark.parametrize("layers,dirs", [(1, 1), (2, 1), (2, 2)])
@pytest.mark.parametrize("form", list(FORMS))
def test_c_equals_simulator(tmp_path, form, layers, dirs, preset, compensation):
    qm, x = model_and_data([FORMS[form]], layers, dirs, preset)
    export_c(qm, tmp_path, "m", compensation)
    res = verify(qm, tmp_path, "m", x)
    assert res["output_values"] == 5 * 11 * 6 * dirs and res["state_values"] == 5 * 6 * layers * dirs
    assert exact(res), res


@pytest.mark.parametrize("preset", ["int8", "w8a16", "int16"])
def test_reset_before_hard_sigmoid_linear_equals_simulator(tmp_path, preset):
    """The form of every option at once: a linear candidate's g_out shares g_pre's grid."""
    form = CellForm(reset_after=False, gate="hard_sigmoid", gate_alpha=0.2, gate_beta=0.5, candidate="linear")
    qm, x = model_and_data([form], 2, 2, preset)
    export_c(qm, tmp_path, "m", "offset")
    assert exact(verify(qm, tmp_path, "m", x))


SIZEOF_MAIN = '#include <stdio.h>\n#include "m.h"\nint main(void) { printf("%u\\n", (unsigned)sizeof(m_state_t)); ' \
              "return 0; }\n"


def _wide():
    """z_out and rh wider than h: z held in its own int16 buffer, rh in an int16 one."""
    cfg = preset_config("int8")
    cfg.update(z_out=TensorConfig(16, False), rh=TensorConfig(16, False))
    return cfg


def _symmetric_state():
    """x and h symmetric (zero points 0): only rh's zero point asks for compensation."""
    cfg = preset_config("int8")
    cfg.update(x=TensorConfig(8, True), h=TensorConfig(8, True))
    return cfg


@pytest.mark.parametrize("compensation", ["table", "offset"])
@pytest.mark.parametrize("case", ["mixed_forms", "wide", "symmetric_state", "mixed_forms_wide"])
def test_buffers_and_mixed_forms(tmp_path, case, compensation):
    """A haste layer under a reset-before one, rh and z wider than the state, compensation that
    only rh needs: exact, and the footprint's RAM is the state's sizeof."""
    forms = [HASTE, RESET_BEFORE] if case.startswith("mixed") else [RESET_BEFORE]
    config = _wide() if case.endswith("wide") else _symmetric_state() if case == "symmetric_state" else None
    qm, x = model_and_data(forms, 2, 2, config=config)
    ty = model_types(qm, compensation)
    assert ty.rh_t == ("int16_t" if case.endswith("wide") else "int8_t")
    assert ty.z_t == ("int16_t" if case.endswith("wide") else "")
    if case == "symmetric_state":
        assert all(cq.spec["x"].zp == cq.spec["h"].zp == 0 != cq.spec["rh"].zp for row in qm.cells for cq in row)
        assert ty.offsets == [[compensation == "offset"] * 2] * 2
    fp = export_c(qm, tmp_path, "m", compensation)
    assert exact(verify(qm, tmp_path, "m", x))
    (tmp_path / "main.c").write_text(SIZEOF_MAIN)
    compile_c(sources(tmp_path, "m") + [tmp_path / "main.c"], tmp_path / "s", tmp_path)
    assert int(subprocess.run([tmp_path / "s"], capture_output=True, text=True).stdout) == fp.ram_bytes


def test_reset_before_export_has_its_own_tables_and_program(tmp_path):
    """The reset-before cell's export: b_pre holds every bias (no b_Rh_add_br), P its own
    scalars, the state its rh buffer (H bytes more RAM at int8); the passes' program has rh and
    the g rows' GEMM on it, no Rh_add_br and no rRh; a haste model's export has none of it."""
    qm, _ = model_and_data([RESET_BEFORE], 2, 1, seed=3)
    haste, _ = model_and_data([HASTE], 2, 1, seed=3)
    c = render_c(qm, "m")
    params_c, params_h, header = c.files["m_params.c"], c.files["m_params.h"], c.files["m.h"]
    assert "_b_Rh_add_br" not in params_c and "m_l1_fwd_b_pre[18]" in params_c
    assert f"m_l0_fwd_P[{len(PARAMS_RESET_BEFORE)}]" in params_c and "QGRU_RB_SH_RH_PROD," in params_h
    assert "    int8_t rh[6];" in header and "int32_t reset_after;" in params_h
    code = re.sub(r"/\*.*?\*/", "", c.files["m.c"], flags=re.S)
    assert code.count("_dot1_rh(") == 3 and "P[" not in code.split("m_reset")[0]  # two cells, one kernel
    fp_h = footprint(haste)
    assert c.footprint.ram_bytes == fp_h.ram_bytes + 6 and c.footprint.macs_per_step == fp_h.macs_per_step
    assert c.footprint.bias_bytes == 2 * 3 * 6 * SIZES[model_types(qm, "table").b_t]  # b_pre alone
    removed = [w for r in c.footprint.passes["passes"].values() for w in r["what"]]
    assert "layer0.fwd: rescale br_g -> g_pre" in removed and not any("Rh_add_br" in w for w in removed)
    assert c.footprint.passes["partition"]["core_fully_integral"]
    from qtool.numerics.passes import run_passes

    core = [f"{op.kind} {op.what}" for op in run_passes(qm).ops if op.where == "layer1.fwd"]
    assert {"mul rh = r h", "gemm Rh_g = R_g rh", "gemm Rh_zr = R_zr h", "constant b_pre"} <= set(core)
    assert not any("rRh" in w or "b_Rh_add_br" in w for w in core)
    h = render_c(haste, "m").files
    assert not any(s in h[n] for n in ("m.c", "m.h", "m_params.h") for s in ("dot2_", "rh[", "reset_after", "QGRU_RB"))


def test_parameter_tables_of_a_reset_before_cell():
    from qtool.exporters.tables import parameter_tables

    qm, _ = model_and_data([FORMS["reset_before_hard_sigmoid_relu"]], 1, 1)
    cell = parameter_tables(qm)["cells"][0]
    assert "rh" in cell["tensors"] and "Rh_add_br" not in cell["tensors"]
    assert list(cell["shifts"]) == list(PARAMS_RESET_BEFORE)
    assert cell["form"] == {"reset_after": False, "gate": "hard_sigmoid", "gate_alpha": 0.2, "gate_beta": 0.5,
                            "candidate": "relu"}
    haste, _ = model_and_data([HASTE], 1, 1)
    assert "form" not in parameter_tables(haste)["cells"][0]


def test_streaming_equals_sequence(tmp_path):
    qm, _ = model_and_data([RESET_BEFORE, HASTE], 2, 1, seed=3)
    export_c(qm, tmp_path, "m")
    (tmp_path / "main.c").write_text(STREAM_MAIN)
    compile_c(sources(tmp_path, "m") + [tmp_path / "main.c"], tmp_path / "s", tmp_path)
    assert subprocess.run([tmp_path / "s"], capture_output=True, text=True).stdout.strip() == "0"


@pytest.mark.skipif(shutil.which("clang") is None, reason="clang not installed")
@pytest.mark.parametrize("preset", ["int8", "int16"])
def test_test_vectors_pass_under_gcc_and_clang_strict_flags(tmp_path, preset):
    qm, x = model_and_data([HASTE, FORMS["reset_before_hard_sigmoid_relu"]], 2, 2, preset, seed=5)
    export_c(qm, tmp_path, "m")
    write_test_vectors(qm, tmp_path, "m", x[:2])
    for cc in ("gcc", "clang"):
        cmd = [cc, *CFLAGS, f"-I{tmp_path}", *map(str, sources(tmp_path, "m")), str(tmp_path / "m_test_main.c"),
               "-o", str(tmp_path / cc)]
        res = subprocess.run(cmd, capture_output=True, text=True)
        assert res.returncode == 0, res.stderr
        run = subprocess.run([tmp_path / cc], capture_output=True, text=True)
        assert run.returncode == 0 and run.stdout.startswith("PASS: 0 mismatches in 264 ")


@pytest.mark.parametrize("preset", ["int8", "int16"])
def test_no_signed_overflow_on_extreme_inputs(tmp_path, preset, monkeypatch):
    """Inputs far beyond the calibrated range drive every tensor, rh too, to its ends: compiled
    with UBSan, a statement whose proven bound were wrong would stop the program."""
    qm, x = model_and_data([RESET_BEFORE], 2, 2, preset, seed=15)
    export_c(qm, tmp_path, "m", "offset")
    probe = subprocess.run(["gcc", "-fsanitize=signed-integer-overflow", "-x", "c", "-", "-o",
                            str(tmp_path / "p")], input="int main(void){return 0;}", text=True,
                           capture_output=True)
    if probe.returncode != 0:
        pytest.skip("gcc without UBSan")
    monkeypatch.setenv("CC", "gcc -fsanitize=signed-integer-overflow,shift -fno-sanitize-recover=all")
    assert exact(verify(qm, tmp_path, "m", np.sign(x) * 1e6))


def test_cli_exports_and_verifies_a_reset_before_model(cli, tmp_path):
    """As a user runs it: `export c` with test vectors, offset compensation and the fully-integral
    check, the test main passes; `verify` finds no mismatch; a tampered R_g fails it."""
    from qtool import api

    qm, x = model_and_data([RESET_BEFORE], 2, 1, "w8a16", seed=7)
    api.save(qm, tmp_path / "q.h5")
    np.save(tmp_path / "test.npy", x)
    code, out, err = cli("export", "c", tmp_path / "q.h5", "-o", tmp_path / "c", "--name", "kws", "--test-vectors",
                         "--data", tmp_path / "test.npy", "--compensation", "offset", "--fully-integral", "--json")
    assert code == 0, err
    doc = json.loads(out)
    assert doc["macs_per_step"] == 3 * 6 * (5 + 6) + 3 * 6 * (6 + 6)
    assert doc["ram_bytes"] == 2 * (2 * 6 + 6 + 6) and doc["partition"]["core_fully_integral"]
    compile_c(sources(tmp_path / "c", "kws") + [tmp_path / "c" / "kws_test_main.c"], tmp_path / "t", tmp_path / "c")
    run = subprocess.run([tmp_path / "t"], capture_output=True, text=True)
    assert run.returncode == 0 and run.stdout.startswith("PASS: 0 mismatches"), run.stdout
    code, out, err = cli("verify", tmp_path / "q.h5", tmp_path / "c", tmp_path / "test.npy", "--json")
    res = json.loads(out)
    assert code == 0 and res["output_mismatches"] == res["state_mismatches"] == 0, err
    params = tmp_path / "c" / "kws_params.c"  # R's g rows of unit 0 (unit-major: after its z and r rows)
    text = params.read_text()
    body = text.index("{", text.index("kws_l1_fwd_qR[")) + 1
    values = text[body:text.index("}", body)].replace("\n", " ").split(",")
    values[2 * 6] = "127" if int(values[2 * 6]) < 0 else "-127"
    params.write_text(text[:body] + ",".join(values) + text[text.index("}", body):])
    code, out, _ = cli("verify", tmp_path / "q.h5", tmp_path / "c", tmp_path / "test.npy", "--json")
    assert code == 1 and json.loads(out)["output_mismatches"] > 0


@needs_qemu
@pytest.mark.parametrize("compensation", ["table", "offset"])
@pytest.mark.parametrize("form", list(FORMS))
def test_cortex_m4_equals_simulator(tmp_path, form, compensation):
    qm, x = model_and_data([FORMS[form]], 2, 2)
    export_c(qm, tmp_path, "m", compensation)
    res = verify(qm, tmp_path, "m", x[:3], target="cortex-m4", timeout=120)
    assert res["output_values"] == 3 * 11 * 12 and exact(res)


@needs_qemu
@pytest.mark.parametrize("case", ["mixed_forms", "wide"])
def test_cortex_m4_buffers_and_mixed_forms(tmp_path, case):
    """The int16 rh buffer (its GEMM off the SMLAD kernel) and z's own buffer; a haste layer and
    a reset-before one in one export."""
    forms = [HASTE, RESET_BEFORE] if case == "mixed_forms" else [RESET_BEFORE]
    qm, x = model_and_data(forms, 2, 2, config=_wide() if case == "wide" else None)
    export_c(qm, tmp_path, "m", "offset")
    assert exact(verify(qm, tmp_path, "m", x[:3], target="cortex-m4", timeout=120))


@needs_qemu
def test_dsp_and_portable_paths_both_pass_on_the_board(tmp_path):
    """The reset-before cell's GEMMs (two rows, then one) use SMLAD on the Cortex-M4 and the plain
    loops with QGRU_PORTABLE; the test main passes with both (C = 5, H = 6: every kernel's tail)."""
    qm, x = model_and_data([RESET_BEFORE], 2, 1, seed=22)
    export_c(qm, tmp_path, "m")
    write_test_vectors(qm, tmp_path, "m", x[:2])
    t = c_target.TARGETS["cortex-m4"]
    for flags, smlad in (([], True), (["-DQGRU_PORTABLE"], False)):
        exe = tmp_path / f"t{len(flags)}.elf"
        c_target.cross_compile(t, sources(tmp_path, "m") + [tmp_path / "m_test_main.c"], exe, tmp_path,
                               CFLAGS + flags)
        res = c_target.run(t, exe, [], tmp_path, timeout=60)
        assert res.returncode == 0 and "PASS: 0 mismatches in 132 " in c_target.output(res)
        code = subprocess.run(["arm-none-eabi-objdump", "-d", str(exe)], capture_output=True, text=True).stdout
        assert ("smlad" in code) == smlad and "ssat" in code


@needs_qemu
@pytest.mark.skipif(shutil.which("clang") is None, reason="clang not installed")
def test_clang_for_cortex_m4(tmp_path):
    """clang builds the reset-before cell's SMLAD kernels warning-free for the Cortex-M4."""
    from test_c_target import _picolibc_includes

    qm, x = model_and_data([HASTE, RESET_BEFORE], 2, 2, seed=25)
    export_c(qm, tmp_path, "m", "offset")
    write_test_vectors(qm, tmp_path, "m", x[:2])
    t = c_target.TARGETS["cortex-m4"]
    objs = []
    for src in sources(tmp_path, "m") + [tmp_path / "m_test_main.c"]:
        obj = tmp_path / (src.name + ".o")
        res = subprocess.run(["clang", "--target=arm-none-eabi", *t.cflags, *_picolibc_includes(), *CFLAGS,
                              f"-I{tmp_path}", "-c", str(src), "-o", str(obj)], capture_output=True, text=True)
        assert res.returncode == 0, res.stderr
        objs.append(str(obj))
    exe = tmp_path / "t.elf"
    subprocess.run([c_target.CROSS_CC, *t.cflags, *objs, "-o", str(exe), *c_target.link_flags(t)], check=True)
    res = c_target.run(t, exe, [], tmp_path, timeout=60)
    assert res.returncode == 0 and "PASS: 0 mismatches in 264 " in c_target.output(res)


# ---- a whole model whose GRU is a reset-before one


@pytest.mark.parametrize("target", ["host", pytest.param("cortex-m4", marks=needs_qemu)])
def test_whole_model_with_a_reset_before_gru(tmp_path, target):
    from test_export_graph_c import _data, causal_graph

    from qtool import api

    g = causal_graph()
    gru = next(n for n in g.nodes if n.op == "gru")
    gru.attrs["reset_after"] = False
    qg = api.calibrate(g, _data(6, 64, 24, 0), bits="int8", method="minmax", check=False)
    res = api.export_c(qg, tmp_path, name="m")
    assert "_dot1_rh(" in (tmp_path / "m_gru.c").read_text()
    v = api.verify(qg, tmp_path, _data(6, 4 if target == "host" else 2, 17, 1) * 1.3, target=target)
    assert v.streaming and v.edge_values > 0 and v.stream_values > 0 and v.mismatches == 0, v.to_dict()
    assert res.footprint.ram_bytes > 0
