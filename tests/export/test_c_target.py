"""The exported C on a microcontroller's instruction set: cross-compiled with arm-none-eabi-gcc
(picolibc) and run on emulated Cortex-M boards under QEMU, it computes every integer the
simulator computes; the Cortex-M4F build links no double-precision routines."""

import shutil
import subprocess

import pytest
from qtool.exporters import c_target
from qtool.exporters.c_export import export_c, sources
from qtool.exporters.c_verify import CFLAGS, VERIFY_MAIN
from test_export_c import model_and_data, verify, write_test_vectors

from qtool.errors import QtoolError

needs_qemu = pytest.mark.skipif(bool(c_target.missing_tools()),
                                reason=f"needs {c_target.PACKAGES} (Debian packages)")


@needs_qemu
@pytest.mark.parametrize("preset,compensation", [("int8", "table"), ("w8a16", "offset"),
                                                 ("int16", "table"), ("mixed", "offset")])
@pytest.mark.parametrize("layers,dirs", [(1, 1), (2, 1), (2, 2)])
def test_cortex_m4_equals_simulator(tmp_path, preset, compensation, layers, dirs):
    qm, x = model_and_data(layers, dirs, layers * 10 + dirs, preset)
    export_c(qm, tmp_path, "m", compensation)
    res = verify(qm, tmp_path, "m", x[:3], target="cortex-m4", timeout=120)
    assert res["output_values"] == 3 * 11 * 6 * dirs and res["state_values"] == 3 * 6 * layers * dirs
    assert res["output_mismatches"] == res["state_mismatches"] == res["dequantized_mismatches"] == 0


@needs_qemu
@pytest.mark.parametrize("target", ["cortex-m33", "cortex-m55"])
def test_other_cores_equal_simulator(tmp_path, target):
    qm, x = model_and_data(2, 2, 21, "int8")
    export_c(qm, tmp_path, "m", "offset")
    res = verify(qm, tmp_path, "m", x[:2], target=target, timeout=120)
    assert res["output_mismatches"] == res["state_mismatches"] == res["dequantized_mismatches"] == 0


def _objdump(exe) -> str:
    return subprocess.run(["arm-none-eabi-objdump", "-d", str(exe)], capture_output=True, text=True).stdout


@needs_qemu
def test_dsp_and_portable_paths_both_pass_on_the_board(tmp_path):
    """The int8 GEMMs use SMLAD on the Cortex-M4 and the plain loop with QGRU_PORTABLE; the
    test vectors' main passes on the board with both (C = 5: the kernel's tail is exercised);
    both saturate with SSAT."""
    qm, x = model_and_data(2, 1, 22, "int8")
    export_c(qm, tmp_path, "m")
    write_test_vectors(qm, tmp_path, "m", x[:2])
    t = c_target.TARGETS["cortex-m4"]
    for flags, smlad in (([], True), (["-DQGRU_PORTABLE"], False)):
        exe = tmp_path / f"t{len(flags)}.elf"
        c_target.cross_compile(t, sources(tmp_path, "m") + [tmp_path / "m_test_main.c"], exe, tmp_path,
                               CFLAGS + flags)
        res = c_target.run(t, exe, [], tmp_path, timeout=60)
        assert res.returncode == 0 and "PASS: 0 mismatches in 132 " in c_target.output(res)
        code = _objdump(exe)
        assert ("smlad" in code) == smlad and "ssat" in code


@needs_qemu
def test_cortex_m4f_build_links_no_double_precision(tmp_path):
    """quantize_input and dequantize_output run in single precision: the linked Cortex-M4F
    program (without -lm) holds no soft-double helper (__aeabi_d*) and no FPU double op."""
    qm, _ = model_and_data(1, 1, 23, "int8")
    export_c(qm, tmp_path, "m")
    (tmp_path / "main.c").write_text(VERIFY_MAIN.format(prefix="m", P="M"))
    exe = tmp_path / "v.elf"
    c_target.cross_compile(c_target.TARGETS["cortex-m4"], sources(tmp_path, "m") + [tmp_path / "main.c"],
                           exe, tmp_path, CFLAGS)
    symbols = subprocess.run(["arm-none-eabi-nm", str(exe)], capture_output=True, text=True).stdout
    assert " T m_quantize_input" in symbols and " T m_dequantize_output" in symbols
    assert "__aeabi_d" not in symbols
    assert "vcvt.s32.f32" in _objdump(exe)  # float to int: the FPU's single-precision conversion


