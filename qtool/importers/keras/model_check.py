"""The check of a whole Keras model's import: `check_keras_graph` loads the model with Keras itself
(the inference-only copy of keras/copy.py, safe mode, float32) and compares it with
`qtool.layers.run` on random inputs."""

from __future__ import annotations

import json
import tempfile
import time
import zipfile
from pathlib import Path

import numpy as np

import qtool.layers
from qtool.core import edges
from qtool.core.graph import Graph
from qtool.errors import QtoolError
from qtool.importers.checks import (
    MAX_TENSOR_ELEMENTS,
    framework_run,
    one_torch_thread,
    reason,
    rounding_spread,
    wrong_import,
)
from qtool.importers.keras.check import _import_keras, _load, _oversized, float_activations, keras2_hard_sigmoid
from qtool.importers.keras.config import FLOAT_POLICIES, _policy, keras_major
from qtool.importers.keras.model_graph import input_shapes
from qtool.importers.keras.reader import SPOOL_BYTES, _open
from qtool.layers import same_pads

SEQUENCES, STEPS = 3, 8
TOLERANCE = 1e-4  # float32 arithmetic of two libraries; scaled by the outputs' size above 1

# keras/src/backend/torch/nn.py pads an uneven "same" pooling window by repeating the edge step, which
# an average then counts; TensorFlow (Keras' reference) and qtool's avg_pool1d leave padded steps out
UNEVEN_AVG_POOL = ("Keras' PyTorch backend averages repeated edge steps where AveragePooling1D(padding='same') "
                   "pads unevenly; TensorFlow and qtool leave them out")



def _float32(config):
    """The config with every float dtype policy float32: the check compares float32 arithmetic."""
    if isinstance(config, dict):
        return {k: "float32" if k == "dtype" and _policy(config) in FLOAT_POLICIES else _float32(v)
                for k, v in config.items()}
    if isinstance(config, list):
        return [_float32(v) for v in config]
    return config


def _uneven_avg_pools(graph: Graph, x: dict[str, np.ndarray]) -> list[str]:
    """The average poolings with "same" padding that pad unevenly on the inputs `x` (a window
    then holds padded steps on one side only)."""
    pools = [n for n in graph.nodes if n.op == "avg_pool1d" and n.attrs.get("padding") == "same"
             and n.attrs.get("pool", 1) > 2]
    if not pools:
        return []
    values = qtool.layers.run(graph, {k: v[:1] for k, v in x.items()}, keep=True)
    return [n.name for n in pools if (lambda left, right: left != right)(
        *same_pads(values[n.inputs[0]].shape[1], n.attrs["pool"], n.attrs.get("stride", n.attrs["pool"])))]


def _steps(graph: Graph, specs: dict) -> int:
    """STEPS, or the first count of steps from there on where no average pooling pads unevenly."""
    for t in range(STEPS, 4 * STEPS):
        zeros = {k: np.zeros(edges.zeros_shape(shape, 1, fixed or t), np.float32)
                 for k, (shape, fixed, _) in specs.items()}
        if not _uneven_avg_pools(graph, zeros):
            return t
    return STEPS


