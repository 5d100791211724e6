"""Keras import against Keras itself (torch backend): models built one after another in one process
(so config names and weight-group names disagree), custom names, several GRUs of different sizes,
Bidirectional, Sequential and functional models, legacy .h5, and every config setting that changes
the math and qtool does not compute refused whatever the layer is called."""


import numpy as np
import pytest
from conftest import has, keras_on_torch

from qtool.errors import QtoolError
from qtool.importers import import_model
from qtool.numerics.float_gru import run_float

pytestmark = pytest.mark.skipif(not (has("keras") and has("torch")), reason="keras (torch backend) not installed")


@pytest.fixture(scope="module")
def keras():
    return keras_on_torch(7)


def held_out(c, n=4, t=9, seed=11):
    return np.random.RandomState(seed).randn(n, t, c).astype(np.float32)


def keras_out(model, x):
    return np.asarray(model.predict(x, verbose=0))


def gru(keras, units, **kw):
    return keras.layers.GRU(units, return_sequences=True, bias_initializer="random_normal", **kw)


def test_second_model_in_a_process_imports_in_keras_order(keras, tmp_path):
    """Config names gru_1, gru_2 against weight groups layers/gru, layers/gru_1: was read reversed."""
    keras.Sequential([keras.Input((None, 4)), gru(keras, 4)])  # takes the name 'gru'
    m = keras.Sequential([keras.Input((None, 4)), gru(keras, 4), gru(keras, 4)])
    assert [layer.name for layer in m.layers] != ["gru", "gru_1"]
    m.save(tmp_path / "m.keras")
    x = held_out(4)
    model = import_model(tmp_path / "m.keras")
    assert model.num_layers == 2
    assert np.abs(run_float(model, x) - keras_out(m, x)).max() < 1e-5
    assert model.extra["check"]["checked"] and model.extra["check"]["max_abs_diff"] < 1e-5


def test_custom_names_and_sizes_pick_by_name(keras, tmp_path):
    m = keras.Sequential([keras.Input((None, 3)), gru(keras, 7, name="my_gru"), gru(keras, 2, name="enc")])
    m.save(tmp_path / "m.keras")
    x = held_out(3)
    first = import_model(tmp_path / "m.keras", name="my_gru")
    assert first.hidden_size == 7 and first.name == "my_gru"
    want = keras.Model(m.inputs, m.get_layer("my_gru").output)
    assert np.abs(run_float(first, x) - keras_out(want, x)).max() < 1e-5
    both = import_model(tmp_path / "m.keras")
    assert [c[0].R.shape[1] for c in both.layers] == [7, 2]
    assert np.abs(run_float(both, x) - keras_out(m, x)).max() < 1e-5


@pytest.mark.parametrize("bad, match", [  # relu, linear, hard_sigmoid, reset_after=False: test_gru_variants.py
    (dict(activation="elu"), "activation='elu'; qtool's GRU computes 'tanh', 'relu', 'linear' candidates"),
    (dict(recurrent_activation="tanh"), "recurrent_activation='tanh'; qtool's GRU computes 'sigmoid' or "
                                        "'hard_sigmoid' gates"),
    (dict(go_backwards=True), "go_backwards"),
])
def test_settings_that_change_the_math_are_refused_whatever_the_name(keras, tmp_path, bad, match):
    keras.Sequential([keras.Input((None, 3)), gru(keras, 3)])  # this process's names move on
    m = keras.Sequential([keras.Input((None, 3)), gru(keras, 4, name="my_gru", **bad)])
    m.save(tmp_path / "m.keras")
    with pytest.raises(QtoolError, match=match):
        import_model(tmp_path / "m.keras")


