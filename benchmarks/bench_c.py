"""Footprint and speed of the exported C runtime.

    python benchmarks/bench_c.py [--model sample|large|h256|whole-sample|layers] [--bits int8]
                                 [--compensation table|offset] [--cmsis-nn DIR]

--model sample: the bundled digits GRU (2 layers, C=8, H=64) calibrated on samples/calib.npy;
--model large: one layer, C=64, H=128, random weights, calibrated on random inputs; --model h256:
the same with H=256.

Prints flash/RAM/MACs; host time steps per second (gcc -O2) and instructions per MAC under
callgrind (if valgrind is installed); and on an emulated Cortex-M4 (arm-none-eabi-gcc -O2,
QEMU mps2-an386, if installed: Debian's gcc-arm-none-eabi picolibc-arm-none-eabi
qemu-system-arm) the instructions per time step and per MAC, for the whole step and for the
GEMMs alone, with the portable C loop and with the DSP (SMLAD) kernel. Instructions are counted
with QEMU's -icount shift=0 (one virtual nanosecond per executed instruction) read back from
the board's 25 MHz CMSDK timer (one tick per 40 instructions), over enough steps that the tick
granularity is below 0.1%. --cmsis-nn DIR also times CMSIS-NN's own int8 matrix-vector kernel
(arm_nn_vec_mat_mult_t_s8, from a CMSIS-NN source tree) on the same matrices and core.

--model whole-sample: the whole-model C export (qtool.exporters.c_graph) of samples/digits.onnx
(the 2-layer GRU, its last step, a Linear head 64->10) calibrated on samples/calib.npy: its
flash/RAM/MACs per layer and the instructions per input frame (NAME_step) and per MAC on the
emulated Cortex-M4 (-O2, DSP path); then what --model layers prints. --model layers: single-layer
whole models, int8, random weights, minmax-calibrated on random inputs: dense 64->192 and
320->768 (the GEMMs 3H x H of the GRU row "sample", H=64, and 3H x (C+H) of the row
"C=64,H=256") and causal conv1d kernel 3, 32->32: instructions per MAC of NAME_step;
with --cmsis-nn DIR also CMSIS-NN's arm_fully_connected_s8 on each dense shape (the same int8
weights, input offset, per-tensor requantization), built and counted the same way.
A CMSIS-NN tree: git clone https://github.com/ARM-software/CMSIS-NN (only Include/ and Source/ are read).
"""

from __future__ import annotations

import argparse
import re
import shutil
import subprocess
import tempfile
from pathlib import Path

import numpy as np
from qtool.exporters import c_target
from qtool.exporters.c_export import export_c, sources
from qtool.exporters.c_graph import render_graph_c
from qtool.exporters.c_types import COMPENSATION, model_types
from qtool.exporters.c_verify import compile_c

from qtool.api import calibrate
from qtool.calibration.observe import build_quant_model, collect, new_observers, observe_batch
from qtool.core.graph import Graph, Node
from qtool.core.model import GruCell, GruModel
from qtool.core.tensors import preset_config
from qtool.importers import import_model
from qtool.io.files import open_sequences

SAMPLES = Path(__file__).resolve().parent.parent / "samples"
TICK_INSTRUCTIONS = 40  # -icount shift=0: 1 ns per instruction; the MPS2 timer runs at 25 MHz

HOST_MAIN = r"""
#include <stdio.h>
#include <stdlib.h>
#include <time.h>
#include "m.h"
static m_state_t s;
int main(int argc, char **argv)
{
    long steps = argc > 1 ? atol(argv[1]) : 100000, t, i, check = 0;
    m_q_t x[M_INPUT_SIZE], y[M_OUTPUT_SIZE];
    clock_t c0;
    for (i = 0; i < M_INPUT_SIZE; i++) x[i] = (m_q_t)(i * 7 % 50);
    m_reset(&s);
    c0 = clock();
    for (t = 0; t < steps; t++) {
        x[t % M_INPUT_SIZE] = (m_q_t)(t % 100 - 50);
        m_step(&s, x, y);
        check += y[0];
    }
    printf("%.1f %ld\n", (double)steps / ((double)(clock() - c0) / CLOCKS_PER_SEC), check);
    return 0;
}
"""