def check_keras_graph(path: str | Path, graph: Graph) -> dict:
    """Run the model with Keras itself (its own loader on the inference-only copy of the file, safe
    mode, float32) and `qtool.layers.run(graph)` on the same random inputs; refuse the graph when
    they differ by more than TOLERANCE (times the outputs' largest magnitude, when above 1).
    Returns what was checked (the keys of `qtool.importers.crosscheck.describe`); where Keras
    cannot be imported, says so instead."""
    path = Path(path)
    with tempfile.SpooledTemporaryFile(SPOOL_BYTES) as tmp:
        try:
            config, f, _ = _open(path, tmp)
            f.close()
            specs = input_shapes(config, str(path))
        except QtoolError:
            raise
        except (OSError, RuntimeError, KeyError, ValueError, TypeError, AttributeError, zipfile.BadZipFile) as e:
            raise QtoolError(f"{path}: not a readable Keras file ({reason(e)})") from None
    for k, (shape, fixed, _) in specs.items():  # before anything is allocated
        if SEQUENCES * (fixed or 4 * STEPS) * shape[-1] > MAX_TENSOR_ELEMENTS:
            raise QtoolError(f"{path}: input '{k}' of {fixed} steps x {shape[-1]} channels is too large to check "
                             f"({SEQUENCES} sequences would hold more than {MAX_TENSOR_ELEMENTS:,} values)")
    rng, t = np.random.default_rng(0), _steps(graph, specs)
    x = {k: rng.standard_normal((SEQUENCES, fixed or t, *frame) if frame
                                else edges.zeros_shape(shape, SEQUENCES, fixed or t)).astype(np.float32)
         for k, (shape, fixed, frame) in specs.items()}
    steps = max((v.shape[1] for v in x.values() if v.ndim >= 3), default=0)
    big = _oversized(config)
    if big:
        raise QtoolError(f"{path}: {big} would make Keras allocate more than {MAX_TENSOR_ELEMENTS:,} values for "
                         "one weight; not loaded with Keras")
    t0, framework = time.perf_counter(), "Keras"
    try:
        keras = _import_keras()
        if '"qkeras' in json.dumps(config):  # registers QKeras' layers and quantizers with Keras
            framework = "QKeras"
            import qkeras  # noqa: F401
    except ImportError as e:
        missing = f"no module {e.name!r}" if e.name else str(e)
        return {"checked": False, "reason": f"{framework} cannot be imported ({missing})"}
    try:
        with framework_run(), one_torch_thread():
            model = _load(keras, path, _float32(config))
            keras2_hard_sigmoid(keras, model, keras_major(path))
            pairs = float_activations(keras, model)  # QKeras' quantizers on the data: their float functions
            args = [x[k] for k in specs]
            ys = model(args[0] if len(args) == 1 else args, training=False)
            want = [np.asarray(keras.ops.convert_to_numpy(y), np.float32)
                    for y in (ys if isinstance(ys, (list, tuple)) else [ys])]
    except QtoolError:
        raise
    except Exception as e:  # Keras refused the file qtool accepted: say so, in one line
        raise QtoolError(f"{path}: Keras cannot run this model ({reason(e)})") from None
    feeds = {k: a.reshape(*a.shape[:2], -1) if a.ndim == 4 else a for k, a in zip(graph.inputs, args)}  # maps: frames
    got = qtool.layers.run(graph, feeds)
    want = [w.reshape(*w.shape[:2], -1) if w.ndim == 4 else w for w in want]
    if len(want) != len(graph.outputs):
        raise QtoolError(f"{path}: Keras gives {len(want)} outputs, the graph {len(graph.outputs)}")
    diff = 0.0
    for edge, w in zip(graph.outputs, want):
        g = got[edge]
        if g.shape != w.shape:
            raise QtoolError(f"{path}: Keras gives output '{edge}' of shape {w.shape}, qtool's graph {g.shape}; "
                             "the file was not read as Keras reads it")
        d = float(np.abs(w - g).max()) if w.size else 0.0
        tol = TOLERANCE * max(1.0, float(np.abs(w).max()) if w.size else 0.0)
        if not d <= tol:
            hint = (f" ({UNEVEN_AVG_POOL} on these {steps} steps)" if _uneven_avg_pools(graph, x) else "")
            raise wrong_import(f"{path}: the imported graph's output '{edge}' differs from Keras by up to {d:.3g} on "
                               f"random inputs (tolerance {tol:.3g}){hint}", TOLERANCE,
                               rounding_spread(lambda v: qtool.layers.run(graph, v), feeds))
        diff = max(diff, d)
    same_pools = any(n.op == "avg_pool1d" and n.attrs.get("padding") == "same" for n in graph.nodes)
    note = ({"note": f"{UNEVEN_AVG_POOL}; checked on {steps} steps, where they agree"}
            if same_pools and keras.backend.backend() == "torch" else {})
    return {"checked": True, "framework": "Keras", "max_abs_diff": diff, "sequences": SEQUENCES, "steps": steps,
            "seconds": round(time.perf_counter() - t0, 3), **note, **({"fake_quant_pairs": pairs} if pairs else {})}
