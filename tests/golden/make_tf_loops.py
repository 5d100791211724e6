"""Golden files for GRUs written as loops, made the way published TensorFlow models were: tf2onnx
1.16 on TensorFlow 2.15 (Keras 2), opset 13.

    python -m venv tfenv && tfenv/bin/pip install tensorflow-cpu==2.15.1 tf2onnx==1.16.1 "numpy<2"
    tfenv/bin/python tests/golden/make_tf_loops.py

Writes, each with `NAME_io.npz` (held-out inputs x, TensorFlow's own output y):
- tf_loop_precise.onnx: a Mycroft Precise wake-word model, MFCC [N, 29, 13] -> Keras GRU(20,
  reset_after=False, hard_sigmoid gates, linear candidate) -> Dense(1, sigmoid); tf2onnx writes the
  GRU as a Loop whose body reads the sequence from the outer graph.
- tf_loop_keras_v1.onnx: a Keras GRU(12, reset_after=False) on [N, T, 6] of any length T, its whole
  sequence into a second one (two Loops), then Dense(3).
- tf_loop_reset_after.onnx: a Keras GRU(7, reset_after=True, hard_sigmoid gates, relu candidate)
  on [N, T, 5] of any length T, returning its last state.
- tf_scan_gru.onnx: TensorFlow 1's GRUCell(16) in dynamic_rnn over [N, 25, 10], its last step into a
  dense layer (a frozen graph, as ARM's keyword spotters): a Scan.
- tf_scan_stack.onnx: two GRUCells in a MultiRNNCell (both cells in one Scan body).
- tf_loop_rnn.onnx: a Keras SimpleRNN(8) (a Loop that is no GRU: refused).
- tf_loop_bidir.onnx and tf_loop_bidir_seq.onnx: a Keras Bidirectional(GRU(6, reset_after=False)),
  its final states and its every step (then a second GRU): tf2onnx's backward Loop reads a
  ReverseSequence. tf_loop_backwards.onnx: a GRU(6, go_backwards=True) alone (refused).
- tf_while_gates.tflite: the wake-word model as Precise trains it (Keras' implementation=1: a
  matmul per gate; dropout), whose TFLite body computes each gate apart.
- tf_while_precise.tflite and tf_while_stack.tflite: the wake-word model, and a Keras GRU(12)
  whose every step feeds a GRU(12, reset_after=False) then Dense(3, softmax), through TensorFlow's
  TFLite converter at one sequence per run (as TFLite models ship): each GRU a WHILE loop, the
  first GRU's steps in a lowered tensor list.
- tf_while_dyn.tflite (steps of any length, one sequence a run) and tf_while_f16.tflite (weights
  stored as float16, DEQUANTIZE to float32: the converter's float16 quantization).
- tf_conv.onnx and tf_conv.tflite: Conv1D(12, 3, relu, same, stride 2) -> DepthwiseConv1D(3) ->
  GRU(16, reset_after=False) -> Dense(1, sigmoid) on [N, 30, 8]; both converters write the
  convolutions in 2-D over a unit axis (ExpandDims, Conv2D, Squeeze).
- tf_crnn.onnx and tf_crnn_lite.tflite: a convolutional recurrent keyword spotter over MFCC maps
  [N, T, 10, 1]: Conv2D(8, 3x3, stride (1, 2), same) -> BatchNormalization -> ReLU ->
  DepthwiseConv2D(3x3, same, relu) -> Reshape((-1, 40)) -> GRU(16, reset_after=False) -> Dense(4,
  softmax); the ONNX file of any length T, the TFLite file at 49 steps.
- tf_while_bidi.tflite and tf_while_bidi_last.tflite: a Keras Bidirectional(GRU(6)) through the
  TFLite converter, its every step into Dense(3), and (reset_after=False) its final states into
  Dense(2): the backward WHILE loop reads the sequence REVERSE_V2 reverses, and its steps are
  reversed back. `make_tf_loops.py bidirectional_tflite` writes only these.
- tf_layernorm.onnx: Keras' LayerNormalization in the two forms tf2onnx writes (layer_norms).
- tf_flex.tflite (a GRU converted with SELECT_TF_OPS: TensorFlow's tensor-list ops inside) and
  tf_dense_int8.tflite (a model quantized to int8 by the converter): both refused.
"""

import os
from pathlib import Path

os.environ["TF_CPP_MIN_LOG_LEVEL"] = "3"

import numpy as np  # noqa: E402
import tensorflow as tf  # noqa: E402
import tf2onnx  # noqa: E402

HERE = Path(__file__).parent
OPSET = 13


