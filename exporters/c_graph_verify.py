"""`qtool verify` of a whole model: compile the export with a main that runs every sequence whole
(NAME_run_sequence, then every edge's integers as NAME_edge_layout places them) and, where the
model streams, frame by frame (NAME_step); compare each with the simulator's integers
(`compare_graph`: the caller, qtool.api, runs the simulator)."""

from __future__ import annotations

import subprocess
import tempfile
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
from qtool.exporters import c_target
from qtool.exporters.c_graph import suffix
from qtool.exporters.c_target import HOST, TARGETS, check_tools, cross_compile
from qtool.exporters.c_verify import CFLAGS, compile_c

from qtool.errors import QtoolError

MAIN = """#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "{p}.h"

/* usage: verify N T in.bin edges.bin stream.bin y.bin counts.bin others.bin (in.bin: per sequence,
 * each input's [T][INPUTj_SIZE] floats in turn): every sequence whole (every edge's steps and
 * integers, the dequantized output), then frame by frame (the frames NAME_step and NAME_flush
 * complete, and how many; others.bin: each time output k > 0 has a new frame, the sequence, k,
 * its count and the frame) */
int main(int argc, char **argv)
{{
    static {p}_state_t s;
    int32_t steps[{P}_LAYOUT_SIZE], offset[{P}_LAYOUT_SIZE];
    size_t n, N, T, e;
    int32_t bytes, out_steps;
    float *yf;
{decls}    {p}_out_t *y, frame[{P}_OUTPUT_SIZE];
    void *work;
    FILE *fin, *fe, *fs, *fy, *fc, *fo;
    int32_t seen[{others_n}];
    static const size_t width[{P}_NUM_EDGES] = {{{widths}}};
    static const size_t size[{P}_NUM_EDGES] = {{{sizes}}};
    if (argc != 9 || qgru_check_platform() != 0) {{
        return 2;
    }}
    N = (size_t)atol(argv[1]);
    T = (size_t)atol(argv[2]);
    bytes = {p}_edge_layout((int32_t)T, steps, offset);
    if (bytes < 0) {{
        return 6;
    }}
{allocs}    y = malloc(sizeof({p}_out_t) * (size_t)steps[{out}] * {P}_OUTPUT_SIZE);
    yf = malloc(sizeof(float) * (size_t)steps[{out}] * {P}_OUTPUT_SIZE);
    work = malloc((size_t)bytes + 4);
    fin = fopen(argv[3], "rb");
    fe = fopen(argv[4], "wb");
    fs = fopen(argv[5], "wb");
    fy = fopen(argv[6], "wb");
    fc = fopen(argv[7], "wb");
    fo = fopen(argv[8], "wb");
    if ({held} || !y || !yf || !work || !fin || !fe || !fs || !fy || !fc || !fo) {{
        return 3;
    }}
    for (n = 0; n < N; n++) {{
        int32_t t, count = 0;
{reads}        out_steps = {p}_run_sequence(&s, {args}, (int32_t)T, y, work);
        if (out_steps != steps[{out}]) {{
            return 6;
        }}
        {p}_dequantize_output(y, yf, out_steps * {P}_OUTPUT_SIZE);
        if (fwrite(steps, sizeof(steps[0]), {P}_NUM_EDGES, fe) != {P}_NUM_EDGES) {{
            return 5;
        }}
        for (e = 0; e < {P}_NUM_EDGES; e++) {{
            const void *at = e < {inputs} ? ins[e] : (const void *)((unsigned char *)work + offset[e]);
            const size_t k = (size_t)steps[e] * width[e];
            if (fwrite(at, size[e], k, fe) != k) {{
                return 5;
            }}
        }}
        if (fwrite(yf, sizeof(float), (size_t)out_steps * {P}_OUTPUT_SIZE, fy)
            != (size_t)out_steps * {P}_OUTPUT_SIZE) {{
            return 5;
        }}
#if {P}_STREAMING
        {p}_reset(&s);
        memset(seen, 0, sizeof(seen));
        for (t = 0; t < (int32_t)T; t++) {{
            if ({p}_step(&s, {frames}, frame)) {{
                count++;
                if (fwrite(frame, sizeof(frame[0]), {P}_OUTPUT_SIZE, fs) != {P}_OUTPUT_SIZE) {{
                    return 5;
                }}
            }}
{others}        }}
        for (;;) {{ /* the end: padding after it, a row a call */
            const int done = {p}_flush(&s, frame);
            if (done < 0) {{
                break;
            }}
            if (done) {{
                count++;
                if (fwrite(frame, sizeof(frame[0]), {P}_OUTPUT_SIZE, fs) != {P}_OUTPUT_SIZE) {{
                    return 5;
                }}
            }}
{others}        }}
#endif
        (void)seen;
        (void)t;
        (void)frame;
        if (fwrite(&count, sizeof(count), 1, fc) != 1) {{
            return 5;
        }}
    }}
    if (fclose(fin) || fclose(fe) || fclose(fs) || fclose(fy) || fclose(fc) || fclose(fo)) {{
        return 5;
    }}
{frees}    free(y);
    free(yf);
    free(work);
    return 0;
}}
"""

