"""The ONNX side of the import check: each GRU node, copied with all its attributes into a one-node
model, run by ONNX Runtime; a stack feeds each node the one before's output with its directions
concatenated (what onnx_graph.feeds_next proved the graph's ops do).

Weights computed from constants (torch.onnx's default exporter concatenates slices of the PyTorch
tensors) are computed again by ONNX Runtime from the file's own nodes and stored tensors, so that
the check does not rest on qtool's evaluation of them (onnx_fold)."""

from __future__ import annotations

import re
import time
from pathlib import Path

import numpy as np

from qtool.errors import QtoolError
from qtool.importers.checks import MAX_TENSOR_ELEMENTS, framework_run, reason, rounding_spread, wrong_import
from qtool.importers.onnx import fake_quant
from qtool.importers.onnx.external import inline
from qtool.importers.onnx.graph import Graph
from qtool.importers.onnx.model_layout import FLOAT
from qtool.importers.onnx.streaming import stream_pairs

X, Y = "qtool.check.x", "qtool.check.y"


def _one_node_model(graph: Graph, node):
    from onnx import helper

    weights = list(node.input[1:4])  # W, R and B; initial_h was proved zero or is an input
    nodes, stored = graph.cone(weights)
    inits = [graph.tensor(n) for n in stored]  # external data read in, each size checked first
    casts = [helper.make_node("Cast", [n], [f"qtool.check.w{k}"], to=FLOAT) for k, n in enumerate(weights) if n]
    gru = helper.make_node("GRU", [X, *(f"qtool.check.w{k}" if n else "" for k, n in enumerate(weights))], [Y],
                           name=node.name)
    gru.attribute.extend(a for a in node.attribute if a.name != "output_sequence")  # GRU-1/3 only
    g = helper.make_graph([*nodes, *casts, gru], "check", [helper.make_tensor_value_info(X, FLOAT, None)],
                          [helper.make_tensor_value_info(Y, FLOAT, None)], inits)
    # GRU computes the same from opset 7 on (14 added `layout`, refused unless 0): a fixed opset lets ONNX
    # Runtime run nodes of files written for newer or older runtimes; nodes computing the weights need
    # the file's own opset
    opset = [helper.make_opsetid("", graph.opset if nodes else 14)]
    return helper.make_model(g, opset_imports=opset, ir_version=max(8, helper.find_min_ir_version_for(opset, True)))


def run_onnx(graph: Graph, nodes: list, x: np.ndarray) -> np.ndarray:
    """ONNX Runtime on the GRU `nodes`, one after another, on batch-first `x [N, T, C]`; `graph` is
    the importer's, a QDQ file's weights already folded into the floats they stand for."""
    import onnxruntime as ort  # ImportError: ONNX Runtime is not installed

    opts = ort.SessionOptions()
    opts.log_severity_level = 4  # ORT would print its own errors; qtool says them in one line
    opts.intra_op_num_threads = 1
    y = np.asarray(x, np.float32)
    for node in nodes:
        sess = ort.InferenceSession(_one_node_model(graph, node).SerializeToString(), opts,
                                    providers=["CPUExecutionProvider"])
        out = sess.run([Y], {X: np.ascontiguousarray(y.transpose(1, 0, 2))})[0]  # time-first
        y = out.transpose(2, 0, 1, 3).reshape(out.shape[2], out.shape[0], -1)  # [T, dirs, N, H] -> [N, T, dirs * H]
    return y


# ---- a whole model: the file run by ONNX Runtime against qtool's graph (qtool.layers.run)

TOLERANCE = 1e-4  # the ONNX Runtime check, relative to the output's magnitude where it exceeds 1
CHECK_N, CHECK_T = 3, 8  # the check's batch and steps where the file leaves them dynamic
# ONNX Runtime's status code and where in its sources it failed (`[ONNXRuntimeError] : 1 : FAIL :
# /onnxruntime_src/...h:46 void f(...)`): not the reason, which follows
ORT_NOISE = re.compile(r"\[ONNXRuntimeError\] : \d+ : \w+ : "
                       r"|/onnxruntime_src/\S+:\d+ (?:(?:[\w:~*&]+ )?[\w:~]+\([^()]*\) )?")