def biased(model: tf.keras.Model, seed: int) -> tf.keras.Model:
    """Keras' initial weights, with biases that are not zero (a zero bias proves no mapping)."""
    rng = np.random.default_rng(seed)
    for w in model.weights:
        if "bias" in w.name:
            w.assign(rng.uniform(-0.3, 0.3, w.shape).astype("float32"))
    return model


def tflite_file(name: str, model: tf.keras.Model, x: np.ndarray) -> None:
    (HERE / f"{name}.tflite").write_bytes(tf.lite.TFLiteConverter.from_keras_model(model).convert())
    np.savez(HERE / f"{name}_io.npz", x=x, y=np.concatenate([model(x[k:k + 1]).numpy() for k in range(len(x))]))


def keras_file(name: str, model: tf.keras.Model, x: np.ndarray) -> None:
    spec = (tf.TensorSpec((None, *model.input_shape[1:]), tf.float32, name="x"),)
    tf2onnx.convert.from_keras(model, input_signature=spec, opset=OPSET, output_path=str(HERE / f"{name}.onnx"))
    np.savez(HERE / f"{name}_io.npz", x=x, y=model.predict(x, verbose=0))


def precise(rng) -> None:
    i = tf.keras.Input((29, 13))
    h = tf.keras.layers.GRU(20, reset_after=False, recurrent_activation="hard_sigmoid", activation="linear")(i)
    model = biased(tf.keras.Model(i, tf.keras.layers.Dense(1, activation="sigmoid")(h)), 1)
    keras_file("tf_loop_precise", model, rng.standard_normal((16, 29, 13)).astype("float32"))


def keras_v1(rng) -> None:
    i = tf.keras.Input((None, 6))
    h = tf.keras.layers.GRU(12, reset_after=False, return_sequences=True)(i)
    h = tf.keras.layers.GRU(12, reset_after=False)(h)
    model = biased(tf.keras.Model(i, tf.keras.layers.Dense(3)(h)), 2)
    keras_file("tf_loop_keras_v1", model, rng.standard_normal((16, 17, 6)).astype("float32"))


def tflite_models(rng) -> None:
    i = tf.keras.Input((29, 13), batch_size=1)
    h = tf.keras.layers.GRU(20, reset_after=False, recurrent_activation="hard_sigmoid", activation="linear")(i)
    model = biased(tf.keras.Model(i, tf.keras.layers.Dense(1, activation="sigmoid")(h)), 5)
    tflite_file("tf_while_precise", model, rng.standard_normal((8, 29, 13)).astype("float32"))
    i = tf.keras.Input((29, 13), batch_size=1)  # Precise's own cell: a matmul per gate, trained with dropout
    h = tf.keras.layers.GRU(20, implementation=1, dropout=0.2, reset_after=False, recurrent_activation="hard_sigmoid",
                            activation="linear")(i)
    model = biased(tf.keras.Model(i, tf.keras.layers.Dense(1, activation="sigmoid")(h)), 7)
    tflite_file("tf_while_gates", model, rng.standard_normal((8, 29, 13)).astype("float32"))
    i = tf.keras.Input((17, 6), batch_size=1)
    h = tf.keras.layers.GRU(12, return_sequences=True)(i)
    h = tf.keras.layers.GRU(12, reset_after=False)(h)
    model = biased(tf.keras.Model(i, tf.keras.layers.Dense(3, activation="softmax")(h)), 6)
    tflite_file("tf_while_stack", model, rng.standard_normal((8, 17, 6)).astype("float32"))


def more_tflite(rng) -> None:
    i = tf.keras.Input((None, 6), batch_size=1)
    model = biased(tf.keras.Model(i, tf.keras.layers.GRU(11, reset_after=False)(i)), 8)
    tflite_file("tf_while_dyn", model, rng.standard_normal((4, 13, 6)).astype("float32"))
    i = tf.keras.Input((17, 6), batch_size=1)
    model = biased(tf.keras.Model(i, tf.keras.layers.Dense(3)(tf.keras.layers.GRU(12)(i))), 9)
    conv = tf.lite.TFLiteConverter.from_keras_model(model)
    conv.optimizations = [tf.lite.Optimize.DEFAULT]
    conv.target_spec.supported_types = [tf.float16]
    (HERE / "tf_while_f16.tflite").write_bytes(conv.convert())
    x = rng.standard_normal((8, 17, 6)).astype("float32")
    np.savez(HERE / "tf_while_f16_io.npz", x=x, y=np.concatenate([model(x[k:k + 1]).numpy() for k in range(len(x))]))


