"""Whole Keras models as graphs (qtool.importers.keras.model_graph): models as users build and save
them (compiled with a custom loss, trained one epoch, saved as .keras and legacy .h5), every layer
one node of the op table; `qtool.layers.run` equals Keras' `predict` on held-out data, and the
import check against Keras itself runs and passes. What qtool does not compute is refused in one
line naming the layer."""


import numpy as np
import pytest
from conftest import fit_and_save, keras_on_torch

FORMATS = ["m.keras", "m.h5"]


@pytest.fixture(scope="module")
def keras():
    return keras_on_torch(5)


def steps(m):
    return m.inputs[0].shape[1] or 9


def frame(m) -> tuple:
    """An input step's shape: (C,), or a map's (F, C)."""
    return tuple(m.inputs[0].shape[2:])


def train_and_save(keras, m, folder):
    """Compiled with a custom loss (code the file names, never needed to import), one epoch, saved twice."""
    def loss(y, p):
        return keras.ops.mean(keras.ops.square(y - p))

    m.compile(optimizer="adam", loss=loss)
    x = np.random.RandomState(0).randn(16, steps(m), *frame(m)).astype(np.float32)
    return fit_and_save(m, folder, x, batch_size=8)


@pytest.fixture(scope="module")
def models(keras, tmp_path_factory):
    """name: (trained Keras model, folder holding m.keras and m.h5)."""
    L, root = keras.layers, tmp_path_factory.mktemp("graphs")

    # the sequence model
    conv = keras.Sequential([keras.Input((None, 3)), L.Conv1D(8, 3, padding="causal", dilation_rate=2, name="conv"),
                             L.BatchNormalization(name="bn"), L.ReLU(name="relu"), L.ZeroPadding1D((2, 1), name="pad"),
                             L.AveragePooling1D(2, name="pool"), L.GRU(6, name="gru"), L.Dense(4, name="head")])
    # a skip: Dense -> GRU -> Dense(sigmoid) added to the first Dense's output, joined with the GRU's
    i = keras.Input((None, 4), name="features")
    d = L.PReLU(shared_axes=[1], alpha_initializer="random_normal", name="prelu")(L.Dense(6, name="embed")(i))
    g = L.GRU(6, return_sequences=True, name="gru")(L.Dropout(0.2, name="drop")(d))
    s = L.Dense(6, activation="sigmoid", name="gate")(g)
    c = L.Concatenate(name="join")([L.Add(name="skip")([d, s]), g])
    skip = keras.Model(i, L.Dense(2, name="head")(c))
    # a keyword spotter
    kws = keras.Sequential([keras.Input((None, 5)), L.Dense(8, activation="relu", name="embed"),
                            L.LayerNormalization(beta_initializer="random_normal", name="norm"),
                            L.Bidirectional(L.GRU(6, return_sequences=True), name="bigru"),
                            L.GRU(6, return_sequences=False, name="gru"), L.Dense(3, activation="softmax", name="cls")])
    # pooled heads, fixed T, two outputs
    i = keras.Input((12, 4), name="audio")
    h = L.DepthwiseConv1D(3, depth_multiplier=2, padding="same", name="dw")(i)
    h = L.LeakyReLU(0.1, name="leaky")(h)
    h = L.Conv1D(6, 3, strides=2, padding="same", activation="tanh", name="conv")(h)
    h = L.MaxPooling1D(2, padding="same", name="maxpool")(h)
    emb = L.UnitNormalization(name="unit")(L.Dense(4, name="proj")(L.GlobalAveragePooling1D(name="gap")(h)))
    probs = L.Softmax(name="softmax")(L.Dense(3, name="logits")(L.Flatten(name="flat")(
        L.GlobalMaxPooling1D(name="gmp")(L.ReLU(max_value=6.0, name="relu6")(h)))))
    heads = keras.Model(i, [emb, probs])
    # a convolutional recurrent keyword spotter over MFCC maps [N, T, 10, 1]
    crnn = keras.Sequential([keras.Input((None, 10, 1)), L.Conv2D(8, 3, strides=(1, 2), padding="same", name="conv",
                                                                  activation="relu"),
                             L.BatchNormalization(name="bn"), L.PReLU(shared_axes=[1, 2], name="prelu"),
                             L.DepthwiseConv2D(3, padding="same", name="dw"),
                             L.LayerNormalization(name="norm"), L.Reshape((-1, 40), name="frames"),
                             L.GRU(6, name="gru"), L.Dense(3, activation="softmax", name="cls")])
    return {name: train_and_save(keras, m, root / name)
            for name, m in (("conv", conv), ("skip", skip), ("kws", kws), ("heads", heads), ("crnn", crnn))}


