"""Whole Keras models with QKeras layers (qtool.importers.keras.model_graph): QDense and QConv1D
import with their weights as QKeras' quantizers give them, a QActivation (or a quantizer as a
layer's `activation=`) as its float function with its grid on the edge (`Graph.ranges`), which
`calibrate` takes; the import check runs Keras with those quantizers replaced by their float
functions. Models as users build them: trained with a custom loss, saved as .keras and .h5."""

import re

import numpy as np
import pytest
from conftest import has, keras_on_torch

from qtool import api
from qtool.errors import QtoolError
from qtool.importers.crosscheck import describe

pytestmark = pytest.mark.skipif(not (has("qkeras") and has("keras") and has("torch")),
                                reason="needs qkeras, keras and torch")
C, F, H, K, T = 4, 8, 16, 3, 12
FORMATS = ["m.keras", "m.h5"]
# edge: (lo, hi, step, bits) of QKeras' grid, worked out from its forward
GRIDS = {"qrelu": (0.0, 4 - 2.0**-6, 2.0**-6, 8),     # quantized_relu(8,2): k 2^(2-8), k in 0..255
         "dense": (-8.0, 8 - 2.0**-4, 2.0**-4, 8)}    # quantized_bits(8,3): k 2^(3-7), k in -128..127


@pytest.fixture(scope="module")
def keras():
    keras = keras_on_torch(11)
    pytest.importorskip("qkeras")
    return keras


def _save(keras, m, folder, epochs=2):
    def my_loss(y, p):  # a custom loss: code the file names, never needed to import
        return keras.ops.mean(keras.ops.square(y - p))

    m.compile(optimizer="adam", loss=my_loss)
    rng = np.random.default_rng(0)
    x = rng.standard_normal((64, T, C)).astype(np.float32)
    m.fit(x, rng.standard_normal((64, *m.outputs[0].shape[1:])).astype(np.float32), epochs=epochs, batch_size=16,
          verbose=0)
    for name in FORMATS:
        m.save(folder / name)
    return m, folder


@pytest.fixture(scope="module")
def model(keras, tmp_path_factory):
    """Input -> QConv1D -> QActivation(quantized_relu(8,2)) -> GRU -> QDense -> QActivation(quantized_bits(8,3))."""
    from qkeras import QActivation, QConv1D, QDense, quantized_bits, quantized_relu

    inp = keras.Input((None, C))
    y = QConv1D(F, 3, padding="same", kernel_quantizer=quantized_bits(8, 0, alpha=1),
                bias_quantizer=quantized_bits(8, 0, alpha=1), name="conv")(inp)
    y = QActivation(quantized_relu(8, 2), name="qrelu")(y)
    y = keras.layers.GRU(H, name="gru")(y)
    y = QDense(K, kernel_quantizer=quantized_bits(8, 0, alpha=1), bias_quantizer=quantized_bits(8, 0, alpha=1),
               name="dense")(y)
    y = QActivation(quantized_bits(8, 3), name="qout")(y)
    return _save(keras, keras.Model(inp, y), tmp_path_factory.mktemp("qkeras"))


@pytest.fixture(scope="module")
def data():
    rng = np.random.default_rng(1)
    return rng.standard_normal((64, T, C)).astype(np.float32), rng.standard_normal((48, T, C)).astype(np.float32)


@pytest.mark.parametrize("name", FORMATS)
def test_import_passes_the_check_with_the_quantizers_as_float_functions(model, name):
    g = api.load_model(model[1] / name)
    check = g.check_result
    assert check["checked"] and check["max_abs_diff"] <= 1e-4
    assert check["fake_quant_pairs"] == 2  # the two QActivations; the weight quantizers are folded
    assert "2 fake quantizer(s) on the data" in describe(check)
    ops = {n.name: (n.op, n.attrs.get("kind")) for n in g.nodes}
    # quantized_relu is a relu in the float graph; quantized_bits the identity (no node)
    assert ops == {"conv": ("conv1d", None), "qrelu": ("activation", "relu"), "gru": ("gru", None),
                   "dense": ("dense", None)}
    assert g.outputs == ["dense"]


