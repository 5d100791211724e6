"""`qtool verify`: compile the exported C with the host compiler (or cross-compile it for a
Cortex-M and run it under QEMU), run it on data (`run_c`), and compare every output integer of
every time step, and every final state, with the simulator's (`compare`: the caller, qtool.api,
runs the simulator and hands its integers over; exporters do not run the engine)."""

from __future__ import annotations

import os
import re
import shlex
import shutil
import subprocess
import tempfile
from dataclasses import dataclass
from pathlib import Path

import numpy as np
from qtool.exporters import c_target
from qtool.exporters.c_export import sources
from qtool.exporters.c_target import HOST, TARGETS, check_tools, cross_compile
from qtool.exporters.c_types import act_type

from qtool.core.qmodel import QuantModel
from qtool.errors import QtoolError
from qtool.numerics.qparams import dequantize

# the flags an embedded reviewer builds with: the export must be clean under every one of them
WARNINGS = ["-Wall", "-Wextra", "-Wconversion", "-Wsign-conversion", "-Wshadow", "-Wcast-align",
            "-Werror", "-pedantic"]
CFLAGS = ["-std=c99", "-O2", *WARNINGS]

VERIFY_MAIN = """#include <stdio.h>
#include <stdlib.h>
#include "qgru.h"
#include "{prefix}.h"

/* usage: verify N T in.bin y.bin h.bin yf.bin; on a board the files are the host's
 * (semihosting) */
int main(int argc, char **argv)
{{
    static {prefix}_state_t s;
    size_t n, N, T, in_n, out_n;
    float *x, *yf;
    {prefix}_q_t *xq, *y, *work;
    FILE *fin, *fy, *fh, *fyf;
    if (argc != 7 || qgru_check_platform() != 0) {{
        return 2;
    }}
    N = (size_t)atol(argv[1]);
    T = (size_t)atol(argv[2]);
    in_n = T * {P}_INPUT_SIZE;
    out_n = T * {P}_OUTPUT_SIZE;
    x = malloc(sizeof(float) * in_n);
    xq = malloc(sizeof({prefix}_q_t) * in_n);
    y = malloc(sizeof({prefix}_q_t) * out_n);
    yf = malloc(sizeof(float) * out_n);
    work = malloc(sizeof({prefix}_q_t) * (size_t){P}_SEQUENCE_WORK((int32_t)T));
    fin = fopen(argv[3], "rb");
    fy = fopen(argv[4], "wb");
    fh = fopen(argv[5], "wb");
    fyf = fopen(argv[6], "wb");
    if (!x || !xq || !y || !yf || !work || !fin || !fy || !fh || !fyf) {{
        return 3;
    }}
    for (n = 0; n < N; n++) {{
        if (fread(x, sizeof(float), in_n, fin) != in_n) {{
            return 4;
        }}
        {prefix}_quantize_input(x, xq, (int32_t)in_n);
        {prefix}_run_sequence(&s, xq, (int32_t)T, y, work);
        {prefix}_dequantize_output(y, yf, (int32_t)out_n);
        if (fwrite(y, sizeof({prefix}_q_t), out_n, fy) != out_n
            || fwrite(s.h, sizeof({prefix}_q_t), {P}_STATE_SIZE, fh) != {P}_STATE_SIZE
            || fwrite(yf, sizeof(float), out_n, fyf) != out_n) {{
            return 5;
        }}
    }}
    if (fclose(fin) || fclose(fy) || fclose(fh) || fclose(fyf)) {{
        return 5;
    }}
    free(x);
    free(xq);
    free(y);
    free(yf);
    free(work);
    return 0;
}}
"""


def export_fingerprint(export_dir: Path, prefix: str) -> str | None:
    """The fingerprint of the quantized model an export was made from (None: not recorded)."""
    header = export_dir / f"{prefix}.h"
    if not header.is_file():
        return None
    m = re.search(r'_MODEL_FINGERPRINT "([0-9a-f]+)"', header.read_text(errors="replace"))
    return m.group(1) if m else None


def find_compiler() -> list[str]:
    cc = shlex.split(os.environ.get("CC", "cc"))
    if not cc or shutil.which(cc[0]) is None:
        raise QtoolError(f"no C compiler found ('{' '.join(cc) or 'cc'}'); install gcc or clang, "
                         "or set CC")
    return cc


def compile_c(sources: list[Path], exe: Path, include: Path, extra: list[str] | None = None) -> None:
    """Build a host program with $CC (no -lm: the export needs none)."""
    cmd = find_compiler() + CFLAGS + [f"-I{include}"] + [str(s) for s in sources] + \
        ["-o", str(exe)] + (extra or [])
    res = subprocess.run(cmd, capture_output=True, text=True)
    if res.returncode != 0:
        lines = res.stderr.strip().splitlines()
        first = next((x for x in lines if "error" in x), lines[0] if lines else "(no message)")
        raise QtoolError(f"the exported C did not compile: {first}")


