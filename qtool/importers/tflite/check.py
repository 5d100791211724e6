"""The TFLite side of the import check: the file as written, run by the LiteRT interpreter (the
`ai-edge-litert` package, or TensorFlow's `tf.lite` where that is what is installed), against
qtool's graph on the same random inputs, in runs of the batch the file fixes (one sequence at a
time for the converter's usual batch of 1)."""

from __future__ import annotations

import contextlib
import os
import time
from pathlib import Path

import numpy as np

from qtool.errors import QtoolError
from qtool.importers.checks import framework_run, reason
from qtool.importers.onnx.check import CHECK_N, check_inputs, compare_outputs


@contextlib.contextmanager
def _native_stderr_silenced():
    """LiteRT's C++ prints `INFO: Created TensorFlow Lite XNNPACK delegate` on file descriptor 2,
    through a progress bar: that descriptor goes to /dev/null while it runs."""
    saved = os.dup(2)
    try:
        with open(os.devnull, "wb") as null:
            os.dup2(null.fileno(), 2)
        yield
    finally:
        os.dup2(saved, 2)
        os.close(saved)


def _interpreter(path: Path):
    """LiteRT's interpreter of `path`; ImportError where neither LiteRT nor TensorFlow is installed."""
    with framework_run():
        try:
            from ai_edge_litert.interpreter import Interpreter
        except ImportError:
            from tensorflow.lite import Interpreter  # TensorFlow's own copy of the same interpreter
    return Interpreter(model_path=str(path))


def run_tflite(it, feeds: dict[str, np.ndarray], n: int) -> dict[str, np.ndarray]:
    """Each output of the file interpreter `it` runs on `feeds` (by tensor name, `n` sequences
    each), in runs of the batch the file fixes (one sequence at a time for the converter's usual
    batch of 1); an axis the file leaves dynamic (the steps) is resized to the feeds'."""
    ins = {d["name"]: d for d in it.get_input_details()}
    batch = _fixed_batch(ins.values()) or n
    outs: dict[str, list] = {}
    for start in range(0, n, batch):
        run = {k: v[start:start + batch] for k, v in feeds.items()}
        for name, x in run.items():
            if list(ins[name]["shape"]) != list(x.shape):
                it.resize_tensor_input(ins[name]["index"], list(x.shape))
        it.allocate_tensors()
        for name, x in run.items():
            it.set_tensor(ins[name]["index"], np.ascontiguousarray(x, ins[name]["dtype"]))
        it.invoke()
        for d in it.get_output_details():
            outs.setdefault(d["name"], []).append(np.array(it.get_tensor(d["index"])))
    return {k: np.concatenate(v, axis=0) for k, v in outs.items()}


def _fixed_batch(details) -> int | None:
    """The batch the inputs are sized for: a signature may leave it open (-1) while the graph holds
    tensor lists one sequence wide, so the sizes the file gives are the ones run."""
    sizes = {int(d["shape"][0]) for d in details if len(d["shape"])}
    return sizes.pop() if len(sizes) == 1 else None


def check_tflite(path: Path, graph, ports, reader) -> dict:
    """The file run by LiteRT against `graph` run by qtool.layers.run; raises where they differ."""
    try:
        with _native_stderr_silenced():
            it = _interpreter(path)
        batch = _fixed_batch(it.get_input_details())
    except ImportError:
        return {"checked": False, "reason": "LiteRT cannot be imported (pip install ai-edge-litert)"}
    except Exception as e:  # the interpreter raises RuntimeError and ValueError on files it cannot load
        raise QtoolError(f"{path}: LiteRT cannot load this file ({reason(e)})") from None
    t0 = time.perf_counter()
    # a batch the file fixes above one: that many sequences in one run; else CHECK_N, run by run
    feeds, xs, n, t = check_inputs(reader, ports, batch if batch and batch > 1 else CHECK_N)
    try:
        with _native_stderr_silenced():
            want = run_tflite(it, feeds, n)
    except Exception as e:  # as above, on inputs it cannot take
        raise QtoolError(f"{path}: LiteRT cannot run this file ({reason(e)})") from None
    worst = compare_outputs(path, graph, ports, xs, want, n, "LiteRT")
    return {"checked": True, "framework": "LiteRT", "max_abs_diff": worst, "sequences": n, "steps": t,
            "seconds": round(time.perf_counter() - t0, 3)}
