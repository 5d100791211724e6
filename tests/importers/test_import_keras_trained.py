"""Keras GRU models as users save them: compiled with a custom loss and custom metrics (a function,
a Loss subclass, a Metric subclass), trained, saved as .keras and legacy .h5, the GRU between other
layers. Each imports with the Keras check on, says which layers it took, which it left out and
what feeds it, and equals the Keras GRU layer's own output on held-out data."""

import os
import re
import zipfile

import numpy as np
import pytest
from conftest import fit_and_save, keras_on_torch

from qtool.errors import QtoolError
from qtool.importers import import_graph, import_model
from qtool.numerics.float_gru import run_float

FORMATS = ["m.keras", "m.h5"]


@pytest.fixture(scope="module")
def keras():
    return keras_on_torch(3)


def held_out(c, n=3, t=7, seed=21):
    return np.random.RandomState(seed).randn(n, t, c).astype(np.float32)


def train_and_save(keras, m, folder, how: str):
    """Compiled as users do (custom code the file names but qtool never needs), one epoch, saved twice."""
    def loss(y, p):
        return keras.ops.mean(keras.ops.square(y - p))

    def abs_err(y, p):
        return keras.ops.mean(keras.ops.abs(y - p))

    class SquaredLoss(keras.losses.Loss):
        def call(self, y, p):
            return keras.ops.mean(keras.ops.square(y - p), axis=-1)

    class AbsErr(keras.metrics.Mean):
        def update_state(self, y, p, sample_weight=None):
            return super().update_state(keras.ops.abs(y - p), sample_weight)

    if how == "function":
        m.compile(optimizer="adam", loss=loss, metrics=[abs_err, AbsErr(name="abs_err_class")])
    else:
        m.compile(optimizer="rmsprop", loss=SquaredLoss(), metrics=[AbsErr()])
    x = np.random.RandomState(0).randn(8, 5, m.inputs[0].shape[-1]).astype(np.float32)
    return fit_and_save(m, folder, x, batch_size=4)


@pytest.fixture(scope="module")
def models(keras, tmp_path_factory):
    """name: (trained Keras model, folder holding m.keras and m.h5)."""
    L, root = keras.layers, tmp_path_factory.mktemp("trained")

    def l1(w):  # training-only code the config names: a custom regularizer
        return 1e-3 * keras.ops.sum(keras.ops.abs(w))

    seq = keras.Sequential([keras.Input((None, 3)), L.Dense(4, activation="relu", name="embed", kernel_regularizer=l1),
                            L.GRU(5, return_sequences=True, name="gru", recurrent_regularizer=l1,
                                  kernel_constraint=keras.constraints.MaxNorm(3)),
                            L.Dense(2, name="head")])
    i = keras.Input((None, 3))
    h = L.Dropout(0.2)(L.Dense(4, name="embed")(i))
    fn = keras.Model(i, L.Dense(2, name="head")(L.GRU(5, return_sequences=True, name="gru")(h)))
    i = keras.Input((None, 3))
    head = keras.Model(i, L.Dense(2, name="head")(L.GRU(4, name="gru")(L.Reshape((-1, 3), name="reshape")(i))))
    stacked = keras.Sequential([keras.Input((None, 3)), L.GRU(4, return_sequences=True, name="a"), L.Dropout(0.1),
                                L.GRU(5, return_sequences=True, name="b"), L.Dense(2, name="head")])
    return {"sequential": train_and_save(keras, seq, root / "sequential", "function"),
            "functional": train_and_save(keras, fn, root / "functional", "class"),
            "head": train_and_save(keras, head, root / "head", "function"),
            "stacked": train_and_save(keras, stacked, root / "stacked", "class")}


def gru_matches_keras(keras, m, model, first: str, last: str):
    """The imported GRU against Keras' own layers on held-out data: Keras computes the GRU's input
    (the layers before it) and the GRU's output, qtool's float GRU runs between them."""
    x = held_out(3)
    feed = m.get_layer(first).input
    gru_in = x if feed is m.inputs[0] else keras.Model(m.inputs, feed).predict(x, verbose=0)
    want = keras.Model(m.inputs, m.get_layer(last).output).predict(x, verbose=0)
    got = run_float(model, np.asarray(gru_in, np.float32))
    got = got if want.ndim == 3 else got[:, -1]
    assert np.abs(got - want).max() < 1e-4
    assert model.extra["check"]["checked"] and model.extra["check"]["max_abs_diff"] < 1e-4


@pytest.mark.parametrize("fmt", FORMATS)
@pytest.mark.parametrize("kind", ["sequential", "functional"])
def test_gru_between_dense_layers_compiled_with_custom_loss_and_metrics(keras, models, kind, fmt):
    m, folder = models[kind]
    model = import_model(folder / fmt)
    assert model.extra["import"] == {"took": ["gru"], "left_out": ["embed (Dense)", "head (Dense)"],
                                     "input_from": "embed (Dense)", "notes": []}
    gru_matches_keras(keras, m, model, "gru", "gru")


