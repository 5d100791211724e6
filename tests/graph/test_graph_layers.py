"""Every op of the whole-model graph (qtool.layers) against the frameworks' own layers: PyTorch
(torch.nn.functional) for the math, Keras (torch backend) where its semantics differ ("same"
padding, pooling, GRU final states, hard_sigmoid, gelu's flag, unit normalization). Random
held-out inputs, sequences and vectors where both apply; out_shape must agree with what forward
returns; bad attributes and shapes are one QtoolError line naming the node."""

from __future__ import annotations

import os
import re
from pathlib import Path

import numpy as np
import pytest
from conftest import keras_on_torch

from qtool.core.graph import Node
from qtool.errors import QtoolError
from qtool.layers import REGISTRY, layer

torch = pytest.importorskip("torch")
F = torch.nn.functional
DOCS = Path(__file__).resolve().parents[2] / "docs" / "graph.md"
COVERED: dict[str, set[str]] = {}  # test -> the ops it runs (`covers`)


def covers(*ops: str):
    """Declare the ops a test runs: test_every_op_is_tested reads the declarations, whichever
    process runs which test, and `run` holds each test to its own."""
    def mark(test):
        COVERED[test.__name__] = set(ops)
        return test
    return mark


@pytest.fixture(scope="module")
def keras():
    return keras_on_torch(0)


def rand(*shape, seed=0, scale=1.0):
    return (np.random.RandomState(seed).randn(*shape) * scale).astype(np.float32)


def node(op, attrs=None, params=None, inputs=1):
    return Node("n1", op, [f"x{i}" for i in range(inputs)], ["y"], dict(attrs or {}),
                {k: np.asarray(v, np.float32) for k, v in (params or {}).items()}, source="Test")


def shape_of(x):
    return (None, x.shape[-1]) if x.ndim == 3 else (x.shape[-1],)


def run(nd, *xs):
    """forward of one node, after out_shape, whose answer must describe what forward returns."""
    test = os.environ.get("PYTEST_CURRENT_TEST", "").split("::")[-1].split("[")[0].split(" ")[0]
    assert nd.op in COVERED.get(test, ()), f"{test} runs op {nd.op} without declaring it (@covers)"
    mod = layer(nd.op, nd.label)
    (shape,) = mod.out_shape(nd, [shape_of(x) for x in xs])
    (y,) = mod.forward(nd, [np.asarray(x, np.float32) for x in xs])
    assert y.dtype == np.float32
    assert y.ndim == len(shape) + 1 and y.shape[-1] == shape[-1] and y.shape[0] == xs[0].shape[0]
    return y


def close(y, ref, tol=1e-5):
    ref = np.asarray(ref.detach().numpy() if hasattr(ref, "detach") else ref, np.float32)
    assert y.shape == ref.shape
    np.testing.assert_allclose(y, ref, rtol=tol, atol=tol * max(1.0, float(np.abs(ref).max(initial=0))))


def t(x):
    return torch.from_numpy(np.ascontiguousarray(x))


def kcall(keras, lay, x):
    return keras.ops.convert_to_numpy(lay(x))


def ncw(x):
    """channels-last `[N, T, C]` as PyTorch's `[N, C, T]` (and back)."""
    return t(x).permute(0, 2, 1)


# ---- dense, batchnorm, elementwise, concat, last_step, zero_pad1d ------------------------------

@covers("dense")
@pytest.mark.parametrize("bias", [True, False])
def test_dense(bias):
    W, b = rand(7, 5, seed=1), rand(7, seed=2)
    nd = node("dense", params={"W": W, "b": b} if bias else {"W": W})
    for x in (rand(3, 6, 5, seed=3, scale=30), rand(4, 5, seed=4)):
        close(run(nd, x), F.linear(t(x), t(W), t(b) if bias else None))


@covers("batchnorm")
def test_batchnorm():
    C = 6
    p = {"gamma": rand(C, seed=1), "beta": rand(C, seed=2), "mean": rand(C, seed=3), "var": rand(C, seed=4) ** 2}
    nd = node("batchnorm", {"epsilon": 1e-3}, p)
    for x in (rand(3, 8, C, seed=5), rand(4, C, seed=6)):
        xt = ncw(x) if x.ndim == 3 else t(x)
        ref = F.batch_norm(xt, t(p["mean"]), t(p["var"]), t(p["gamma"]), t(p["beta"]), training=False, eps=1e-3)
        close(run(nd, x), ref.permute(0, 2, 1) if x.ndim == 3 else ref)


@covers("add", "mul")
@pytest.mark.parametrize("op", ["add", "mul"])
def test_add_mul(op):
    for shape in ((3, 7, 4), (5, 4)):
        xs = [rand(*shape, seed=s) for s in range(3)]
        want = xs[0] + xs[1] + xs[2] if op == "add" else t(xs[0]) * t(xs[1]) * t(xs[2])
        close(run(node(op, inputs=3), *xs), want)
        close(run(node(op, inputs=2), *xs[:2]), t(xs[0]) + t(xs[1]) if op == "add" else t(xs[0]) * t(xs[1]))


