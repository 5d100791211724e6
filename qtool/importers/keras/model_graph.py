"""Whole Keras models (`.keras` archives and legacy `.h5` files, Sequential and functional, nested
models flattened as `outer/inner`) as a `qtool.core.graph.Graph`: every layer one node of the op
table (docs/graph.md), Keras' channels-last layout kept, or the model refused in one line naming
the layer, its class and the supported classes.

What reads what comes from the layer graph of the config (keras/graph.py); each layer's weights
from the group Keras itself assigns to it (keras/config.py: `layers/<class>_<n>/vars` in an
archive, `model_weights/<name>` in a legacy file), sizes checked before anything is read; GRUs
through the GRU importer's own config checks and cell reader (qtool's layout, gates z, r, g).

`check_keras_graph` loads the model with Keras itself (the inference-only copy of keras/copy.py,
safe mode, float32) and compares it with `qtool.layers.run` on random inputs.
"""

from __future__ import annotations

import json
import re
import tempfile
import time
import zipfile
from dataclasses import dataclass
from pathlib import Path

import h5py
import numpy as np

import qtool.layers
from qtool.core.graph import Graph, Node
from qtool.core.model import DIRECTIONS
from qtool.errors import QtoolError
from qtool.importers.checks import MAX_TENSOR_ELEMENTS, framework_run, one_torch_thread, reason
from qtool.importers.keras.check import _import_keras, _load, _oversized, float_activations, keras2_hard_sigmoid
from qtool.importers.keras.config import (
    FLOAT_POLICIES,
    MODELS,
    KerasGru,
    _policy,
    _unique,
    find_grus,
    hard_sigmoid_params,
    keras_major,
    model_layers,
    snake_case,
)
from qtool.importers.keras.graph import NO_OPS, Layer, _model
from qtool.importers.keras.quantizers import activation_grid, is_quantizer, quantize, quantizer_config
from qtool.importers.keras.reader import SPOOL_BYTES, _cells_keras3, _cells_legacy, _dataset, _open
from qtool.importers.ranges import GraphRanges, ImportedRange
from qtool.layers import same_pads

GRUS = ("GRU", "Bidirectional", "RNN")  # RNN: one GRUCell; Bidirectional: of a GRU
LAYOUT = ("Flatten", "Reshape", "Permute")  # only where they leave the layout as it is
QKERAS = ("QDense", "QConv1D", "QActivation")  # QKeras layers (.h5 files name them 'qkeras>QDense')
COMPUTING = ("Dense", "Conv1D", "DepthwiseConv1D", "Conv2D", "DepthwiseConv2D", "BatchNormalization",
             "LayerNormalization", "Activation", "ReLU", "LeakyReLU", "PReLU", "Softmax", "UnitNormalization", "Add",
             "Multiply", "Concatenate", "AveragePooling1D", "MaxPooling1D", "GlobalAveragePooling1D",
             "GlobalMaxPooling1D", "ZeroPadding1D", *GRUS, *QKERAS)
SUPPORTED = tuple(sorted({*COMPUTING, *LAYOUT, *NO_OPS}))
MERGES = {"Add": "add", "Multiply": "mul", "Concatenate": "concat"}
POOLS = {"AveragePooling1D": "avg_pool1d", "MaxPooling1D": "max_pool1d",
         "GlobalAveragePooling1D": "global_avg_pool1d", "GlobalMaxPooling1D": "global_max_pool1d"}
# keras.activations by name -> (op, attrs); "linear" is no node. Keras 3's hard_sigmoid is relu6(x + 3) / 6
# (Keras 2's 0.2x + 0.5: `_activation` takes the file's), its leaky_relu's default slope 0.2, its gelu the
# exact (erf) one
ACTIVATIONS = {"relu": ("activation", {"kind": "relu"}), "relu6": ("activation", {"kind": "relu6"}),
               "leaky_relu": ("activation", {"kind": "leaky_relu", "alpha": 0.2}),
               "sigmoid": ("activation", {"kind": "sigmoid"}), "tanh": ("activation", {"kind": "tanh"}),
               "hard_sigmoid": ("activation", {"kind": "hard_sigmoid", "alpha": 1 / 6, "beta": 0.5}),
               "softplus": ("activation", {"kind": "softplus"}), "gelu": ("activation", {"kind": "gelu"}),
               "softmax": ("softmax", {}), "linear": None}
WEIGHT_ALIASES = {"depthwise_kernel": "kernel"}  # Keras 2's name for DepthwiseConv1D's kernel
SEQUENCES, STEPS = 3, 8
TOLERANCE = 1e-4  # float32 arithmetic of two libraries; scaled by the outputs' size above 1
# keras/src/backend/torch/nn.py pads an uneven "same" pooling window by repeating the edge step, which
# an average then counts; TensorFlow (Keras' reference) and qtool's avg_pool1d leave padded steps out
UNEVEN_AVG_POOL = ("Keras' PyTorch backend averages repeated edge steps where AveragePooling1D(padding='same') "
                   "pads unevenly; TensorFlow and qtool leave them out")


@dataclass
class _Entry:
    """One layer of the (flattened) model: its config, weights group and place in the layer graph."""

    name: str  # "outer/inner" inside nested models
    cls: str
    cfg: dict
    group: str  # its weights group in a .keras archive
    nested: bool

    @property
    def label(self) -> str:
        return f"'{self.name}' ({self.cls})"