def check_graph(path: Path, graph, ports, reader) -> dict:
    """Run file `path` with ONNX Runtime and `graph` with qtool.layers.run on the same random inputs
    (`ports`: where its edges sit in the file, `reader`: the import that read it); raises when they
    differ by more than TOLERANCE (relative where the output exceeds 1)."""
    try:
        with framework_run():  # importing it writes a file into the temporary folder
            import onnxruntime as ort
    except ImportError as e:
        return {"checked": False, "reason": f"ONNX Runtime cannot be imported (no module {e.name or 'onnxruntime'!r})"}
    t0 = time.perf_counter()
    if stream_pairs(reader.model):
        return _check_stream(path, graph, ports, reader, t0)
    feeds, xs, n, t = check_inputs(reader, ports)
    opts = ort.SessionOptions()
    opts.log_severity_level = 4  # ORT would print its own errors; qtool says them in one line
    opts.intra_op_num_threads = 1
    if any(n.op_type == "DequantizeLinear" for n in reader.model.graph.node):
        # its optimizer fuses DequantizeLinear into integer kernels of other numerics: the float model
        # the file stands for is what it computes unoptimized
        opts.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    try:
        with framework_run():
            sess = ort.InferenceSession(_checked_model(reader).SerializeToString(), opts,
                                        providers=["CPUExecutionProvider"])
            want = dict(zip(ports.outputs, sess.run(list(ports.outputs), feeds)))
    except Exception as e:  # ONNX Runtime raises its own types on files it cannot run
        raise QtoolError(f"{path}: ONNX Runtime cannot run this file ({reason(ORT_NOISE.sub('', str(e)))})") from None
    worst = compare_outputs(path, graph, ports, xs, want, n, "ONNX Runtime")
    pairs = {"fake_quant_pairs": len(reader.fake_quant)} if reader.fake_quant else {}
    unused = {"note": f"input(s) {', '.join(repr(s) for s in ports.states)} feed none of the outputs: left out"
              } if ports.states else {}
    return {"checked": True, "framework": "ONNX Runtime", "max_abs_diff": worst, "sequences": n, "steps": t,
            "seconds": round(time.perf_counter() - t0, 3), **pairs, **unused}