@pytest.mark.parametrize("name", FORMATS)
def test_weights_are_qkeras_quantized_ones(keras, model, name):
    from qkeras import quantized_bits

    m, folder = model
    g = api.load_model(folder / name, check=False)
    nodes = {n.name: n for n in g.nodes}
    for layer, to_qtool in (("conv", lambda w: w.transpose(2, 1, 0)), ("dense", lambda w: w.T)):
        lay = m.get_layer(layer)
        # QKeras' own quantizer objects on the trained float weights, independently of qtool's port
        kernel = keras.ops.convert_to_numpy(quantized_bits(8, 0, alpha=1)(lay.kernel))
        bias = keras.ops.convert_to_numpy(quantized_bits(8, 0, alpha=1)(lay.bias))
        assert not np.array_equal(kernel, keras.ops.convert_to_numpy(lay.kernel))  # quantizing changed them
        assert np.array_equal(nodes[layer].params["W"], to_qtool(kernel))
        assert np.array_equal(nodes[layer].params["b"], bias)
        assert np.array_equal(kernel * 128, np.round(kernel * 128))  # on QKeras' grid of 2^-7


@pytest.mark.parametrize("name", FORMATS)
def test_ranges_are_the_exact_qkeras_grids(model, name):
    from qkeras import quantized_bits, quantized_relu

    g = api.load_model(model[1] / name, check=False)
    assert g.ranges.kind == "QKeras" and set(g.ranges.edges) == set(GRIDS) and not g.ranges.notes
    sources = {"qrelu": "QActivation 'qrelu' (quantized_relu(8,2))",
               "dense": "QActivation 'qout' (quantized_bits(8,3))"}
    x = np.linspace(-20, 20, 400001, dtype=np.float32)
    for edge, q in (("qrelu", quantized_relu(8, 2)), ("dense", quantized_bits(8, 3))):
        r = g.ranges.edges[edge]
        assert (r.lo, r.hi, r.step, r.bits) == GRIDS[edge] and r.source == sources[edge]
        # the grid is the set of values QKeras' quantizer gives: every level from lo to hi, nothing else
        levels = np.unique(np.asarray(q(x)))
        assert np.array_equal(levels, np.arange(round(r.lo / r.step), round(r.hi / r.step) + 1) * r.step)


@pytest.mark.parametrize("name", FORMATS)
def test_calibration_takes_the_qkeras_grids_and_simulation_follows_qkeras(keras, model, data, name):
    m, folder = model
    calib, test = data
    qg = api.calibrate(folder / name, calib, method="minmax")
    # quantized_relu(8,2): step 2^-6, its 256 levels 0 .. 255 on q = -128 .. 127 (zero point at the lowest)
    assert (qg.grids["qrelu"].exp2_inv, qg.grids["qrelu"].zp) == (6, -128)
    # quantized_bits(8,3): step 2^-4, levels -128 .. 127 as they are
    assert (qg.grids["dense"].exp2_inv, qg.grids["dense"].zp) == (4, 0)
    rows = {r["edge"]: r for r in qg.info["imported"]["rows"]}
    assert all(rows[e]["used"] and rows[e]["moved_db"] == 0.0 and not rows[e]["clips"] for e in GRIDS)
    assert qg.info["edge_methods"]["qrelu"] == "the file's" and qg.info["edge_methods"]["dense"] == "the file's"
    sim = api.simulate(qg, test, outputs=True)
    y = sim.y_quant
    want = keras.ops.convert_to_numpy(m(test))  # QKeras' own quantized model
    assert np.array_equal(y * 16, np.round(y * 16))  # on QKeras' output grid
    cos = float((y * want).sum() / np.linalg.norm(y) / np.linalg.norm(want))
    assert cos > 0.99, cos


