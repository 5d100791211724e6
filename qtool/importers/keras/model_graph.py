"""Whole Keras models (`.keras` archives and legacy `.h5` files, Sequential and functional, nested
models flattened as `outer/inner`) as a `qtool.core.graph.Graph`: every layer one node of the op
table (docs/graph.md), Keras' channels-last layout kept, or the model refused in one line naming
the layer, its class and the supported classes.

What reads what comes from the layer graph of the config (keras/graph.py); each layer's weights
from the group Keras itself assigns to it (keras/config.py: `layers/<class>_<n>/vars` in an
archive, `model_weights/<name>` in a legacy file), sizes checked before anything is read; GRUs
through the GRU importer's own config checks and cell reader (qtool's layout, gates z, r, g).

Each layer class is built by its builder (qtool.importers.keras.ops, one module per family);
keras/model_check.py checks the graph against Keras itself.
"""

from __future__ import annotations

import re
import tempfile
import zipfile
from dataclasses import dataclass
from pathlib import Path

import h5py
import numpy as np

import qtool.layers
from qtool.core import edges
from qtool.core.graph import Graph, Node
from qtool.errors import QtoolError
from qtool.importers.checks import reason
from qtool.importers.keras.config import MODELS, KerasGru, _unique, find_grus, keras_major, model_layers, snake_case
from qtool.importers.keras.graph import NO_OPS, Layer, _model
from qtool.importers.keras.ops import BUILDERS
from qtool.importers.keras.ops.common import activation_of, policy_ok
from qtool.importers.keras.ops.layout import MERGES
from qtool.importers.keras.ops.linear import QKERAS
from qtool.importers.keras.quantizers import activation_grid, is_quantizer
from qtool.importers.keras.reader import SPOOL_BYTES, _dataset, _open
from qtool.importers.ranges import GraphRanges, ImportedRange

SUPPORTED = tuple(sorted({*BUILDERS, *NO_OPS}))
WEIGHT_ALIASES = {"depthwise_kernel": "kernel"}  # Keras 2's name for DepthwiseConv1D's kernel



@dataclass
class Entry:
    """One layer of the (flattened) model: its config, weights group and place in the layer graph."""

    name: str  # "outer/inner" inside nested models
    cls: str
    cfg: dict
    group: str  # its weights group in a .keras archive
    nested: bool

    @property
    def label(self) -> str:
        return f"'{self.name}' ({self.cls})"


class Reader:
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

    def fail(self, e: Entry, why: str) -> QtoolError:
        return QtoolError(f"{self.where}: layer {e.label} {why}")

    def add(self, e: Entry, op: str, inputs: list[str], attrs: dict | None = None, params: dict | None = None,
            activation=None) -> None:
        """Node `op` for layer `e` writing the edge named after it; a separate activation node
        (`<layer>/activation`) after it for a layer's fused activation other than linear. A QKeras
        quantizer as the activation is its float function there, its grid that edge's range."""
        q = activation_grid(f"{self.where}: layer {e.label}", "activation", activation) \
            if is_quantizer(activation) else None
        act = activation_of(self, e, q.kind if q else activation)
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

    def weights(self, e: Entry, roles: list[str]) -> dict[str, np.ndarray]:
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

    def _legacy_weights(self, e: Entry, roles: list[str]) -> dict[str, np.ndarray]:
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


# the layers that read a feature map [N, T, F, C] (the others are refused on one), those that make one
ON_MAPS = ("Conv2D", "DepthwiseConv2D", "BatchNormalization", "LayerNormalization", "Activation", "ReLU", "LeakyReLU",
           "PReLU", "Add", "Multiply", "Reshape", "QActivation")

MAP_MAKERS = ("Conv2D", "DepthwiseConv2D", "Reshape")



def _entries(model: dict, path: str, prefix: str, where: str, out: dict[str, Entry]) -> None:
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
            out[prefix + name] = Entry(prefix + name, cls, cfg, group, bool(prefix))


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
            found[str(name)] = (edges.sequence(shape[2] * shape[3]), shape[1], tuple(shape[2:]))
        else:
            found[str(name)] = ((edges.sequence(shape[-1]), shape[1], ()) if len(shape) == 3
                                else (edges.vector(shape[-1]), None, ()))
    return found


def _graph(path: Path, config: dict, f: h5py.File, legacy: bool) -> Graph:
    where = str(path)
    major = keras_major(path)
    grus = {g.name: g for g in find_grus(config, where, major)}  # the GRU importer's checks (settings, masks, states)
    entries: dict[str, Entry] = {}
    _entries(config, "", "", where, entries)
    layers: dict[str, Layer] = {}
    ins, outs = _model(config, "", layers)
    r = Reader(where, f, legacy, grus, major)
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
        e = entries.get(name) or Entry(name, cls, {}, "", "/" in name)
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
        policy_ok(r, e)
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