# Includes the generated m.c, so that its GEMM kernels (static) can be timed on their own, as the
# cells call them: GEMMS is every layer's, its sizes constants (gemm_loops).
TARGET_MAIN = r"""
#include <stdio.h>
#include "m.c"
#define TIMER ((volatile uint32_t *)0x40000000u) /* CMSDK APB timer 0 of the MPS2 board */
static m_state_t s;
int main(void)
{
    m_q_t x[M_INPUT_SIZE], y[M_OUTPUT_SIZE];
    uint32_t t0, t1;
    int32_t t, i, j;
    long check = 0;
    TIMER[2] = 0xFFFFFFFFu; /* reload */
    TIMER[1] = 0xFFFFFFFFu; /* value: counts down */
    TIMER[0] = 1u;          /* enable */
    for (i = 0; i < M_INPUT_SIZE; i++) x[i] = (m_q_t)(i * 7 % 50);
    m_reset(&s);
    t0 = TIMER[1];
    for (t = 0; t < STEPS; t++) {
        x[t % M_INPUT_SIZE] = (m_q_t)(t % 100 - 50);
        m_step(&s, x, y);
        check += y[0];
    }
    t1 = TIMER[1];
    printf("step %lu %ld\n", (unsigned long)(t0 - t1), check);
    t0 = TIMER[1];
    for (t = 0; t < STEPS; t++) {
GEMMS    }
    t1 = TIMER[1];
    printf("gemm %lu %ld\n", (unsigned long)(t0 - t1), check);
    return 0;
}
"""

CMSIS_MAIN = r"""
#include <stdio.h>
#include "arm_nnsupportfunctions.h"
#include "m.h"
#include "m_params.h"
#define TIMER ((volatile uint32_t *)0x40000000u)
static int8_t out[4 * M_MAX_HIDDEN * 3];
static int8_t h[M_MAX_HIDDEN];
int main(void)
{
    uint32_t t0, t1;
    int32_t t, l;
    int8_t x[M_INPUT_SIZE] = {0};
    TIMER[2] = 0xFFFFFFFFu;
    TIMER[1] = 0xFFFFFFFFu;
    TIMER[0] = 1u;
    t0 = TIMER[1];
    for (t = 0; t < STEPS; t++) {
        for (l = 0; l < M_NUM_LAYERS; l++) {
            const m_cell_t *c = &m_cells[l];
            const int32_t H = c->hidden_size;
            arm_nn_vec_mat_mult_t_s8(l ? h : x, c->qW, NULL, NULL, out, 3, 0, 1 << 30, -8,
                                     c->input_size, 3 * H, -128, 127, 1, 0);
            arm_nn_vec_mat_mult_t_s8(h, c->qR, NULL, NULL, out + 3 * H, 1, 0, 1 << 30, -8,
                                     H, 3 * H, -128, 127, 1, 0);
        }
    }
    t1 = TIMER[1];
    printf("cmsis %lu %d\n", (unsigned long)(t0 - t1), out[0]);
    return 0;
}
"""

# NAME_step of a whole-model export (prefix m), one input frame a call
GRAPH_MAIN = r"""
#include <stdio.h>
#include "m.h"
#define TIMER ((volatile uint32_t *)0x40000000u)
static m_state_t s;
int main(void)
{
    m_in_t x[M_INPUT_SIZE];
    m_out_t y[M_OUTPUT_SIZE] = {0};
    uint32_t t0, t1;
    int32_t t, i;
    long check = 0;
    TIMER[2] = 0xFFFFFFFFu;
    TIMER[1] = 0xFFFFFFFFu;
    TIMER[0] = 1u;
    for (i = 0; i < M_INPUT_SIZE; i++) x[i] = (m_in_t)(i * 7 % 50);
    m_reset(&s);
    t0 = TIMER[1];
    for (t = 0; t < STEPS; t++) {
        x[t % M_INPUT_SIZE] = (m_in_t)(t % 100 - 50);
        check += m_step(&s, x, y) + y[0];
    }
    t1 = TIMER[1];
    printf("step %lu %ld\n", (unsigned long)(t0 - t1), check);
    return 0;
}
"""