def _check_stream(path: Path, graph, ports, reader, t0: float) -> dict:
    """A streaming file (qtool.importers.onnx.streaming) run frame by frame by ONNX Runtime, its
    caches starting at zero and fed back, against qtool's graph over the whole sequence."""
    import onnxruntime as ort

    pairs = dict(stream_pairs(reader.model))
    model = _inlined_model(reader)
    f = ports.steps or 1  # the steps of one run: a frame, or the length the file fixes
    runs = max(2, -(-CHECK_T // f))
    feeds, xs, n, _ = check_inputs(reader, ports, n=ports.batch or 1, steps=runs * f)
    opts = ort.SessionOptions()
    opts.log_severity_level = 4
    opts.intra_op_num_threads = 1
    declared = {i.name: i for i in model.graph.input}
    state = {c: np.zeros([d.dim_value or n for d in declared[c].type.tensor_type.shape.dim], np.float32)
             for c in pairs}  # a dynamic size: the batch (a GRU's h0 [layers, N, H])
    frames: dict[str, list] = {name: [] for name in ports.outputs}
    try:
        with framework_run():
            sess = ort.InferenceSession(model.SerializeToString(), opts, providers=["CPUExecutionProvider"])
            for k in range(runs):
                frame = {name: np.ascontiguousarray(lay.from_qtool(xs[name][:, k * f:(k + 1) * f])) for name, lay
                         in ports.inputs.items()}
                outs = dict(zip([*ports.outputs, *pairs.values()],
                                sess.run([*ports.outputs, *pairs.values()], {**frame, **state})))
                state = {c: outs[o] for c, o in pairs.items()}
                for name in ports.outputs:
                    frames[name].append(outs[name])
    except Exception as e:  # ONNX Runtime raises its own types on files it cannot run
        raise QtoolError(f"{path}: ONNX Runtime cannot run this file ({reason(ORT_NOISE.sub('', str(e)))})") from None
    want = {}
    for name, (_, layout) in ports.outputs.items():
        if "T" not in layout.axes:
            raise QtoolError(f"{path}: output '{name}' of a streaming file has no time axis ({layout.describe()})")
        want[name] = np.concatenate(frames[name], axis=layout.axes.index("T"))
    worst = compare_outputs(path, graph, ports, xs, want, n, "ONNX Runtime frame by frame")
    return {"checked": True, "framework": "ONNX Runtime", "max_abs_diff": worst, "sequences": n, "steps": runs * f,
            "frame_by_frame": True, "seconds": round(time.perf_counter() - t0, 3)}


def compare_outputs(path: Path, graph, ports, xs: dict, want: dict, n: int, framework: str) -> float:
    """The largest difference between the framework's outputs `want` and qtool's graph on `xs`
    (relative where the output exceeds 1); raises beyond TOLERANCE."""
    import qtool.layers as L

    got = L.run(graph, xs)
    worst = 0.0
    for name, (edge, layout) in ports.outputs.items():
        ref = layout.to_qtool(np.asarray(want[name], np.float32), n)
        if ref.shape != got[edge].shape:
            raise QtoolError(f"{path}: output '{name}': {framework} gives {list(want[name].shape)} "
                             f"({list(ref.shape)} channels-last), qtool's graph {list(got[edge].shape)}")
        diff = float(np.abs(ref - got[edge]).max(initial=0.0)) / max(1.0, float(np.abs(ref).max(initial=0.0)))
        if not diff <= TOLERANCE:
            raise wrong_import(f"{path}: output '{name}' of the imported graph differs from {framework} by up to "
                               f"{diff:.3g} (relative where above 1; tolerance {TOLERANCE:g})", TOLERANCE,
                               rounding_spread(lambda v: L.run(graph, v), xs))
        worst = max(worst, diff)
    return worst


def check_inputs(reader, ports, n: int | None = None, steps: int | None = None) -> tuple[dict, dict, int, int]:
    """ONNX Runtime's feeds (each in its own layout) and qtool's inputs (channels-last): random data,
    zeros for state inputs."""
    from onnx import helper

    rng = np.random.default_rng(0)
    n, t = n or ports.batch or CHECK_N, steps or ports.steps or CHECK_T
    for name, lay in ports.inputs.items():  # a file may fix its batch and length: bounded before allocating
        if n * (t if lay.seq else 1) * lay.channels > MAX_TENSOR_ELEMENTS:
            raise QtoolError(f"{reader.where}: input '{name}' is fixed at {n:,} sequences x {t:,} steps x "
                             f"{lay.channels:,} channels, too large to check (more than {MAX_TENSOR_ELEMENTS:,} "
                             "values); `check=False` imports it unchecked")
    feeds, xs, params = {}, {}, {}
    for name, lay in ports.inputs.items():
        x = rng.standard_normal((n, t, lay.channels) if lay.seq else (n, lay.channels)).astype(np.float32)
        xs[name], feeds[name] = x, np.ascontiguousarray(lay.from_qtool(x))
        info = next(i for i in reader.model.graph.input if i.name == name)
        for a, d in zip(lay.axes, info.type.tensor_type.shape.dim):
            if d.dim_param:
                params[d.dim_param] = n if a == "N" else t
    for name in ports.states:
        info = next(i for i in reader.model.graph.input if i.name == name)
        dims = [d.dim_value if d.HasField("dim_value") else params.get(d.dim_param, n)
                for d in info.type.tensor_type.shape.dim]
        feeds[name] = np.zeros(dims, helper.tensor_dtype_to_np_dtype(info.type.tensor_type.elem_type or FLOAT))
    return feeds, xs, n, t


def _checked_model(reader):
    """What ONNX Runtime runs for the check: the file inline, its fake-quant pairs on the data
    replaced by what qtool's float graph computes for them (the identity, or a relu)."""
    model = _inlined_model(reader)
    fake_quant.without_fake_quant(model, reader.fake_quant)
    return model


def _inlined_model(reader):
    """A copy of the model as its file has it (loops that qtool read as GRU nodes included), every
    stored tensor inline (external data read by qtool, checked first)."""
    from onnx import ModelProto

    from qtool.importers.onnx.loops import load_onnx, loop_notes

    model = ModelProto()
    rewritten = loop_notes(reader.model) or stream_pairs(reader.model)
    model.CopyFrom(load_onnx(reader.path, loops=False) if rewritten else reader.model)
    graph = model.graph
    # (a streaming file's cache updates, which qtool does not read, are inline or read here checked)
    inits = [reader.g.tensor(t.name) if t.name in reader.g.consts else inline(reader.where, t, reader.path.parent)
             for t in graph.initializer]
    del graph.initializer[:]
    graph.initializer.extend(inits)
    for k, node in enumerate(graph.node):
        inlined = reader.g.inlined(node)
        if inlined is not node:
            graph.node[k].CopyFrom(inlined)
    return model