DTYPES = {"int8_t": np.int8, "int16_t": np.int16}


@dataclass
class GraphCOutputs:
    target: str
    sequences: int
    time_steps: int
    edges: dict[str, np.ndarray]   # every edge's integers [N, steps, C] (a vector: [N, C])
    y_float: np.ndarray            # the dequantized output
    stream: list[np.ndarray] | None  # per sequence, the frames NAME_step completed (None: no NAME_step)
    others: dict = field(default_factory=dict)  # output 1, 2, ... -> per sequence, (NAME_framesK, its frame) seen


def run_graph_c(layout, export_dir: Path, prefix: str, xs: list[np.ndarray], target: str = HOST,
                timeout: float = 600.0) -> GraphCOutputs:
    """Compile and run a whole-model export on float inputs `xs`, each `[N, T, C]` (one per input of
    the model, in order). `layout`: the export's edges, each (name, C type, width, is sequence),
    the output's index and whether it streams."""
    edges, out, streaming, sources, others = layout
    if target != HOST:
        check_tools(c_target.target(target))
    N, T, _ = xs[0].shape
    main = MAIN.format(p=prefix, P=prefix.upper(), out=out, widths=", ".join(str(w) for _, _, w, _ in edges),
                       sizes=", ".join("1" if t == "int8_t" else "2" for _, t, _, _ in edges),
                       **_inputs_c(prefix, len(xs)), **_others_c(prefix, others, edges))
    with tempfile.TemporaryDirectory(prefix="qtool-verify-") as tmp:
        tmp = Path(tmp)
        np.concatenate([np.ascontiguousarray(x, np.float32).reshape(N, -1) for x in xs], 1).tofile(tmp / "in.bin")
        (tmp / "verify_main.c").write_text(main)
        exe = tmp / "verify.elf"
        srcs = [export_dir / s for s in sources] + [tmp / "verify_main.c"]
        args = [str(N), str(T), "in.bin", "edges.bin", "stream.bin", "y.bin", "counts.bin", "others.bin"]
        if target == HOST:
            compile_c(srcs, exe, export_dir, ["-lm"])
            res = subprocess.run([str(exe), *args], cwd=tmp, capture_output=True)
            where = "the compiled C program"
        else:
            t = TARGETS[target]
            cross_compile(t, srcs, exe, export_dir, CFLAGS, ["-lm"])
            res = c_target.run(t, exe, args, tmp, timeout)
            where = f"the C program on the emulated {target}"
        if res.returncode != 0:
            why = {6: ": the sequences are too short or too long for the model",
                   3: f": it could not allocate its buffers for sequences of {T} steps"
                      + (f" in the emulated {target}'s {TARGETS[target].ram_size >> 20} MiB of RAM (whole sequences"
                         " take work in proportion to their steps: verify shorter ones)" if target != HOST else "")
                   }.get(res.returncode, "")
            raise QtoolError(f"{where} failed (exit {res.returncode}){why}")
        if not all((tmp / f).exists() for f in args[3:]):
            said = " ".join((res.stdout + res.stderr).split())[-200:]
            raise QtoolError(f"{where} stopped before writing its results (a fault: the model's state and "
                             f"work may not fit the target's memory){': ' + said if said else ''}")
        return _read(tmp, layout, N, target, T)


