"""The int8 of qtool's peers on the published models of benchmarks/published_models.py, on the same
calibration and held-out data, so that qtool's figures there can be read against them:

- LiteRT (TFLite) full-integer int8 of ARM's CRNN keyword spotters: the tf2onnx file's weights in
  a Keras model (Conv2D, the two reset-before GRU layers unrolled, two dense layers; checked against
  ONNX Runtime on the file), converted with the calibration clips as its representative dataset
  and run by the TFLite interpreter; top-1 agreement with float and cosine of the probabilities.
  Needs tensorflow (2.15 here), onnx and onnxruntime:

      python benchmarks/peer_int8.py tflite CRNN_S.onnx --calib calib.npy --test test.npy

- ONNX Runtime's static int8 (`quantize_static`, QDQ, int8 activations and weights, MinMax and
  percentile 99.9 calibration) of an ONNX file; cosine and 99th-percentile error of the output.
  ONNX Runtime has no integer GRU, so its GRUs stay in float. Per-channel weights are asked for
  and fall back to per-tensor where its quantizer cannot take them (GTCRN's grouped
  ConvTranspose). Features as for published_models.py; `--transpose` puts them in the file's
  layout (GTCRN: 0,2,1,3 from [N, T, 257, 2] to its [N, 257, T, 2]):

      python benchmarks/peer_int8.py ort gtcrn.onnx --calib calib.npy --test test.npy --transpose 0,2,1,3
"""

from __future__ import annotations

import argparse
import os
import tempfile
from pathlib import Path

import numpy as np


def cosine(a: np.ndarray, b: np.ndarray) -> float:
    a, b = a.ravel().astype(np.float64), b.ravel().astype(np.float64)
    return float(a @ b / max(np.linalg.norm(a) * np.linalg.norm(b), 1e-30))


def softmax(x: np.ndarray) -> np.ndarray:
    e = np.exp(x - x.max(-1, keepdims=True))
    return e / e.sum(-1, keepdims=True)


def crnn_keras(path: Path):
    """ARM's CRNN (tf2onnx: Conv, Relu, a Scan over TF1 GRUCells, two Gemm) as a Keras model of the
    file's weights, returning logits."""
    import onnx
    import tensorflow as tf
    from onnx import numpy_helper

    m = onnx.load(path)
    w = {i.name: numpy_helper.to_array(i) for i in m.graph.initializer}
    scan = next(n for n in m.graph.node if n.op_type == "Scan")
    body = next(a.g for a in scan.attribute if a.name == "body")
    w.update({i.name: numpy_helper.to_array(i) for i in body.initializer})
    conv = next(n for n in m.graph.node if n.op_type == "Conv")
    att = {a.name: onnx.helper.get_attribute_value(a) for a in conv.attribute}
    gemms = [n for n in m.graph.node if n.op_type == "Gemm"]
    cells = sorted({k.split("/gru_cell")[0].split("/")[-1] for k in w if "gru_cell/gates/kernel" in k})

    def weight(part: str) -> np.ndarray:
        return next(v for k, v in w.items() if part in k)

    x = tf.keras.Input(tuple(int(d.dim_value) for d in m.graph.input[0].type.tensor_type.shape.dim[1:]))
    kernel = w[conv.input[1]]  # [O, 1, kh, kw]
    layer = tf.keras.layers.Conv2D(kernel.shape[0], tuple(att["kernel_shape"]), strides=tuple(att["strides"]),
                                   activation="relu")
    y = layer(x)
    layer.set_weights([kernel.transpose(2, 3, 1, 0), w[conv.input[2]]])
    y = tf.keras.layers.Reshape((y.shape[1], y.shape[2] * y.shape[3]))(y)
    for i, cell in enumerate(cells):
        # TF1 GRUCell: gates [x, h] @ W_g -> (r, u); candidate [x, r * h] @ W_c; h' = u h + (1 - u) c.
        # Keras GRU(reset_after=False) is the same cell with its gates in the order (z = u, r, h).
        w_g, b_g = weight(f"{cell}/gru_cell/gates/kernel"), weight(f"{cell}/gru_cell/gates/bias")
        w_c, b_c = weight(f"{cell}/gru_cell/candidate/kernel"), weight(f"{cell}/gru_cell/candidate/bias")
        h = w_c.shape[1]
        n_in = w_g.shape[0] - h
        gru = tf.keras.layers.GRU(h, reset_after=False, unroll=True, return_sequences=i < len(cells) - 1)
        y = gru(y)
        gru.set_weights([np.concatenate([w_g[:n_in, h:], w_g[:n_in, :h], w_c[:n_in]], 1),
                         np.concatenate([w_g[n_in:, h:], w_g[n_in:, :h], w_c[n_in:]], 1),
                         np.concatenate([b_g[h:], b_g[:h], b_c])])
    for i, gemm in enumerate(gemms):
        dense = tf.keras.layers.Dense(w[gemm.input[1]].shape[1], activation="relu" if i < len(gemms) - 1 else None)
        y = dense(y)
        dense.set_weights([w[gemm.input[1]], w[gemm.input[2]]])
    return tf.keras.Model(x, y), m.graph.input[0].name


