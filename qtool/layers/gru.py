"""gru: a (possibly stacked, possibly bidirectional) GRU, qtool's float GRU
(qtool.numerics.float_gru: gates z | r | g, `g = tanh(Wx_g + r * (Rh_g + br_g) + bx_g)`, Keras'
reset_after=True and PyTorch's formulation, unless the attrs below say otherwise), zero initial state.

Attrs: `layers` (default 1), `bidirectional` (default false), `return_sequences` (default true);
the cell's form (qtool.core.model.CellForm), the same for every layer and direction, each absent
where it is the default: `reset_after` (default true; false: `g = act(Wx_g + R_g (r * h) + bx_g
+ br_g)`), `gate` (`sigmoid`, `hard_sigmoid` with `gate_alpha` and `gate_beta`: clip(alpha v +
beta, 0, 1)) and `candidate` (`tanh`, `relu`, `linear`).
Params `l{k}.{fwd,bwd}.{W,R,bx,br}` for layer k: W [3H, C_k], R [3H, H], bx [3H], br [3H]
(qtool.core.model's layout); layer k + 1 reads layer k's sequence, [fwd | bwd] channels.

Output: the last layer's sequence `[N, T, H * directions]`, or with return_sequences false its
final states `[N, H * directions]`: the forward direction after the last step and the backward
direction after the whole (reversed) sequence, i.e. at step 0 of its output. That is Keras'
`Bidirectional(GRU(return_sequences=False))` and PyTorch's `cat(h_n[-2], h_n[-1])`. PyTorch's
`output[:, -1]` differs for the backward direction (its state after one step): that model is a
gru with return_sequences true followed by last_step.

Along a feature map (a dual-path RNN's GRUs; the map `[T, F, C]` is the edge `[T, F * C]` in
`order` "fc" (f * C + c) or "cf" (c * F + f), as conv2d's): `freq` F > 1 runs the GRU on each
frequency's C channels, the weights shared, and `along` says along which axis:
- "time" (the inter-frame GRU): F independent sequences over time, each frequency its own state;
- "freq" (the intra-frame GRU): within each frame, a sequence of F positions (bidirectional: from
  both ends), its state zero at each frame's first position; each frame on its own, so streaming.
Either way the output frame holds, per frequency f, the GRU's H * directions values: order "fc"
`[T, F * H * directions]`; `return_sequences` stays true.

Integers: the GRU core exactly as qtool quantizes a GRU alone (docs/numerics.md), its input
edge on x's grid and its output edge on h's: `qp["qm"]`, the QuantModel calibrated on the
GRU's own input (qtool.graph.calibrate), run by the CPU engine (or `qp["runner"]`, another
engine's run_model: the CUDA one).
"""

from __future__ import annotations

import numpy as np

from qtool.core.edges import channels, sequence, vector
from qtool.core.graph import Graph, Node
from qtool.core.model import DIRECTIONS, CellForm, GruCell, GruModel
from qtool.core.node_args import attr_bool, attr_int, fail, only, param, want_inputs
from qtool.core.qmodel import TensorQ
from qtool.errors import QtoolError
from qtool.layers.integer import requantize
from qtool.numerics.float_gru import run_float

OP = "gru"
FORM = ("reset_after", "gate", "gate_alpha", "gate_beta", "candidate")  # CellForm's fields
ATTRS = ("layers", "bidirectional", "return_sequences", "along", "freq", "order", *FORM)
ALONG = ("time", "freq")
ORDERS = ("cf", "fc")
MAX_LAYERS = 64


def form(node: Node) -> CellForm:
    """The cell form the node's attrs give (the haste form where they give none)."""
    try:
        return CellForm(**{k: node.attrs[k] for k in FORM if k in node.attrs})
    except QtoolError as e:
        raise fail(node, str(e)) from None


def _attrs(node: Node) -> tuple[int, int, bool]:
    layers = attr_int(node, "layers", 1, high=MAX_LAYERS)
    dirs = 2 if attr_bool(node, "bidirectional", False) else 1
    return layers, dirs, attr_bool(node, "return_sequences", True)