def _inputs_c(p: str, n: int) -> dict[str, str]:
    """The main's code for `n` inputs: input j read as floats x{j}, quantized into xq{j}."""
    P, js = p.upper(), range(n)
    k = [suffix(j) for j in js]
    size = [f"T * {P}_INPUT{k[j]}_SIZE" for j in js]
    reads = "".join(f"""        if (fread(x{j}, sizeof(float), {size[j]}, fin) != {size[j]}) {{
            return 4;
        }}
        {p}_quantize_input{k[j]}(x{j}, xq{j}, (int32_t)({size[j]}));
""" for j in js)
    return {"decls": "".join(f"    float *x{j};\n    {p}_in{k[j]}_t *xq{j};\n" for j in js)
            + f"    const void *ins[{n}]; /* the inputs' integers: the first edges */\n",
            "allocs": "".join(f"    x{j} = malloc(sizeof(float) * {size[j]});\n"
                              f"    xq{j} = malloc(sizeof({p}_in{k[j]}_t) * {size[j]});\n"
                              f"    ins[{j}] = xq{j};\n" for j in js),
            "held": " || ".join(f"!x{j} || !xq{j}" for j in js), "reads": reads,
            "args": ", ".join(f"xq{j}" for j in js), "inputs": str(n),
            "frames": ", ".join(f"xq{j} + t * {P}_INPUT{k[j]}_SIZE" for j in js),
            "frees": "".join(f"    free(x{j});\n    free(xq{j});\n" for j in js)}


def _others_c(p: str, others: list[int], edges: list) -> dict[str, str]:
    """The main's code for outputs 1, 2, ... frame by frame: after a step or the finish, each one
    whose NAME_framesK moved is written to others.bin (sequence, k, count, its latest frame)."""
    code = "".join(f"""            if ({p}_frames{k}(&s) != seen[{k - 1}]) {{
                const int32_t head[3] = {{(int32_t)n, {k}, {p}_frames{k}(&s)}};
                seen[{k - 1}] = head[2];
                if (fwrite(head, sizeof(head[0]), 3, fo) != 3
                    || fwrite({p}_latest{k}(&s), sizeof({p}_out{k}_t), {edges[e][2]}, fo) != {edges[e][2]}) {{
                    return 5;
                }}
            }}
""" for k, e in enumerate(others, 1))
    return {"others": code, "others_n": str(max(len(others), 1))}


def _read(tmp: Path, layout, N: int, target: str, T: int) -> GraphCOutputs:
    edges, out, streaming, _, others = layout
    raw = (tmp / "edges.bin").read_bytes()
    counts = np.fromfile(tmp / "counts.bin", np.int32)
    frames = np.fromfile(tmp / "stream.bin", DTYPES[edges[out][1]]).reshape(-1, edges[out][2])
    got: dict[str, list] = {name: [] for name, _, _, _ in edges}
    at = 0
    for _ in range(N):
        steps = np.frombuffer(raw, np.int32, len(edges), at)
        at += steps.nbytes
        for (name, t, w, seq), k in zip(edges, steps):
            a = np.frombuffer(raw, DTYPES[t], int(k) * w, at)
            at += a.nbytes
            got[name].append(a.reshape(int(k), w) if seq else a)
    ends = np.cumsum(counts)
    stream = [frames[e - c:e].astype(np.int64) for c, e in zip(counts, ends)] if streaming else None
    y_float = np.fromfile(tmp / "y.bin", np.float32)
    return GraphCOutputs(target, N, T, {k: np.stack(v).astype(np.int64) for k, v in got.items()}, y_float, stream,
                         _read_others(tmp / "others.bin", [edges[e] for e in others], N) if streaming else {})


