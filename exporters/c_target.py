"""Cortex-M targets for `qtool verify --target`: cross-compile with arm-none-eabi-gcc and
picolibc, run on an emulated MPS2/MPS3 board under qemu-system-arm, with semihosting for the
program's arguments, files, output and exit status."""

from __future__ import annotations

import shutil
import subprocess
from dataclasses import dataclass
from pathlib import Path

from qtool.errors import QtoolError

PACKAGES = "gcc-arm-none-eabi picolibc-arm-none-eabi qemu-system-arm"
CROSS_CC = "arm-none-eabi-gcc"
QEMU = "qemu-system-arm"


@dataclass(frozen=True)
class Target:
    name: str
    cflags: tuple[str, ...]
    machine: str   # the QEMU board
    flash: int     # where code and constants go, and how much there is
    flash_size: int
    ram: int
    ram_size: int


TARGETS = {t.name: t for t in (
    # MPS2 AN386: Cortex-M4 with FPU, 4 MiB SSRAM for code at 0, 4 MiB at 0x20000000
    Target("cortex-m4", ("-mcpu=cortex-m4", "-mthumb", "-mfloat-abi=hard", "-mfpu=fpv4-sp-d16"),
           "mps2-an386", 0x00000000, 0x400000, 0x20000000, 0x400000),
    # MPS2 AN505: Cortex-M33 (DSP, FPU), secure aliases of SSRAM1 and SSRAM2/3
    Target("cortex-m33", ("-mcpu=cortex-m33", "-mthumb", "-mfloat-abi=hard", "-mfpu=fpv5-sp-d16"),
           "mps2-an505", 0x10000000, 0x400000, 0x38000000, 0x400000),
    # MPS3 AN547: Cortex-M55 (DSP, MVE, FPU), secure aliases of the 512 KiB ITCM and DTCM
    Target("cortex-m55", ("-mcpu=cortex-m55", "-mthumb", "-mfloat-abi=hard"),
           "mps3-an547", 0x10000000, 0x80000, 0x30000000, 0x80000),
)}
HOST = "host"
STACK_BYTES = 0x10000
CHOICES = (HOST, *TARGETS)


def target(name: str) -> Target:
    if name not in TARGETS:
        raise QtoolError(f"unknown target {name!r}: use one of {', '.join(CHOICES)}")
    return TARGETS[name]


def missing_tools() -> list[str]:
    """The tools a Cortex-M run needs that this machine lacks (empty: all there)."""
    missing = [t for t in (CROSS_CC, QEMU) if shutil.which(t) is None]
    if not missing and not picolibc_specs():
        missing.append("picolibc")
    return missing


def picolibc_specs() -> bool:
    res = subprocess.run([CROSS_CC, "-print-file-name=picolibc.specs"], capture_output=True, text=True)
    return res.returncode == 0 and Path(res.stdout.strip()).is_file()


def check_tools(t: Target) -> None:
    missing = missing_tools()
    if missing:
        raise QtoolError(f"`target` {t.name} needs {', '.join(missing)}: on Debian or Ubuntu, "
                         f"apt-get install {PACKAGES}")


def link_flags(t: Target) -> list[str]:
    return ["--specs=picolibc.specs", "--oslib=semihost", "--crt0=semihost",
            f"-Wl,--defsym=__flash={t.flash:#x}", f"-Wl,--defsym=__flash_size={t.flash_size:#x}",
            f"-Wl,--defsym=__ram={t.ram:#x}", f"-Wl,--defsym=__ram_size={t.ram_size:#x}",
            # 64 KiB of stack, not picolibc's 2 KiB: NAME_run_sequence keeps two int32 per edge and
            # layer on it (3.3 KiB for GTCRN's 205 layers)
            f"-Wl,--defsym=__stack_size={STACK_BYTES:#x}", "-Wl,--gc-sections"]


def cross_compile(t: Target, sources: list[Path], exe: Path, include: Path, cflags: list[str],
                  extra: list[str] | None = None) -> None:
    """Compile and link a semihosted program for `t` (no -lm: the export needs none)."""
    check_tools(t)
    cmd = [CROSS_CC, *t.cflags, *cflags, "-ffunction-sections", "-fdata-sections", f"-I{include}",
           *[str(s) for s in sources], "-o", str(exe), *link_flags(t), *(extra or [])]
    res = subprocess.run(cmd, capture_output=True, text=True)
    if res.returncode != 0:
        lines = res.stderr.strip().splitlines()
        first = next((x for x in lines if "error" in x), lines[0] if lines else "(no message)")
        raise QtoolError(f"the exported C did not build for {t.name}: {first}")


def output(res: subprocess.CompletedProcess) -> str:
    """What the program printed: QEMU writes the semihosting console to its stderr."""
    return res.stdout + res.stderr


def run(t: Target, exe: Path, args: list[str], cwd: Path, timeout: float,
        icount: bool = False) -> subprocess.CompletedProcess:
    """Run `exe` on the emulated board; file names in `args` are relative to `cwd`.
    `icount`: one virtual nanosecond per instruction (QEMU -icount shift=0), so that a 25 MHz
    board timer counts one tick per 40 instructions."""
    check_tools(t)
    semi = ",".join(["enable=on", "target=native", *(f"arg={a}" for a in args)])
    cmd = [QEMU, "-M", t.machine, "-nographic", "-monitor", "none", "-serial", "none",
           "-semihosting-config", semi, "-kernel", str(exe)]
    if icount:
        cmd[1:1] = ["-icount", "shift=0,align=off,sleep=off"]
    try:
        return subprocess.run(cmd, cwd=cwd, capture_output=True, text=True, timeout=timeout)
    except subprocess.TimeoutExpired:
        raise QtoolError(f"the program did not finish within {timeout:.0f} s on the emulated "
                         f"{t.name} ({t.machine})") from None
