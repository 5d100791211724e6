"""The ONNX side of the import check: each GRU node, copied with all its attributes into a one-node
model, run by ONNX Runtime; a stack feeds each node the one before's output with its directions
concatenated (what onnx_graph.feeds_next proved the graph's ops do).

Weights computed from constants (torch.onnx's default exporter concatenates slices of the PyTorch
tensors) are computed again by ONNX Runtime from the file's own nodes and stored tensors, so that
the check does not rest on qtool's evaluation of them (onnx_fold)."""

from __future__ import annotations

import numpy as np

from qtool.importers.onnx.graph import Graph

X, Y = "qtool.check.x", "qtool.check.y"
FLOAT = 1  # TensorProto.FLOAT: the check runs in float32, as qtool's reference does


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
