"""`qtool verify`: compile the exported C with the host compiler, run it on data, and compare
every output integer of every time step, and every final state, with the simulator's."""

from __future__ import annotations

import os
import re
import shlex
import shutil
import subprocess
import tempfile
from pathlib import Path

import numpy as np

from qtool.engine_cpu import run_int
from qtool.errors import QtoolError
from qtool.qmodel import QuantModel
from qtool.qparams import dequantize

CFLAGS = ["-std=c99", "-O2", "-Wall", "-Wextra", "-Werror", "-pedantic"]

VERIFY_MAIN = """#include <stdio.h>
#include <stdlib.h>
#include "qgru.h"
#include "{prefix}.h"

/* usage: verify N T in.bin y.bin h.bin yf.bin */
int main(int argc, char **argv)
{{
    static {prefix}_state_t s;
    long n, N, T;
    float *x, *yf;
    int16_t *xq, *y, *work;
    FILE *fin, *fy, *fh, *fyf;
    if (argc != 7 || qgru_check_platform() != 0) {{
        return 2;
    }}
    N = atol(argv[1]);
    T = atol(argv[2]);
    x = malloc(sizeof(float) * T * {P}_INPUT_SIZE);
    xq = malloc(sizeof(int16_t) * T * {P}_INPUT_SIZE);
    y = malloc(sizeof(int16_t) * T * {P}_OUTPUT_SIZE);
    yf = malloc(sizeof(float) * T * {P}_OUTPUT_SIZE);
    work = malloc(sizeof(int16_t) * {P}_SEQUENCE_WORK(T));
    fin = fopen(argv[3], "rb");
    fy = fopen(argv[4], "wb");
    fh = fopen(argv[5], "wb");
    fyf = fopen(argv[6], "wb");
    if (!x || !xq || !y || !yf || !work || !fin || !fy || !fh || !fyf) {{
        return 3;
    }}
    for (n = 0; n < N; n++) {{
        if (fread(x, sizeof(float), (size_t)(T * {P}_INPUT_SIZE), fin) != (size_t)(T * {P}_INPUT_SIZE)) {{
            return 4;
        }}
        {prefix}_quantize_input(x, xq, (int32_t)(T * {P}_INPUT_SIZE));
        {prefix}_run_sequence(&s, xq, (int32_t)T, y, work);
        {prefix}_dequantize_output(y, yf, (int32_t)(T * {P}_OUTPUT_SIZE));
        fwrite(y, sizeof(int16_t), (size_t)(T * {P}_OUTPUT_SIZE), fy);
        fwrite(s.h, sizeof(int16_t), {P}_STATE_SIZE, fh);
        fwrite(yf, sizeof(float), (size_t)(T * {P}_OUTPUT_SIZE), fyf);
    }}
    fclose(fin); fclose(fy); fclose(fh); fclose(fyf);
    free(x); free(xq); free(y); free(yf); free(work);
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
    cmd = find_compiler() + CFLAGS + [f"-I{include}"] + [str(s) for s in sources] + \
        ["-o", str(exe), "-lm"] + (extra or [])
    res = subprocess.run(cmd, capture_output=True, text=True)
    if res.returncode != 0:
        first = (res.stderr.strip().splitlines() or ["(no message)"])[0]
        raise QtoolError(f"the exported C did not compile: {first}")


def verify(qm: QuantModel, export_dir: Path, prefix: str, x: np.ndarray) -> dict:
    """Compile and run the C code on float `x [N, T, C]`; compare with the simulator."""
    P = prefix.upper()
    needed = [export_dir / f for f in ("qgru.c", "qgru.h", f"{prefix}.c", f"{prefix}.h",
                                       f"{prefix}_params.h")]
    missing = [p.name for p in needed if not p.is_file()]
    if missing:
        raise QtoolError(f"{export_dir}: not a qtool C export for '{prefix}' (missing "
                         f"{', '.join(missing)}); run 'qtool export c' or pass --name")
    N, T, _ = x.shape
    with tempfile.TemporaryDirectory(prefix="qtool-verify-") as tmp:
        tmp = Path(tmp)
        main = tmp / "verify_main.c"
        main.write_text(VERIFY_MAIN.format(prefix=prefix, P=P))
        exe = tmp / "verify"
        compile_c([export_dir / "qgru.c", export_dir / f"{prefix}.c", main], exe, export_dir)
        np.ascontiguousarray(x, np.float32).tofile(tmp / "in.bin")
        res = subprocess.run([str(exe), str(N), str(T)] + [str(tmp / f) for f in
                             ("in.bin", "y.bin", "h.bin", "yf.bin")], capture_output=True)
        if res.returncode != 0:
            raise QtoolError(f"the compiled C program failed (exit {res.returncode})")
        out_w = qm.model.output_size
        y_c = np.fromfile(tmp / "y.bin", np.int16).reshape(N, T, out_w)
        h_c = np.fromfile(tmp / "h.bin", np.int16).reshape(N, -1)
        yf_c = np.fromfile(tmp / "yf.bin", np.float32).reshape(N, T, out_w)
    finals: list = []
    y_sim = run_int(qm, x, finals=finals)
    h_sim = np.concatenate(finals, axis=1)
    s = qm.cells[-1][0].spec["h"]
    yf_sim = dequantize(y_sim, s.exp2_inv, s.zp).astype(np.float32)
    return {
        "sequences": N, "time_steps": T,
        "output_values": int(y_sim.size), "output_mismatches": int(np.count_nonzero(y_c != y_sim)),
        "state_values": int(h_sim.size), "state_mismatches": int(np.count_nonzero(h_c != h_sim)),
        "dequantized_mismatches": int(np.count_nonzero(yf_c != yf_sim)),
    }
