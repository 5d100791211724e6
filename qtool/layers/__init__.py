"""The layer types of a whole model, one module each, and the registry that maps an op name
(`qtool.core.graph.Node.op`) to its module. A module defines `OP`, `out_shape(node, shapes)`
(the shapes of its outputs from its inputs', refusing what does not fit) and `forward(node, xs)`
(its float reference, numpy, batch-first float32). A new layer type is one module and one line
in `REGISTRY` (static imports: readers and tools see every layer); their shared helpers are
`qtool.core.node_args`."""

from __future__ import annotations

from fractions import Fraction
from types import ModuleType

import numpy as np

from qtool.core import edges
from qtool.core.graph import Graph
from qtool.core.node_args import same_pads, windows  # noqa: F401 (for the importers and tests)
from qtool.errors import QtoolError
from qtool.io.files import frames_fit, map_frame
from qtool.layers import activation, dense, elementwise, gru, hypot, pool, prelu, reduce, tail
from qtool.layers.conv import conv1d, conv2d
from qtool.layers.moves import concat, select, steps
from qtool.layers.norm import batchnorm, layernorm

MAX_EDGE_CHANNELS = 1 << 20  # a declared width beyond this is refused before anything is allocated

REGISTRY: dict[str, ModuleType] = {  # op -> its module
    "dense": dense,
    "conv1d": conv1d,
    "conv2d": conv2d,
    "batchnorm": batchnorm,
    "activation": activation,
    "prelu": prelu,
    "layernorm": layernorm,
    "add": elementwise,
    "sub": elementwise,
    "mul": elementwise,
    "concat": concat,
    "hypot": hypot,
    "select": select,
    "avg_pool1d": pool,
    "max_pool1d": pool,
    "global_avg_pool1d": pool,
    "global_max_pool1d": pool,
    "reduce_mean": reduce,
    "zero_pad1d": steps,
    "last_step": steps,
    "gru": gru,
    "softmax": tail,
    "l2_normalize": tail,
}


def layer(op: str, where: str) -> ModuleType:
    """The module of `op`; a QtoolError naming `where` and the supported ops otherwise."""
    if op not in REGISTRY:
        raise QtoolError(f"{where}: op '{op}' is not supported (supported: {', '.join(sorted(REGISTRY))})")
    return REGISTRY[op]


def check(graph: Graph, where: str = "") -> Graph:
    """Prove the graph well formed before anything runs it: unique names, every edge defined
    once and before it is read (so no cycle), every output reachable, shapes that agree (each
    op's `out_shape`), sizes within limits. Raises QtoolError naming the node."""
    where = f"{where}: " if where else ""
    names, shapes = set(), dict(graph.inputs)
    for edge, shape in graph.inputs.items():
        _check_shape(f"{where}input '{edge}'", shape)
    for node in graph.nodes:
        if node.name in names:
            raise QtoolError(f"{where}two nodes are named '{node.name}'")
        names.add(node.name)
        missing = [e for e in node.inputs if e not in shapes]
        if missing:
            raise QtoolError(f"{where}node {node.label} reads '{missing[0]}', which nothing before it "
                             "computes (a dangling input or a cycle)")
        out = layer(node.op, f"{where}node {node.label}").out_shape(node, [shapes[e] for e in node.inputs])
        if len(out) != len(node.outputs):
            raise QtoolError(f"{where}node {node.label} has {len(node.outputs)} outputs, its op gives {len(out)}")
        for edge, shape in zip(node.outputs, out):
            if edge in shapes:
                raise QtoolError(f"{where}edge '{edge}' is written twice (by node {node.label})")
            _check_shape(f"{where}node {node.label}", shape)
            shapes[edge] = shape
    for edge in graph.outputs:
        if edge not in shapes:
            raise QtoolError(f"{where}output '{edge}' is computed by no node")
    graph.shapes = shapes
    return graph


def run(graph: Graph, x: np.ndarray | dict[str, np.ndarray], keep: bool = False) -> dict[str, np.ndarray]:
    """The float reference: every node's op in order on batch-first float32 inputs (one array
    for a single-input model). Returns the output edges (every edge with `keep`)."""
    if not graph.shapes:  # an unchecked graph would fail in numpy, not in one line
        check(graph)
    if not isinstance(x, dict):
        if len(graph.inputs) != 1:
            raise QtoolError(f"the model has {len(graph.inputs)} inputs; pass a dict of arrays")
        x = {next(iter(graph.inputs)): x}
    values = {k: np.asarray(v, np.float32) for k, v in x.items()}
    for k, v in values.items():  # a map's frames, in the model's order
        frame = input_map(graph) if v.ndim == 4 else None
        if frame is not None and not frames_fit(v.shape[2:], frame):
            what = "channels then frequencies" if frame[0] == "cf" else "frequencies then channels"
            raise QtoolError(f"input '{k}': its frames are {list(v.shape[2:])} but the model reads "
                             f"{list(map_frame(frame))} ({what})")
    values = {k: v.reshape(*v.shape[:2], -1) if v.ndim == 4 else v for k, v in values.items()}
    for edge, shape in graph.inputs.items():  # batch-first, channels last: [N, T, C] or [N, C]
        v = values.get(edge)
        if v is None or v.ndim != edges.array_rank(shape) or v.shape[-1] != edges.channels(shape):
            got = "nothing" if v is None else f"shape {list(v.shape)}"
            raise QtoolError(f"input '{edge}' must be {edges.array_text(shape)} (batch first, channels last), "
                             f"got {got}")
    values = graph.scale_inputs(values)
    for node in graph.nodes:
        outs = layer(node.op, node.label).forward(node, [values[e] for e in node.inputs])
        values.update(zip(node.outputs, (np.asarray(o, np.float32) for o in outs)))
    return values if keep else {e: values[e] for e in graph.outputs}


