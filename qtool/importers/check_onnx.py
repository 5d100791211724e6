"""The ONNX side of the import check: each GRU node, copied with all its attributes into a one-node
model, run by ONNX Runtime; a stack feeds each node the one before's output with its directions
concatenated (what onnx_graph.feeds_next proved the graph's layout ops do)."""

from __future__ import annotations

import numpy as np

from qtool.importers.onnx_graph import Graph, float_tensor


def _one_node_model(graph: Graph, node):
    from onnx import TensorProto, helper, numpy_helper

    weights = [n for n in node.input[1:4] if n]  # W, R and B; initial_h was proved zero or is an input
    inits = [numpy_helper.from_array(float_tensor(n, graph.consts[n], n), n) for n in weights]
    gru = helper.make_node("GRU", ["X", *node.input[1:4]], ["Y"], name=node.name)
    gru.attribute.extend(a for a in node.attribute if a.name != "output_sequence")  # GRU-1/3 only
    g = helper.make_graph([gru], "check", [helper.make_tensor_value_info("X", TensorProto.FLOAT, None)],
                          [helper.make_tensor_value_info("Y", TensorProto.FLOAT, None)], inits)
    # GRU computes the same from opset 7 on (14 added `layout`, refused unless 0); a fixed opset and IR
    # version let ONNX Runtime run nodes of files written for newer or older runtimes
    return helper.make_model(g, opset_imports=[helper.make_opsetid("", 14)], ir_version=8)


def run_onnx(graph: Graph, nodes: list, x: np.ndarray) -> np.ndarray:
    """ONNX Runtime on the GRU `nodes`, one after another, on batch-first `x [N, T, C]`; `graph` is
    the importer's, a QDQ file's weights already folded into the floats they stand for."""
    import onnxruntime as ort  # ImportError: ONNX Runtime is not installed

    opts = ort.SessionOptions()
    opts.log_severity_level = 3
    opts.intra_op_num_threads = 1
    y = np.asarray(x, np.float32)
    for node in nodes:
        sess = ort.InferenceSession(_one_node_model(graph, node).SerializeToString(), opts,
                                    providers=["CPUExecutionProvider"])
        out = sess.run(["Y"], {"X": np.ascontiguousarray(y.transpose(1, 0, 2))})[0]  # time-first
        y = out.transpose(2, 0, 1, 3).reshape(out.shape[2], out.shape[0], -1)  # [T, dirs, N, H] -> [N, T, dirs * H]
    return y
