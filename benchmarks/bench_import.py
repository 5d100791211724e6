"""What the import check costs: `qtool import` of the same GRU saved as .safetensors, .pt, .keras and
.onnx, with and without the check against the source framework.

Cold: a fresh process per run, as a user runs `qtool import` (includes importing the framework).
Warm: `import_model` again in a process that has the framework loaded already (the check's own work:
building the framework's GRU, running it on the check's sequences, comparing).
A benchmark, not a test; torch, safetensors, keras and onnxruntime are needed here.

    KERAS_BACKEND=torch python benchmarks/bench_import.py [--C 64 --H 256 --layers 2 --repeat 5]
"""

from __future__ import annotations

import argparse
import os
import platform
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np


def save_all(d: Path, C: int, H: int, layers: int) -> dict[str, Path]:
    """One bidirectional GRU stack in every framework format."""
    import keras
    import onnx
    import torch
    from onnx import TensorProto, helper, numpy_helper
    from safetensors.torch import save_file

    torch.manual_seed(0)
    gru = torch.nn.GRU(C, H, num_layers=layers, bidirectional=True, batch_first=True)
    save_file({k: v.contiguous() for k, v in gru.state_dict().items()}, str(d / "m.safetensors"))
    torch.save(gru.state_dict(), d / "m.pt")
    m = keras.Sequential([keras.Input((None, C))] + [keras.layers.Bidirectional(
        keras.layers.GRU(H, return_sequences=True)) for _ in range(layers)])
    m.save(d / "m.keras")
    rng = np.random.RandomState(0)
    node = helper.make_node("GRU", ["X", "W", "R", "B"], ["Y"], name="g", hidden_size=H,
                            direction="bidirectional", linear_before_reset=1)
    inits = [numpy_helper.from_array((rng.randn(*s) * 0.1).astype(np.float32), n)
             for n, s in (("W", (2, 3 * H, C)), ("R", (2, 3 * H, H)), ("B", (2, 6 * H)))]
    graph = helper.make_graph([node], "g", [helper.make_tensor_value_info("X", TensorProto.FLOAT, None)],
                              [helper.make_tensor_value_info("Y", TensorProto.FLOAT, None)], inits)
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 14)]), d / "m.onnx")
    return {p.suffix[1:]: p for p in sorted(d.iterdir()) if p.stem == "m"}


def cold(path: Path, out: Path, check: bool, repeat: int) -> list[float]:
    cmd = [sys.executable, "-m", "qtool.cli", "import", str(path), "-o", str(out), "--force"]
    times = []
    for _ in range(repeat):
        t0 = time.perf_counter()
        subprocess.run(cmd + ([] if check else ["--no-check"]), check=True, capture_output=True,
                       env={**os.environ, "KERAS_BACKEND": "torch"})
        times.append(time.perf_counter() - t0)
    return times


def warm(path: Path, check: bool, repeat: int) -> list[float]:
    from qtool.importers import import_model

    import_model(path, check=check)  # the framework is loaded once, outside the timing
    times = []
    for _ in range(repeat):
        t0 = time.perf_counter()
        import_model(path, check=check)
        times.append(time.perf_counter() - t0)
    return times


def span(times: list[float]) -> str:
    return f"{min(times):.2f}-{max(times):.2f}"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--C", type=int, default=64)
    ap.add_argument("--H", type=int, default=256)
    ap.add_argument("--layers", type=int, default=2)
    ap.add_argument("--repeat", type=int, default=5)
    args = ap.parse_args()
    os.environ.setdefault("KERAS_BACKEND", "torch")
    cpu = platform.processor() or platform.machine()
    print(f"bidirectional GRU, {args.layers} layer(s), C={args.C}, H={args.H}; {cpu}, {os.cpu_count()} CPUs; "
          f"seconds, min-max of {args.repeat} runs")
    print("| format | cold, --no-check | cold, checked | warm, --no-check | warm, checked |")
    print("|---|---|---|---|---|")
    with tempfile.TemporaryDirectory() as d:
        files = save_all(Path(d), args.C, args.H, args.layers)
        for fmt, path in files.items():
            out = Path(d) / "out.h5"
            row = [span(cold(path, out, c, args.repeat)) for c in (False, True)]
            row += [span(warm(path, c, args.repeat)) for c in (False, True)]
            print(f"| {fmt} | " + " | ".join(row) + " |")


if __name__ == "__main__":
    main()
