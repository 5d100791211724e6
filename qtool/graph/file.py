"""The HDF5 files of a whole model (docs/file-formats.md, "Whole models"):

    format "qtool-graph" (a float graph, `qtool import`) or "qtool-qgraph" (quantized)
    /            attrs: format, version, qtool_version, graph (JSON: name, source, inputs,
                 outputs, nodes [{name, op, inputs, outputs, attrs, source}])
    /params/<k>/<param>     node k's float32 params
    quantized only:
    /            attrs: quant (JSON: core, tail, passes, info (with layer_bits {node: [weight,
                 bias, activation(, weight method where not minmax)]}), grids {edge: [bits,
                 exp2_inv, zp, lo, hi]}), fingerprint
                 (`QGraph.fingerprint()`; absent from files written before it)
    /gru/<k>/    node k's quantized GRU, laid out as a "qtool-qgru" file (qtool.core.qmodel)

The other layers' integers are not stored: they follow from the grids and the float weights
(each layer's `quantize`), which a reader derives exactly as the calibration did. A file that
loads is proved well formed (qtool.layers.check; the GRUs as qtool.io.qmodel_file proves them)
and consistent: what it holds twice (a GRU's float weights, in /params and in its /gru group)
agrees, and the fingerprints agree with the contents.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np

from qtool.core import edges
from qtool.core.graph import Graph, Node
from qtool.core.model import DIRECTIONS, open_h5
from qtool.core.qgraph import GVERSION, MODEL_OPS, QGFORMAT, QGraph, plain_json
from qtool.core.qmodel import TensorQ
from qtool.errors import QtoolError
from qtool.importers.ranges import GraphRanges
from qtool.io.qmodel_file import read_qmodel, write_qmodel
from qtool.layers import check, layer
from qtool.layers import gru as gru_layer
from qtool.layers.integer import LayerBits, same_grid
from qtool.version import __version__

GFORMAT = "qtool-graph"
MAX_JSON = 1 << 24  # characters of the graph's description
MAX_PARAM_VALUES = 1 << 27


def _input_shifts(raw, graph: Graph, where: str) -> dict[str, tuple[int, ...]]:
    """The per-channel input shifts a graph file holds, each proved to fit its input."""
    if not isinstance(raw, dict):
        raise QtoolError(f"{where}: input_shifts is not a table of inputs")
    out = {}
    for e, k in raw.items():
        ok = (e in graph.inputs and isinstance(k, list) and len(k) == graph.inputs[e][-1]
              and all(isinstance(v, int) and not isinstance(v, bool) and 0 <= v <= 30 for v in k))
        if not ok:
            raise QtoolError(f"{where}: input_shifts of '{e}' is not one shift in 0..30 per channel of an input")
        out[e] = tuple(k)
    return out


def _input_maps(raw, graph: Graph, where: str) -> dict[str, tuple]:
    """The feature-map inputs' (order, F, C) a graph file holds, each proved to fit its input."""
    if not isinstance(raw, dict):
        raise QtoolError(f"{where}: input_maps is not a table of inputs")
    out = {}
    for e, m in raw.items():
        ok = (e in graph.inputs and isinstance(m, list) and len(m) == 3 and m[0] in ("cf", "fc")
              and all(isinstance(v, int) and not isinstance(v, bool) and v > 0 for v in m[1:])
              and m[1] * m[2] == graph.inputs[e][-1])
        if not ok:
            raise QtoolError(f"{where}: input_maps of '{e}' is not an order and the F and C of an input's map")
        out[e] = tuple(m)
    return out


def file_format(f) -> str | None:
    fmt = f.attrs.get("format")
    return fmt.decode(errors="replace") if isinstance(fmt, bytes) else fmt