# CMSIS-NN's int8 fully connected layer on the weights of the dense export m (m_fc_W), one frame a
# call: input offset -zp_x, output offset zp_y, per-tensor multiplier and shift, int32 bias
CMSIS_FC_MAIN = r"""
#include <stdio.h>
#include "arm_nnfunctions.h"
#include "m.h"
#include "m_params.h"
#define TIMER ((volatile uint32_t *)0x40000000u)
static int32_t bias[M_OUTPUT_SIZE];
int main(void)
{
    int8_t x[M_INPUT_SIZE], y[M_OUTPUT_SIZE];
    const cmsis_nn_context ctx = {NULL, 0};
    const cmsis_nn_fc_params fc = {-M_INPUT_ZP, 0, M_OUTPUT_ZP, {-128, 127}};
    const cmsis_nn_per_tensor_quant_params q = {1 << 30, -8};
    const cmsis_nn_dims in = {1, 1, 1, M_INPUT_SIZE}, w = {M_INPUT_SIZE, 1, 1, M_OUTPUT_SIZE};
    const cmsis_nn_dims b = {1, 1, 1, M_OUTPUT_SIZE}, out = {1, 1, 1, M_OUTPUT_SIZE};
    uint32_t t0, t1;
    int32_t t, i;
    long check = 0;
    TIMER[2] = 0xFFFFFFFFu;
    TIMER[1] = 0xFFFFFFFFu;
    TIMER[0] = 1u;
    for (i = 0; i < M_INPUT_SIZE; i++) x[i] = (int8_t)(i * 7 % 50);
    for (i = 0; i < M_OUTPUT_SIZE; i++) bias[i] = i * 37 - 3000;
    t0 = TIMER[1];
    for (t = 0; t < STEPS; t++) {
        x[t % M_INPUT_SIZE] = (int8_t)(t % 100 - 50);
        arm_fully_connected_s8(&ctx, &fc, &q, &in, x, &w, m_fc_W, &b, bias, &out, y);
        check += y[0];
    }
    t1 = TIMER[1];
    printf("cmsis %lu %ld\n", (unsigned long)(t0 - t1), check);
    return 0;
}
"""


def sample_model(bits: str):
    model = import_model(SAMPLES / "digits_gru.safetensors")
    obs = collect(model, open_sequences(SAMPLES / "calib.npy"), "minmax")
    return build_quant_model(model, obs, preset_config(bits), {"method": "minmax"})


def large_model(bits: str, C: int = 64, H: int = 128):
    """One layer, weights uniform in +-1/sqrt(H) (PyTorch's initialisation)."""
    rng = np.random.default_rng(0)
    k = 1 / np.sqrt(H)
    cell = GruCell(*(rng.uniform(-k, k, s) for s in ((3 * H, C), (3 * H, H), (3 * H,), (3 * H,))))
    model = GruModel([[cell]], name="large")
    obs = new_observers(model, "minmax")
    observe_batch(model, rng.standard_normal((64, 32, C)).astype(np.float32), obs)
    return build_quant_model(model, obs, preset_config(bits), {"method": "minmax"})


MODELS = {"sample": sample_model, "large": large_model,
          "h256": lambda bits: large_model(bits, H=256)}


