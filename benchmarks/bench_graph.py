"""Where a whole model's integer simulation spends its time: every layer of a keyword-spotter
shaped model (Conv1D causal -> ReLU -> 2-layer GRU -> last step -> Dense -> softmax) timed in
`qtool.graph.simulate.run_int`, beside the float graph. A benchmark, not a test: run it and copy
the table into the README.

    python benchmarks/bench_graph.py [--N 256 --T 100 --C 40 --F 64 --H 128 --repeat 5 --bits int8]

Random weights (seeded, scaled so that the activations are ordinary), calibrated with minmax on
the first half of the data, timed on the second. One process; numba's threads as configured.
"""

from __future__ import annotations

import argparse
import platform
import resource
import statistics
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from qtool.core.graph import Graph, Node  # noqa: E402
from qtool.core.tensors import load_bits  # noqa: E402
from qtool.graph.calibrate import calibrate_graph  # noqa: E402
from qtool.graph.simulate import dequantized  # noqa: E402
from qtool.io.files import SequenceData  # noqa: E402
from qtool.layers import check, layer, run  # noqa: E402
from qtool.numerics.qparams import quantize  # noqa: E402


def model(C: int, F: int, H: int, classes: int = 12, seed: int = 0) -> Graph:
    rng = np.random.default_rng(seed)

    def w(*shape, fan_in):
        return (rng.standard_normal(shape) / np.sqrt(fan_in)).astype(np.float32)

    gru = {}
    for k, width in enumerate((F, H)):
        gru.update({f"l{k}.fwd.W": w(3 * H, width, fan_in=width), f"l{k}.fwd.R": w(3 * H, H, fan_in=H),
                    f"l{k}.fwd.bx": w(3 * H, fan_in=10), f"l{k}.fwd.br": w(3 * H, fan_in=10)})
    nodes = [
        Node("conv", "conv1d", ["x"], ["c"], {"kernel": 3, "padding": "causal"},
             {"W": w(F, C, 3, fan_in=3 * C), "b": w(F, fan_in=10)}),
        Node("relu", "activation", ["c"], ["r"], {"kind": "relu"}),
        Node("gru", "gru", ["r"], ["h"], {"layers": 2}, gru),
        Node("last", "last_step", ["h"], ["v"]),
        Node("head", "dense", ["v"], ["logits"], {}, {"W": w(classes, H, fan_in=H), "b": w(classes, fan_in=10)}),
        Node("softmax", "softmax", ["logits"], ["y"]),
    ]
    return check(Graph(nodes, {"x": (None, C)}, ["y"], "kws"))


def gemm_path(node, qp: dict, q: np.ndarray, g) -> str:
    """How a dense or conv1d node computes its sums: the dtype of its exact GEMM (and conv1d's way)."""
    if node.op == "dense":
        return np.dtype(layer("dense", node.label).gemm_path(qp, q)[0]).name
    dt, how, _ = layer("conv1d", node.label).gemm_path(node, qp, q, g)
    return f"{np.dtype(dt).name} {how}"


def timed_run(qg, x: np.ndarray, paths: dict | None = None) -> dict[str, float]:
    """run_int with each node timed; the input quantization and the float tail too; `paths` gets
    each dense or conv1d node's GEMM path."""
    t = {}
    t0 = time.perf_counter()
    e = next(iter(qg.graph.inputs))
    g = qg.grids[e]
    q = {e: quantize(x, int(g.exp2_inv), g.zp, g.bits)}
    t["quantize input"] = time.perf_counter() - t0
    for name in qg.core:
        node = qg.node(name)
        if paths is not None and node.op in ("dense", "conv1d"):
            paths[name] = gemm_path(node, qg.qparams[name], q[node.inputs[0]], qg.grids[node.inputs[0]])
        t0 = time.perf_counter()
        outs = layer(node.op, node.label).forward_int(node, qg.qparams[name], [q[i] for i in node.inputs],
                                                      [qg.grids[i] for i in node.inputs],
                                                      [qg.grids[o] for o in node.outputs])
        q.update(zip(node.outputs, outs))
        t[f"{name} ({node.op})"] = time.perf_counter() - t0
    t0 = time.perf_counter()
    dequantized(qg, q)
    t["dequantize + float tail"] = time.perf_counter() - t0
    return t


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    for k, v in (("N", 256), ("T", 100), ("C", 40), ("F", 64), ("H", 128), ("repeat", 5)):
        ap.add_argument(f"--{k}", type=int, default=v)
    ap.add_argument("--bits", default="int8")
    a = ap.parse_args()
    g = model(a.C, a.F, a.H)
    x = np.random.default_rng(1).standard_normal((2 * a.N, a.T, a.C)).astype(np.float32)
    qg = calibrate_graph(g, SequenceData(x[:a.N], False, "calib"), a.N, load_bits(a.bits)[1], "minmax")
    test = x[a.N:]
    paths: dict[str, str] = {}
    timed_run(qg, test, paths)  # compile and warm; each GEMM's path on the timed data
    runs, floats = [], []
    for _ in range(a.repeat):
        runs.append(timed_run(qg, test))
        t0 = time.perf_counter()
        run(qg.graph, test)
        floats.append(time.perf_counter() - t0)
    total = [sum(r.values()) for r in runs]
    print(f"machine: {platform.processor() or platform.machine()}, {platform.system()}, python "
          f"{platform.python_version()}; N={a.N} T={a.T} C={a.C} F={a.F} H={a.H} {a.bits}, median of {a.repeat}")
    print("| step | ms | share |\n|---|---|---|")
    med_total = statistics.median(total)
    for k in runs[0]:
        ms = statistics.median(r[k] for r in runs) * 1e3
        print(f"| {k} | {ms:.1f} | {100 * ms / 1e3 / med_total:.1f}% |")
    print(f"| **integer model** | **{med_total * 1e3:.1f}** | {1e6 * med_total / (a.N * a.T):.2f} us per step |")
    print(f"| float graph (numpy) | {statistics.median(floats) * 1e3:.1f} | |")
    print("GEMM paths: " + ", ".join(f"{k}: {v}" for k, v in paths.items()))
    print(f"peak RSS: {resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024:.0f} MiB")


if __name__ == "__main__":
    main()
