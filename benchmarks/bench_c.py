"""Footprint and speed of the exported C runtime for the bundled sample.

    python benchmarks/bench_c.py [--bits int8] [--compensation table|offset]

Prints flash/RAM/MACs, host time steps per second (gcc -O2), instructions per MAC under
callgrind (if valgrind is installed), and Cortex-M4 .text/.rodata sizes (if arm-none-eabi-gcc is
installed: Debian's gcc-arm-none-eabi).
"""

from __future__ import annotations

import argparse
import re
import shutil
import subprocess
import tempfile
from pathlib import Path

from exporters.c_export import COMPENSATION, export_c
from exporters.c_verify import compile_c
from qtool.calibration import build_quant_model, collect
from qtool.fileio import open_sequences
from qtool.importers import import_model
from qtool.tensors import preset_config

SAMPLES = Path(__file__).resolve().parent.parent / "samples"
TIMING_MAIN = r"""
#include <stdio.h>
#include <time.h>
#include "qgru.h"
#include "m.h"
static m_state_t s;
int main(int argc, char **argv)
{
    long steps = argc > 1 ? atol(argv[1]) : 100000, t, i;
    int16_t x[M_INPUT_SIZE], y[M_OUTPUT_SIZE];
    long check = 0;
    clock_t c0;
    for (i = 0; i < M_INPUT_SIZE; i++) x[i] = (int16_t)(i * 7 % 50);
    m_reset(&s);
    c0 = clock();
    for (t = 0; t < steps; t++) {
        x[t % M_INPUT_SIZE] = (int16_t)(t % 100 - 50);
        m_step(&s, x, y);
        check += y[0];
    }
    printf("%.1f %ld\n", steps / ((double)(clock() - c0) / CLOCKS_PER_SEC), check);
    return 0;
}
"""


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--bits", default="int8")
    ap.add_argument("--compensation", default="table", choices=COMPENSATION)
    a = ap.parse_args()
    model = import_model(SAMPLES / "digits_gru.safetensors")
    obs = collect(model, open_sequences(SAMPLES / "calib.npy"), "minmax")
    qm = build_quant_model(model, obs, preset_config(a.bits), {"method": "minmax"})
    with tempfile.TemporaryDirectory() as tmp:
        d = Path(tmp)
        fp = export_c(qm, d, "m", a.compensation)
        base = fp.int8_weight_bytes + fp.table_bytes
        print(f"sample digits GRU ({a.bits}, {a.compensation} compensation): flash {fp.flash_bytes} B "
              f"(weights {fp.weight_bytes}, "
              f"biases {fp.bias_bytes}, tables {fp.table_bytes}, shifts/compensation/params "
              f"{fp.other_bytes}), {100 * (fp.flash_bytes / base - 1):.1f}% above int8 weights + "
              f"tables; RAM {fp.ram_bytes} B; {fp.macs_per_step} MACs per step")
        (d / "main.c").write_text(TIMING_MAIN.replace("#include <time.h>",
                                                      "#include <time.h>\n#include <stdlib.h>"))
        compile_c([d / "qgru.c", d / "m.c", d / "main.c"], d / "t", d)
        rate = float(subprocess.run([d / "t", "200000"], capture_output=True, text=True).stdout.split()[0])
        print(f"host gcc -O2: {rate:,.0f} time steps/s ({rate * fp.macs_per_step / 1e9:.2f} GMAC/s)")
        if shutil.which("valgrind"):
            res = subprocess.run(["valgrind", "--tool=callgrind", f"--callgrind-out-file={d}/cg",
                                  str(d / "t"), "2000"], capture_output=True, text=True)
            m = re.search(r"Collected : (\d+)", res.stderr)
            if m:
                print(f"callgrind: {int(m.group(1)) / (2000 * fp.macs_per_step):.2f} instructions per MAC")
        if shutil.which("arm-none-eabi-gcc"):
            objs = []
            for src in ("qgru.c", "m.c"):
                obj = d / (src + ".o")
                subprocess.run(["arm-none-eabi-gcc", "-mcpu=cortex-m4", "-mthumb", "-Os", "-std=c99",
                                "-Wall", "-Wextra", "-Werror", "-pedantic", "-ffunction-sections",
                                "-fdata-sections", "-c", str(d / src), "-o", str(obj)], check=True)
                objs.append(obj)
            sizes = {}
            for obj in objs:
                out = subprocess.run(["arm-none-eabi-size", "-A", str(obj)], capture_output=True,
                                     text=True).stdout
                for line in out.splitlines():
                    parts = line.split()
                    if len(parts) >= 2 and parts[0].startswith("."):
                        key = parts[0].split(".")[1]
                        sizes[key] = sizes.get(key, 0) + int(parts[1])
            print(f"Cortex-M4 (arm-none-eabi-gcc -Os): .text {sizes.get('text', 0)} B, "
                  f".rodata {sizes.get('rodata', 0)} B")


if __name__ == "__main__":
    main()