def write_graph(f, graph: Graph) -> None:
    desc = {"name": graph.name, "source": graph.source, "inputs": {k: list(v) for k, v in graph.inputs.items()},
            "outputs": graph.outputs, "check": graph.check_result, "steps": graph.steps,
            **({"notes": graph.notes} if graph.notes else {}),
            **({"input_shifts": {e: list(k) for e, k in graph.input_shifts.items()}} if graph.input_shifts else {}),
            **({"input_maps": {e: list(m) for e, m in graph.input_maps.items()}} if graph.input_maps else {}),
            **({"ranges": graph.ranges.to_json()} if graph.ranges is not None else {}),
            "nodes": [{"name": n.name, "op": n.op, "inputs": n.inputs, "outputs": n.outputs, "source": n.source,
                       "attrs": {k: plain_json(v) for k, v in n.attrs.items()}} for n in graph.nodes]}
    f.attrs.update(format=GFORMAT, version=GVERSION, qtool_version=__version__,
                   graph=json.dumps(desc, default=plain_json))
    for k, n in enumerate(graph.nodes):
        for name, a in n.params.items():
            f.create_dataset(f"params/{k}/{name}", data=np.asarray(a, np.float32))


def _json(f, key: str, where: str):
    raw = f.attrs.get(key)
    if isinstance(raw, bytes):
        raw = raw.decode(errors="replace")
    if not isinstance(raw, str) or len(raw) > MAX_JSON:
        raise QtoolError(f"{where}: attribute '{key}' is missing or not a JSON text of at most {MAX_JSON:,} characters")
    try:
        return json.loads(raw)
    except ValueError as e:
        raise QtoolError(f"{where}: attribute '{key}' is not valid JSON ({e})") from None


def _shape(v, where: str) -> tuple:
    shape = edges.from_list(v)
    if shape is None:
        raise QtoolError(f"{where}: an input shape must be [null, C] or [C], got {v!r:.60}")
    return shape


def read_graph(f, where: str) -> Graph:
    desc = _json(f, "graph", where)
    try:
        nodes = []
        for k, d in enumerate(desc["nodes"]):
            params = {}
            for name, ds in f.get(f"params/{k}", {}).items():
                if ds.size > MAX_PARAM_VALUES or ds.dtype.kind != "f":
                    raise QtoolError(f"{where}: params/{k}/{name} must be float with at most "
                                     f"{MAX_PARAM_VALUES:,} values")
                params[name] = np.asarray(ds[()], np.float32)
            attrs = {a: tuple(v) if isinstance(v, list) else v for a, v in d.get("attrs", {}).items()}
            nodes.append(Node(str(d["name"]), str(d["op"]), [str(e) for e in d["inputs"]],
                              [str(e) for e in d["outputs"]], attrs, params, str(d.get("source", ""))))
        graph = Graph(nodes, {str(k): _shape(v, where) for k, v in desc["inputs"].items()},
                      [str(e) for e in desc["outputs"]], str(desc.get("name", "model")), str(desc.get("source", "")))
    except (KeyError, TypeError, AttributeError) as e:
        raise QtoolError(f"{where}: the graph description is malformed ({type(e).__name__}: {e})") from None
    graph.check_result = desc.get("check") if isinstance(desc.get("check"), dict) else None
    steps = desc.get("steps")
    graph.steps = steps if isinstance(steps, int) and not isinstance(steps, bool) and steps > 0 else None
    notes = desc.get("notes", [])
    graph.notes = [str(n) for n in notes] if isinstance(notes, list) else []
    graph.input_shifts = _input_shifts(desc.get("input_shifts", {}), graph, where)
    graph.input_maps = _input_maps(desc.get("input_maps", {}), graph, where)
    check(graph, where)
    if "ranges" in desc:
        graph.ranges = _ranges(desc["ranges"], where)
        unknown = [e for e in graph.ranges.edges if e not in graph.shapes]
        if unknown:
            raise QtoolError(f"{where}: the graph's ranges name '{unknown[0]}', which is no edge of the graph")
    return graph