def test_functional_parallel_grus_of_different_sizes(keras, tmp_path):
    """Two GRUs on the same input: not a stack; names given in reverse alphabetical order."""
    i = keras.Input((None, 3))
    a, b = gru(keras, 5, name="zz")(i), gru(keras, 3, name="aa")(i)
    m = keras.Model(i, keras.layers.Concatenate()([a, b]))
    m.save(tmp_path / "m.keras")
    with pytest.raises(QtoolError, match="several GRUs"):
        import_model(tmp_path / "m.keras")
    x = held_out(3)
    y = keras_out(m, x)
    assert np.abs(run_float(import_model(tmp_path / "m.keras", name="zz"), x) - y[..., :5]).max() < 1e-5
    assert np.abs(run_float(import_model(tmp_path / "m.keras", name="aa"), x) - y[..., 5:]).max() < 1e-5


def test_functional_stack_use_bias_false_and_last_step_only(keras, tmp_path):
    i = keras.Input((None, 3))
    h = keras.layers.Bidirectional(gru(keras, 4, use_bias=False), name="enc")(i)
    h = keras.layers.Dropout(0.5)(h)  # identity at inference: still one stack
    y = keras.layers.Bidirectional(keras.layers.GRU(5, bias_initializer="random_normal"), name="dec")(h)
    m = keras.Model(i, y)  # the last layer returns its last step only: same GRU, fewer outputs
    m.save(tmp_path / "m.keras")
    x = held_out(3)
    model = import_model(tmp_path / "m.keras")
    assert model.num_layers == 2 and not model.layers[0][1].bx.any()
    got, want = run_float(model, x), keras_out(m, x)
    assert np.abs(got[:, -1, :5] - want[:, :5]).max() < 1e-5  # forward: after the last step
    assert np.abs(got[:, 0, 5:] - want[:, 5:]).max() < 1e-5  # backward: after the first step


def test_bidirectional_stack_sequential_and_legacy_h5(keras, tmp_path):
    m = keras.Sequential([keras.Input((None, 5)),
                          keras.layers.Bidirectional(gru(keras, 8)),
                          keras.layers.Bidirectional(gru(keras, 6))])
    x = held_out(5)
    for name in ("m.keras", "m.h5"):
        m.save(tmp_path / name)
        model = import_model(tmp_path / name)
        assert model.bidirectional and model.num_layers == 2
        assert np.abs(run_float(model, x) - keras_out(m, x)).max() < 1e-5


def test_custom_backward_layer_is_checked(keras, tmp_path):
    fwd = gru(keras, 4)
    bwd = gru(keras, 4, go_backwards=True, activation="elu")
    m = keras.Sequential([keras.Input((None, 3)), keras.layers.Bidirectional(fwd, backward_layer=bwd)])
    m.save(tmp_path / "m.keras")
    with pytest.raises(QtoolError, match="activation='elu'"):
        import_model(tmp_path / "m.keras")


def test_rnn_of_a_gru_cell_is_a_gru(keras, tmp_path):
    cell = keras.layers.GRUCell(4, bias_initializer="random_normal")
    m = keras.Sequential([keras.Input((None, 3)), keras.layers.RNN(cell, return_sequences=True, name="r")])
    m.save(tmp_path / "m.keras")
    x = held_out(3)
    assert np.abs(run_float(import_model(tmp_path / "m.keras"), x) - keras_out(m, x)).max() < 1e-5


def test_layers_between_grus_break_the_stack(keras, tmp_path):
    m = keras.Sequential([keras.Input((None, 4)), gru(keras, 4, name="a"), keras.layers.Dense(4),
                          gru(keras, 4, name="b")])
    m.save(tmp_path / "m.keras")
    with pytest.raises(QtoolError, match="several GRUs"):
        import_model(tmp_path / "m.keras")