def conv_front(rng) -> None:
    def build(batch):
        i = tf.keras.Input((30, 8), batch_size=batch)
        h = tf.keras.layers.Conv1D(12, 3, strides=2, padding="same", activation="relu")(i)
        h = tf.keras.layers.DepthwiseConv1D(3)(h)
        h = tf.keras.layers.GRU(16, reset_after=False)(h)
        return tf.keras.Model(i, tf.keras.layers.Dense(1, activation="sigmoid")(h))
    onnx_model, lite = biased(build(None), 10), build(1)
    lite.set_weights(onnx_model.get_weights())
    keras_file("tf_conv", onnx_model, rng.standard_normal((16, 30, 8)).astype("float32"))
    (HERE / "tf_conv.tflite").write_bytes(tf.lite.TFLiteConverter.from_keras_model(lite).convert())


def crnn(rng) -> None:
    def build(steps, batch):
        i = tf.keras.Input((steps, 10, 1), batch_size=batch)
        h = tf.keras.layers.Conv2D(8, 3, strides=(1, 2), padding="same")(i)
        h = tf.keras.layers.ReLU()(tf.keras.layers.BatchNormalization()(h))
        h = tf.keras.layers.DepthwiseConv2D(3, padding="same", activation="relu")(h)
        h = tf.keras.layers.GRU(16, reset_after=False)(tf.keras.layers.Reshape((-1, 40))(h))
        return tf.keras.Model(i, tf.keras.layers.Dense(4, activation="softmax")(h))
    onnx_model, lite = biased(build(None, None), 11), build(49, 1)
    for w in onnx_model.weights:  # a trained batchnorm's statistics
        if "moving" in w.name or "gamma" in w.name:
            w.assign(rng.uniform(0.5, 1.5, w.shape).astype("float32"))
    lite.set_weights(onnx_model.get_weights())
    keras_file("tf_crnn", onnx_model, rng.standard_normal((16, 30, 10, 1)).astype("float32"))
    tflite_file("tf_crnn_lite", lite, rng.standard_normal((8, 49, 10, 1)).astype("float32"))


def layer_norms(rng) -> None:
    """tf_layernorm.onnx: Dense(8) -> LayerNormalization -> GRU(10) -> LayerNormalization(epsilon
    1e-5) -> LayerNormalization(center=False) -> Dense(3) on [N, T, 6]. Keras 2 runs the first as
    a training-mode fused batch norm over the rows of a reshaped tensor (tf2onnx: Reshape,
    ReduceMean, ReduceSumSquare, BatchNormalization with those statistics, Reshape, Mul, Add) and
    the others, whose epsilon the fused kernel does not take or with no beta, as
    tf.nn.batch_normalization's formula (GlobalAveragePool moments, x * s + (beta - mean * s))."""
    i = tf.keras.Input((None, 6))
    h = tf.keras.layers.LayerNormalization()(tf.keras.layers.Dense(8)(i))
    h = tf.keras.layers.LayerNormalization(epsilon=1e-5)(tf.keras.layers.GRU(10, return_sequences=True)(h))
    h = tf.keras.layers.LayerNormalization(center=False)(h)
    model = biased(tf.keras.Model(i, tf.keras.layers.Dense(3)(h)), 12)
    for w in model.weights:
        if "gamma" in w.name or "beta" in w.name:
            w.assign(rng.uniform(0.5, 1.5, w.shape).astype("float32") if "gamma" in w.name else
                     rng.uniform(-0.3, 0.3, w.shape).astype("float32"))
    keras_file("tf_layernorm", model, rng.standard_normal((8, 20, 6)).astype("float32"))


def refused_tflite(rng) -> None:
    i = tf.keras.Input((None, 6))
    conv = tf.lite.TFLiteConverter.from_keras_model(tf.keras.Model(i, tf.keras.layers.GRU(4)(i)))
    conv.target_spec.supported_ops = [tf.lite.OpsSet.TFLITE_BUILTINS, tf.lite.OpsSet.SELECT_TF_OPS]
    conv._experimental_lower_tensor_list_ops = False
    (HERE / "tf_flex.tflite").write_bytes(conv.convert())
    i = tf.keras.Input((6,), batch_size=1)
    conv = tf.lite.TFLiteConverter.from_keras_model(tf.keras.Model(i, tf.keras.layers.Dense(3)(i)))
    conv.optimizations = [tf.lite.Optimize.DEFAULT]
    conv.representative_dataset = lambda: ([rng.standard_normal((1, 6)).astype("float32")] for _ in range(8))
    conv.target_spec.supported_ops = [tf.lite.OpsSet.TFLITE_BUILTINS_INT8]
    conv.inference_input_type = conv.inference_output_type = tf.int8
    (HERE / "tf_dense_int8.tflite").write_bytes(conv.convert())