@covers("hypot", "select", "sub")
def test_sub_hypot_select():
    for shape in ((3, 7, 4), (5, 4)):
        a, b = rand(*shape, seed=1), rand(*shape, seed=2)
        close(run(node("sub", inputs=2), a, b), t(a) - t(b))
        close(run(node("hypot", {"epsilon": 1e-3}, inputs=2), a, b), torch.sqrt(t(a) ** 2 + t(b) ** 2 + 1e-3))
        close(run(node("select", {"index": (3, -1, 0, 0)}), a),
              torch.nn.functional.pad(t(a), (1, 0))[..., [4, 0, 1, 1]])


@covers("concat")
def test_concat():
    for a, b in ((rand(2, 5, 3, seed=1), rand(2, 5, 4, seed=2)), (rand(2, 3, seed=3), rand(2, 6, seed=4))):
        close(run(node("concat", inputs=2), a, b), torch.cat([t(a), t(b)], dim=-1))


@covers("last_step")
def test_last_step():
    x = rand(3, 9, 4)
    close(run(node("last_step"), x), t(x)[:, -1])


@covers("zero_pad1d")
def test_zero_pad1d(keras):
    x = rand(2, 5, 3)
    close(run(node("zero_pad1d", {"pad": (2, 3)}), x), kcall(keras, keras.layers.ZeroPadding1D((2, 3)), x))
    close(run(node("zero_pad1d", {"pad": [0, 1]}), x), F.pad(ncw(x), (0, 1)).permute(0, 2, 1))


# ---- conv1d ------------------------------------------------------------------------------------

TORCH_CONVS = [  # kernel, stride, dilation, groups, padding (C_in 6, C_out 4 unless depthwise)
    (3, 1, 1, 1, "valid"), (5, 2, 1, 1, "valid"), (3, 1, 2, 1, "valid"), (3, 3, 2, 2, "valid"),
    (3, 1, 1, 6, "valid"), (4, 2, 1, 1, (2, 2)), (3, 1, 3, 2, (1, 4)), (1, 1, 1, 1, "valid"),
    (3, 1, 1, 1, "causal"), (4, 2, 3, 2, "causal"), (4, 1, 1, 1, "same"), (3, 1, 2, 6, "same"),
]