OPS = {"conv": ["conv1d", "batchnorm", "activation", "zero_pad1d", "avg_pool1d", "gru", "dense"],
       "skip": ["dense", "prelu", "gru", "dense", "activation", "add", "concat", "dense"],
       "kws": ["dense", "activation", "layernorm", "gru", "gru", "dense", "softmax"],
       "heads": ["conv1d", "activation", "conv1d", "activation", "max_pool1d", "global_avg_pool1d", "dense",
                 "l2_normalize", "activation", "global_max_pool1d", "dense", "softmax"],
       "crnn": ["conv2d", "activation", "batchnorm", "prelu", "conv2d", "layernorm", "gru", "dense", "softmax"]}


@pytest.mark.parametrize("fmt", FORMATS)
@pytest.mark.parametrize("kind", list(OPS))
def test_whole_model_equals_keras(keras, models, kind, fmt):
    import qtool.layers
    from qtool.importers.keras.model_check import check_keras_graph
    from qtool.importers.keras.model_graph import read_keras_graph

    m, folder = models[kind]
    graph = qtool.layers.check(read_keras_graph(folder / fmt))
    assert sorted(n.op for n in graph.nodes) == sorted(OPS[kind])
    x = np.random.RandomState(21).randn(4, steps(m), *frame(m)).astype(np.float32)
    want = m.predict(x, verbose=0)
    got = qtool.layers.run(graph, x.reshape(*x.shape[:2], -1))  # a map's frames [F, C] flattened
    for edge, w in zip(graph.outputs, want if isinstance(want, list) else [want]):
        assert got[edge].shape == w.shape
        assert np.abs(got[edge] - w).max() < 1e-4
    check = check_keras_graph(folder / fmt, graph)
    assert check["checked"] and check["max_abs_diff"] < 1e-4 and check["framework"] == "Keras"


def test_a_map_and_its_refusals(keras, tmp_path):
    """LayerNormalization over a map's frequencies and channels (one group: the whole frame, .keras: Keras'
    own .h5 cannot reload its gamma); a Dense, or a Reshape that mixes time into the frames, on a map is refused."""
    from qtool.errors import QtoolError
    from qtool.importers.keras.model_check import check_keras_graph
    from qtool.importers.keras.model_graph import read_keras_graph

    L = keras.layers
    i = keras.Input((None, 6, 2))
    m = keras.Model(i, L.Reshape((-1, 12))(L.LayerNormalization(axis=[2, 3], beta_initializer="random_normal")(
        L.Conv2D(2, (2, 3), padding="same")(i))))
    m.save(tmp_path / "norm.keras")
    g = read_keras_graph(tmp_path / "norm.keras")
    assert [(n.op, n.attrs.get("size")) for n in g.nodes] == [("conv2d", None), ("layernorm", 12)]
    assert check_keras_graph(tmp_path / "norm.keras", g)["checked"]
    assert g.name == "norm"  # Keras' own "functional_N" names no model: the file's stem does
    for name, top in (("dense", L.Dense(3)), ("mix", L.Reshape((6, -1)))):
        keras.Model(i, top(L.Conv2D(2, 3, padding="same")(i))).save(tmp_path / f"{name}.keras")
        with pytest.raises(QtoolError, match="feature map") as e:
            read_keras_graph(tmp_path / f"{name}.keras")
        assert "\n" not in str(e.value)


def test_graph_names_and_attrs(keras, models):
    """Keras' names, its channel-last weights in the op table's layout, fused activations split off."""
    from qtool.importers.keras.model_graph import read_keras_graph

    m, folder = models["kws"]
    graph = read_keras_graph(folder / "m.keras")
    nodes = {n.name: n for n in graph.nodes}
    assert list(nodes) == ["embed", "embed/activation", "norm", "bigru", "gru", "cls", "cls/activation"]
    assert nodes["embed/activation"].attrs == {"kind": "relu"} and nodes["cls/activation"].op == "softmax"
    assert nodes["bigru"].attrs == {"return_sequences": True, "bidirectional": True, "layers": 1}
    assert nodes["gru"].attrs == {"return_sequences": False, "bidirectional": False, "layers": 1}
    assert nodes["bigru"].params["l0.bwd.R"].shape == (18, 6) and nodes["gru"].params["l0.fwd.W"].shape == (18, 12)
    np.testing.assert_array_equal(nodes["embed"].params["W"], m.get_layer("embed").get_weights()[0].T)
    assert graph.shapes["gru"] == (6,) and graph.shapes["bigru"] == (None, 12) and graph.outputs == ["cls"]
    conv = {n.name: n for n in read_keras_graph(models["conv"][1] / "m.h5").nodes}["conv"]
    assert conv.attrs == {"kernel": 3, "stride": 1, "dilation": 2, "groups": 1, "padding": "causal"}
    assert conv.params["W"].shape == (8, 3, 3)