def layer_graph(op: str, c_in: int, c_out: int, kernel: int = 0):
    """One dense (kernel 0) or causal conv1d node, weights uniform in +-1/sqrt(fan-in), int8,
    calibrated (minmax) on random inputs."""
    rng = np.random.default_rng(0)
    k = 1 / np.sqrt(c_in * max(kernel, 1))
    shape, attrs = (c_out, c_in), {}
    if kernel:
        shape, attrs = (c_out, c_in, kernel), {"kernel": kernel, "padding": "causal"}
    params = {"W": rng.uniform(-k, k, shape).astype(np.float32), "b": rng.uniform(-k, k, c_out).astype(np.float32)}
    g = Graph([Node("fc", op, ["x"], ["y"], attrs, params)], {"x": (None, c_in)}, ["y"])
    x = rng.standard_normal((32, 16, c_in)).astype(np.float32)
    return calibrate(g, x, bits="int8", method="minmax", check=False)


LAYERS = (("dense 64->192", "dense", 64, 192, 0), ("dense 320->768", "dense", 320, 768, 0),
          ("conv1d k3 32->32 causal", "conv1d", 32, 32, 3))


def graph_step(d: Path, qg, opt: str, steps: int):
    """Export `qg` whole (prefix m) into `d`; NAME_step's instructions per input frame on the
    Cortex-M4 (DSP path), and the export's footprint."""
    ex = render_graph_c(qg, "m")
    for n, data in ex.encoded().items():
        (d / n).write_bytes(data)
    sources = [d / n for n in ex.layout[3]]  # the export's .c files, as verify compiles them
    c = _qemu_counts(d, GRAPH_MAIN, sources, ["-std=c99", opt], steps)
    return c["step"], ex.footprint


def print_footprint(fp) -> None:
    print(f"{'layer':<16} {'op':<10} {'flash B':>8} {'RAM B':>6} {'MACs/frame':>10}")
    for x in fp.layers:
        print(f"{x.name:<16} {x.op:<10} {x.flash_bytes:>8} {x.state_bytes:>6} {x.macs_per_frame:>10}")
    print(f"{'total':<27} {fp.flash_bytes:>8} {fp.ram_bytes:>6} {fp.macs_per_step:>10}")


def whole_layers(opt: str, steps: int, cmsis_nn: Path | None) -> None:
    """Per layer type: qtool's NAME_step, and CMSIS-NN's arm_fully_connected_s8 on each dense."""
    print(f"\nCortex-M4 {opt}, instructions per MAC (one frame a call; DSP path)")
    print(f"{'layer (int8)':<26} {'MACs':>7} {'qtool':>7} {'CMSIS-NN':>9}")
    for label, op, c_in, c_out, kernel in LAYERS:
        with tempfile.TemporaryDirectory() as tmp:
            d = Path(tmp)
            n, fp = graph_step(d, layer_graph(op, c_in, c_out, kernel), opt, steps)
            macs, cmsis = fp.macs_per_step, "-"
            if cmsis_nn is not None and op == "dense":
                srcs = [cmsis_nn / "Source/FullyConnectedFunctions/arm_fully_connected_s8.c",
                        cmsis_nn / "Source/NNSupportFunctions/arm_nn_vec_mat_mult_t_s8.c", d / "m_params.c"]
                c = _qemu_counts(d, CMSIS_FC_MAIN, srcs, ["-std=c99", opt, f"-I{cmsis_nn / 'Include'}"], steps)
                cmsis = f"{c['cmsis'] / macs:.3f}"
        print(f"{label:<26} {macs:>7} {n / macs:>7.3f} {cmsis:>9}")


def whole_sample(bits: str, opt: str, steps: int, cmsis_nn: Path | None) -> None:
    qg = calibrate(SAMPLES / "digits.onnx", SAMPLES / "calib.npy", bits=bits)
    with tempfile.TemporaryDirectory() as tmp:
        n, fp = graph_step(Path(tmp), qg, opt, steps)
    print(f"whole-sample (samples/digits.onnx, {bits}), whole-model C export:")
    print_footprint(fp)
    print(f"Cortex-M4 {opt} DSP (SMLAD): NAME_step {n:,.0f} instructions per input frame, "
          f"{n / fp.macs_per_step:.3f} per MAC")
    whole_layers(opt, steps, cmsis_nn)