def reset_after(rng) -> None:
    i = tf.keras.Input((None, 5))
    h = tf.keras.layers.GRU(7, reset_after=True, recurrent_activation="hard_sigmoid", activation="relu")(i)
    x = rng.standard_normal((16, 11, 5)).astype("float32")
    keras_file("tf_loop_reset_after", biased(tf.keras.Model(i, h), 4), x)


def bidirectional(rng) -> None:
    i = tf.keras.Input((9, 4))
    h = tf.keras.layers.Bidirectional(tf.keras.layers.GRU(6, reset_after=False))(i)
    keras_file("tf_loop_bidir", biased(tf.keras.Model(i, h), 11), rng.standard_normal((4, 9, 4)).astype("float32"))
    i = tf.keras.Input((None, 4))
    h = tf.keras.layers.Bidirectional(tf.keras.layers.GRU(6, reset_after=False, return_sequences=True))(i)
    h = tf.keras.layers.GRU(5, reset_after=False)(h)
    keras_file("tf_loop_bidir_seq", biased(tf.keras.Model(i, h), 12),
               rng.standard_normal((4, 9, 4)).astype("float32"))
    i = tf.keras.Input((9, 4))
    h = tf.keras.layers.GRU(6, reset_after=False, go_backwards=True)(i)
    keras_file("tf_loop_backwards", biased(tf.keras.Model(i, h), 13), rng.standard_normal((4, 9, 4)).astype("float32"))


def bidirectional_tflite(rng) -> None:
    i = tf.keras.Input((15, 4), batch_size=1)
    h = tf.keras.layers.Bidirectional(tf.keras.layers.GRU(6, return_sequences=True))(i)
    tflite_file("tf_while_bidi", biased(tf.keras.Model(i, tf.keras.layers.Dense(3)(h)), 14),
                rng.standard_normal((6, 15, 4)).astype("float32"))
    i = tf.keras.Input((15, 4), batch_size=1)
    h = tf.keras.layers.Bidirectional(tf.keras.layers.GRU(6, reset_after=False))(i)
    tflite_file("tf_while_bidi_last", biased(tf.keras.Model(i, tf.keras.layers.Dense(2)(h)), 15),
                rng.standard_normal((6, 15, 4)).astype("float32"))


def simple_rnn(rng) -> None:
    i = tf.keras.Input((10, 4))
    model = biased(tf.keras.Model(i, tf.keras.layers.SimpleRNN(8)(i)), 3)
    keras_file("tf_loop_rnn", model, rng.standard_normal((4, 10, 4)).astype("float32"))


def tf1_file(name: str, layers: int, rng) -> None:
    tf1 = tf.compat.v1
    g = tf.Graph()
    with g.as_default():
        x = tf1.placeholder(tf.float32, (None, 25, 10), name="x")
        cells = [tf1.nn.rnn_cell.GRUCell(16, name=f"gru{k}") for k in range(layers)]
        cell = cells[0] if layers == 1 else tf1.nn.rnn_cell.MultiRNNCell(cells)
        out, _ = tf1.nn.dynamic_rnn(cell, x, dtype=tf.float32)
        tf.identity(tf1.layers.dense(out[:, -1, :], 4, name="fc"), name="y")
        with tf1.Session(graph=g) as s:
            s.run(tf1.global_variables_initializer())
            for v in tf1.global_variables():
                if "bias" in v.name:
                    s.run(v.assign(rng.uniform(-0.3, 0.3, v.shape).astype("float32")))
            frozen = tf1.graph_util.convert_variables_to_constants(s, g.as_graph_def(), ["y"])
            xs = rng.standard_normal((16, 25, 10)).astype("float32")
            y = s.run("y:0", {"x:0": xs})
    tf2onnx.convert.from_graph_def(frozen, input_names=["x:0"], output_names=["y:0"], opset=OPSET,
                                   output_path=str(HERE / f"{name}.onnx"))
    np.savez(HERE / f"{name}_io.npz", x=xs, y=y)


def main() -> None:
    import sys

    if sys.argv[1:] == ["bidirectional_tflite"]:  # the newest files alone, the others as they are
        tf.random.set_seed(1)
        bidirectional_tflite(np.random.default_rng(14))
        return
    tf.random.set_seed(0)
    rng = np.random.default_rng(0)
    precise(rng)
    keras_v1(rng)
    reset_after(rng)
    simple_rnn(rng)
    tflite_models(rng)
    refused_tflite(rng)
    more_tflite(rng)
    conv_front(rng)
    crnn(rng)
    bidirectional(rng)
    layer_norms(np.random.default_rng(12))
    tf.compat.v1.disable_v2_behavior()  # TF1's control flow: TensorArrays in a while loop, as TF1 froze them
    tf1_file("tf_scan_gru", 1, rng)
    tf1_file("tf_scan_stack", 2, rng)


if __name__ == "__main__":
    main()
