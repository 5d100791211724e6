"""Golden files of Keras 2 `.h5` models, written the way TensorFlow 2.15 users save them
(`model.save("m.h5")` after `compile` with a custom loss and `fit`):

    python -m venv tfenv && tfenv/bin/pip install tensorflow-cpu==2.15.1 "numpy<2"
    tfenv/bin/python tests/golden/make_keras2.py

Writes, each with `NAME_io.npz` (held-out inputs x, TensorFlow's own output y):
- keras2_seq.h5: Conv1D(8, 3, causal, relu) -> GRU(12, return_sequences) -> Dense(3, softmax) on
  [N, 20, 5]; Keras 2 writes `time_major: false` into the GRU's config, which Keras 3 no longer
  takes.
- keras2_bidi_hs.h5: Bidirectional(GRU(6, reset_after=False, recurrent_activation="hard_sigmoid"))
  -> Dense(2) on [N, 20, 5]: Keras 2's hard_sigmoid (0.2 x + 0.5), one bias per gate.
"""

from pathlib import Path

import numpy as np
import tensorflow as tf
from tensorflow import keras
from tensorflow.keras import layers

OUT = Path(__file__).parent
N, T, C = 64, 20, 5


def my_loss(y_true, y_pred):  # a custom loss, as users compile with
    return tf.reduce_mean(keras.losses.categorical_crossentropy(y_true, y_pred))


def main() -> None:
    tf.random.set_seed(0)
    rng = np.random.default_rng(0)
    x = rng.standard_normal((N, T, C)).astype(np.float32)
    labels = (np.cumsum(x[:, :, 0], axis=1) > 0).astype(int) + (x[:, :, 1] > 1)
    seq = keras.Sequential([keras.Input((T, C)), layers.Conv1D(8, 3, padding="causal", activation="relu"),
                            layers.GRU(12, return_sequences=True), layers.Dense(3, activation="softmax")])
    seq.compile("adam", loss=my_loss)
    seq.fit(x[:48], keras.utils.to_categorical(labels[:48], 3), epochs=3, batch_size=16, verbose=0)
    bidi = keras.Sequential([keras.Input((T, C)),
                             layers.Bidirectional(layers.GRU(6, reset_after=False,
                                                             recurrent_activation="hard_sigmoid")),
                             layers.Dense(2)])
    bidi.compile("adam", loss="mse")
    bidi.fit(x[:48], x[:48, -1, :2], epochs=3, batch_size=16, verbose=0)
    for name, model in (("keras2_seq", seq), ("keras2_bidi_hs", bidi)):
        model.save(OUT / f"{name}.h5")
        np.savez(OUT / f"{name}_io.npz", x=x[48:], y=model.predict(x[48:], verbose=0))
    print(tf.__version__)


if __name__ == "__main__":
    main()