def host_speed(d: Path, macs: int) -> None:
    (d / "main.c").write_text(HOST_MAIN)
    compile_c(sources(d, "m") + [d / "main.c"], d / "t", d)
    rate = float(subprocess.run([d / "t", "200000"], capture_output=True, text=True).stdout.split()[0])
    print(f"host gcc -O2: {rate:,.0f} time steps/s ({rate * macs / 1e9:.2f} GMAC/s)")
    if shutil.which("valgrind"):
        res = subprocess.run(["valgrind", "--tool=callgrind", f"--callgrind-out-file={d}/cg",
                              str(d / "t"), "2000"], capture_output=True, text=True)
        m = re.search(r"Collected : (\d+)", res.stderr)
        if m:
            print(f"host callgrind: {int(m.group(1)) / (2000 * macs):.2f} instructions per MAC")


def gemm_loops(qm) -> str:
    """Every unit's two dot3 calls, layer by layer, as the cells make them (unit-major weights,
    the sizes literal), each of the six sums used."""
    code, src, off = "", "x", 0
    for l, (cq,) in enumerate(qm.cells):
        H, C = cq.hidden_size, cq.qW.shape[1]
        code += f"""        for (j = 0; j < {H}; j++) {{
            M_ACC_W acc_w[3];
            M_ACC_R acc_r[3];
            m_dot3_W(m_l{l}_fwd_qW + j * 3 * {C}, {C}, {src}, {C}, 0, acc_w);
            m_dot3_R(m_l{l}_fwd_qR + j * 3 * {H}, {H}, s.h + {off}, {H}, 0, acc_r);
            check += acc_w[0] + acc_w[1] + acc_w[2] + acc_r[0] + acc_r[1] + acc_r[2];
        }}
"""
        src, off = f"s.h + {off}", off + H
    return code


def _qemu_counts(d: Path, main: str, srcs: list[Path], flags: list[str], steps: int) -> dict:
    t = c_target.TARGETS["cortex-m4"]
    (d / "bench_main.c").write_text(main)
    exe = d / "bench.elf"
    c_target.cross_compile(t, srcs + [d / "bench_main.c"], exe, d, flags, [f"-DSTEPS={steps}"])
    res = c_target.run(t, exe, [], d, timeout=600, icount=True)
    counts = {m.group(1): int(m.group(2)) * TICK_INSTRUCTIONS / steps
              for m in re.finditer(r"^(step|gemm|cmsis) (\d+)", c_target.output(res), re.M)}
    if res.returncode != 0 or not counts:
        raise SystemExit(f"the Cortex-M4 benchmark failed (exit {res.returncode})")
    return counts


def cortex_m4(d: Path, qm, macs: int, opt: str, steps: int, cmsis_nn: Path | None) -> None:
    ty = model_types(qm, "table")
    flags = ["-std=c99", opt, f"-DM_ACC_W={ty.acc('Wx')}", f"-DM_ACC_R={ty.acc('Rh')}"]
    gemm_macs = macs  # the GEMMs are all of the MACs
    for path, extra in (("portable", ["-DQGRU_PORTABLE"]), ("DSP (SMLAD)", [])):
        c = _qemu_counts(d, TARGET_MAIN.replace("GEMMS", gemm_loops(qm)), [d / "qgru.c", d / "m_params.c"],
                         flags + extra, steps)
        print(f"Cortex-M4 {opt} {path}: {c['step']:,.0f} instructions per time step, "
              f"{c['step'] / macs:.2f} per MAC; GEMMs alone {c['gemm'] / gemm_macs:.2f} per MAC "
              f"({c['gemm']:,.0f} per step)")
    if cmsis_nn is not None:
        srcs = [cmsis_nn / "Source/NNSupportFunctions/arm_nn_vec_mat_mult_t_s8.c", d / "m_params.c"]
        c = _qemu_counts(d, CMSIS_MAIN, srcs, ["-std=c99", opt, f"-I{cmsis_nn / 'Include'}"], steps)
        print(f"Cortex-M4 {opt} CMSIS-NN arm_nn_vec_mat_mult_t_s8 (DSP), the same matrices: "
              f"{c['cmsis'] / gemm_macs:.2f} instructions per MAC")
    print(f"Cortex-M4 code and constants of the model (qgru.c, m.c, m_params.c), -Os: {object_sizes(d)}")


