"""A streaming ONNX file, read as the model it runs over whole sequences.

Such a file computes one frame a run and carries its layers' state from run to run in cache
inputs and outputs (GTCRN ships `stream/onnx_models/gtcrn.onnx` so): each cache output is its
cache input with parts overwritten (ScatterND or ScatterElements, and the layout ops around it),
or the frames a Concat joined the cache with, but the first (`inp[:, :, 1:]`). qtool follows every
cell of every cache through those ops, each value an array of cell numbers, and takes two uses of
a cache, the two a streaming model is written with:

- a GRU's initial_h whose cells are written back with the GRU's Y_h: the GRU's own state, carried
  from frame to frame; the GRU runs over the sequence from a zero state (the caches start at zero);
- a Concat of cache cells before the frame's x along an axis, whose cells are written back with
  the Concat's last frames: the frames a convolution looks back on; the Concat becomes a Pad of x
  with as many zero frames before it (a causal convolution over the sequence).

Any other read of a cache cell is refused, saying where. The file is then the model over whole
sequences, which qtool reads, runs frame by frame itself (its streaming C keeps that state), and
checks against the file run frame by frame by ONNX Runtime with its caches fed back
(qtool.importers.onnx.check)."""

from __future__ import annotations

import bisect
import json
from pathlib import Path

import numpy as np

from qtool.errors import QtoolError
from qtool.importers.checks import reason
from qtool.importers.onnx.external import inline
from qtool.importers.onnx.fold import evaluate

STREAM_NOTE = "qtool.stream"  # the metadata entry: the caches, as JSON pairs [input, output]
# the ops that only move values, and which of their inputs are values (the others: indices, shapes)
MOVES = {"Gather": (0,), "Slice": (0,), "ScatterND": (0, 2), "ScatterElements": (0, 2), "Reshape": (0,),
         "Squeeze": (0,), "Unsqueeze": (0,), "Transpose": (0,), "Expand": (0,), "Identity": (0,), "Split": (0,),
         "Flatten": (0,), "Concat": None}


def cache_pairs(model) -> list[tuple[str, str]]:
    """(input, output) for each output that is an input of the graph with parts overwritten
    (ScatterND, ScatterElements: torch.onnx's two exporters), or a Concat's frames after the input
    it joins first (_joined_cache), or the final states of GRUs whose initial states that input
    alone gives (torch's `h0` given to `forward` and `h_n` returned: the state carried by the
    caller)."""
    graph = model.graph
    stored = {t.name for t in graph.initializer}
    inputs = {i.name for i in graph.input if i.name not in stored}
    producer = {o: n for n in graph.node for o in n.output}
    pairs = []
    for out in graph.output:
        v, scattered = out.name, False
        while v in producer and producer[v].op_type in ("ScatterND", "ScatterElements", "Identity"):
            scattered = scattered or producer[v].op_type != "Identity"
            v = producer[v].input[0]
        if v in inputs and scattered:
            pairs.append((v, out.name))
            continue
        joined = _joined_cache(graph, producer, inputs, out.name)
        if joined:
            pairs.append((joined, out.name))
            continue
        grus = [n for n in _moved_from(producer, out.name) if n.op_type == "GRU" and out.name and
                len(n.output) > 1 and n.output[1] in _values_moved(producer, out.name)]
        sources = {i for n in grus if len(n.input) > 5 and n.input[5]
                   for i in _values_moved(producer, n.input[5]) if i in inputs}
        if grus and len(sources) == 1:
            pairs.append((sources.pop(), out.name))
    return pairs


def _joined_cache(graph, producer: dict, inputs: set[str], out: str) -> str | None:
    """The input a Concat joins before the frame where `out` is moved out of that Concat alone and
    has the input's shape: `inp = cat([cache, x]); return ..., inp[:, :, 1:]`, the frames a
    convolution looks back on given back whole (no in-place update)."""
    concats = [n for n in _nodes_moved(producer, out) if n.op_type == "Concat"]
    if len(concats) != 1 or len(concats[0].input) < 2:
        return None
    lead = {i for name in concats[0].input[:-1] for i in _values_moved(producer, name) if i in inputs}
    if len(lead) != 1 or _values_moved(producer, concats[0].input[-1]) & lead:
        return None
    cache = lead.pop()
    shapes = _declared(graph.input, cache), _declared(graph.output, out)
    return cache if None in shapes or shapes[0] == shapes[1] else None