def test_missing_toolchain_is_one_clear_error(tmp_path, monkeypatch):
    qm, x = model_and_data(1, 1, 24, "int8")
    export_c(qm, tmp_path, "m")
    monkeypatch.setenv("PATH", str(tmp_path / "nowhere"))
    with pytest.raises(QtoolError, match=r"`target` cortex-m4 needs arm-none-eabi-gcc, "
                                         r"qemu-system-arm: .*apt-get install gcc-arm-none-eabi "
                                         r"picolibc-arm-none-eabi qemu-system-arm"):
        verify(qm, tmp_path, "m", x, target="cortex-m4")
    with pytest.raises(QtoolError, match="unknown target 'cortex-m7'"):
        verify(qm, tmp_path, "m", x, target="cortex-m7")


@needs_qemu
def test_cli_verify_on_cortex_m4(cli, tmp_path):
    from conftest import SAMPLES, has

    if not has("safetensors"):
        pytest.skip("the sample is .safetensors")
    q = tmp_path / "q.h5"
    assert cli("calibrate", SAMPLES / "digits_gru.safetensors", SAMPLES / "calib.npy", "-o", q)[0] == 0
    assert cli("export", "c", q, "-o", tmp_path / "c", "--name", "digits")[0] == 0
    code, out, err = cli("verify", q, tmp_path / "c", SAMPLES / "test.npy", "--name", "digits",
                         "--target", "cortex-m4", "--limit", "40", "--json")
    assert code == 0, err
    import json

    res = json.loads(out)
    assert res["target"] == "cortex-m4" and res["output_values"] == 40 * 8 * 64
    assert res["output_mismatches"] == res["state_mismatches"] == res["dequantized_mismatches"] == 0
    code, _, err = cli("verify", q, tmp_path / "c", SAMPLES / "test.npy", "--name", "digits",
                       "--target", "riscv")
    assert code == 2 and "unknown target 'riscv'" in err


def test_targets_are_consistent():
    assert set(c_target.CHOICES) == {"host", "cortex-m4", "cortex-m33", "cortex-m55"}
    for t in c_target.TARGETS.values():
        assert t.cflags[0] == f"-mcpu={t.name}" and t.flash_size >= 0x80000 and t.ram_size >= 0x80000


def _picolibc_includes() -> list[str]:
    res = subprocess.run([c_target.CROSS_CC, "--specs=picolibc.specs", "-E", "-Wp,-v", "-x", "c",
                          "/dev/null", "-o", "/dev/null"], capture_output=True, text=True)
    lines = res.stderr.splitlines()
    start = lines.index("#include <...> search starts here:") + 1
    # the C library's headers only: clang brings its own stdint.h and arm_acle.h
    return [f"-isystem{p.strip()}" for p in lines[start:lines.index("End of search list.")]
            if "picolibc" in p]


@needs_qemu
@pytest.mark.skipif(shutil.which("clang") is None, reason="clang not installed")
def test_clang_for_cortex_m4(tmp_path):
    """clang builds the export for the Cortex-M4 warning-free under the strict flags (its SMLAD
    kernel uses the intrinsics alone: clang folds the rotations) and the result passes on the
    board."""
    qm, x = model_and_data(2, 2, 25, "int8")
    export_c(qm, tmp_path, "m", "offset")
    write_test_vectors(qm, tmp_path, "m", x[:2])
    t = c_target.TARGETS["cortex-m4"]
    objs = []
    for src in sources(tmp_path, "m") + [tmp_path / "m_test_main.c"]:
        obj = tmp_path / (src.name + ".o")
        res = subprocess.run(["clang", "--target=arm-none-eabi", *t.cflags, *_picolibc_includes(),
                              *CFLAGS, f"-I{tmp_path}", "-c", str(src), "-o", str(obj)],
                             capture_output=True, text=True)
        assert res.returncode == 0, res.stderr
        objs.append(str(obj))
    exe = tmp_path / "t.elf"
    subprocess.run([c_target.CROSS_CC, *t.cflags, *objs, "-o", str(exe), *c_target.link_flags(t)],
                   check=True)
    assert "smlad" in _objdump(exe)
    res = c_target.run(t, exe, [], tmp_path, timeout=60)
    assert res.returncode == 0 and "PASS: 0 mismatches in 264 " in c_target.output(res)