def object_sizes(d: Path) -> str:
    """.text and .rodata of the export's objects for the Cortex-M4, -Os."""
    t = c_target.TARGETS["cortex-m4"]
    sizes: dict[str, int] = {}
    for src in sources(d, "m"):
        obj = d / (src.name + ".o")
        subprocess.run([c_target.CROSS_CC, *t.cflags, "--specs=picolibc.specs", "-Os", "-std=c99",
                        "-ffunction-sections", "-fdata-sections", f"-I{d}", "-c", str(src), "-o", str(obj)],
                       check=True)
        out = subprocess.run(["arm-none-eabi-size", "-A", str(obj)], capture_output=True, text=True).stdout
        for line in out.splitlines():
            parts = line.split()
            if len(parts) >= 2 and parts[0].startswith((".text", ".rodata")):
                key = parts[0].split(".")[1]
                sizes[key] = sizes.get(key, 0) + int(parts[1])
    return f".text {sizes.get('text', 0):,} B, .rodata {sizes.get('rodata', 0):,} B"


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", default="sample", choices=(*MODELS, "whole-sample", "layers"))
    ap.add_argument("--bits", default="int8")
    ap.add_argument("--compensation", default="table", choices=COMPENSATION)
    ap.add_argument("--opt", default="-O2", help="optimisation flag of the Cortex-M4 build")
    ap.add_argument("--steps", type=int, default=200, help="time steps per Cortex-M4 measurement")
    ap.add_argument("--cmsis-nn", type=Path, help="a CMSIS-NN source tree, to time its kernel too")
    a = ap.parse_args()
    if a.model in ("whole-sample", "layers"):
        if c_target.missing_tools():
            raise SystemExit(f"the whole-model benchmarks need the Cortex-M4 tools: apt-get install "
                             f"{c_target.PACKAGES}")
        if a.model == "whole-sample":
            whole_sample(a.bits, a.opt, a.steps, a.cmsis_nn)
        else:
            whole_layers(a.opt, a.steps, a.cmsis_nn)
        return
    qm = MODELS[a.model](a.bits)
    if qm.model.num_directions != 1:
        raise SystemExit("the step benchmark needs a unidirectional model")
    with tempfile.TemporaryDirectory() as tmp:
        d = Path(tmp)
        fp = export_c(qm, d, "m", a.compensation)
        base = fp.int8_weight_bytes + fp.table_bytes
        print(f"{a.model} GRU ({a.bits}, {a.compensation} compensation): flash {fp.flash_bytes} B "
              f"(weights {fp.weight_bytes}, biases {fp.bias_bytes}, tables {fp.table_bytes}, "
              f"shifts/compensation/params {fp.other_bytes}), {100 * (fp.flash_bytes / base - 1):.1f}% "
              f"above int8 weights + tables; RAM {fp.ram_bytes} B; {fp.macs_per_step} MACs per step")
        host_speed(d, fp.macs_per_step)
        if c_target.missing_tools():
            print(f"no Cortex-M4 figures: apt-get install {c_target.PACKAGES}")
            return
        cortex_m4(d, qm, fp.macs_per_step, a.opt, a.steps, a.cmsis_nn)


if __name__ == "__main__":
    main()