def dual_path(node: Node) -> tuple[str, int, str]:
    """(along, F, order) of the node: ("time", 1, "fc") for a GRU over a plain sequence."""
    along, order = node.attrs.get("along", "time"), node.attrs.get("order", "fc")
    if along not in ALONG:
        raise fail(node, f"attribute 'along' must be one of {', '.join(ALONG)}, got {along!r:.40}")
    if order not in ORDERS:
        raise fail(node, f"attribute 'order' must be one of {', '.join(ORDERS)}, got {order!r:.40}")
    F = attr_int(node, "freq", 1)
    if along == "freq" and F < 2:
        raise fail(node, "runs along frequency over a map of fewer than 2 frequencies (attribute 'freq')")
    if F > 1 and not attr_bool(node, "return_sequences", True):
        raise fail(node, "runs over a map's frequencies and returns final states; it returns its sequence")
    return along, F, order


def sequences(node: Node, x: np.ndarray) -> np.ndarray:
    """The GRU's own sequences `[N', T', C]` from its input edge `[N, T, F * C]`: [N * F, T, C] along
    time, [N * T, F, C] along frequency; the edge itself for a plain GRU."""
    along, F, order = dual_path(node)
    if F == 1:
        return x
    N, T, W = x.shape
    m = x.reshape(N, T, F, W // F) if order == "fc" else x.reshape(N, T, W // F, F).transpose(0, 1, 3, 2)
    if along == "freq":
        return m.reshape(N * T, F, W // F)
    return m.transpose(0, 2, 1, 3).reshape(N * F, T, W // F)


def unsequences(node: Node, y: np.ndarray, N: int) -> np.ndarray:
    """The output edge `[N, T, F * H * dirs]` (order "fc") from the GRU's own output sequences."""
    along, F, _ = dual_path(node)
    if F == 1:
        return y
    if along == "freq":
        return y.reshape(N, -1, F * y.shape[-1])
    return y.reshape(N, F, -1, y.shape[-1]).transpose(0, 2, 1, 3).reshape(N, -1, F * y.shape[-1])


def _names(layers: int, dirs: int) -> list[list[str]]:
    return [[f"l{k}.{DIRECTIONS[d]}." for d in range(dirs)] for k in range(layers)]


def out_shape(node: Node, shapes: list[tuple]) -> list[tuple]:
    layers, dirs, seqs = _attrs(node)
    names = _names(layers, dirs)
    only(node, ATTRS, params=tuple(p + w for cells in names for p in cells for w in ("W", "R", "bx", "br")))
    want_inputs(node, shapes, seq=True)
    form(node)
    _, F, _ = dual_path(node)
    if channels(shapes[0]) % F:
        raise fail(node, f"reads {channels(shapes[0])} channels, which are not {F} frequencies of equal channels")
    width = channels(shapes[0]) // F
    for k, cells in enumerate(names):
        hidden = None
        for p in cells:
            R = param(node, p + "R", (None, None))
            H = R.shape[1]
            if R.shape[0] != 3 * H or hidden not in (None, H):
                raise fail(node, f"param '{p}R' has shape {list(R.shape)}, expected [3H, H]"
                                 + ("" if hidden is None else f" with H={hidden}"))
            hidden = H
            W = param(node, p + "W", (3 * H, None))
            if W.shape[1] != width:
                raise fail(node, f"param '{p}W' is {list(W.shape)} but layer {k} reads {width} channels")
            param(node, p + "bx", (3 * H,)), param(node, p + "br", (3 * H,))
        width = hidden * dirs
    return [sequence(width * F) if seqs else vector(width)]


def model(node: Node) -> GruModel:
    """The node's GRU as qtool's float model (the layout every GRU pass reads)."""
    layers, dirs, _ = _attrs(node)
    cell_form = form(node)
    return GruModel([[GruCell(*(node.params[p + w] for w in ("W", "R", "bx", "br")), cell_form) for p in cells]
                     for cells in _names(layers, dirs)], name=node.name, source=node.source)


def alone(gru: GruModel) -> Graph:
    """A GRU alone as the whole model it is: one gru node from input `x` to output `y` (the
    inverse of `model`), for qtool.layers.check to prove. Its cells must share one form, as a
    node's do."""
    forms = {c.form for cells in gru.layers for c in cells}
    if len(forms) > 1:
        raise QtoolError(f"{gru.name}: its layers compute different cell forms; a gru node has one")
    names = _names(gru.num_layers, len(gru.layers[0]))
    params = {p + w: getattr(c, w) for cells, ps in zip(gru.layers, names) for c, p in zip(cells, ps)
              for w in ("W", "R", "bx", "br")}
    attrs = {"layers": gru.num_layers, "bidirectional": gru.bidirectional, **gru.layers[0][0].form.attrs()}
    node = Node(gru.name, OP, ["x"], ["y"], attrs, params, gru.source or "GRU")
    return Graph([node], {"x": sequence(gru.input_size)}, ["y"], gru.name, gru.source)


def as_alone(graph: Graph) -> Node | None:
    """The gru node of a graph that is a GRU alone (`alone`'s inverse): one gru node over a plain
    sequence, from the model's only input to its only output, returning its sequence; else None."""
    if len(graph.nodes) != 1 or graph.input_shifts or graph.nodes[0].op != OP:
        return None
    node = graph.nodes[0]
    plain = node.inputs == list(graph.inputs) and node.outputs == list(graph.outputs) and dual_path(node)[1] == 1
    return node if plain and _attrs(node)[2] else None


def scales_input(node: Node) -> bool:
    """Whether `scale_input` can take a grid per input channel: not over a map, whose frequencies
    share W's columns."""
    return dual_path(node)[1] == 1


def scale_input(node: Node, shifts: np.ndarray) -> None:
    """The same GRU on its input's channels times 2^shifts: the first layer's W columns (each
    direction's) divided by them (exact)."""
    for d in DIRECTIONS[:_attrs(node)[1]]:
        W = np.asarray(node.params[f"l0.{d}.W"], np.float32)
        node.params[f"l0.{d}.W"] = np.ldexp(W, -shifts[None, :]).astype(np.float32)


def describe(node: Node) -> str:
    """The node as tables show its op: `gru`, with its layers, direction, axis and a cell other
    than the haste form (`gru, 2 layers, bidirectional, along 33 freqs; reset before ...`)."""
    layers, f = int(node.attrs.get("layers", 1)), form(node)
    along, F, _ = dual_path(node)
    parts = [f"{layers} layers"] if layers > 1 else []
    parts += ["bidirectional"] if node.attrs.get("bidirectional") else []
    parts += [] if F == 1 else [f"along {F} freqs" if along == "freq" else f"per freq (x{F})"]
    return ", ".join([node.op, *parts]) + ("" if f.haste else f"; {f.describe()}")


def _final(node: Node, y: np.ndarray, H: int, dirs: int) -> np.ndarray:
    """The sequence `y [N, T, H * dirs]`, or with return_sequences false the final states."""
    if _attrs(node)[2]:
        return y
    if y.shape[1] == 0:
        raise fail(node, "an empty sequence has no final state")
    # forward: after the last step; backward: after the whole reversed sequence, which is step 0
    return y[:, -1] if dirs == 1 else np.concatenate([y[:, -1, :H], y[:, 0, H:]], axis=-1)


def forward(node: Node, xs: list[np.ndarray]) -> list[np.ndarray]:
    gru = model(node)
    # [N, T, H * dirs]; the backward half at step t saw steps T-1..t
    y = run_float(gru, sequences(node, xs[0]))
    return [unsequences(node, _final(node, y, gru.hidden_size, gru.num_directions), len(xs[0]))]


def forward_fq(node: Node, qp: dict, g_in: list[TensorQ], g_out: list[TensorQ], xs: list[np.ndarray]
               ) -> list[np.ndarray]:
    """The fake-quant GRU (qtool.numerics.fakequant): every tensor rounded onto its grid."""
    from qtool.numerics.fakequant import run_fakequant

    qm = qp["qm"]
    y = run_fakequant(qm, sequences(node, xs[0]))
    return [unsequences(node, _final(node, y, qm.model.hidden_size, qm.model.num_directions), len(xs[0]))]


def forward_int(node: Node, qp: dict, qs: list[np.ndarray], g_in: list[TensorQ], g_out: list[TensorQ]
                ) -> list[np.ndarray]:
    from qtool.engine.cpu import run_model

    qm = qp["qm"]
    y = qp.get("runner", run_model)(qm, None, xq=np.ascontiguousarray(sequences(node, qs[0]))).y_int.astype(np.int64)
    h = qm.cells[-1][0].spec["h"]
    y = unsequences(node, _final(node, y, qm.model.hidden_size, qm.model.num_directions), len(qs[0]))
    return [requantize(y, h, g_out[0])]