@covers("conv1d")
@pytest.mark.parametrize("kernel,stride,dilation,groups,padding", TORCH_CONVS)
def test_conv1d_against_torch(kernel, stride, dilation, groups, padding):
    c_in, c_out = 6, 6 if groups == 6 else 4
    W, b = rand(c_out, c_in // groups, kernel, seed=1), rand(c_out, seed=2)
    nd = node("conv1d", {"kernel": kernel, "stride": stride, "dilation": dilation, "groups": groups,
                         "padding": padding}, {"W": W, "b": b})
    for T in (11, 12):
        x = rand(3, T, c_in, seed=T, scale=4)
        xt = ncw(x)
        if padding == "causal":
            xt = F.pad(xt, ((kernel - 1) * dilation, 0))
        elif isinstance(padding, tuple):
            xt = F.pad(xt, padding)
        # stride 1: PyTorch's own "same" (total (k-1)*d zeros, the odd one after) is Keras' too
        pad = "same" if padding == "same" else 0
        ref = F.conv1d(xt, t(W), t(b), stride=stride, dilation=dilation, groups=groups, padding=pad)
        close(run(nd, x), ref.permute(0, 2, 1))
    if isinstance(padding, tuple) and padding[0] == padding[1]:  # PyTorch's symmetric padding=p
        ref = F.conv1d(ncw(x), t(W), t(b), stride=stride, dilation=dilation, groups=groups, padding=padding[0])
        close(run(nd, x), ref.permute(0, 2, 1))


KERAS_CONVS = [  # kernel, stride, dilation, groups, padding, T
    (3, 1, 1, 1, "same", 10), (4, 1, 1, 1, "same", 10), (4, 2, 1, 1, "same", 10), (4, 2, 1, 1, "same", 9),
    (5, 3, 1, 1, "same", 10), (2, 3, 1, 1, "same", 11), (3, 1, 2, 2, "same", 9), (1, 2, 1, 1, "same", 7),
    (3, 1, 2, 1, "causal", 9), (3, 2, 1, 3, "valid", 10), (7, 4, 1, 1, "same", 5),
]


@covers("conv1d")
@pytest.mark.parametrize("kernel,stride,dilation,groups,padding,T", KERAS_CONVS)
def test_conv1d_against_keras(keras, kernel, stride, dilation, groups, padding, T):
    c_in, c_out = 6, 6
    conv = keras.layers.Conv1D(c_out, kernel, strides=stride, dilation_rate=dilation, groups=groups,
                               padding=padding, bias_initializer="random_normal")
    x = rand(2, T, c_in, seed=T)
    want = kcall(keras, conv, x)
    kernel_w, b = (keras.ops.convert_to_numpy(w) for w in conv.weights)  # [k, C_in / groups, C_out]
    nd = node("conv1d", {"kernel": kernel, "stride": stride, "dilation": dilation, "groups": groups,
                         "padding": padding}, {"W": kernel_w.transpose(2, 1, 0), "b": b})
    close(run(nd, x), want)


@covers("conv1d")
def test_conv1d_too_short_input():
    nd = node("conv1d", {"kernel": 5}, {"W": rand(2, 3, 5)})
    with pytest.raises(QtoolError, match=r"n1 \(Test\).*3 steps"):
        run(nd, rand(1, 3, 3))


# ---- conv2d -------------------------------------------------------------------------------------

TORCH_CONV2DS = [  # kernel, stride, dilation, groups, time padding, freq pads (C_in 4, C_out 6 unless depthwise)
    ((3, 3), (1, 1), (1, 1), 1, "valid", (0, 0)), ((10, 4), (2, 2), (1, 1), 1, "valid", (0, 0)),
    ((2, 3), (1, 2), (1, 1), 2, "causal", (1, 1)), ((3, 3), (1, 1), (2, 1), 4, "causal", (1, 1)),
    ((1, 1), (1, 1), (1, 1), 1, "valid", (0, 0)), ((3, 2), (2, 1), (1, 2), 2, (1, 2), (2, 0)),
    ((1, 5), (1, 2), (1, 1), 1, "valid", (2, 2)),
]


def _map_edge(m, order):
    """A map [N, T, F, C] as its edge [N, T, F * C] in `order`."""
    return (m if order == "fc" else m.transpose(0, 1, 3, 2)).reshape(*m.shape[:2], -1)


@covers("conv2d")
@pytest.mark.parametrize("order,out_order", [("cf", "cf"), ("fc", "fc"), ("cf", "fc")])
@pytest.mark.parametrize("kernel,stride,dilation,groups,padding,freq_pads", TORCH_CONV2DS)
def test_conv2d_against_torch(kernel, stride, dilation, groups, padding, freq_pads, order, out_order):
    c_in, freq = 4, 10
    c_out = 4 if groups == 4 else 6
    W, b = rand(c_out, c_in // groups, *kernel, seed=1), rand(c_out, seed=2)
    nd = node("conv2d", {"kernel": kernel, "stride": stride, "dilation": dilation, "groups": groups,
                         "padding": padding, "freq": freq, "freq_pads": freq_pads, "order": order,
                         "out_order": out_order}, {"W": W, "b": b})
    for T in (12, 13):
        x = rand(2, c_in, T, freq, seed=T, scale=3)  # PyTorch's [N, C, T, F]
        time_pads = {"valid": (0, 0), "causal": ((kernel[0] - 1) * dilation[0], 0)}.get(padding, padding)
        xt = F.pad(t(x), (*freq_pads, *time_pads))
        ref = F.conv2d(xt, t(W), t(b), stride=stride, dilation=dilation, groups=groups)  # [N, C_out, T', F']
        y = run(nd, _map_edge(x.transpose(0, 2, 3, 1), order))
        close(y, _map_edge(ref.permute(0, 2, 3, 1).numpy(), out_order))


@covers("conv2d")
@pytest.mark.parametrize("up,kf,pad,groups", [(2, 5, 2, 1), (2, 4, 1, 2), (3, 3, 0, 1), (1, 3, 1, 4)])
def test_conv2d_spread_is_pytorchs_transposed_convolution(up, kf, pad, groups):
    """freq_up u with the kernel flipped and (k - 1) - p zeros each side: ConvTranspose2d of stride
    (1, u) and padding (0, p) (time kernel 2, causal)."""
    c_in, c_out, freq = 4, 8, 7
    Wt = rand(c_in, c_out // groups, 2, kf, seed=up)  # ConvTranspose2d's [C_in, C_out / groups, kt, kf]
    W = Wt.reshape(groups, c_in // groups, c_out // groups, 2, kf).swapaxes(1, 2).reshape(c_out, c_in // groups, 2, kf)
    W = np.ascontiguousarray(W[:, :, ::-1, ::-1])
    nd = node("conv2d", {"kernel": (2, kf), "freq": freq, "freq_up": up, "freq_pads": (kf - 1 - pad, kf - 1 - pad),
                         "groups": groups, "padding": "causal"}, {"W": W})
    x = rand(2, c_in, 9, freq, seed=5)
    ref = F.conv_transpose2d(F.pad(t(x), (0, 0, 1, 0)), t(Wt), stride=(1, up), padding=(1, pad), groups=groups)
    close(run(nd, _map_edge(x.transpose(0, 2, 3, 1), "cf")), _map_edge(ref.permute(0, 2, 3, 1).numpy(), "cf"))


@pytest.mark.parametrize("kernel,stride,padding,T", [((3, 3), (1, 1), "same", 9), ((4, 3), (2, 2), "same", 10),
                                                      ((4, 4), (2, 3), "same", 9), ((10, 4), (2, 2), "valid", 49)])
@covers("conv2d")
def test_conv2d_against_keras(keras, kernel, stride, padding, T):
    """Keras' Conv2D on [N, T, F, C] ("same" pads both axes the TensorFlow way: the odd one after)."""
    conv = keras.layers.Conv2D(5, kernel, strides=stride, padding=padding, bias_initializer="random_normal")
    x = rand(2, T, 10, 3, seed=T)
    want = kcall(keras, conv, x)  # [N, T', F', C_out]
    kernel_w, b = (keras.ops.convert_to_numpy(w) for w in conv.weights)  # [kt, kf, C_in, C_out]
    from qtool.core.node_args import same_pads

    freq_pads = same_pads(10, kernel[1], stride[1]) if padding == "same" else (0, 0)
    nd = node("conv2d", {"kernel": kernel, "stride": stride, "padding": padding, "freq": 10,
                         "freq_pads": freq_pads, "order": "fc"}, {"W": kernel_w.transpose(3, 2, 0, 1), "b": b})
    close(run(nd, x.reshape(2, T, -1)), want.reshape(*want.shape[:2], -1))


# ---- activations ---------------------------------------------------------------------------------

def act_input(seed):
    x = rand(3, 7, 5, seed=seed, scale=4)
    x[0, 0, :] = [-30.0, -1e-3, 0.0, 1e-3, 30.0]  # the far ends and zero
    return x


ACTIVATIONS = [
    ({"kind": "relu"}, F.relu),
    ({"kind": "relu6"}, F.relu6),
    ({"kind": "leaky_relu", "alpha": 0.1}, lambda v: F.leaky_relu(v, 0.1)),
    ({"kind": "sigmoid"}, torch.sigmoid),
    ({"kind": "tanh"}, torch.tanh),
    ({"kind": "hard_sigmoid"}, F.hardsigmoid),
    ({"kind": "hard_sigmoid", "alpha": 0.2, "beta": 0.5}, lambda v: torch.clamp(0.2 * v + 0.5, 0, 1)),
    ({"kind": "softplus"}, F.softplus),
    ({"kind": "gelu"}, F.gelu),
    ({"kind": "gelu", "approximate": "none"}, F.gelu),
    ({"kind": "gelu", "approximate": "tanh"}, lambda v: F.gelu(v, approximate="tanh")),
    ({"kind": "square"}, lambda v: v.pow(2)),
    ({"kind": "sqrt"}, lambda v: torch.sqrt(torch.clamp(v, min=0))),
    ({"kind": "linear"}, lambda v: v),
]


@covers("activation")
@pytest.mark.parametrize("attrs,fn", ACTIVATIONS, ids=[f"{a['kind']}-{len(a)}" for a, _ in ACTIVATIONS])
def test_activation_against_torch(attrs, fn):
    for x in (act_input(1), rand(4, 5, seed=2, scale=4)):
        close(run(node("activation", attrs), x), fn(t(x)))


@covers("activation")
def test_activation_against_keras(keras):
    x = act_input(3)
    acts = keras.activations
    for attrs, fn in (({"kind": "hard_sigmoid"}, acts.hard_sigmoid), ({"kind": "relu6"}, acts.relu6),
                      ({"kind": "gelu", "approximate": True}, lambda v: acts.gelu(v, approximate=True)),
                      ({"kind": "gelu", "approximate": False}, lambda v: acts.gelu(v, approximate=False)),
                      ({"kind": "leaky_relu", "alpha": 0.3}, keras.layers.LeakyReLU(negative_slope=0.3)),
                      ({"kind": "softplus"}, acts.softplus), ({"kind": "sigmoid"}, acts.sigmoid)):
        close(run(node("activation", attrs), x), keras.ops.convert_to_numpy(fn(x)))


@covers("prelu")
def test_prelu_against_torch_and_keras(keras):
    alpha = rand(6, seed=3, scale=0.4)
    nd = node("prelu", params={"alpha": alpha})
    for x in (rand(3, 7, 6, seed=4, scale=3), rand(5, 6, seed=5, scale=3)):
        close(run(nd, x), F.prelu(t(x).transpose(1, -1), t(alpha)).transpose(1, -1))  # PyTorch's channels: axis 1
    lay = keras.layers.PReLU(shared_axes=[1], alpha_initializer="random_normal")
    x = rand(2, 9, 6, seed=6, scale=2)
    want = kcall(keras, lay, x)
    close(run(node("prelu", params={"alpha": keras.ops.convert_to_numpy(lay.weights[0]).reshape(-1)}), x), want)


@covers("layernorm")
@pytest.mark.parametrize("size,stride", [(12, 1), (4, 1), (4, 3), (2, 2)])
def test_layernorm_against_torch(size, stride):
    """Groups of `size` channels `stride` apart (the whole frame; each frequency's channels in "fc" or
    "cf" frames) normalized as PyTorch's LayerNorm over that axis, then gamma and beta per channel."""
    gamma, beta = 1 + rand(12, seed=1, scale=0.3), rand(12, seed=2)
    nd = node("layernorm", {"size": size, "stride": stride, "epsilon": 1e-5}, {"gamma": gamma, "beta": beta})
    for x in (rand(3, 7, 12, seed=3, scale=3) + 1, rand(4, 12, seed=4)):
        g = t(x).reshape(*x.shape[:-1], -1, size, stride).transpose(-1, -2)
        ref = F.layer_norm(g, (size,), eps=1e-5).transpose(-1, -2).reshape(x.shape) * t(gamma) + t(beta)
        close(run(nd, x), ref)


@covers("layernorm")
def test_layernorm_against_keras(keras):
    lay = keras.layers.LayerNormalization(epsilon=1e-3, gamma_initializer="random_normal",
                                          beta_initializer="random_normal")
    x = rand(2, 9, 6, seed=6, scale=2)
    want = kcall(keras, lay, x)
    gamma, beta = (keras.ops.convert_to_numpy(w) for w in lay.weights)
    close(run(node("layernorm", {"size": 6, "epsilon": 1e-3}, {"gamma": gamma, "beta": beta}), x), want)


@covers("add", "mul", "reduce_mean")
@pytest.mark.parametrize("size,stride", [(3, 1), (3, 2), (6, 1), (2, 3)])
def test_reduce_mean_and_a_repeated_input(size, stride):
    """reduce_mean over groups (a map's frequencies in "cf" or "fc" frames) as torch.mean, and
    add/mul repeating its output over the groups as PyTorch broadcasts it."""
    x = rand(3, 5, 6, seed=size, scale=2)
    view = t(x).reshape(3, 5, -1, size, stride)
    mean = view.mean(dim=-2)
    y = run(node("reduce_mean", {"size": size, "stride": stride}), x)
    close(y, mean.reshape(3, 5, -1))
    for op, f in (("mul", torch.mul), ("add", torch.add)):
        got = run(node(op, {"repeat": (size, stride)}, inputs=2), x, y)
        close(got, f(view, mean[..., None, :]).reshape(3, 5, 6))


@covers("activation")
def test_activation_extremes_are_finite():
    x = np.array([[-1e30, -100.0, 100.0, 1e30]], np.float32)
    for attrs in ({"kind": "sigmoid"}, {"kind": "softplus"}, {"kind": "gelu"}, {"kind": "tanh"},
                  {"kind": "gelu", "approximate": "tanh"}):
        with np.errstate(over="raise", invalid="raise", divide="raise"):  # underflow to 0 is right
            y = run(node("activation", attrs), x)
        assert np.all(np.isfinite(y)), attrs


# ---- pooling -----------------------------------------------------------------------------------

def tf_avg_same(x, pool, stride):
    """TensorFlow's "same" average, step by step: the mean of the window's real steps."""
    T = x.shape[1]
    out = -(-T // stride)
    total = max((out - 1) * stride + pool - T, 0)
    start = -(total // 2)
    return np.stack([x[:, max(start + i * stride, 0): start + i * stride + pool].mean(axis=1) for i in range(out)],
                    axis=1)


POOLS = [(2, 2, 8), (2, 2, 9), (3, 1, 7), (3, 2, 9), (3, 2, 6), (2, 1, 5), (4, 3, 10), (5, 2, 4), (1, 1, 3)]


@covers("avg_pool1d", "max_pool1d")
@pytest.mark.parametrize("pool,stride,T", POOLS)
def test_pool_valid_and_same(keras, pool, stride, T):
    x = rand(2, T, 3, seed=T)
    for padding in ("valid", "same"):
        if padding == "valid" and T < pool:
            continue
        attrs = {"pool": pool, "stride": stride, "padding": padding}
        y_max, y_avg = run(node("max_pool1d", attrs), x), run(node("avg_pool1d", attrs), x)
        close(y_max, kcall(keras, keras.layers.MaxPooling1D(pool, stride, padding=padding), x))
        if padding == "valid":
            close(y_avg, kcall(keras, keras.layers.AveragePooling1D(pool, stride, padding=padding), x))
            close(y_avg, F.avg_pool1d(ncw(x), pool, stride).permute(0, 2, 1))
            close(y_max, F.max_pool1d(ncw(x), pool, stride).permute(0, 2, 1))
            continue
        close(y_avg, tf_avg_same(x, pool, stride))
        total = max((-(-T // stride) - 1) * stride + pool - T, 0)
        if total % 2 == 0:
            # Keras on the torch backend pads an even total through PyTorch with count_include_pad=False,
            # TensorFlow's semantics; an odd total it pads by replicating the edge step, which is not
            # (TensorFlow and JAX backends divide by the real steps), so those cases compare step by step
            close(y_avg, kcall(keras, keras.layers.AveragePooling1D(pool, stride, padding=padding), x))


@covers("avg_pool1d", "max_pool1d", "zero_pad1d")
@pytest.mark.parametrize("pool,stride,pad", [(3, 1, 1), (4, 2, 2), (5, 3, 2), (2, 2, 1)])
def test_pool_explicit_padding_against_torch(pool, stride, pad):
    x = rand(2, 9, 3, seed=pool)
    attrs = {"pool": pool, "stride": stride, "padding": (pad, pad)}
    xt = ncw(x)
    close(run(node("max_pool1d", attrs), x), F.max_pool1d(xt, pool, stride, pad).permute(0, 2, 1))
    close(run(node("avg_pool1d", attrs), x),
          F.avg_pool1d(xt, pool, stride, pad, count_include_pad=False).permute(0, 2, 1))
    # PyTorch's default count_include_pad=True: zero_pad1d, then a "valid" average
    padded = run(node("zero_pad1d", {"pad": (pad, pad)}), x)
    close(run(node("avg_pool1d", {"pool": pool, "stride": stride}), padded),
          F.avg_pool1d(xt, pool, stride, pad).permute(0, 2, 1))


@covers("max_pool1d")
def test_pool_stride_defaults_to_pool(keras):
    x = rand(2, 9, 3)
    close(run(node("max_pool1d", {"pool": 3}), x), kcall(keras, keras.layers.MaxPooling1D(3), x))


@covers("global_avg_pool1d", "global_max_pool1d")
def test_global_pools(keras):
    x = rand(3, 7, 4, seed=5)
    close(run(node("global_avg_pool1d"), x), kcall(keras, keras.layers.GlobalAveragePooling1D(), x))
    close(run(node("global_max_pool1d"), x), kcall(keras, keras.layers.GlobalMaxPooling1D(), x))
    close(run(node("global_max_pool1d"), x), t(x).amax(dim=1))


# ---- gru ---------------------------------------------------------------------------------------

def torch_params(gru, layers, dirs):
    """PyTorch's GRU weights (gates r | z | n) as the op's params (z | r | g)."""
    def order(a):
        r, z, n = np.split(a.detach().numpy(), 3)
        return np.concatenate([z, r, n])

    p = {}
    for k in range(layers):
        for d, name in enumerate(("fwd", "bwd")[:dirs]):
            sfx = f"l{k}" + ("_reverse" if d else "")
            for ours, theirs in (("W", "weight_ih_"), ("R", "weight_hh_"), ("bx", "bias_ih_"), ("br", "bias_hh_")):
                p[f"l{k}.{name}.{ours}"] = order(getattr(gru, theirs + sfx))
    return p


@covers("gru", "last_step")
@pytest.mark.parametrize("layers,bidirectional", [(1, False), (2, False), (1, True), (2, True)])
def test_gru_against_torch(layers, bidirectional):
    torch.manual_seed(layers)
    C, H, dirs = 5, 6, 2 if bidirectional else 1
    gru = torch.nn.GRU(C, H, num_layers=layers, bidirectional=bidirectional, batch_first=True)
    p = torch_params(gru, layers, dirs)
    x = rand(3, 8, C, seed=9)
    with torch.no_grad():
        out, h_n = gru(t(x))
    attrs = {"layers": layers, "bidirectional": bidirectional}
    seq = run(node("gru", attrs, p), x)
    close(seq, out)
    final = run(node("gru", {**attrs, "return_sequences": False}, p), x)
    close(final, torch.cat(list(h_n[-dirs:]), dim=-1))  # the last layer's final states
    # PyTorch's output[:, -1] (the backward direction after one step) is the sequence's last step
    close(run(node("last_step"), seq), out[:, -1])
    if bidirectional:
        assert not np.allclose(final, out[:, -1].numpy())


def keras_params(cells):
    """Keras GRU cells (reset_after=True: kernel [C, 3H], recurrent [H, 3H], bias [2, 3H]) as params."""
    p = {}
    for name, cell in cells.items():
        kernel, recurrent, bias = (np.asarray(w.numpy() if hasattr(w, "numpy") else w) for w in
                                   (cell.kernel, cell.recurrent_kernel, cell.bias))
        p.update({f"{name}.W": kernel.T, f"{name}.R": recurrent.T, f"{name}.bx": bias[0], f"{name}.br": bias[1]})
    return p


@covers("gru")
def test_gru_against_keras_bidirectional_final_states(keras):
    keras.utils.set_random_seed(3)
    C, H = 4, 5
    inp = keras.Input((None, C))
    first = keras.layers.Bidirectional(keras.layers.GRU(H, return_sequences=True, bias_initializer="random_normal"))
    last = keras.layers.Bidirectional(keras.layers.GRU(H, return_sequences=False, bias_initializer="random_normal"))
    model = keras.Model(inp, last(first(inp)))
    x = rand(3, 7, C, seed=4)
    want = np.asarray(model.predict(x, verbose=0))
    cells = {"l0.fwd": first.forward_layer.cell, "l0.bwd": first.backward_layer.cell,
             "l1.fwd": last.forward_layer.cell, "l1.bwd": last.backward_layer.cell}
    nd = node("gru", {"layers": 2, "bidirectional": True, "return_sequences": False}, keras_params(cells))
    close(run(nd, x), want)


@covers("gru")
def test_gru_against_keras_sequences(keras):
    keras.utils.set_random_seed(4)
    gru = keras.layers.GRU(6, return_sequences=True, bias_initializer="random_normal")
    x = rand(2, 9, 3, seed=5)
    want = kcall(keras, gru, x)
    nd = node("gru", {}, keras_params({"l0.fwd": gru.cell}))
    close(run(nd, x), want)
    last = keras.layers.GRU(6, return_sequences=False)
    last.build((None, None, 3))
    last.set_weights(gru.get_weights())
    close(run(node("gru", {"return_sequences": False}, nd.params), x), kcall(keras, last, x))


# ---- softmax, l2_normalize ------------------------------------------------------------------------

@covers("softmax")
def test_softmax():
    for x in (rand(2, 6, 5, scale=30), rand(4, 5, seed=1, scale=30)):
        close(run(node("softmax"), x), torch.softmax(t(x), dim=-1))


@covers("l2_normalize")
def test_l2_normalize(keras):
    for x in (rand(2, 6, 5, scale=3), rand(4, 5, seed=1)):
        x[0, 0] = 0  # a zero vector: the epsilon keeps it 0 (no 0 / 0)
        y = run(node("l2_normalize"), x)
        close(y, F.normalize(t(x), dim=-1))
        close(y, kcall(keras, keras.layers.UnitNormalization(), x))
    x = rand(3, 4, seed=2) * 1e-4
    close(run(node("l2_normalize", {"epsilon": 1e-3}), x), F.normalize(t(x), dim=-1, eps=1e-3))
    # an epsilon on the squared norm (tf.math.l2_normalize) is this op's epsilon = sqrt(e)
    close(run(node("l2_normalize", {"epsilon": 1e-3}), x),
          x / np.sqrt(np.maximum((x.astype(np.float64) ** 2).sum(-1, keepdims=True), 1e-6)))


# ---- refusals ----------------------------------------------------------------------------------

SEQ, VEC = (None, 4), (4,)
BAD = [  # op, attrs, params, input shapes, what the message says
    ("dense", {}, {"W": rand(3, 5)}, [SEQ], "input has 4 channels"),
    ("dense", {}, {"W": rand(3, 4), "b": rand(4)}, [SEQ], "param 'b' has shape [4], expected [3]"),
    ("dense", {}, {}, [VEC], "param 'W' is missing"),
    ("dense", {"units": 3}, {"W": rand(3, 4)}, [VEC], "unknown attribute 'units'"),
    ("dense", {}, {"W": rand(3, 4), "bias": rand(3)}, [VEC], "unknown param 'bias'"),
    ("dense", {}, {"W": rand(3, 4)}, [SEQ, SEQ], "takes 1 input(s), got 2"),
    ("dense", {}, {"W": np.full((3, 4), np.nan, np.float32)}, [SEQ], "NaN"),
    ("conv1d", {"kernel": 0}, {"W": rand(2, 4, 1)}, [SEQ], "'kernel' must be an integer in 1..1048576, got 0"),
    ("prelu", {}, {"alpha": rand(3)}, [SEQ], "param 'alpha' has shape [3], expected [4]"),
    ("reduce_mean", {"size": 3}, {}, [SEQ], "groups of 3 channels 1 apart do not tile the frame's 4 channels"),
    ("mul", {"repeat": (2, 1)}, {}, [SEQ, (None, 3)], "inputs of different shapes"),
    ("add", {"repeat": (0, 1)}, {}, [SEQ, (None, 2)], "'repeat' must be (size, stride)"),
    ("layernorm", {"size": 3, "epsilon": 1e-5}, {"gamma": rand(4), "beta": rand(4)}, [SEQ],
     "groups of 3 channels 1 apart do not tile the frame's 4 channels"),
    ("layernorm", {"size": 4}, {"gamma": rand(4), "beta": rand(4)}, [SEQ], "attribute 'epsilon' is missing"),
    ("prelu", {"alpha": 0.1}, {"alpha": rand(4)}, [SEQ], "unknown attribute 'alpha'"),
    ("conv2d", {"kernel": (3, 0), "freq": 2}, {"W": rand(2, 2, 3, 1)}, [SEQ],
     "'kernel' must be two integers (time, frequency) in 1..1048576"),
    ("conv2d", {"kernel": (3, 1), "freq": 3}, {"W": rand(2, 1, 3, 1)}, [SEQ], "4 channels are no map of 3 frequencies"),
    ("conv2d", {"kernel": (3, 1), "freq": 2, "order": "tf"}, {"W": rand(2, 2, 3, 1)}, [SEQ],
     "'order' must be one of cf, fc"),
    ("conv2d", {"kernel": (3, 5), "freq": 2}, {"W": rand(2, 2, 3, 5)}, [SEQ], "window spans more than the 2"),
    ("conv2d", {"kernel": (3, 1), "freq": 2}, {"W": rand(2, 3, 3, 1)}, [SEQ], "param 'W' has shape [2, 3, 3, 1]"),
    ("conv1d", {"kernel": 3, "stride": 1.5}, {"W": rand(2, 4, 3)}, [SEQ], "'stride' must be an integer"),
    ("conv1d", {"kernel": 3, "groups": 3}, {"W": rand(2, 4, 3)}, [SEQ], "groups 3 does not divide the input's 4"),
    ("conv1d", {"kernel": 3, "groups": 2}, {"W": rand(3, 2, 3)}, [SEQ], "does not divide the 3 output channels"),
    ("conv1d", {"kernel": 3, "padding": "full"}, {"W": rand(2, 4, 3)}, [SEQ], "'padding' must be one of"),
    ("conv1d", {"kernel": 3, "padding": (1, -1)}, {"W": rand(2, 4, 3)}, [SEQ], "'padding' must be one of"),
    ("conv1d", {"kernel": 3}, {"W": rand(2, 4, 2)}, [SEQ], "expected [?, 4, 3]"),
    ("conv1d", {"kernel": 3}, {"W": rand(2, 4, 3)}, [VEC], "takes a sequence"),
    ("conv1d", {"strides": 2, "kernel": 3}, {"W": rand(2, 4, 3)}, [SEQ], "unknown attribute 'strides'"),
    ("batchnorm", {}, {k: rand(4) for k in ("gamma", "beta", "mean", "var")}, [SEQ], "'epsilon' is missing"),
    ("batchnorm", {"epsilon": 1e-3}, {k: rand(3) for k in ("gamma", "beta", "mean", "var")}, [SEQ], "expected [4]"),
    ("activation", {"kind": "swish"}, {}, [SEQ], "'kind' must be one of relu"),
    ("activation", {"kind": "leaky_relu"}, {}, [SEQ], "'alpha' is missing"),
    ("activation", {"kind": "relu", "alpha": 0.1}, {}, [SEQ], "unknown attribute 'alpha'"),
    ("activation", {"kind": "gelu", "approximate": "erf"}, {}, [SEQ], "'approximate' must be"),
    ("activation", {"kind": "hard_sigmoid", "alpha": "x"}, {}, [SEQ], "'alpha' must be a finite number"),
    ("add", {}, {}, [SEQ], "takes two or more inputs, got 1"),
    ("add", {}, {}, [SEQ, (None, 5)], "inputs of different shapes"),
    ("mul", {}, {}, [SEQ, VEC], "inputs of different shapes"),
    ("concat", {}, {}, [SEQ, VEC], "joins sequences and vectors"),
    ("avg_pool1d", {}, {}, [SEQ], "'pool' is missing"),
    ("max_pool1d", {"pool": 2, "padding": "causal"}, {}, [SEQ], "'padding' must be one of valid, same"),
    ("max_pool1d", {"pool": 2, "padding": (2, 0)}, {}, [SEQ], "smaller than the pool"),
    ("avg_pool1d", {"pool": 2}, {}, [VEC], "takes a sequence"),
    ("global_avg_pool1d", {}, {}, [VEC], "takes a sequence"),
    ("global_max_pool1d", {"pool": 2}, {}, [SEQ], "unknown attribute 'pool'"),
    ("zero_pad1d", {"pad": 2}, {}, [SEQ], "'pad' must be (before, after)"),
    ("zero_pad1d", {"pad": (0, 1 << 40)}, {}, [SEQ], "steps in 0..1048576"),
    ("max_pool1d", {"pool": 1 << 40, "padding": "same"}, {}, [SEQ], "'pool' must be an integer in 1..1048576"),
    ("conv1d", {"kernel": 3, "dilation": True}, {"W": rand(2, 4, 3)}, [SEQ], "'dilation' must be an integer"),
    ("gru", {"layers": 65}, {}, [SEQ], "'layers' must be an integer in 1..64, got 65"),
    ("last_step", {}, {}, [VEC], "takes a sequence (None, C), got shape (4,)"),
    ("gru", {"layers": 0}, {}, [SEQ], "'layers' must be an integer in 1..64"),
    ("gru", {"bidirectional": 1}, {}, [SEQ], "'bidirectional' must be true or false"),
    ("gru", {}, {"l0.fwd.R": rand(9, 3)}, [SEQ], "param 'l0.fwd.W' is missing"),
    ("gru", {}, {"l0.fwd.W": rand(9, 5), "l0.fwd.R": rand(9, 3), "l0.fwd.bx": rand(9), "l0.fwd.br": rand(9)},
     [SEQ], "layer 0 reads 4 channels"),
    ("gru", {}, {"l0.fwd.W": rand(9, 4), "l0.fwd.R": rand(9, 4), "l0.fwd.bx": rand(9), "l0.fwd.br": rand(9)},
     [SEQ], "expected [3H, H]"),
    ("gru", {}, {"l1.fwd.W": rand(9, 4)}, [SEQ], "unknown param 'l1.fwd.W'"),
    ("softmax", {"axis": 1}, {}, [SEQ], "unknown attribute 'axis'"),
    ("l2_normalize", {"epsilon": 0}, {}, [SEQ], "'epsilon' must be a finite positive number"),
]


@pytest.mark.parametrize("op,attrs,params,shapes,what", BAD, ids=[f"{b[0]}-{i}" for i, b in enumerate(BAD)])
def test_refusals_name_the_node(op, attrs, params, shapes, what):
    nd = Node("n1", op, [f"x{i}" for i in range(len(shapes))], ["y"], attrs, params, source="Test")
    with pytest.raises(QtoolError) as e:
        layer(op, nd.label).out_shape(nd, shapes)
    msg = str(e.value)
    assert "\n" not in msg and msg.startswith("node n1 (Test): ") and what in msg, msg


# ---- the registry ------------------------------------------------------------------------------

def test_modules_declare_their_ops():
    for op, module in REGISTRY.items():
        mod = layer(op, "test")
        assert op in getattr(mod, "OPS", (getattr(mod, "OP", None),)), (op, module)


def test_every_op_is_documented():
    table = DOCS.read_text().split("## Ops", 1)[1].split("\n## ", 1)[0]  # this section only
    rows = re.findall(r"^\| ([a-z0-9_, ]+) \|", table, re.M)[1:]  # the first is the header
    assert {name for row in rows for name in row.split(", ")} == set(REGISTRY)


def test_every_op_is_tested():
    """Every registered op is run against a framework by a test above (`covers`)."""
    tested = set().union(*COVERED.values())
    assert set(REGISTRY) <= tested, sorted(set(REGISTRY) - tested)


def test_steps_text_follows_strides_pools_and_pads():
    """The tables' `[T/2, C]`: each sequence edge's steps against the input's T, as the layers
    compute them (a valid conv of 3: T-2; a pool of 2: T/2; a pad of 1 + 2: T+3)."""
    from qtool.core.graph import Graph
    from qtool.layers import check, run, steps_text

    w = np.ones((4, 4, 3), np.float32)
    g = check(Graph([Node("pad", "zero_pad1d", ["x"], ["z"], {"pad": (1, 2)}),
                     Node("conv", "conv1d", ["z"], ["c"], {"kernel": 3}, {"W": w}),
                     Node("pool", "max_pool1d", ["c"], ["p"], {"pool": 2}),
                     Node("conv2", "conv1d", ["p"], ["y"], {"kernel": 3, "stride": 2}, {"W": w})],
                    {"x": (None, 4)}, ["y"]))
    assert steps_text(g) == {"x": "T", "z": "T+3", "c": "T+1", "p": "T/2", "y": "T/4-1"}
    for t in (13, 50):  # held out: what the text says is what runs
        ys = run(g, np.zeros((1, t, 4), np.float32), keep=True)
        assert ys["p"].shape[1] == (t + 1) // 2 and ys["z"].shape[1] == t + 3
