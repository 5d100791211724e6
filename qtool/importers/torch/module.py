"""A PyTorch `nn.Module` as a whole-model graph: exported to ONNX (the route PyTorch users take),
read by the ONNX graph reader, and checked against the module's own output."""

from __future__ import annotations

import tempfile
from pathlib import Path

import numpy as np

from qtool.errors import QtoolError
from qtool.importers.checks import quiet, reason

TOLERANCE = 1e-4  # as the file imports: float32 libraries differ by ~1e-7, a misread model by far more


def graph_of_module(module, example, check: bool = True):
    """`module`'s graph, from `example` (`[N, T, C]` float array or tensor) exported with batch
    and steps free; with `check`, the graph's float run equals `module(example)` to 1e-4."""
    try:
        import torch
    except ImportError:
        raise QtoolError("a PyTorch module needs PyTorch (pip install torch==2.13.0, the CPU build)") from None
    from qtool.importers import import_graph
    from qtool.layers import run

    if not isinstance(module, torch.nn.Module):
        raise QtoolError(f"expected a file path or a torch.nn.Module, got {type(module).__name__}")
    if example is None:
        raise QtoolError("a PyTorch module needs `example`: an input [N, T, C] to export it with")
    x = torch.as_tensor(np.asarray(example, np.float32))
    if x.ndim not in (2, 3):
        raise QtoolError(f"`example` must be [N, T, C] (or [N, C]), got shape {tuple(x.shape)}")
    axes = {0: "batch", 1: "steps"} if x.ndim == 3 else {0: "batch"}
    module = module.eval()
    with tempfile.TemporaryDirectory(prefix="qtool-module-") as tmp:
        path = Path(tmp) / f"{type(module).__name__}.onnx"
        try:
            with quiet(), torch.no_grad():
                torch.onnx.export(module, (x,), str(path), input_names=["x"], dynamo=False,
                                  dynamic_axes={"x": axes})
        except Exception as e:  # the exporter raises many types for what it cannot trace
            raise QtoolError(f"torch.onnx.export cannot export {type(module).__name__} ({reason(e)})") from None
        graph = import_graph(path, "onnx", check)
    graph.source = f"PyTorch {type(module).__name__} (through ONNX)"
    if check:
        with torch.no_grad():
            want = module(x)
        want = (want[0] if isinstance(want, (tuple, list)) else want).numpy()
        got = run(graph, x.numpy())[graph.outputs[0]]
        if got.size == want.size:  # a kept unit time axis (`y[:, -1:]`) is the same values as a vector
            want = want.reshape(got.shape)
        if got.shape != want.shape:
            raise QtoolError(f"the graph of {type(module).__name__} gives outputs of shape {got.shape}, the module "
                             f"{tuple(want.shape)}; refusing a wrong import")
        diff = float(np.abs(got - want).max())
        if not diff <= TOLERANCE * max(1.0, float(np.abs(want).max())):
            raise QtoolError(f"the graph of {type(module).__name__} differs from the module by up to {diff:.3g} "
                             f"on the example (tolerance {TOLERANCE:g}); refusing a wrong import")
    return graph