class _Reader:
    """The state of one import: the open weights file, the edges and shapes so far, the nodes."""

    def __init__(self, where: str, f: h5py.File, legacy: bool, grus: dict[str, KerasGru], major: int | None):
        self.where, self.f, self.legacy, self.grus = where, f, legacy, grus
        self.major = major  # of the Keras that wrote the file (keras/config.py: keras_major)
        self.edge: dict[str, str] = {}  # layer -> the edge holding its output
        self.shapes: dict[str, tuple] = {}
        self.nodes: list[Node] = []
        self.ranges = GraphRanges("QKeras")  # QKeras quantizers on the data, by qtool edge
        self.maps: dict[str, int] = {}  # a feature map's edge -> its frequencies (frames [F, C] flattened)
        self.map_layers: dict[str, int] = {}  # the layers (and inputs) whose output is a map -> its frequencies
        self.on_map: int | None = None  # the frequencies of the map the layer being read reads

    def fail(self, e: _Entry, why: str) -> QtoolError:
        return QtoolError(f"{self.where}: layer {e.label} {why}")

    def add(self, e: _Entry, op: str, inputs: list[str], attrs: dict | None = None, params: dict | None = None,
            activation=None) -> None:
        """Node `op` for layer `e` writing the edge named after it; a separate activation node
        (`<layer>/activation`) after it for a layer's fused activation other than linear. A QKeras
        quantizer as the activation is its float function there, its grid that edge's range."""
        q = activation_grid(f"{self.where}: layer {e.label}", "activation", activation) \
            if is_quantizer(activation) else None
        act = _activation(self, e, q.kind if q else activation)
        out = f"{e.name}/preactivation" if act else e.name
        self._node(Node(e.name, op, inputs, [out], attrs or {}, params or {}, e.cls))
        if act:
            self._node(Node(f"{e.name}/activation", act[0], [out], [e.name], dict(act[1]), {}, e.cls))
        self.edge[e.name] = e.name
        if q:
            self.quantized(e.name, q, f"{e.cls} '{e.name}' activation ({q.label})")

    def quantized(self, edge: str, q, source: str) -> None:
        """The grid of a QKeras quantizer on the data (`quantizers.ActivationGrid`) as `edge`'s range."""
        self.ranges.add(edge, ImportedRange(q.qmin * q.step, q.qmax * q.step, source, q.step, q.bits))

    def _node(self, node: Node) -> None:
        """Appended once its op accepts it (attrs, params, the shapes of its inputs)."""
        checked = qtool.layers.check(Graph([node], {i: self.shapes[i] for i in node.inputs}, node.outputs), self.where)
        self.shapes.update((k, checked.shapes[k]) for k in node.outputs)
        self.nodes.append(node)

    def weights(self, e: _Entry, roles: list[str]) -> dict[str, np.ndarray]:
        """The layer's weights by role (kernel, bias, gamma, ...), in the order Keras creates them."""
        if self.legacy:
            return self._legacy_weights(e, roles)
        vars_ = self.f.get(f"{e.group}/vars")
        if not isinstance(vars_, h5py.Group):
            raise self.fail(e, f"has no weights in the file ('{e.group}/vars')")
        stored = vars_.attrs.get("name")
        if stored is not None and stored != e.name.rsplit("/", 1)[-1]:
            raise QtoolError(f"{self.where}: weights group '{e.group}' belongs to layer '{stored}', not to "
                             f"'{e.name}'; the file's config and weights disagree")
        keys = sorted(vars_.keys(), key=lambda k: int(k) if k.isdigit() else -1)
        if keys != [str(i) for i in range(len(roles))]:
            raise self.fail(e, f"stores {len(keys)} weight tensors, its config needs {len(roles)} "
                            f"({', '.join(roles)})")
        return {r: _dataset(self.where, self.f, f"{e.group}/vars/{k}") for r, k in zip(roles, keys)}

    def _legacy_weights(self, e: _Entry, roles: list[str]) -> dict[str, np.ndarray]:
        if e.nested:
            raise self.fail(e, "is inside a nested model, which legacy .h5 files do not store per layer; "
                            "save the model as .keras")
        group = self.f["model_weights"].get(e.name) if "model_weights" in self.f else None
        if not isinstance(group, h5py.Group):
            raise self.fail(e, "has no weights in the file")
        names = [n.decode() if isinstance(n, bytes) else str(n) for n in group.attrs.get("weight_names", [])]
        by_role = {}
        for n in names:
            role = n.rsplit("/", 1)[-1].split(":")[0]
            by_role[WEIGHT_ALIASES.get(role, role)] = n
        if sorted(by_role) != sorted(roles) or len(names) != len(roles):
            raise self.fail(e, f"stores weights {', '.join(names) or '(none)'}; its config needs "
                            f"{', '.join(roles)}")
        return {r: _dataset(self.where, group, by_role[r]) for r in roles}


def _ints(r: _Reader, e: _Entry, key: str, default=None, n: int = 1) -> tuple[int, ...]:
    """A config value given as an int or a list of `n` ints (`kernel_size: [3]`), as a tuple."""
    v = e.cfg.get(key, default)
    v = [v] * n if isinstance(v, int) else v
    if (not isinstance(v, (list, tuple)) or len(v) != n
            or not all(isinstance(i, int) and not isinstance(i, bool) and 0 <= i <= MAX_TENSOR_ELEMENTS for i in v)):
        raise r.fail(e, f"has {key}={e.cfg.get(key)!r}; expected {n} non-negative integer(s)")
    return tuple(v)


def _channels_last(r: _Reader, e: _Entry) -> None:
    if e.cfg.get("data_format") not in (None, "channels_last"):
        raise r.fail(e, f"has data_format={e.cfg.get('data_format')!r}; only 'channels_last' (Keras' default, "
                     "[N, T, C]) is supported")


def _last_axis(r: _Reader, e: _Entry, key: str, shape: tuple) -> None:
    """`axis` (an int or a list of one) must name the channel axis: -1, or 2 of [N, T, C], 1 of [N, C]."""
    v = e.cfg.get(key, -1)
    v = v[0] if isinstance(v, list) and len(v) == 1 else v
    if v not in (-1, len(shape)):
        raise r.fail(e, f"has {key}={e.cfg.get(key)!r}; only the channel axis (-1) is supported")


