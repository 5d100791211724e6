"""Which layer of a Keras model reads which: the layer graph of a model config (Sequential, functional,
nested models; Keras 3 and Keras 2 configs), so that an imported GRU says which layers it took,
which computing layers it left out and whose output it reads.

Data for a model is data for its GRU only when nothing sits between the model's input and the
GRU but inference no-ops (dropout, noise), which are looked through; everything else (Dense,
Conv1D, normalization, Activation, Embedding, merges, cropping and padding, custom layers, another
GRU, and layout layers: a Permute or Reshape lays the data out otherwise than the GRU reads them)
is named.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from qtool.importers.keras.config import IDENTITY, MODELS, call_refs, tensor_refs

NO_OPS = ("InputLayer", *IDENTITY, "SpatialDropout2D", "SpatialDropout3D")  # identities at inference


@dataclass
class Layer:
    name: str  # "outer/inner" inside nested models, as KerasGru names it
    cls: str
    calls: list[list[str]] = field(default_factory=list)  # per call: the layers whose outputs it reads

    @property
    def label(self) -> str:
        return f"{self.name} ({self.cls})"

    @property
    def computes(self) -> bool:
        return self.cls not in NO_OPS


def layer_graph(config: dict) -> dict[str, Layer]:
    """Every layer of the model by its full name; a layer without calls reads the model's input."""
    graph: dict[str, Layer] = {}
    _model(config, "", graph)
    return graph


def left_out(graph: dict[str, Layer], took: list[str]) -> list[str]:
    """`"name (Class)"` of every computing layer that is not one of `took`, in the config's order."""
    return [l.label for l in graph.values() if l.computes and l.name not in took]


def input_from(graph: dict[str, Layer], name: str) -> str | None:
    """The nearest computing layer whose output the layer `name` reads (through no-ops, in every
    call), or None when it reads the model's own input."""
    seen, todo = set(), [c[0] for c in graph[name].calls if c] if name in graph else []
    while todo:
        src = todo.pop(0)
        if src in seen:
            continue
        seen.add(src)
        layer = graph.get(src)
        if layer is None:  # a config naming a layer it does not hold: not the model's input
            return f"{src} (unknown layer)"
        if layer.computes:
            return layer.label
        todo += [c[0] for c in layer.calls if c]
    return None


def _name(layer: dict) -> str:
    cfg = layer.get("config")
    return str((cfg if isinstance(cfg, dict) else {}).get("name", layer.get("name")))


def _model(model: dict, prefix: str, graph: dict[str, Layer]) -> tuple[list[str], list[str]]:
    """Adds the layers of `model` to `graph`; returns the full names of the layers that take its
    inputs and of those that give its outputs (a nested model is looked through)."""
    cfg = model.get("config")
    layers = cfg if isinstance(cfg, list) else cfg.get("layers") if isinstance(cfg, dict) else None
    layers = [l for l in layers if isinstance(l, dict)] if isinstance(layers, list) else []
    inner: dict[str, tuple[list[str], list[str]]] = {}
    for layer in layers:
        name = _name(layer)
        if layer.get("class_name") in MODELS:
            inner[name] = _model(layer, f"{prefix}{name}/", graph)
        else:
            graph[prefix + name] = Layer(prefix + name, str(layer.get("class_name")))

    def output(name: str, index: int = 0) -> str:
        outs = inner[name][1] if name in inner else []
        return outs[index] if 0 <= index < len(outs) else outs[0] if outs else prefix + name

    def call(name: str, sources: list[str]) -> None:
        if name not in inner:
            if prefix + name in graph:
                graph[prefix + name].calls.append(sources)
            return
        for k, first in enumerate(inner[name][0]):  # the nested model's k-th input reads the k-th source
            if first in graph:
                graph[first].calls.append(sources[min(k, len(sources) - 1):][:1])

    if model.get("class_name") == "Sequential":
        start = f"{prefix}<input>"  # each layer reads the one before; the first one the model's input
        graph[start] = Layer(start, "InputLayer")
        prev = start
        for layer in layers:
            call(_name(layer), [prev])
            prev = output(_name(layer))
        return [start], [prev]
    for layer in layers:
        nodes = layer.get("inbound_nodes")
        for node in nodes if isinstance(nodes, list) else []:
            call(_name(layer), [output(n, t) for n, t in call_refs(node)])
    ins = cfg.get("input_layers") if isinstance(cfg, dict) else None
    outs = cfg.get("output_layers") if isinstance(cfg, dict) else None
    return [output(n) for n, _ in tensor_refs(ins)], [output(n, t) for n, t in tensor_refs(outs)]