FRAME_KEEPING = ("zero_pad1d", "activation", "prelu", "batchnorm", "add", "sub", "mul")  # a frame's channels stay put


def input_map(graph: Graph, edge: str | None = None) -> tuple[str, int, int] | None:
    """(order, F, C) of the model's input `edge` (by default its one input) where it is a feature
    map (a conv2d reads it), else None: what its data's 4-D frames must be
    (qtool.io.files.SequenceData.check_features)."""
    if edge is None:
        if len(graph.inputs) != 1:
            return None
        edge = next(iter(graph.inputs))
    shape = graph.inputs[edge]
    if not edges.is_sequence(shape):
        return None
    if edge in graph.input_maps:  # as the file declares it
        return tuple(graph.input_maps[edge])
    todo, seen = [edge], set()
    while todo:  # through the ops that keep each frame's channels where they are, to the first conv2d
        e = todo.pop()
        seen.add(e)
        for n in graph.nodes:
            if e not in n.inputs:
                continue
            if n.op == "conv2d" and n.inputs[0] == e:
                F = int(n.attrs["freq"])
                return str(n.attrs.get("order", "cf")), F, edges.channels(shape) // F
            out = graph.shapes.get(n.outputs[0])
            if n.op in FRAME_KEEPING and out is not None and edges.channels(out) == edges.channels(shape):
                todo.extend(o for o in n.outputs if o not in seen)
    return None


def check_data(graph: Graph, data) -> None:
    """The data (a SequenceData, or a ModelData of one per input) fit each of the model's inputs:
    channels, and a map's frames in the model's order."""
    parts = getattr(data, "parts", None) or {next(iter(graph.inputs)): data}
    if len(parts) != len(graph.inputs):
        names = ", ".join(graph.inputs)
        raise QtoolError(f"{data.name}: the model has {len(graph.inputs)} inputs ({names}); give their data "
                         "as one .npz or .h5 file holding an array per input, named after it")
    for edge, shape in graph.inputs.items():
        parts[edge].check_features(edges.channels(shape), input_map(graph, edge))


PROBE_STEPS = (240, 480)  # divisible by every stride and pool size up to 6, and by 8, 10, 12, 15, 16


def steps_text(graph: Graph) -> dict[str, str]:
    """Each sequence edge's number of steps as a function of the input's T ("T", "T/2",
    "T-2", "T/2+1"), measured by running zeros of two lengths through the float graph; "T"
    for every edge where that cannot run (several inputs, a model that takes one length)."""
    seqs = [e for e, shape in graph.shapes.items() if edges.is_sequence(shape)]
    if len(graph.inputs) != 1 or not edges.is_sequence(next(iter(graph.inputs.values()))):
        return dict.fromkeys(seqs, "T")
    width = edges.channels(next(iter(graph.inputs.values())))
    try:
        lens = [{e: v.shape[1] for e, v in run(graph, np.zeros((1, t, width), np.float32), keep=True).items()
                 if v.ndim == 3} for t in PROBE_STEPS]
    except (QtoolError, ValueError, IndexError):
        return dict.fromkeys(seqs, "T")
    (t1, t2), out = PROBE_STEPS, {}
    for e in seqs:
        a = Fraction(lens[1][e] - lens[0][e], t2 - t1)
        b = lens[0][e] - a * t1
        lead = "" if a == 0 else ("T" if a == 1 else f"{a.numerator}T" if a.denominator == 1 else
                                  f"{'' if a.numerator == 1 else a.numerator}T/{a.denominator}")
        tail = "" if b == 0 else f"{round(b):+d}" if lead else f"{round(b)}"
        out[e] = lead + tail if b.denominator == 1 else "T"
    return out


def _check_shape(where: str, shape: tuple) -> None:
    if not edges.well_formed(shape):
        raise QtoolError(f"{where}: shape {shape} is neither a sequence (None, C) nor a vector (C,)")
    if not 1 <= edges.channels(shape) <= MAX_EDGE_CHANNELS:
        raise QtoolError(f"{where}: {edges.channels(shape):,} channels (at most {MAX_EDGE_CHANNELS:,})")