def _activation(r: _Reader, e: _Entry, value) -> tuple[str, dict] | None:
    """(op, attrs) of a Keras activation given by name; None for linear; refused otherwise."""
    if isinstance(value, dict) and value.get("class_name") == "function" and isinstance(value.get("config"), str):
        value = value["config"]  # a serialized keras.activations function
    if value == "hard_sigmoid":  # what it meant in the Keras that wrote the file
        alpha, beta = hard_sigmoid_params(r.major, f"{r.where}: layer {e.label}")
        return "activation", {"kind": "hard_sigmoid", "alpha": alpha, "beta": beta}
    if value is None or value in ACTIVATIONS:
        return ACTIVATIONS.get(value)
    what = value.get("class_name", value) if isinstance(value, dict) else value
    raise r.fail(e, f"has activation {what!r}; supported: {', '.join(ACTIVATIONS)}")


def _policy_ok(r: _Reader, e: _Entry) -> None:
    if _policy(e.cfg) not in (None, *FLOAT_POLICIES):
        raise r.fail(e, f"has dtype policy {_policy(e.cfg)!r}; only float policies are supported")


def _dense(r: _Reader, e: _Entry, src: list[str]) -> None:
    use_bias = bool(e.cfg.get("use_bias", True))
    w = _quantized_weights(r, e, r.weights(e, ["kernel", "bias"][:1 + use_bias]))
    if w["kernel"].ndim != 2 or w["kernel"].shape[1] != e.cfg.get("units"):
        raise r.fail(e, f"has a kernel of shape {w['kernel'].shape}, expected [C_in, {e.cfg.get('units')}]")
    params = {"W": np.ascontiguousarray(w["kernel"].T)} | ({"b": w["bias"]} if use_bias else {})
    r.add(e, "dense", src, {}, params, e.cfg.get("activation"))


def _conv(r: _Reader, e: _Entry, src: list[str]) -> None:
    _channels_last(r, e)
    (k,), (s,), (d,) = _ints(r, e, "kernel_size"), _ints(r, e, "strides", 1), _ints(r, e, "dilation_rate", 1)
    padding = e.cfg.get("padding", "valid")
    if padding not in ("valid", "same", "causal"):
        raise r.fail(e, f"has padding={padding!r}; supported: 'valid', 'same', 'causal'")
    if padding == "causal" and e.cls == "QConv1D":  # QConv1D hands it to keras.ops.conv, which does not pad
        raise r.fail(e, "has padding='causal', which QKeras' QConv1D does not compute as Keras' Conv1D does; "
                     "supported there: 'valid', 'same'")
    use_bias = bool(e.cfg.get("use_bias", True))
    w = _quantized_weights(r, e, r.weights(e, ["kernel", "bias"][:1 + use_bias]))
    kernel, c_in = w["kernel"], r.shapes[src[0]][-1]
    if e.cls in ("Conv1D", "QConv1D"):
        (groups,) = _ints(r, e, "groups", 1)
        if kernel.ndim != 3 or kernel.shape[0] != k or kernel.shape[2] != e.cfg.get("filters"):
            raise r.fail(e, f"has a kernel of shape {kernel.shape}, expected [{k}, C_in / groups, "
                         f"{e.cfg.get('filters')}]")
        W = kernel.transpose(2, 1, 0)  # [C_out, C_in / groups, kernel]
    else:  # DepthwiseConv1D: kernel [k, C_in, multiplier], output channel c * multiplier + m
        (mult,) = _ints(r, e, "depth_multiplier", 1)
        if kernel.shape != (k, c_in, mult):
            raise r.fail(e, f"has a kernel of shape {kernel.shape}, expected [{k}, {c_in}, {mult}]")
        groups, W = c_in, kernel.transpose(1, 2, 0).reshape(c_in * mult, 1, k)
    attrs = {"kernel": k, "stride": s, "dilation": d, "groups": groups, "padding": padding}
    params = {"W": np.ascontiguousarray(W)} | ({"b": w["bias"]} if use_bias else {})
    r.add(e, "conv1d", src, attrs, params, e.cfg.get("activation"))


def _conv2d(r: _Reader, e: _Entry, src: list[str]) -> None:
    """Conv2D and DepthwiseConv2D over a map [N, T, F, C] (time, frequency): conv2d on "fc" frames."""
    if src[0] not in r.maps:
        raise r.fail(e, "reads no feature map; qtool reads Conv2D over a map [N, T, F, C] (a 4-D input)")
    if e.cfg.get("data_format", "channels_last") not in ("channels_last", None):
        raise r.fail(e, f"has data_format={e.cfg.get('data_format')!r}; qtool reads channels_last maps")
    freq = r.maps[src[0]]
    c_in = r.shapes[src[0]][-1] // freq
    kernel, stride = _ints(r, e, "kernel_size", None, 2), _ints(r, e, "strides", 1, 2)
    dilation = _ints(r, e, "dilation_rate", 1, 2)
    padding = e.cfg.get("padding", "valid")
    if padding not in ("valid", "same"):
        raise r.fail(e, f"has padding={padding!r}; supported: 'valid', 'same'")
    use_bias = bool(e.cfg.get("use_bias", True))
    w = r.weights(e, ["kernel", "bias"][:1 + use_bias])
    k = w["kernel"]
    if e.cls == "Conv2D":
        (groups,) = _ints(r, e, "groups", 1)
        if k.ndim != 4 or tuple(k.shape[:2]) != tuple(kernel) or k.shape[2] * groups != c_in:
            raise r.fail(e, f"has a kernel of shape {k.shape} for {c_in} channels")
        W = k.transpose(3, 2, 0, 1)  # [C_out, C_in / groups, kt, kf]
    else:  # DepthwiseConv2D: [kt, kf, C_in, multiplier], output channel c * multiplier + m
        (mult,) = _ints(r, e, "depth_multiplier", 1)
        if k.shape != (*kernel, c_in, mult):
            raise r.fail(e, f"has a kernel of shape {k.shape}, expected [{kernel[0]}, {kernel[1]}, {c_in}, {mult}]")
        groups, W = c_in, k.transpose(2, 3, 0, 1).reshape(c_in * mult, 1, *kernel)
    freq_pads = same_pads(freq, kernel[1], stride[1], dilation[1]) if padding == "same" else (0, 0)
    attrs = {"kernel": tuple(kernel), "stride": tuple(stride), "dilation": tuple(dilation), "groups": groups,
             "padding": padding, "freq": freq, "freq_pads": freq_pads, "order": "fc"}
    params = {"W": np.ascontiguousarray(W)} | ({"b": w["bias"]} if use_bias else {})
    r.add(e, "conv2d", src, attrs, params, e.cfg.get("activation"))
    span = (kernel[1] - 1) * dilation[1] + 1
    r.maps[r.edge[e.name]] = (freq + sum(freq_pads) - span) // stride[1] + 1