@pytest.mark.parametrize("case", ["masking", "initial_state", "custom_class", "weights_only"])
def test_unsupported_models_are_refused(keras, tmp_path, case):
    path = tmp_path / "m.keras"
    if case == "masking":
        m = keras.Sequential([keras.Input((None, 3)), keras.layers.Masking(), gru(keras, 4)])
        match = "masks time steps"
    elif case == "initial_state":
        i, h0 = keras.Input((None, 3)), keras.Input((4,))
        m = keras.Model([i, h0], gru(keras, 4)(i, initial_state=h0))
        match = "initial state"
    elif case == "custom_class":
        @keras.saving.register_keras_serializable(package="test_import_keras")
        class MyGRU(keras.layers.GRU):
            pass

        m = keras.Sequential([keras.Input((None, 3)), MyGRU(4, name="gru")])
        match = "GRU-shaped cell"
    else:
        m = keras.Sequential([keras.Input((None, 3)), gru(keras, 4)])
        path = tmp_path / "m.weights.h5"
        m.save_weights(path)
        match = "no model config"
    if case != "weights_only":
        m.save(path)
    with pytest.raises(QtoolError, match=match):
        import_model(path)


def test_weights_entry_declaring_too_much_is_refused_before_reading(keras, tmp_path):
    """A zip member's declared size is checked before anything is read (a zip bomb)."""
    m = keras.Sequential([keras.Input((None, 3)), gru(keras, 4)])
    m.save(tmp_path / "m.keras")
    data = bytearray((tmp_path / "m.keras").read_bytes())
    pos = data.find(b"PK\x01\x02")
    while pos >= 0:  # central directory entries: the uncompressed size is at offset 24
        name_len = int.from_bytes(data[pos + 28:pos + 30], "little")
        if data[pos + 46:pos + 46 + name_len] == b"model.weights.h5":
            data[pos + 24:pos + 28] = (3 << 30).to_bytes(4, "little")
        pos = data.find(b"PK\x01\x02", pos + 4)
    (tmp_path / "bomb.keras").write_bytes(bytes(data))
    with pytest.raises(QtoolError, match="beyond qtool's limit"):
        import_model(tmp_path / "bomb.keras")


def test_config_claiming_huge_layers_is_not_loaded_with_keras(keras, tmp_path):
    """The GRU is fine, but a Dense layer's config claims 10^9 units: Keras would allocate 4 GB
    building it before noticing that the weights do not match, so the check refuses to load it."""
    import json
    import zipfile

    m = keras.Sequential([keras.Input((None, 3)), gru(keras, 4), keras.layers.Dense(2)])
    m.save(tmp_path / "m.keras")
    with zipfile.ZipFile(tmp_path / "m.keras") as z:
        files = {n: z.read(n) for n in z.namelist()}

    def with_units(layer: int, units: int):
        config = json.loads(files["config.json"])
        config["config"]["layers"][layer]["config"]["units"] = units
        with zipfile.ZipFile(tmp_path / "big.keras", "w") as z:
            for n, data in files.items():
                z.writestr(n, json.dumps(config) if n == "config.json" else data)
        return tmp_path / "big.keras"

    with pytest.raises(QtoolError, match=r"layer 'dense.*' \(units=1000000000\) would make Keras allocate"):
        import_model(with_units(-1, 10**9))
    assert import_model(tmp_path / "big.keras", check=False).hidden_size == 4
    with pytest.raises(QtoolError, match=r"has shape \(4, 12\), expected \(1000000000, 3000000000\)"):
        import_model(with_units(1, 10**9), check=False)  # the GRU claims H = 1e9: checked, never allocated


def test_nested_model_stack_and_its_layers(keras, tmp_path):
    inner = keras.Sequential([keras.Input((None, 3)), gru(keras, 4, name="g1"), gru(keras, 5, name="g2")],
                             name="enc")
    i = keras.Input((None, 3))
    m = keras.Model(i, keras.layers.Dense(2)(inner(i)))
    m.save(tmp_path / "m.keras")
    x = held_out(3)
    assert np.abs(run_float(import_model(tmp_path / "m.keras"), x) - keras_out(inner, x)).max() < 1e-5
    g2 = import_model(tmp_path / "m.keras", name="enc/g2")
    assert g2.input_size == 4 and g2.name == "enc_g2" and g2.extra["check"]["checked"]