def _read_others(path: Path, outputs: list, N: int) -> dict[str, list[list]]:
    """others.bin: per output 1, 2, ... and sequence, the (count, frame) of each new frame seen."""
    raw, at = path.read_bytes(), 0
    seen: dict[str, list[list]] = {name: [[] for _ in range(N)] for name, _, _, _ in outputs}
    while at < len(raw):
        n, k, count = np.frombuffer(raw, np.int32, 3, at)
        name, t, w, _ = outputs[k - 1]
        frame = np.frombuffer(raw, DTYPES[t], w, at + 12)
        at += 12 + frame.nbytes
        seen[name][n].append((int(count), frame.astype(np.int64)))
    return seen


def _other_frames(y: np.ndarray, per_sequence: list[list]) -> tuple[int, int]:
    """(values compared, mismatches) of an output other than the first, frame by frame: a sequence
    output's every frame seen against its frame at that count, and the final count against its
    steps; a vector output's last frame against the vector."""
    values = bad = 0
    for n, seen in enumerate(per_sequence):
        if y.ndim == 2:  # a vector: the last frame seen is the output
            values += y.shape[1]
            bad += y.shape[1] if not seen else int(np.count_nonzero(seen[-1][1] != y[n]))
            continue
        steps, C = y.shape[1:]
        for count, frame in seen:
            values += C
            bad += int(np.count_nonzero(frame != y[n][count - 1])) if 1 <= count <= steps else C
        bad += C * abs(steps - (seen[-1][0] if seen else 0))
    return values, bad


def compare_graph(c: GraphCOutputs, q: dict[str, np.ndarray], out_edge: str, y_float: np.ndarray) -> dict:
    """Count the integers where the C differs from the simulator's `q` (every edge's integers),
    and the dequantized outputs that differ from `y_float`; streaming: the frames NAME_step gave
    against the whole sequence's output (a vector: its last frame), and each other output's frames
    as NAME_latestK showed them when NAME_framesK moved (a frame missing or too many: its values
    count as mismatches)."""
    edges = {}
    for e, got in c.edges.items():
        want = np.asarray(q[e], np.int64)
        edges[e] = int(want.size) if got.shape != want.shape else int(np.count_nonzero(got != want))
    y_out = np.asarray(q[out_edge], np.int64)
    stream_bad, stream_values = 0, 0
    if c.stream is not None:
        for n, frames in enumerate(c.stream):
            want = y_out[n] if y_out.ndim == 3 else y_out[n][None]
            got = frames if y_out.ndim == 3 else frames[-1:]
            stream_values += want.size
            stream_bad += want.size if got.shape != want.shape else int(np.count_nonzero(got != want))
    for e, per_sequence in c.others.items():
        values, bad = _other_frames(np.asarray(q[e], np.int64), per_sequence)
        stream_values, stream_bad = stream_values + values, stream_bad + bad
    yf = np.asarray(y_float, np.float32).ravel()
    deq_bad = yf.size if yf.shape != c.y_float.shape else int(np.count_nonzero(yf != c.y_float))
    return {"target": c.target, "sequences": c.sequences, "time_steps": c.time_steps,
            "edge_values": int(sum(np.size(q[e]) for e in c.edges)), "edge_mismatches": int(sum(edges.values())),
            "edges": edges, "stream_values": int(stream_values), "stream_mismatches": int(stream_bad),
            "streaming": c.stream is not None, "dequantized_mismatches": deq_bad}
