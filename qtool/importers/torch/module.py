"""A PyTorch `nn.Module` as a whole-model graph: exported to ONNX (the route PyTorch users take),
read by the ONNX graph reader, and checked against the module's own output."""

from __future__ import annotations

import tempfile
from pathlib import Path

import numpy as np

from qtool.errors import QtoolError
from qtool.importers.checks import framework_run, reason

TOLERANCE = 1e-4  # as the file imports: float32 libraries differ by ~1e-7, a misread model by far more


def graph_of_module(module, example, check: bool = True):
    """`module`'s graph, exported from `example` (the module's own input: `[N, T, C]`, `[N, C, T]`
    for a convolution first, `[N, C]`, or a map `[N, C, T, F]`, its time free too) with the batch
    free; the graph takes any number of steps.
    With `check`, ONNX Runtime runs the export and, for `[N, T, C]` inputs, the graph's float run
    equals `module(example)` to 1e-4. The module's training mode is left as it was."""
    try:
        import torch
    except ImportError:
        raise QtoolError("a PyTorch module needs PyTorch (pip install torch==2.13.0, the CPU build)") from None
    from qtool.importers import import_graph
    from qtool.layers import run

    if not isinstance(module, torch.nn.Module):
        raise QtoolError(f"expected a file path or a torch.nn.Module, got {type(module).__name__}")
    if example is None:
        raise QtoolError("a PyTorch module needs `example`: an input to export it with")
    x = torch.as_tensor(np.asarray(example, np.float32))
    if x.ndim not in (2, 3, 4):
        raise QtoolError(f"`example` must be the module's input, [N, T, C], [N, C, T], [N, C] or a map "
                         f"[N, C, T, F]; got shape {tuple(x.shape)}")
    name, training = type(module).__name__, module.training
    with tempfile.TemporaryDirectory(prefix="qtool-module-") as tmp:
        path = Path(tmp) / f"{name}.onnx"
        try:  # the batch left free; the reader takes any number of steps from a fixed-length export
            with framework_run(), torch.no_grad():
                torch.onnx.export(module.eval(), (x,), str(path), input_names=["x"], output_names=["y"],
                                  dynamo=False, dynamic_axes={"x": {0: "batch", **({2: "time"} if x.ndim == 4
                                                                                         else {})}})
        except Exception as e:  # the exporter raises many types for what it cannot trace
            raise QtoolError(f"torch.onnx.export cannot export {name} ({reason(e)})") from None
        finally:
            module.train(training)
        try:
            graph = import_graph(path, "onnx", check)
        except QtoolError as e:  # name the module, not a file that is gone
            raise QtoolError(str(e).replace(str(path), f"module {name}")) from None
    read_as = graph.source.partition(", input")[2]  # the reader's words when it is not [N, T, C]
    graph.source = f"PyTorch {name} (through ONNX)" + (f", input{read_as}" if read_as else "")
    if check and not read_as:  # ONNX Runtime checked the file; this checks the export against the module
        try:
            with torch.no_grad():
                want = module.eval()(x)
        finally:
            module.train(training)
        want = (want[0] if isinstance(want, (tuple, list)) else want).numpy()
        got = run(graph, x.numpy())[graph.outputs[0]]
        if got.size == want.size:  # a kept unit time axis (`y[:, -1:]`) is the same values as a vector
            want = want.reshape(got.shape)
        if got.shape != want.shape:
            raise QtoolError(f"the graph of {name} gives outputs of shape {got.shape}, the module "
                             f"{tuple(want.shape)}; refusing a wrong import")
        diff = float(np.abs(got - want).max())
        if not diff <= TOLERANCE * max(1.0, float(np.abs(want).max())):
            raise QtoolError(f"the graph of {name} differs from the module by up to {diff:.3g} "
                             f"on the example (tolerance {TOLERANCE:g}); refusing a wrong import")
    return graph