def _ranges(d, where: str) -> GraphRanges:
    """A QDQ file's grids on the graph's edges, as `write_graph` stored them."""
    try:
        ranges = GraphRanges.from_json(d)
    except (KeyError, TypeError, ValueError, AttributeError) as e:
        raise QtoolError(f"{where}: the graph's ranges are malformed ({type(e).__name__}: {e})") from None
    for edge, r in ranges.edges.items():
        fits = (np.isfinite(r.lo) and np.isfinite(r.hi) and r.lo <= 0 <= r.hi and r.step > 0 and 2 <= r.bits <= 16
                and (r.hi - r.lo) / r.step <= (1 << r.bits) - 1 + 1e-6)
        if not fits:
            raise QtoolError(f"{where}: the graph's range of '{edge}' is not a grid's range ([{r.lo}, {r.hi}], "
                             f"step {r.step}, {r.bits} bits)")
    return ranges


def write_qgraph(f, qg: QGraph) -> None:
    write_graph(f, qg.graph)
    grids = {e: [g.bits, int(g.exp2_inv), int(g.zp), float(g.lo), float(g.hi)] for e, g in qg.grids.items()}
    info = {**qg.info, "qtool_version": __version__}  # the provenance says who wrote it, as a GRU's does
    quant = {"core": qg.core, "tail": qg.tail, "passes": qg.passes, "info": info, "grids": grids}
    f.attrs.update(format=QGFORMAT, quant=json.dumps(quant, default=plain_json), fingerprint=qg.fingerprint())
    for k, n in enumerate(qg.graph.nodes):
        if n.op in MODEL_OPS and n.name in qg.qparams:
            write_qmodel(f.create_group(f"gru/{k}"), qg.qparams[n.name]["qm"])


def _grid(v, edge: str, where: str) -> TensorQ:
    ok = isinstance(v, list) and len(v) == 5 and all(isinstance(x, int) for x in v[:3]) and 2 <= v[0] <= 16
    if not ok or not -64 <= v[1] <= 64 or not -(1 << (v[0] - 1)) <= v[2] < (1 << (v[0] - 1)):
        raise QtoolError(f"{where}: the grid of edge '{edge}' is not [bits 2..16, exp2_inv, zp in range, lo, hi]")
    return TensorQ(v[0], False, v[1], v[2], float(v[3]), float(v[4]))


def _layer_bits(v, name: str, where: str) -> LayerBits:
    """[weight, bias, activation] bits, and the weights' range method where it is not minmax."""
    from qtool.calibrators import METHODS

    ok = (isinstance(v, list) and len(v) in (3, 4) and all(isinstance(b, int) and not isinstance(b, bool)
                                                          for b in v[:3]) and (len(v) == 3 or v[3] in METHODS))
    if not ok or not (2 <= v[0] <= 16 and 8 <= v[1] <= 32 and 2 <= v[2] <= 16):
        raise QtoolError(f"{where}: the bits of node '{name}' are not [weight 2..16, bias 8..32, activation 2..16"
                         "(, weight method)]")
    return LayerBits(*v)


def _same_gru(node: Node, k: int, qm, where: str) -> None:
    """The GRU's float params in the graph and its quantized GRU's float weights are written from
    the same arrays: any difference (to the bit) means the file was changed, and the integer GRU
    would no longer be the quantization of the float GRU it is measured against. Its stored
    fingerprint must still be that of its integers."""
    mine = gru_layer.model(node)
    if (mine.num_layers, mine.num_directions) != (qm.model.num_layers, qm.model.num_directions):
        raise QtoolError(f"{where}: gru/{k} has {qm.model.num_layers} layer(s) of {qm.model.num_directions} "
                         f"direction(s), node {node.label} {mine.num_layers} of {mine.num_directions}")
    for l, (cells, qcells) in enumerate(zip(mine.layers, qm.model.layers)):
        for d, (a, b) in enumerate(zip(cells, qcells)):
            for w in ("W", "R", "bx", "br"):
                if not np.array_equal(getattr(a, w), getattr(b, w)):
                    raise QtoolError(f"{where}: params/{k}/l{l}.{DIRECTIONS[d]}.{w} and gru/{k}/layer{l}/"
                                     f"{DIRECTIONS[d]}/{w} (the float and the quantized GRU of node "
                                     f"{node.label}) disagree; the file was changed after qtool wrote it")
    stored, actual = qm.info.get("fingerprint"), qm.fingerprint()
    if stored is not None and stored != actual:
        raise QtoolError(f"{where}: gru/{k}/quant: the integers' fingerprint is {actual}, the file says "
                         f"{stored!s:.40}; the file was changed after qtool wrote it")