def test_nested_models_are_flattened(keras, tmp_path):
    import qtool.layers
    from qtool.errors import QtoolError
    from qtool.importers.keras.model_check import check_keras_graph
    from qtool.importers.keras.model_graph import read_keras_graph

    L = keras.layers
    inner = keras.Sequential([L.Dense(4, name="x"), L.Dropout(0.1)], name="inner")
    i = keras.Input((None, 3))
    m = keras.Model(i, L.GRU(2, name="gru")(inner(i)))
    m.save(tmp_path / "m.keras")
    m.save(tmp_path / "m.h5")
    graph = read_keras_graph(tmp_path / "m.keras")
    assert [n.name for n in graph.nodes] == ["inner/x", "gru"]
    x = np.random.RandomState(1).randn(2, 5, 3).astype(np.float32)
    assert np.abs(qtool.layers.run(graph, x)["gru"] - m.predict(x, verbose=0)).max() < 1e-4
    assert check_keras_graph(tmp_path / "m.keras", graph)["checked"]
    with pytest.raises(QtoolError, match="nested model.*save the model as .keras") as e:
        read_keras_graph(tmp_path / "m.h5")
    assert "\n" not in str(e.value)


def refused(keras, tmp_path, layers, shape=(None, 3)):
    from qtool.errors import QtoolError
    from qtool.importers.keras.model_graph import read_keras_graph

    m = keras.Sequential([keras.Input(shape), *layers])
    m.save(tmp_path / "m.keras")
    with pytest.raises(QtoolError) as e:
        read_keras_graph(tmp_path / "m.keras")
    message = str(e.value)
    assert "\n" not in message
    return message


def test_an_unsupported_layer_is_refused_naming_it_and_where_the_supported_are(keras, tmp_path):
    from qtool.importers.keras.model_graph import SUPPORTED

    L = keras.layers
    message = refused(keras, tmp_path, [L.Dense(4, name="embed"), L.LSTM(3, name="lstm")])
    assert f"layer 'lstm' (LSTM) is not supported (qtool reads {len(SUPPORTED)} Keras layer classes" in message
    assert "docs/graph.md" in message and len(message) < 300  # one short line, not the list
    message = refused(keras, tmp_path, [L.Lambda(lambda t: t * 2, name="double")])
    assert "layer 'double' (Lambda) is not supported" in message


def test_channels_first_and_masking_are_refused(keras, tmp_path):
    L = keras.layers
    message = refused(keras, tmp_path, [L.Conv1D(4, 3, data_format="channels_first", name="conv")], (3, 10))
    assert "layer 'conv' (Conv1D) has data_format='channels_first'" in message
    message = refused(keras, tmp_path, [L.Masking(name="mask"), L.GRU(3, name="gru")])
    assert "'mask' masks time steps" in message
    message = refused(keras, tmp_path, [L.Dense(4, activation="silu", name="d")])
    assert "layer 'd' (Dense) has activation 'silu'" in message
    message = refused(keras, tmp_path, [L.Flatten(name="flat")])
    assert "layer 'flat' (Flatten) changes the layout" in message


def test_the_check_refuses_a_wrong_graph_and_says_when_keras_is_missing(keras, models, monkeypatch):
    from qtool.errors import QtoolError
    from qtool.importers.keras import model_check, model_graph

    folder = models["skip"][1]
    graph = model_graph.read_keras_graph(folder / "m.keras")
    head = next(n for n in graph.nodes if n.name == "head")
    head.params["b"] = head.params["b"] + 0.01
    with pytest.raises(QtoolError, match="output 'head' differs from Keras by up to 0.01") as e:
        model_check.check_keras_graph(folder / "m.keras", graph)
    assert "\n" not in str(e.value)

    def missing():
        raise ImportError("No module named 'keras'", name="keras")

    monkeypatch.setattr(model_check, "_import_keras", missing)
    assert model_check.check_keras_graph(folder / "m.keras", graph) == {
        "checked": False, "reason": "Keras cannot be imported (no module 'keras')"}


def test_same_average_pooling_is_checked_where_backends_agree(keras, tmp_path):
    """Keras' PyTorch backend counts repeated edge steps where a 'same' average pads unevenly;
    TensorFlow and qtool do not. The check runs a step count where every such pooling pads evenly."""
    from qtool.importers.keras.model_check import check_keras_graph
    from qtool.importers.keras.model_graph import read_keras_graph

    L = keras.layers
    m = keras.Sequential([keras.Input((None, 3)), L.Conv1D(4, 3, strides=2, padding="same", name="conv"),
                          L.AveragePooling1D(3, strides=2, padding="same", name="pool")])
    m.save(tmp_path / "m.keras")
    graph = read_keras_graph(tmp_path / "m.keras")
    assert graph.nodes[1].attrs == {"pool": 3, "stride": 2, "padding": "same"}
    check = check_keras_graph(tmp_path / "m.keras", graph)
    assert check["checked"] and check["steps"] != 8  # 8 steps -> 4 -> one padded step after, none before
    assert "TensorFlow and qtool leave them out" in check["note"]  # and the user is told