def _per_channel(r: _Reader, v, width: int) -> np.ndarray:
    """Values per channel (or per frequency and channel) as one per edge channel: repeated at
    each frequency of a map ("fc" frames) where they are one per channel of it; otherwise as
    they are (the op's own check says what does not fit)."""
    v = np.asarray(v, np.float32)
    if r.on_map and v.size != width and v.size == v.shape[-1] and v.size * r.on_map == width:
        return np.tile(v.reshape(-1), r.on_map)
    return v.reshape(-1)


def _quantized_weights(r: _Reader, e: _Entry, w: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    """A QDense's or QConv1D's kernel and bias as its forward uses them: through its
    kernel_quantizer and bias_quantizer (quantized_bits, qtool's port of QKeras' own arithmetic),
    so a fake-quant on a constant folds into it; other layers' weights as stored."""
    if e.cls not in QKERAS:
        return w
    out = dict(w)
    for key in ("kernel", "bias"):
        c = quantizer_config(e.name, f"{key}_quantizer", e.cfg.get(f"{key}_quantizer"), f"{r.where}: layer {e.label}")
        if c is not None and key in w:
            out[key] = quantize(c, w[key])
    return out


def _qactivation(r: _Reader, e: _Entry, src: list[str]) -> None:
    """QActivation(quantizer): the quantizer's float function (the identity for quantized_bits,
    a relu for quantized_relu and for quantized_bits(keep_negative=False)); its grid the range of
    the edge it writes."""
    value = e.cfg.get("activation")
    q = activation_grid(f"{r.where}: layer {e.label}", "activation", value if isinstance(value, dict) else str(value))
    if q.kind == "linear":
        r.edge[e.name] = src[0]
    else:
        r.add(e, "activation", src, {"kind": q.kind})
    r.quantized(r.edge[e.name], q, f"{e.cls} '{e.name}' ({q.label})")


def _batchnorm(r: _Reader, e: _Entry, src: list[str]) -> None:
    _last_axis(r, e, "axis", (None, None, None) if r.on_map else r.shapes[src[0]])
    if e.cfg.get("renorm"):
        raise r.fail(e, "has renorm=True; only plain batch normalization is supported")
    scale, center = bool(e.cfg.get("scale", True)), bool(e.cfg.get("center", True))
    roles = ["gamma"] * scale + ["beta"] * center + ["moving_mean", "moving_variance"]
    w = r.weights(e, roles)
    c = w["moving_mean"].shape
    params = {"gamma": w.get("gamma", np.ones(c, np.float32)), "beta": w.get("beta", np.zeros(c, np.float32)),
              "mean": w["moving_mean"], "var": w["moving_variance"]}
    eps = e.cfg.get("epsilon", 1e-3)
    if not isinstance(eps, (int, float)) or not eps > 0:
        raise r.fail(e, f"has epsilon={eps!r}")
    width = r.shapes[src[0]][-1]
    r.add(e, "batchnorm", src, {"epsilon": float(eps)}, {k: _per_channel(r, v, width) for k, v in params.items()})


def _layernorm(r: _Reader, e: _Entry, src: list[str]) -> None:
    """Over the channels (axis -1), with its gamma and beta where it has them."""
    axis, c = e.cfg.get("axis", -1), r.shapes[src[0]][-1]
    axes = axis if isinstance(axis, list) else [axis]
    rank = len(r.shapes[src[0]]) + 1 + bool(r.on_map)
    if r.on_map and sorted(a % rank for a in axes) == [2, 3] and not e.cfg.get("rms_scaling"):
        axes = [rank - 1]  # a map's frequencies and channels: the whole frame
    elif r.on_map:
        c //= r.on_map  # each frequency's channels, "fc" frames: groups of C, one after another
    if [a % rank for a in axes] != [rank - 1] or e.cfg.get("rms_scaling"):
        raise r.fail(e, f"normalizes axis {axis}{' by RMS' if e.cfg.get('rms_scaling') else ''}; qtool's "
                     "layernorm normalizes the channels (axis -1)")
    scale, center = e.cfg.get("scale", True), e.cfg.get("center", True)
    w = r.weights(e, ["gamma"] * scale + ["beta"] * center)
    eps = e.cfg.get("epsilon", 1e-3)
    if not isinstance(eps, (int, float)) or not eps > 0:
        raise r.fail(e, f"has epsilon={eps!r}")
    width = r.shapes[src[0]][-1]
    params = {k: _per_channel(r, w.get(k, np.full(c, v, np.float32)), width)
              for k, v in (("gamma", 1.0), ("beta", 0.0))}
    r.add(e, "layernorm", src, {"size": c, "epsilon": float(eps)}, params)


def _prelu(r: _Reader, e: _Entry, src: list[str]) -> None:
    """A slope per channel, shared over time (`shared_axes=[1]`); one per step is refused."""
    alpha = np.asarray(r.weights(e, ["alpha"])["alpha"], np.float32)
    per = _per_channel(r, alpha, r.shapes[src[0]][-1])
    if alpha.ndim < 1 or alpha.shape[0] != 1 or per.size != r.shapes[src[0]][-1]:
        raise r.fail(e, f"has slopes of shape {list(alpha.shape)}; qtool reads one slope per channel (PReLU with "
                     "shared_axes=[1] on a sequence)")
    r.add(e, "prelu", src, {}, {"alpha": per})


def _relu(r: _Reader, e: _Entry, src: list[str]) -> None:
    if e.cls == "LeakyReLU":  # Keras 3: negative_slope (default 0.3); Keras 2: alpha
        slope = e.cfg.get("negative_slope", e.cfg.get("alpha", 0.3))
        r.add(e, "activation", src, {"kind": "leaky_relu", "alpha": float(slope)})
        return
    top, slope, threshold = e.cfg.get("max_value"), e.cfg.get("negative_slope") or 0, e.cfg.get("threshold") or 0
    if threshold == 0 and slope == 0 and top in (None, 6):
        r.add(e, "activation", src, {"kind": "relu" if top is None else "relu6"})
    elif threshold == 0 and top is None and isinstance(slope, (int, float)):
        r.add(e, "activation", src, {"kind": "leaky_relu", "alpha": float(slope)})
    else:
        raise r.fail(e, f"has max_value={top!r}, negative_slope={slope!r}, threshold={threshold!r}; supported: "
                     "ReLU(), ReLU(max_value=6) (relu6) and ReLU(negative_slope=a) (leaky_relu)")


def _pool(r: _Reader, e: _Entry, src: list[str]) -> None:
    _channels_last(r, e)
    if e.cls.startswith("Global"):
        if e.cfg.get("keepdims"):
            raise r.fail(e, "has keepdims=True; only keepdims=False ([N, C]) is supported")
        r.add(e, POOLS[e.cls], src)
        return
    (pool,) = _ints(r, e, "pool_size", 2)
    (stride,) = _ints(r, e, "strides", pool) if e.cfg.get("strides") is not None else (pool,)
    padding = e.cfg.get("padding", "valid")
    if padding not in ("valid", "same"):
        raise r.fail(e, f"has padding={padding!r}; supported: 'valid', 'same'")
    r.add(e, POOLS[e.cls], src, {"pool": pool, "stride": stride, "padding": padding})


def _zero_pad(r: _Reader, e: _Entry, src: list[str]) -> None:
    _channels_last(r, e)
    before, after = _ints(r, e, "padding", 1, n=2)
    r.add(e, "zero_pad1d", src, {"pad": (before, after)})


def _merge(r: _Reader, e: _Entry, src: list[str]) -> None:
    if len(src) < 2:
        raise r.fail(e, f"merges {len(src)} input(s); it needs two or more")
    if e.cls == "Concatenate":
        _last_axis(r, e, "axis", r.shapes[src[0]])
    r.add(e, MERGES[e.cls], src)


def _act_layer(r: _Reader, e: _Entry, src: list[str]) -> None:
    if e.cls == "Activation" and is_quantizer(e.cfg.get("activation")):  # Activation(quantized_relu(...))
        _qactivation(r, e, src)
        return
    if e.cls == "Activation":
        act = _activation(r, e, e.cfg.get("activation"))
        if act is None:  # linear: the identity
            r.edge[e.name] = src[0]
        else:
            r.add(e, act[0], src, dict(act[1]))
        return
    _last_axis(r, e, "axis", r.shapes[src[0]])
    if e.cls == "Softmax":
        r.add(e, "softmax", src)
    else:  # Keras 3's UnitNormalization: x * min(rsqrt(sum(x^2)), 1e12)
        r.add(e, "l2_normalize", src, {"epsilon": 1e-12})


def _gru(r: _Reader, e: _Entry, src: list[str]) -> None:
    g = r.grus.get(e.name)
    if g is None:  # a Bidirectional or RNN of something else
        inner = e.cfg.get("layer") if e.cls == "Bidirectional" else e.cfg.get("cell")
        what = inner.get("class_name") if isinstance(inner, dict) else inner
        raise r.fail(e, f"wraps {what!r}; only a GRU (GRUCell) is supported there")
    inner = ((e.cfg.get("layer") or {}).get("config") or {}) if e.cls == "Bidirectional" else e.cfg
    for key in ("return_state", "time_major"):
        if inner.get(key) or e.cfg.get(key):
            raise r.fail(e, f"has {key}=True; qtool's GRU returns its output only, batch first")
    cells = (_cells_legacy if r.legacy else _cells_keras3)(r.where, r.f, g)
    if any(c.form != cells[0].form for c in cells):
        raise r.fail(e, f"computes different cells in its directions ({cells[0].form.describe()}; "
                     f"{cells[1].form.describe()}); a gru node has one cell form")
    params = {f"l0.{DIRECTIONS[d]}.{k}": getattr(c, k) for d, c in enumerate(cells) for k in ("W", "R", "bx", "br")}
    attrs = {"return_sequences": bool(inner.get("return_sequences", False)), "bidirectional": len(cells) == 2,
             "layers": 1, **cells[0].form.attrs()}
    r.add(e, "gru", src, attrs, params)


def _layout(r: _Reader, e: _Entry, src: list[str]) -> None:
    """Flatten, Reshape, Permute: the identity where they leave [N, T, C] or [N, C] as it is."""
    shape = r.shapes[src[0]]
    seq = len(shape) == 2
    if r.on_map:  # [N, T, F, C] -> [N, T, F * C]: the frames as they are ("fc")
        target = list(e.cfg.get("target_shape") or [])
        if e.cls != "Reshape" or len(target) != 2 or target[-1] != shape[-1]:
            raise r.fail(e, f"changes the layout of a feature map [N, T, {r.on_map}, {shape[-1] // r.on_map}]; qtool "
                         f"reads a Reshape of it into [N, T, {shape[-1]}]")
        r.edge[e.name] = src[0]
        return
    if e.cls == "Flatten":
        same = not seq
    elif e.cls == "Permute":
        same = list(e.cfg.get("dims") or []) == ([1, 2] if seq else [1])
    else:
        # [T, C] -> [a, C] keeps every value where it was (Keras runs it only where a is T or -1)
        target = list(e.cfg.get("target_shape") or [])
        same = len(target) == 2 and target[-1] == shape[-1] if seq else target in ([shape[-1]], [-1])
    if not same:
        what = f"[N, T, {shape[-1]}]" if seq else f"[N, {shape[-1]}]"
        raise r.fail(e, f"changes the layout of its input {what}; Reshape, Permute and Flatten are supported only "
                     "where they leave the channels-last layout as it is")
    r.edge[e.name] = src[0]


# the layers that read a feature map [N, T, F, C] (the others are refused on one), those that make one
ON_MAPS = ("Conv2D", "DepthwiseConv2D", "BatchNormalization", "LayerNormalization", "Activation", "ReLU", "LeakyReLU",
           "PReLU", "Add", "Multiply", "Reshape", "QActivation")
MAP_MAKERS = ("Conv2D", "DepthwiseConv2D", "Reshape")
BUILDERS = {"Dense": _dense, "Conv1D": _conv, "DepthwiseConv1D": _conv, "Conv2D": _conv2d, "DepthwiseConv2D": _conv2d,
            "BatchNormalization": _batchnorm,
            "LayerNormalization": _layernorm,
            "QDense": _dense, "QConv1D": _conv, "QActivation": _qactivation,
            "ReLU": _relu, "LeakyReLU": _relu, "PReLU": _prelu, "Activation": _act_layer, "Softmax": _act_layer,
            "UnitNormalization": _act_layer, "ZeroPadding1D": _zero_pad,
            **dict.fromkeys(MERGES, _merge), **dict.fromkeys(POOLS, _pool), **dict.fromkeys(GRUS, _gru),
            **dict.fromkeys(LAYOUT, _layout)}


def _entries(model: dict, path: str, prefix: str, where: str, out: dict[str, _Entry]) -> None:
    """Every layer of the model (nested models' layers as 'outer/inner') with its weights group,
    named as keras/config.py names them."""
    _, layers = model_layers(model, where)
    used: dict[str, int] = {}
    for layer in layers:
        if not isinstance(layer, dict):
            continue
        cls, cfg = _class(str(layer.get("class_name"))), layer.get("config")
        cfg = cfg if isinstance(cfg, dict) else {}
        name = str(cfg.get("name", layer.get("name")))
        group = f"{path}layers/{_unique(snake_case(cls), used)}"
        if cls in MODELS:
            _entries(layer, group + "/", f"{prefix}{name}/", where, out)
        else:
            out[prefix + name] = _Entry(prefix + name, cls, cfg, group, bool(prefix))


def _class(name: str) -> str:
    """A layer's class as the builders know it: QKeras' layers without the 'qkeras>' of .h5 configs."""
    return name.removeprefix("qkeras>") if name.removeprefix("qkeras>") in QKERAS else name


def _order(where: str, layers: dict[str, Layer], starts: list[str]) -> list[str]:
    """The layers in an order where each is computed after those it reads (config order first)."""
    done, order, todo = set(starts), [], [n for n in layers if n not in starts]
    while todo:
        ready = [n for n in todo if all(s in done for s in (layers[n].calls or [[]])[0])]
        if not ready:
            raise QtoolError(f"{where}: layer '{todo[0]}' reads '{layers[todo[0]].calls[0][0]}', which the model "
                             "never computes")
        order += ready
        done.update(ready)
        todo = [n for n in todo if n not in done]
    return order


def input_shapes(config: dict, where: str) -> dict[str, tuple[tuple, int | None]]:
    """The model's inputs (their edge names, in the model's order): (qtool shape, fixed T or None)."""
    layers: dict[str, Layer] = {}
    ins, _ = _model(config, "", layers)
    cfg = config.get("config") if isinstance(config.get("config"), dict) else {}
    found = {}
    for name in ins:
        if name == "<input>":  # a Sequential: its InputLayer, or what its first layer was built for
            _, seq = model_layers(config, where)
            first = next((l for l in seq if isinstance(l, dict)), {})
            fcfg = first.get("config") or {}
            shape = (fcfg.get("batch_shape") or fcfg.get("batch_input_shape") or cfg.get("build_input_shape")
                     or (first.get("build_config") or {}).get("input_shape"))
            name = fcfg.get("name", "input") if first.get("class_name") == "InputLayer" else "input"
        else:
            icfg = next(((l.get("config") or {}) for l in model_layers(config, where)[1]
                         if isinstance(l, dict) and (l.get("config") or {}).get("name") == name), {})
            shape = icfg.get("batch_shape") or icfg.get("batch_input_shape")
        sizes = (shape[2:] if len(shape) == 4 else shape[-1:]) if isinstance(shape, list) else []
        ok = isinstance(shape, list) and len(shape) in (2, 3, 4) and all(isinstance(d, int) and d > 0
                                                                         for d in sizes)
        if not ok or len(shape) >= 3 and shape[1] is not None and not (isinstance(shape[1], int) and shape[1] > 0):
            raise QtoolError(f"{where}: input '{name}' has shape {shape}; qtool reads sequences [N, T, C], feature "
                             "maps [N, T, F, C] and vectors [N, C] with a known C (and F)")
        if len(shape) == 4:  # a map: its frames [F, C] flattened ("fc", qtool.layers.conv.conv2d)
            found[str(name)] = ((None, shape[2] * shape[3]), shape[1], tuple(shape[2:]))
        else:
            found[str(name)] = ((None, shape[-1]), shape[1], ()) if len(shape) == 3 else ((shape[-1],), None, ())
    return found


def _graph(path: Path, config: dict, f: h5py.File, legacy: bool) -> Graph:
    where = str(path)
    major = keras_major(path)
    grus = {g.name: g for g in find_grus(config, where, major)}  # the GRU importer's checks (settings, masks, states)
    entries: dict[str, _Entry] = {}
    _entries(config, "", "", where, entries)
    layers: dict[str, Layer] = {}
    ins, outs = _model(config, "", layers)
    r = _Reader(where, f, legacy, grus, major)
    inputs, steps = {}, None
    for start, (edge, (shape, fixed, frame)) in zip(ins, input_shapes(config, where).items()):
        r.edge[start] = edge
        r.shapes[edge] = shape
        inputs[edge] = shape
        steps = steps or fixed
        if frame:
            r.maps[edge] = r.map_layers[start] = frame[0]
    for name in _order(where, layers, ins):
        layer = layers[name]
        cls = _class(layer.cls)
        e = entries.get(name) or _Entry(name, cls, {}, "", "/" in name)
        if len(layer.calls) != 1:
            raise r.fail(e, f"is called {len(layer.calls)} times; shared layers are not supported"
                         if layer.calls else "is never called")
        src = [r.edge[s] for s in layer.calls[0]]
        if cls in NO_OPS:
            if len(src) != 1:
                raise r.fail(e, f"reads {len(src)} inputs")
            r.edge[name] = src[0]
            continue
        if cls == "Masking":
            raise r.fail(e, "masks time steps, which changes what the layers after it compute; qtool runs every "
                         "step (remove the mask to import)")
        build = BUILDERS.get(cls)
        if build is None:
            raise r.fail(e, f"is not supported (qtool reads {len(SUPPORTED)} Keras layer classes: docs/graph.md, "
                         "\"Keras\", lists them)")
        _policy_ok(r, e)
        if cls not in MERGES and len(src) != 1:
            raise r.fail(e, f"is called with {len(src)} inputs (a state or a mask); only its input is supported")
        maps = {r.map_layers[s] for s in layer.calls[0] if s in r.map_layers}
        if maps and cls not in ON_MAPS:
            raise r.fail(e, f"reads a feature map [N, T, {next(iter(maps))}, C]; qtool reads Conv2D, "
                         "DepthwiseConv2D, BatchNormalization, LayerNormalization, activations, Add and Multiply on a "
                         "map, and a Reshape of it into [N, T, F * C]")
        r.on_map = next(iter(maps)) if maps else None
        build(r, e, src)
        out = r.edge.get(name)
        if maps and cls not in MAP_MAKERS and r.shapes.get(out, (None,))[-1] == r.shapes[src[0]][-1]:
            r.maps[out] = r.map_layers[name] = next(iter(maps))  # a layer channel by channel keeps the map
        elif cls in ("Conv2D", "DepthwiseConv2D"):
            r.map_layers[name] = r.maps[out]
    name = str(((config.get("config") or {}) if isinstance(config.get("config"), dict) else {}).get("name", "model"))
    if re.fullmatch(r"(functional|sequential|model)(_\d+)?", name):  # Keras' own name for every model: the file's
        name = path.stem
    graph = Graph(r.nodes, inputs, [r.edge[o] for o in outs], name, "Keras", steps=steps)
    graph.ranges = r.ranges if r.ranges.edges else None  # QKeras' quantizers on the data
    return qtool.layers.check(graph, where)


def read_keras_graph(path: str | Path) -> Graph:
    """The whole Keras model at `path` (.keras or legacy .h5) as a graph, every layer one node."""
    path = Path(path)
    with tempfile.SpooledTemporaryFile(SPOOL_BYTES) as tmp:
        try:
            config, f, legacy = _open(path, tmp)
            with f:
                if not isinstance(config, dict):
                    raise QtoolError(f"{path}: no model config (a weights-only file); save the whole model "
                                     "(model.save('m.keras'))")
                return _graph(path, config, f, legacy)
        except QtoolError:
            raise
        except (OSError, RuntimeError, KeyError, ValueError, TypeError, AttributeError, IndexError,
                UnicodeError, RecursionError, zipfile.BadZipFile) as e:  # h5py, zipfile, json, a malformed config
            raise QtoolError(f"{path}: not a readable Keras file ({reason(e)})") from None


def _float32(config):
    """The config with every float dtype policy float32: the check compares float32 arithmetic."""
    if isinstance(config, dict):
        return {k: "float32" if k == "dtype" and _policy(config) in FLOAT_POLICIES else _float32(v)
                for k, v in config.items()}
    if isinstance(config, list):
        return [_float32(v) for v in config]
    return config


def _uneven_avg_pools(graph: Graph, x: dict[str, np.ndarray]) -> list[str]:
    """The average poolings with "same" padding that pad unevenly on the inputs `x` (a window
    then holds padded steps on one side only)."""
    pools = [n for n in graph.nodes if n.op == "avg_pool1d" and n.attrs.get("padding") == "same"
             and n.attrs.get("pool", 1) > 2]
    if not pools:
        return []
    values = qtool.layers.run(graph, {k: v[:1] for k, v in x.items()}, keep=True)
    return [n.name for n in pools if (lambda left, right: left != right)(
        *same_pads(values[n.inputs[0]].shape[1], n.attrs["pool"], n.attrs.get("stride", n.attrs["pool"])))]


def _steps(graph: Graph, specs: dict) -> int:
    """STEPS, or the first count of steps from there on where no average pooling pads unevenly."""
    for t in range(STEPS, 4 * STEPS):
        zeros = {k: np.zeros((1, fixed or t, *shape[1:]) if len(shape) == 2 else (1, *shape), np.float32)
                 for k, (shape, fixed, _) in specs.items()}
        if not _uneven_avg_pools(graph, zeros):
            return t
    return STEPS


def check_keras_graph(path: str | Path, graph: Graph) -> dict:
    """Run the model with Keras itself (its own loader on the inference-only copy of the file, safe
    mode, float32) and `qtool.layers.run(graph)` on the same random inputs; refuse the graph when
    they differ by more than TOLERANCE (times the outputs' largest magnitude, when above 1).
    Returns what was checked (the keys of `qtool.importers.crosscheck.describe`); where Keras
    cannot be imported, says so instead."""
    path = Path(path)
    with tempfile.SpooledTemporaryFile(SPOOL_BYTES) as tmp:
        try:
            config, f, _ = _open(path, tmp)
            f.close()
            specs = input_shapes(config, str(path))
        except QtoolError:
            raise
        except (OSError, RuntimeError, KeyError, ValueError, TypeError, AttributeError, zipfile.BadZipFile) as e:
            raise QtoolError(f"{path}: not a readable Keras file ({reason(e)})") from None
    for k, (shape, fixed, _) in specs.items():  # before anything is allocated
        if SEQUENCES * (fixed or 4 * STEPS) * shape[-1] > MAX_TENSOR_ELEMENTS:
            raise QtoolError(f"{path}: input '{k}' of {fixed} steps x {shape[-1]} channels is too large to check "
                             f"({SEQUENCES} sequences would hold more than {MAX_TENSOR_ELEMENTS:,} values)")
    rng, t = np.random.default_rng(0), _steps(graph, specs)
    x = {k: rng.standard_normal((SEQUENCES, fixed or t, *(frame or shape[1:])) if len(shape) == 2
                                else (SEQUENCES, *shape)).astype(np.float32)
         for k, (shape, fixed, frame) in specs.items()}
    steps = max((v.shape[1] for v in x.values() if v.ndim >= 3), default=0)
    big = _oversized(config)
    if big:
        raise QtoolError(f"{path}: {big} would make Keras allocate more than {MAX_TENSOR_ELEMENTS:,} values for "
                         "one weight; not loaded with Keras")
    t0, framework = time.perf_counter(), "Keras"
    try:
        keras = _import_keras()
        if '"qkeras' in json.dumps(config):  # registers QKeras' layers and quantizers with Keras
            framework = "QKeras"
            import qkeras  # noqa: F401
    except ImportError as e:
        missing = f"no module {e.name!r}" if e.name else str(e)
        return {"checked": False, "reason": f"{framework} cannot be imported ({missing})"}
    try:
        with framework_run(), one_torch_thread():
            model = _load(keras, path, _float32(config))
            keras2_hard_sigmoid(keras, model, keras_major(path))
            pairs = float_activations(keras, model)  # QKeras' quantizers on the data: their float functions
            args = [x[k] for k in specs]
            ys = model(args[0] if len(args) == 1 else args, training=False)
            want = [np.asarray(keras.ops.convert_to_numpy(y), np.float32)
                    for y in (ys if isinstance(ys, (list, tuple)) else [ys])]
    except QtoolError:
        raise
    except Exception as e:  # Keras refused the file qtool accepted: say so, in one line
        raise QtoolError(f"{path}: Keras cannot run this model ({reason(e)})") from None
    got = qtool.layers.run(graph, {k: a.reshape(*a.shape[:2], -1) if a.ndim == 4 else a  # a map's frames
                                   for k, a in zip(graph.inputs, args)})
    want = [w.reshape(*w.shape[:2], -1) if w.ndim == 4 else w for w in want]
    if len(want) != len(graph.outputs):
        raise QtoolError(f"{path}: Keras gives {len(want)} outputs, the graph {len(graph.outputs)}")
    diff = 0.0
    for edge, w in zip(graph.outputs, want):
        g = got[edge]
        if g.shape != w.shape:
            raise QtoolError(f"{path}: Keras gives output '{edge}' of shape {w.shape}, qtool's graph {g.shape}; "
                             "the file was not read as Keras reads it")
        d = float(np.abs(w - g).max()) if w.size else 0.0
        tol = TOLERANCE * max(1.0, float(np.abs(w).max()) if w.size else 0.0)
        if not d <= tol:
            hint = (f" ({UNEVEN_AVG_POOL} on these {steps} steps)" if _uneven_avg_pools(graph, x) else "")
            raise QtoolError(f"{path}: the imported graph's output '{edge}' differs from Keras by up to {d:.3g} on "
                             f"random inputs (tolerance {tol:.3g}){hint}; refusing a wrong import")
        diff = max(diff, d)
    same_pools = any(n.op == "avg_pool1d" and n.attrs.get("padding") == "same" for n in graph.nodes)
    note = ({"note": f"{UNEVEN_AVG_POOL}; checked on {steps} steps, where they agree"}
            if same_pools and keras.backend.backend() == "torch" else {})
    return {"checked": True, "framework": "Keras", "max_abs_diff": diff, "sequences": SEQUENCES, "steps": steps,
            "seconds": round(time.perf_counter() - t0, 3), **note, **({"fake_quant_pairs": pairs} if pairs else {})}