def _same_fingerprint(f, qg: QGraph, where: str) -> None:
    """The stored fingerprint against the contents (files written before it have none)."""
    stored = f.attrs.get("fingerprint")
    if isinstance(stored, bytes):
        stored = stored.decode(errors="replace")
    actual = qg.fingerprint()
    if stored is not None and stored != actual:
        raise QtoolError(f"{where}: the contents' fingerprint is {actual}, the file says {stored!s:.40}; "
                         "the file was changed after qtool wrote it")


def read_qgraph(f, where: str) -> QGraph:
    graph = read_graph(f, where)
    quant = _json(f, "quant", where)
    try:
        names = [n.name for n in graph.nodes]
        core, tail = [str(n) for n in quant["core"]], [str(n) for n in quant["tail"]]
        if sorted(core + tail) != sorted(names):
            raise QtoolError(f"{where}: core and tail do not list the graph's nodes once each")
        grids = {str(e): _grid(v, str(e), where) for e, v in quant["grids"].items()}
        info = dict(quant.get("info", {}))
        bits = {str(k): _layer_bits(v, str(k), where) for k, v in info["layer_bits"].items()}
        passes = [tuple(p) for p in quant.get("passes", [])]
    except (KeyError, TypeError, ValueError, AttributeError) as e:
        raise QtoolError(f"{where}: the quantization description is malformed ({type(e).__name__}: {e})") from None
    qparams = {}
    for k, node in enumerate(graph.nodes):
        if node.name not in core:
            continue
        missing = [e for e in node.inputs + node.outputs if e not in grids]
        if missing:
            raise QtoolError(f"{where}: edge '{missing[0]}' of node {node.label} has no grid")
        if node.op in MODEL_OPS:
            if f"gru/{k}" not in f:
                raise QtoolError(f"{where}: gru/{k}, the quantized GRU of node {node.label}, is missing")
            qm = read_qmodel(f[f"gru/{k}"], f"{where}: gru/{k}")
            x, h = qm.cells[0][0].spec["x"], qm.cells[-1][0].spec["h"]
            if not (same_grid(x, grids[node.inputs[0]]) and same_grid(h, grids[node.outputs[0]])):
                raise QtoolError(f"{where}: the GRU of node {node.label} does not read and write its edges' grids")
            _same_gru(node, k, qm, where)
            qparams[node.name] = {"qm": qm}
        else:
            if node.name not in bits:
                raise QtoolError(f"{where}: the bits of node {node.label} are missing")
            qparams[node.name] = layer(node.op, node.label).quantize(
                node, [grids[e] for e in node.inputs], [grids[e] for e in node.outputs], bits[node.name])
    qg = QGraph(graph, grids, qparams, core, tail, passes, info)
    _same_fingerprint(f, qg, where)
    return qg


def load(path: str | Path) -> Graph | QGraph:
    """A whole model file qtool wrote: the float graph or the quantized one."""
    with open_h5(path) as f:
        fmt = file_format(f)
        if fmt == QGFORMAT:
            return read_qgraph(f, str(path))
        if fmt == GFORMAT:
            return read_graph(f, str(path))
    raise QtoolError(f"{path}: not a qtool whole-model file")
