"""Golden files for the import and float-reference tests, produced by independent implementations:
PyTorch's nn.GRU, Keras 3's GRU (torch backend) and ONNX Runtime's GRU kernel.

Run from the repository root with torch, safetensors, keras, onnx and onnxruntime installed:
    KERAS_BACKEND=torch python tests/golden/make_golden.py
"""

from pathlib import Path

import numpy as np
import torch
from safetensors.torch import save_file

HERE = Path(__file__).parent
CASES = {  # name: (input, hidden, layers, bidirectional)
    "single": (5, 16, 1, False),
    "stacked": (6, 12, 3, False),
    "bidir": (4, 10, 2, True),
}


def torch_cases() -> None:
    for name, (c, h, layers, bidir) in CASES.items():
        torch.manual_seed(len(name))
        gru = torch.nn.GRU(c, h, num_layers=layers, bidirectional=bidir, batch_first=True)
        x = torch.randn(3, 7, c)
        with torch.no_grad():
            y, h_n = gru(x)
        save_file({k: v.contiguous() for k, v in gru.state_dict().items()},
                  str(HERE / f"torch_{name}.safetensors"))
        torch.save({"rnn": gru.state_dict()}, HERE / f"torch_{name}.pt")
        np.savez(HERE / f"torch_{name}_io.npz", x=x.numpy(), y=y.numpy(), h_n=h_n.numpy())


def keras_case() -> None:
    import keras

    keras.utils.set_random_seed(3)
    m = keras.Sequential([
        keras.Input((7, 5)),
        keras.layers.Bidirectional(keras.layers.GRU(8, return_sequences=True,
                                                    bias_initializer="random_normal")),
        keras.layers.Bidirectional(keras.layers.GRU(6, return_sequences=True,
                                                    bias_initializer="random_normal")),
    ])
    x = np.random.RandomState(3).randn(3, 7, 5).astype(np.float32)
    y = np.asarray(m.predict(x, verbose=0))
    m.save(HERE / "keras_stack.keras")
    np.savez(HERE / "keras_stack_io.npz", x=x, y=y)
    bad = keras.Sequential([keras.Input((7, 5)), keras.layers.GRU(4, reset_after=False)])
    bad.save(HERE / "keras_reset_before.keras")


def keras_order_case() -> None:
    """A stack built second in its process: config names gru_1, gru_2, weight groups layers/gru,
    layers/gru_1 (equal sizes, so a name-matching importer reads it reversed without noticing);
    as .keras and as legacy .h5."""
    import keras

    keras.utils.set_random_seed(5)
    keras.Sequential([keras.Input((None, 4)), keras.layers.GRU(4)])  # takes the name 'gru'
    m = keras.Sequential([keras.Input((None, 4))] + [
        keras.layers.GRU(4, return_sequences=True, bias_initializer="random_normal") for _ in range(2)])
    assert [layer.name for layer in m.layers] == ["gru_1", "gru_2"]
    x = np.random.RandomState(5).randn(3, 9, 4).astype(np.float32)
    m.save(HERE / "keras_order.keras")
    m.save(HERE / "keras_order.h5")
    np.savez(HERE / "keras_order_io.npz", x=x, y=np.asarray(m.predict(x, verbose=0)))


def onnx_case() -> None:
    import onnx
    import onnxruntime as ort
    from onnx import TensorProto, helper, numpy_helper

    rng = np.random.RandomState(4)
    c, h, dirs = 5, 9, 2
    W = rng.randn(dirs, 3 * h, c).astype(np.float32) * 0.4
    R = rng.randn(dirs, 3 * h, h).astype(np.float32) * 0.4
    B = rng.randn(dirs, 6 * h).astype(np.float32) * 0.3
    node = helper.make_node("GRU", ["X", "W", "R", "B"], ["Y", "Y_h"], name="encoder_gru",
                            hidden_size=h, direction="bidirectional", linear_before_reset=1)
    graph = helper.make_graph(
        [node], "g", [helper.make_tensor_value_info("X", TensorProto.FLOAT, [7, 3, c])],
        [helper.make_tensor_value_info("Y", TensorProto.FLOAT, None)],
        [numpy_helper.from_array(a, n) for a, n in ((W, "W"), (R, "R"), (B, "B"))])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 14)], ir_version=8)
    onnx.save(model, HERE / "onnx_bidir.onnx")
    x = rng.randn(7, 3, c).astype(np.float32)  # ONNX is time-first
    y = ort.InferenceSession(str(HERE / "onnx_bidir.onnx")).run(["Y"], {"X": x})[0]
    # Y is [T, dirs, N, H]; qtool's output is [N, T, dirs * H]
    np.savez(HERE / "onnx_bidir_io.npz", x=x.transpose(1, 0, 2),
             y=y.transpose(2, 0, 1, 3).reshape(3, 7, dirs * h))
    node0 = helper.make_node("GRU", ["X", "W", "R", "B"], ["Y"], hidden_size=h,
                             direction="bidirectional", linear_before_reset=0)
    graph0 = helper.make_graph([node0], "g", graph.input, graph.output, graph.initializer)
    onnx.save(helper.make_model(graph0), HERE / "onnx_lbr0.onnx")


if __name__ == "__main__":
    torch_cases()
    keras_case()
    keras_order_case()
    onnx_case()