def _declared(values, name: str) -> list | None:
    """The shape the file declares for an input or output (None where a size is left free)."""
    v = next(v for v in values if v.name == name)
    dims = [d.dim_value for d in v.type.tensor_type.shape.dim]
    return dims if dims and all(dims) else None


def _nodes_moved(producer: dict, value: str) -> list:
    """The moves that carry values into `value`."""
    return [producer[v] for v in _values_moved(producer, value) if v in producer and producer[v].op_type in MOVES]


def _values_moved(producer: dict, value: str) -> set[str]:
    """The values that ops that only move values carry into `value` (itself included)."""
    seen, todo = set(), [value]
    while todo:
        v = todo.pop()
        if v in seen:
            continue
        seen.add(v)
        node = producer.get(v)
        if node is not None and node.op_type in MOVES:
            moved = range(len(node.input)) if MOVES[node.op_type] is None else MOVES[node.op_type]
            todo.extend(node.input[k] for k in moved if k < len(node.input) and node.input[k])
    return seen


def _moved_from(producer: dict, value: str) -> list:
    """The nodes other than moves whose outputs the moves carry into `value`."""
    return [producer[v] for v in _values_moved(producer, value)
            if v in producer and producer[v].op_type not in MOVES]


def _values(model, where: str, folder: Path | None) -> dict[str, np.ndarray]:
    """Every value of the graph on zero inputs (ONNX Runtime): the shapes, and the indices of the
    ops that move cache cells (which depend on shapes only). Weights stored beside the file
    (`folder`: torch.onnx's `model.onnx.data`) are read in, checked (external.inline)."""
    from onnx import ValueInfoProto, helper, numpy_helper

    try:
        import onnxruntime as ort
    except ImportError:
        raise QtoolError(f"{where}: a streaming file (caches as inputs and outputs): reading it needs ONNX "
                         "Runtime (pip install onnxruntime)") from None
    m = type(model)()
    m.CopyFrom(model)
    inlined = [inline(where, t, folder) for t in m.graph.initializer]
    del m.graph.initializer[:]
    m.graph.initializer.extend(inlined)
    have = {o.name for o in m.graph.output}
    names = [o for n in m.graph.node for o in n.output if o and o not in have]
    m.graph.output.extend(ValueInfoProto(name=n) for n in names)
    feeds = {}
    stored = {t.name for t in m.graph.initializer}
    for i in m.graph.input:
        if i.name in stored:
            continue
        dims = [d.dim_value or 1 for d in i.type.tensor_type.shape.dim]  # a dynamic size: one (a frame)
        feeds[i.name] = np.zeros(dims, helper.tensor_dtype_to_np_dtype(i.type.tensor_type.elem_type))
    opts = ort.SessionOptions()
    opts.log_severity_level = 4
    opts.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    try:
        sess = ort.InferenceSession(m.SerializeToString(), opts, providers=["CPUExecutionProvider"])
        outs = sess.run(None, feeds)
    except Exception as e:  # ONNX Runtime raises its own types
        raise QtoolError(f"{where}: ONNX Runtime cannot run this streaming file ({reason(e)})") from None
    values = dict(zip([o.name for o in m.graph.output], outs))
    values.update(feeds)
    for t in m.graph.initializer:
        values[t.name] = numpy_helper.to_array(t)
    return values


class _Cells:
    """Each value that holds cache cells as an array of cell numbers: the caches' cells first
    (0 .. `total`), then a block for each computed value the moves mix in."""

    def __init__(self, values: dict, caches: list[str]) -> None:
        self.values, self.ids, self.total = values, {}, 0
        for c in caches:
            self.fresh(c)
        self.total = sum(self.ids[c].size for c in caches)

    def fresh(self, name: str) -> np.ndarray:
        if name not in self.ids:
            start = sum(a.size for a in self.ids.values())
            shape = np.shape(self.values[name])
            size = int(np.prod(shape, dtype=np.int64))
            self.ids[name] = np.arange(start, start + size, dtype=np.int64).reshape(shape)
        return self.ids[name]

    def cached(self, name: str) -> bool:
        return name in self.ids and bool((self.ids[name] < self.total).any())


def _label(node) -> str:
    return f"node '{node.name or node.output[0]}' ({node.op_type})"