@pytest.mark.parametrize("fmt", FORMATS)
def test_a_reshape_before_the_gru_is_named(keras, models, fmt):
    """A layout layer moves values without computing, but data for the model are then not laid out
    as the GRU reads them (a Permute swaps time and features): it is named like any other."""
    m, folder = models["head"]
    model = import_model(folder / fmt)
    assert model.extra["import"] == {"took": ["gru"], "left_out": ["reshape (Reshape)", "head (Dense)"],
                                     "input_from": "reshape (Reshape)", "notes": []}
    gru_matches_keras(keras, m, model, "gru", "gru")


@pytest.mark.parametrize("fmt", FORMATS)
def test_stacked_grus_and_each_one_alone(keras, models, fmt):
    m, folder = models["stacked"]
    stack = import_model(folder / fmt)
    assert stack.extra["import"] == {"took": ["a", "b"], "left_out": ["head (Dense)"], "input_from": None, "notes": []}
    gru_matches_keras(keras, m, stack, "a", "b")
    b = import_model(folder / fmt, name="b")
    assert b.extra["import"] == {"took": ["b"], "left_out": ["a (GRU)", "head (Dense)"], "input_from": "a (GRU)",
                                 "notes": []}
    gru_matches_keras(keras, m, b, "b", "b")
    a = import_model(folder / fmt, name="a")
    assert a.extra["import"] == {"took": ["a"], "left_out": ["b (GRU)", "head (Dense)"], "input_from": None,
                                 "notes": []}


def test_gru_inside_a_nested_model_compiled_on_its_own(keras, tmp_path):
    """The inner model's own compile config (a custom loss) is in the file too, inside the outer one's."""
    L = keras.layers
    inner = keras.Sequential([keras.Input((None, 4)), L.GRU(5, return_sequences=True, name="g")], name="enc")

    def loss(y, p):
        return keras.ops.mean(keras.ops.square(y - p))

    inner.compile(optimizer="sgd", loss=loss)
    i = keras.Input((None, 3))
    m = keras.Model(i, L.Dense(2, name="head")(inner(L.Dense(4, name="embed")(i))))
    m.save(tmp_path / "m.keras")
    model = import_model(tmp_path / "m.keras")
    assert model.extra["import"] == {"took": ["enc/g"], "left_out": ["embed (Dense)", "head (Dense)"],
                                     "input_from": "embed (Dense)", "notes": []}
    x = held_out(3)
    gru_in = keras.Model(m.inputs, m.get_layer("embed").output).predict(x, verbose=0)
    assert np.abs(run_float(model, gru_in) - inner.predict(gru_in, verbose=0)).max() < 1e-4


@pytest.mark.parametrize("fmt", FORMATS)
def test_custom_layer_before_the_gru_is_named(keras, tmp_path, fmt):
    """A layer class Keras cannot build without the user's code: the check names the layer and its
    class; without the check the GRU imports, saying what feeds it."""
    class Scale(keras.layers.Layer):  # not registered: as in a process that never imported the user's code
        def call(self, x):
            return 2 * x

    m = keras.Sequential([keras.Input((None, 3)), Scale(name="scale"), keras.layers.GRU(4, name="gru")])
    m.save(tmp_path / fmt)
    with pytest.raises(QtoolError, match=r"layer 'scale' \(Scale\) is the custom class 'Scale'"):
        import_model(tmp_path / fmt)
    model = import_model(tmp_path / fmt, check=False)
    assert model.extra["import"] == {"took": ["gru"], "left_out": ["scale (Scale)"], "input_from": "scale (Scale)",
                                     "notes": []}


EVIL = ["../evil.txt", "/abs_evil.txt", "sub/../../evil2.txt", "a/../../../evil3.txt"]


def test_path_traversal_entries_are_refused_naming_them(keras, models, tmp_path, monkeypatch):
    """An archive with an entry that points outside it is hostile: refused in one line naming the
    entry, before Keras (whose loader may extract an archive) or qtool reads anything of it."""
    m, folder = models["sequential"]
    work = tmp_path / "work" / "deep"
    work.mkdir(parents=True)
    monkeypatch.chdir(work)
    loaded = []
    monkeypatch.setattr(keras.saving, "load_model", lambda *a, **k: loaded.append(a))
    for evil in EVIL:
        path = work / "evil.keras"
        with zipfile.ZipFile(folder / "m.keras") as src, zipfile.ZipFile(path, "w") as z:
            for info in src.infolist():
                z.writestr(info, src.read(info))
            z.writestr(evil, b"written outside")
        with pytest.raises(QtoolError, match=f"archive entry '{re.escape(evil)}' points outside the archive"):
            import_model(path)
        with pytest.raises(QtoolError, match="points outside the archive"):
            import_graph(path)
    assert not loaded
    written = {p.name for p in tmp_path.rglob("*")} | {p.name for p in tmp_path.parent.iterdir()}
    assert not written & {"evil.txt", "abs_evil.txt", "evil2.txt", "evil3.txt"}
    assert not os.path.exists("/abs_evil.txt")
