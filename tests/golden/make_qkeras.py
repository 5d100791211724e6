"""Golden files for the QKeras import test, produced by QKeras itself (qkeras-v3 on Keras 3,
torch backend): two stacked QGRUs with quantized_bits quantizers (8-bit auto_po2 kernels, fixed
power-of-two biases and states), fine-tuned a few steps with the quantizers in the loop.

    pip install --no-deps qkeras-v3 && pip install six scipy networkx tqdm pyparsing
    KERAS_BACKEND=torch python tests/golden/make_qkeras.py

Writes qkeras_gru.keras, qkeras_gru.h5 and qkeras_gru_io.npz: held-out inputs x, QKeras' output y (the model's
own forward, states quantized), and per layer the weights as QKeras' quantizers give them (Wq,
Rq, bq) with the auto_po2 scales it found (W_scale, R_scale).
"""

import os
from pathlib import Path

os.environ.setdefault("KERAS_BACKEND", "torch")

import keras  # noqa: E402
import numpy as np  # noqa: E402
from qkeras import QGRU, quantized_bits  # noqa: E402

HERE = Path(__file__).parent


def qgru(units: int) -> QGRU:
    return QGRU(units, return_sequences=True, activation="tanh", recurrent_activation="sigmoid",
                reset_after=True, kernel_quantizer=quantized_bits(8, 0, alpha="auto_po2"),
                recurrent_quantizer=quantized_bits(8, 0, alpha="auto_po2"),
                bias_quantizer=quantized_bits(8, 2, alpha=1), state_quantizer=quantized_bits(8, 0, alpha=1))


def main() -> None:
    keras.utils.set_random_seed(5)
    m = keras.Sequential([keras.Input((9, 3)), qgru(8), qgru(6)])
    rng = np.random.RandomState(5)
    x_train = rng.randn(256, 9, 3).astype(np.float32)
    target = np.tanh(np.cumsum(x_train[..., :1], axis=1) / 3) * np.ones((1, 1, 6), np.float32)
    m.compile(optimizer=keras.optimizers.Adam(1e-2), loss="mse")
    m.fit(x_train, target, batch_size=32, epochs=3, verbose=0)
    x = rng.randn(16, 9, 3).astype(np.float32)
    y = m.predict(x, verbose=0)
    m.save(HERE / "qkeras_gru.keras")
    m.save(HERE / "qkeras_gru.h5")  # the legacy format, same model
    out = {"x": x, "y": y}
    for l, layer in enumerate(m.layers):
        cell = layer.cell
        for name, q, w in (("W", cell.kernel_quantizer_internal, cell.kernel),
                           ("R", cell.recurrent_quantizer_internal, cell.recurrent_kernel),
                           ("b", cell.bias_quantizer_internal, cell.bias)):
            out[f"{name}q{l}"] = keras.ops.convert_to_numpy(q(w))
            if name != "b":
                out[f"{name}_scale{l}"] = keras.ops.convert_to_numpy(q.scale).reshape(-1)
    np.savez(HERE / "qkeras_gru_io.npz", **out)


if __name__ == "__main__":
    main()