def rewrite_caches(model, where: str, opset: int, folder: Path | None = None) -> str | None:
    """Rewrite a streaming `model` in place as the model over whole sequences (module docstring);
    the note of what it read, also stored in the model's metadata (STREAM_NOTE); None for a file
    without caches."""
    pairs = cache_pairs(model)
    if not pairs:
        return None
    from onnx import helper

    graph = model.graph
    values = _values(model, where, folder)
    cells = _Cells(values, [i for i, _ in pairs])
    producer = {o: n for n in graph.node for o in n.output}
    written = set().union(*(_values_moved(producer, o) for _, o in pairs))
    for node in graph.node:  # the moves, on cell numbers
        if node.op_type not in MOVES or not (any(o in written for o in node.output) or
                                             any(i in cells.ids for i in node.input if i)):
            continue
        moved = range(len(node.input)) if MOVES[node.op_type] is None else MOVES[node.op_type]
        ins = [None if not name else cells.fresh(name) if k in moved else values[name]
               for k, name in enumerate(node.input)]
        for name, out in zip(node.output, evaluate(where, node, ins, opset)):
            if name:
                cells.ids[name] = np.asarray(out, np.int64)
    for _, o in pairs:  # a GRU's final state given out as it is
        if o not in cells.ids and o in producer and producer[o].op_type not in MOVES:
            cells.fresh(o)
    missing = [o for _, o in pairs if o not in cells.ids]
    if missing:
        raise QtoolError(f"{where}: the cache output '{missing[0]}' is not its input with parts overwritten")
    next_of = np.concatenate([cells.ids[o].reshape(-1) for _, o in pairs])  # a cache cell's next frame
    for i, o in pairs:
        if cells.ids[o].shape != cells.ids[i].shape:
            raise QtoolError(f"{where}: the cache output '{o}' has shape {list(cells.ids[o].shape)}, its input "
                             f"'{i}' {list(cells.ids[i].shape)}")
    starts = [int(cells.ids[i].flat[0]) for i, _ in pairs]  # the caches' cells in order: which one a cell is
    grus, windows = [], {}
    for node in graph.node:
        if node.op_type in MOVES or node.op_type in ("Shape", "Size"):
            continue
        for k, name in enumerate(node.input):
            if not name or not cells.cached(name):
                continue
            read = cells.ids[name]
            if node.op_type == "GRU" and k == 5 and _carried(cells, node, read, next_of):
                grus.append(node)
                continue
            window = _window(cells, producer.get(name), next_of)
            if window is None:
                cache = pairs[bisect.bisect_right(starts, int(read[read < cells.total].flat[0])) - 1][0]
                raise QtoolError(f"{where}: {_label(node)} reads cells of the cache '{cache}' in a way qtool does "
                                 "not follow (it reads a cache as a GRU's initial state written back with its "
                                 "final state, or as the frames a Concat joins before the frame's own)")
            windows[producer[name].name or name] = (producer[name], *window)
    for node in grus:
        node.input[5] = ""
    for concat, x, axis, frames in windows.values():
        rank = np.ndim(values[x])
        pads = [0] * (2 * rank)
        pads[axis] = frames
        pad = helper.make_node("Pad", [x, f"{concat.output[0]}.qtool_pads"] if opset >= 11 else [x],
                               list(concat.output), name=concat.name, mode="constant",
                               **({} if opset >= 11 else {"pads": pads}))
        if opset >= 11:
            graph.initializer.append(helper.make_tensor(pad.input[1], 7, [len(pads)], pads))
        concat.CopyFrom(pad)
    caches = {i for i, _ in pairs} | {o for _, o in pairs}
    kept_in = [i for i in graph.input if i.name not in caches]
    kept_out = [o for o in graph.output if o.name not in caches]
    del graph.input[:], graph.output[:]
    graph.input.extend(kept_in)
    graph.output.extend(kept_out)
    _prune(graph)
    carried = ([f"{len(grus)} GRU state{'s' * (len(grus) > 1)}"] if grus else []) + (
        [f"the past frames of {len(windows)} convolution{'s' * (len(windows) > 1)}"] if windows else [])
    note = (f"a streaming file: its caches ({', '.join(i for i, _ in pairs)}) carry {' and '.join(carried)} from "
            "run to run; read as the model over whole sequences, which qtool runs frame by frame with that state "
            "of its own")
    entry = model.metadata_props.add()
    entry.key, entry.value = STREAM_NOTE, json.dumps({"pairs": pairs, "note": note})
    return note