def check_export(export_dir: Path, prefix: str) -> None:
    """Every file the export `prefix` needs is in `export_dir`."""
    needed = [export_dir / f for f in ("qgru.h", f"{prefix}.h", f"{prefix}_params.h")] + \
        sources(export_dir, prefix)
    missing = [p.name for p in needed if not p.is_file()]
    if missing:
        raise QtoolError(f"{export_dir}: not a qtool C export for '{prefix}' (missing "
                         f"{', '.join(missing)}); run 'qtool export c' or pass --name")


def _run_main(export_dir: Path, prefix: str, tmp: Path, N: int, T: int, target: str,
              timeout: float) -> None:
    """Build the verify main with the export, run it on in.bin in `tmp`."""
    main = tmp / "verify_main.c"
    main.write_text(VERIFY_MAIN.format(prefix=prefix, P=prefix.upper()))
    exe = tmp / "verify.elf"
    srcs = sources(export_dir, prefix) + [main]
    args = [str(N), str(T), "in.bin", "y.bin", "h.bin", "yf.bin"]
    if target == HOST:
        compile_c(srcs, exe, export_dir)
        res = subprocess.run([str(exe), *args], cwd=tmp, capture_output=True)
        where = "the compiled C program"
    else:
        t = TARGETS[target]
        cross_compile(t, srcs, exe, export_dir, CFLAGS)
        res = c_target.run(t, exe, args, tmp, timeout)
        where = f"the C program on the emulated {target}"
    if res.returncode != 0:
        raise QtoolError(f"{where} failed (exit {res.returncode})")


@dataclass
class COutputs:
    """What the compiled C computed on `sequences` inputs of `time_steps` steps on `target`."""

    target: str
    sequences: int
    time_steps: int
    y: np.ndarray    # output integers [N, T, output_size]
    h: np.ndarray    # final states, every layer's and direction's, in order [N, state size]
    y_float: np.ndarray  # the dequantized outputs (float32) [N, T, output_size]


def run_c(qm: QuantModel, export_dir: Path, prefix: str, x: np.ndarray, target: str = HOST,
          timeout: float = 600.0) -> COutputs:
    """Compile and run the C code on float `x [N, T, C]`, on the host or an emulated Cortex-M
    (`target`); what it computed."""
    if target != HOST:
        check_tools(c_target.target(target))
    check_export(export_dir, prefix)
    N, T, _ = x.shape
    q_t = np.int8 if act_type(qm) == "int8_t" else np.int16
    with tempfile.TemporaryDirectory(prefix="qtool-verify-") as tmp:
        tmp = Path(tmp)
        np.ascontiguousarray(x, np.float32).tofile(tmp / "in.bin")
        _run_main(export_dir, prefix, tmp, N, T, target, timeout)
        out_w = qm.model.output_size
        y_c = np.fromfile(tmp / "y.bin", q_t).reshape(N, T, out_w)
        h_c = np.fromfile(tmp / "h.bin", q_t).reshape(N, -1)
        yf_c = np.fromfile(tmp / "yf.bin", np.float32).reshape(N, T, out_w)
    return COutputs(target, N, T, y_c, h_c, yf_c)


def compare(qm: QuantModel, c: COutputs, y_sim: np.ndarray, h_sim: np.ndarray) -> dict:
    """Count the integers where the C's outputs `c` differ from the simulator's: its output
    integers `y_sim [N, T, output_size]` and final states `h_sim [N, state size]` (each layer's
    and direction's, in order), and the dequantized outputs."""
    if np.shape(y_sim) != c.y.shape or np.shape(h_sim) != c.h.shape:
        raise ValueError(f"the simulator's outputs {np.shape(y_sim)} and states {np.shape(h_sim)} do "
                         f"not match the C's {c.y.shape} and {c.h.shape}")
    s = qm.cells[-1][0].spec["h"]
    yf_sim = dequantize(y_sim, s.exp2_inv, s.zp).astype(np.float32)
    return {
        "target": c.target, "sequences": c.sequences, "time_steps": c.time_steps,
        "output_values": int(y_sim.size), "output_mismatches": int(np.count_nonzero(c.y != y_sim)),
        "state_values": int(h_sim.size), "state_mismatches": int(np.count_nonzero(c.h != h_sim)),
        "dequantized_mismatches": int(np.count_nonzero(c.y_float != yf_sim)),
    }