def test_quantizer_as_a_layers_activation(keras, tmp_path):
    """QDense(activation=quantized_relu(6,1)): a dense, then a relu with the quantizer's grid."""
    from qkeras import QDense, quantized_bits, quantized_relu

    inp = keras.Input((None, C))
    y = QDense(F, kernel_quantizer=quantized_bits(6, 0, alpha="auto_po2"), activation=quantized_relu(6, 1),
               name="qd")(inp)
    y = keras.layers.GRU(H, name="gru")(y)
    m, folder = _save(keras, keras.Model(inp, keras.layers.Dense(K, name="head")(y)), tmp_path, epochs=1)
    for name in FORMATS:
        g = api.load_model(folder / name)
        assert g.check_result["checked"] and g.check_result["max_abs_diff"] <= 1e-4
        assert g.check_result["fake_quant_pairs"] == 1
        assert [(n.name, n.op, n.outputs) for n in g.nodes][:2] == [("qd", "dense", ["qd/preactivation"]),
                                                                  ("qd/activation", "activation", ["qd"])]
        r = g.ranges.edges["qd"]
        assert (r.lo, r.hi, r.step, r.bits) == (0.0, 2 - 2.0**-5, 2.0**-5, 6)
        assert r.source == "QDense 'qd' activation (quantized_relu(6,1))"
        kernel = keras.ops.convert_to_numpy(m.get_layer("qd").kernel_quantizer_internal(m.get_layer("qd").kernel))
        assert np.array_equal(g.nodes[0].params["W"], kernel.T)  # auto_po2: QKeras' per-column scales


def test_plain_model_has_no_ranges(keras, tmp_path):
    inp = keras.Input((None, C))
    y = keras.layers.GRU(H, name="gru")(keras.layers.Dense(F, activation="relu", name="fc")(inp))
    _, folder = _save(keras, keras.Model(inp, y), tmp_path, epochs=1)
    g = api.load_model(folder / "m.keras")
    assert g.ranges is None and "fake_quant_pairs" not in g.check_result


def _refused(keras, tmp_path, make):
    from qtool.importers.keras.model_graph import read_keras_graph

    inp = keras.Input((None, C))
    m = keras.Model(inp, keras.layers.GRU(H, name="gru")(make()(inp)))
    m.save(tmp_path / "m.keras")
    with pytest.raises(QtoolError) as e:
        read_keras_graph(tmp_path / "m.keras")
    return str(e.value)


@pytest.mark.parametrize("case", ["tanh", "auto", "sigmoid", "slope", "po2_kernel", "tanh_act"])
def test_unsupported_quantizers_are_refused_naming_the_layer(keras, tmp_path, case):
    import qkeras as q

    make, want = {
        "tanh": (lambda: q.QActivation(q.quantized_tanh(4), name="qt"),
                 r"layer 'qt' \(QActivation\): activation 'quantized_tanh' is not supported"),
        "auto": (lambda: q.QActivation(q.quantized_bits(8, 0, alpha="auto_po2"), name="qa"),
                 r"layer 'qa' \(QActivation\): activation quantized_bits has alpha='auto_po2'"),
        "sigmoid": (lambda: q.QActivation(q.quantized_relu(4, 0, use_sigmoid=1), name="qs"),
                    r"layer 'qs' \(QActivation\): activation quantized_relu sets use_sigmoid=1"),
        "slope": (lambda: q.QActivation(q.quantized_relu(4, 0, negative_slope=0.25), name="ql"),
                  r"layer 'ql' \(QActivation\): activation quantized_relu sets negative_slope=0.25"),
        "po2_kernel": (lambda: q.QDense(F, kernel_quantizer=q.quantized_po2(4), name="qp"),
                       r"layer 'qp' \(QDense\): kernel_quantizer 'quantized_po2' is not supported"),
        "tanh_act": (lambda: q.QConv1D(F, 3, activation=q.quantized_tanh(4), name="qc"),
                     r"layer 'qc' \(QConv1D\): activation 'quantized_tanh' is not supported"),
    }[case]
    msg = _refused(keras, tmp_path, make)
    assert "\n" not in msg and re.search(want, msg), msg