def unreturned_hint(model) -> str:
    """What to add to a refusal of `model` where an input is joined before the frame as a
    convolution's cache is but no output is read as giving it back (its import may have failed
    for that: the input was read as data, in a layout it does not have); "" otherwise."""
    graph = model.graph
    stored = {t.name for t in graph.initializer}
    data = {i.name for i in graph.input if i.name not in stored}
    inputs = data - {i for i, _ in stream_pairs(model)}
    producer = {o: n for n in graph.node for o in n.output}
    for node in graph.node:
        frame = _upstream(producer, node.input[-1]) if node.op_type == "Concat" and len(node.input) > 1 else set()
        if not frame & data:  # no frame computed from the data after it (a constant)
            continue
        lead = {i for name in node.input[:-1] for i in _values_moved(producer, name) if i in inputs}
        lead -= frame  # the frame's data joined with what it was computed from
        if lead:
            return (f" (note: the input '{sorted(lead)[0]}' is joined before the frame by {_label(node)} as a "
                    "convolution's cache is, and no output gives it back as qtool reads a cache: updated in "
                    "place, or the joined frames but the first)")
    return ""


def _upstream(producer: dict, value: str) -> set[str]:
    """Every value `value` is computed from, itself included."""
    seen, todo = set(), [value]
    while todo:
        v = todo.pop()
        if v and v not in seen:
            seen.add(v)
            todo.extend(producer[v].input if v in producer else ())
    return seen


def _carried(cells: _Cells, gru, read: np.ndarray, next_of: np.ndarray) -> bool:
    """Whether initial_h's cells are all cache cells written back with this GRU's final state."""
    direction = next((a.s for a in gru.attribute if a.name == "direction"), b"forward")
    if not (read < cells.total).all() or direction != b"forward":  # a state carried backward in time is none
        return False
    written = next_of[read]
    for k in (1, 0):  # Y_h, or Y of the frame's one step
        out = gru.output[k] if len(gru.output) > k else ""
        if out in cells.ids and cells.ids[out].size == read.size and np.array_equal(
                cells.ids[out].reshape(read.shape), written):
            return True
    return False


def _window(cells: _Cells, concat, next_of: np.ndarray) -> tuple[str, int, int] | None:
    """(x, axis, frames) where `concat` joins cache cells, then x along an axis, and writes back
    its own last frames: the cache holds the frames before x."""
    if concat is None or concat.op_type != "Concat" or not concat.input:
        return None
    x = concat.input[-1]
    ids = cells.ids[concat.output[0]]
    axis = next(a.i for a in concat.attribute if a.name == "axis") % ids.ndim
    if x not in cells.ids or cells.cached(x):
        return None
    f = cells.ids[x].shape[axis]
    k = ids.shape[axis] - f
    head = np.take(ids, range(k), axis=axis)
    if k < 1 or not (head < cells.total).all():
        return None
    return (x, axis, k) if np.array_equal(next_of[head], np.take(ids, range(f, f + k), axis=axis)) else None


def _prune(graph) -> None:
    """Drop the nodes no output needs (the caches' updates)."""
    needed = {o.name for o in graph.output}
    keep = []
    for node in reversed(graph.node):
        if any(o in needed for o in node.output):
            keep.append(node)
            needed.update(i for i in node.input if i)
    for node in reversed(keep):
        for attr in node.attribute:  # a subgraph's outer reads
            if attr.type == attr.GRAPH:
                needed.update(i for n in attr.g.node for i in n.input)
    kept = list(reversed(keep))
    del graph.node[:]
    graph.node.extend(kept)
    stored = [t for t in graph.initializer if t.name in needed]
    del graph.initializer[:]
    graph.initializer.extend(stored)


def stream_pairs(model) -> list[tuple[str, str]]:
    """The caches `rewrite_caches` took out of `model`, [] for a file without."""
    entry = next((p.value for p in model.metadata_props if p.key == STREAM_NOTE), None)
    return [tuple(p) for p in json.loads(entry)["pairs"]] if entry else []


def stream_note(model) -> str | None:
    entry = next((p.value for p in model.metadata_props if p.key == STREAM_NOTE), None)
    return json.loads(entry)["note"] if entry else None