def tflite(path: Path, calib: np.ndarray, test: np.ndarray) -> str:
    import onnxruntime as ort
    import tensorflow as tf

    model, input_name = crnn_keras(path)
    want = model.predict(test, verbose=0)
    sess = ort.InferenceSession(str(path))
    ref = np.concatenate([sess.run(None, {input_name: t[None]})[0] for t in test])
    diff = float(np.abs(softmax(want) - ref).max())
    if diff > 1e-4:
        raise SystemExit(f"{path}: the Keras model is {diff:.2g} from ONNX Runtime; not the file's model")
    lines = [f"{path.name}: Keras model of the file's weights within {diff:.2g} of ONNX Runtime"]
    modes = {"int8": [tf.lite.OpsSet.TFLITE_BUILTINS_INT8],
             "int16x8": [tf.lite.OpsSet.EXPERIMENTAL_TFLITE_BUILTINS_ACTIVATIONS_INT16_WEIGHTS_INT8]}
    for label, ops in modes.items():
        conv = tf.lite.TFLiteConverter.from_keras_model(model)
        conv.optimizations = [tf.lite.Optimize.DEFAULT]
        conv.representative_dataset = lambda: ([c[None].astype(np.float32)] for c in calib)
        conv.target_spec.supported_ops = ops
        it = tf.lite.Interpreter(model_content=conv.convert())
        it.allocate_tensors()
        inp, out = it.get_input_details()[0], it.get_output_details()[0]
        got = []
        for t in test:
            it.set_tensor(inp["index"], t[None].astype(np.float32))
            it.invoke()
            got.append(it.get_tensor(out["index"])[0])
        got = np.stack(got).astype(np.float64)
        agree = float(np.mean(got.argmax(1) == want.argmax(1)))
        lines.append(f"  LiteRT {label}: top-1 agreement {agree:.2%}, cosine {cosine(softmax(got), softmax(want)):.4f}")
    return "\n".join(lines)


def ort_static(path: Path, calib: np.ndarray, test: np.ndarray) -> str:
    import onnx
    import onnxruntime as ort
    from onnxruntime.quantization import (
        CalibrationDataReader,
        CalibrationMethod,
        QuantFormat,
        QuantType,
        quantize_static,
    )
    from onnxruntime.quantization.shape_inference import quant_pre_process

    name = ort.InferenceSession(str(path)).get_inputs()[0].name
    want = ort.InferenceSession(str(path)).run(None, {name: test})[0]
    lines = [f"{path.name}: {sum(n.op_type == 'GRU' for n in onnx.load(path).graph.node)} GRUs, left in float"]

    class Reader(CalibrationDataReader):
        def __init__(self):
            self.items = iter([{name: c[None]} for c in calib])

        def get_next(self):
            return next(self.items, None)

    with tempfile.TemporaryDirectory() as d:
        pre, out, here = f"{d}/pre.onnx", f"{d}/int8.onnx", os.getcwd()
        os.chdir(d)  # its pre-processing leaves a file in the working folder
        try:
            quant_pre_process(str(path.resolve()), pre, skip_symbolic_shape=True)
        finally:
            os.chdir(here)
        for method, extra in [("MinMax", {}), ("Percentile", {"CalibPercentile": 99.9})]:
            for per_channel in (True, False):
                try:
                    quantize_static(pre, out, Reader(), quant_format=QuantFormat.QDQ, per_channel=per_channel,
                                    activation_type=QuantType.QInt8, weight_type=QuantType.QInt8,
                                    calibrate_method=getattr(CalibrationMethod, method),
                                    extra_options={"QDQDisableWeightAdjustForInt32Bias": True, **extra})
                    got = ort.InferenceSession(out).run(None, {name: test})[0]
                    break
                except Exception as e:  # its quantizer's refusal of per-channel weights for this model
                    if not per_channel:
                        raise SystemExit(f"{path}: ONNX Runtime's quantizer failed: {e}") from None
            err = np.abs(got.astype(np.float64) - want)
            label = f"{method}{' ' + str(extra['CalibPercentile']) if extra else ''}, " \
                    f"{'per-channel' if per_channel else 'per-tensor: per-channel failed'}"
            lines.append(f"  ONNX Runtime int8 ({label}): cosine {cosine(got, want):.4f}, "
                         f"p99 error {np.percentile(err, 99):.3f}")
    return "\n".join(lines)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("peer", choices=["tflite", "ort"])
    ap.add_argument("files", nargs="+", type=Path)
    ap.add_argument("--calib", type=Path, required=True)
    ap.add_argument("--test", type=Path, required=True)
    ap.add_argument("--transpose", help="axes that put the features in the file's layout, e.g. 0,2,1,3")
    args = ap.parse_args()
    calib, test = (np.load(f).astype(np.float32) for f in (args.calib, args.test))
    if args.transpose:
        axes = [int(a) for a in args.transpose.split(",")]
        calib, test = calib.transpose(axes), test.transpose(axes)
    for path in args.files:
        print(tflite(path, calib, test) if args.peer == "tflite" else ort_static(path, calib, test), flush=True)


if __name__ == "__main__":
    main()
