"""GRU cells written as loops. tf2onnx writes a Keras GRU that it cannot map to an ONNX GRU node
(reset before the recurrent matmul, hard_sigmoid gates, a linear candidate) as a `Loop`, and
TensorFlow 1's `GRUCell` (alone or stacked in a `MultiRNNCell`, all cells in one body) as a `Scan`.

Each such loop is replaced, before the import reads the graph, by the ONNX GRU nodes it computes.
Nothing is matched against the body's op patterns (they change from one exporter release to the
next): the loop's anatomy (which carried value is a state, which per-step read is the input
sequence, which per-step output is which state) is read from its signature; each state's cell is
found among the body's constant weights by their shapes (a Keras kernel [I, 3H] and recurrent
kernel [H, 3H], or a GRUCell's gates kernel [I + H, 2H] and candidate kernel [I + H, H]) and every
activation qtool's GRU computes; and a candidate is taken only when qtool's float GRU reproduces
what the loop computes (ONNX's reference evaluator running the graph up to it) on probe sequences,
every step and every state. A loop that is no GRU stays as it is, with why on the node, and the
import refuses it saying what its body does.
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from qtool.core.model import CellForm, GruCell
from qtool.errors import QtoolError
from qtool.importers.checks import quiet, reason
from qtool.importers.onnx.fold import attr

LOOP_NOTE = "qtool.loop"  # how qtool.importers.onnx.loops marks what it read of a loop, and why not
_LOOP_TAIL = ("; qtool reads a loop whose states are GRU cells (tf2onnx writes a Keras GRU as a Loop and a TF1 "
              "GRUCell as a Scan), and a GRU as an ONNX GRU node (torch.onnx.export of nn.GRU)")
UNREAD_RECURRENT = {"LSTM": "an LSTM, which qtool does not compute (it quantizes GRUs)",
                    "RNN": "a plain RNN, which qtool does not compute (it quantizes GRUs)"}
LOOPS = ("Loop", "Scan")

PROBE_SEQUENCES = 3
PROBE_STEPS = 8  # where the input's steps are not fixed; a second length checks the trip count
TOLERANCE = 1e-4  # of the larger of 1 and the state's peak: float32 rounding, not a different cell
FLOAT = 1  # TensorProto.FLOAT

# what a cell's gates and candidate may compute: qtool's CellForm and how an ONNX GRU node says it
GATES = (("sigmoid", None, None), ("hard_sigmoid", 0.2, 0.5), ("hard_sigmoid", 1 / 6, 0.5))
CANDIDATES = ("tanh", "linear", "relu")
ONNX_NAMES = {"sigmoid": "Sigmoid", "hard_sigmoid": "HardSigmoid", "tanh": "Tanh", "linear": "Affine", "relu": "Relu"}


class NotACell(Exception):
    """Why a loop is not GRU cells (said by the import's refusal of the loop)."""


@dataclass
class _State:
    init: str  # the outer value it starts from
    body_in: str
    body_out: str
    final: str  # the loop's output of its last value ("" when not produced)
    scans: list  # (the loop's per-step output, the axis it stacks steps on)
    copies: list = field(default_factory=list)  # (a loop output, "last" or "all" steps, its shape)


@dataclass
class _Anatomy:
    node: object
    body: object
    sequence: str  # the outer value read one step at a time, time first [T, N, C]
    states: list
    unused: list  # the loop's other outputs (counters, invariants): nothing may read them
    invariant: dict = field(default_factory=dict)  # a body input carried unchanged -> its outer value


def load_onnx(path: Path, loops: bool = True):
    """The ModelProto of an ONNX file, its external data left to qtool's own checked reader
    (external.py), or the one a TFLite file computes (qtool.importers.tflite); with `loops`, its
    GRU cells written as loops read as GRU nodes (`rewrite_loops`)."""
    try:
        import onnx
    except ImportError:
        raise QtoolError("reading ONNX needs the 'onnx' package (pip install onnx)") from None
    from qtool.importers.tflite.reader import is_tflite

    if is_tflite(Path(path)):  # whatever its name: the ONNX graph a TFLite file computes
        from qtool.importers.tflite.to_onnx import to_onnx

        model = to_onnx(Path(path))
    else:
        try:
            model = onnx.load(str(path), load_external_data=False)
        except Exception as e:  # protobuf decode errors have several types
            if Path(path).suffix.lower() == ".tflite":
                raise QtoolError(f"{path}: not a TFLite file (no TFL3 identifier), nor an ONNX file") from None
            raise QtoolError(f"{path}: not a readable ONNX file ({reason(e)})") from None
        if not model.graph.node and Path(path).suffix.lower() == ".tflite":
            raise QtoolError(f"{path}: not a TFLite file (no TFL3 identifier)")
    if loops:
        rewrite_loops(model, str(path))  # GRU cells written as loops become the GRU nodes they compute
    return model


def rewrite_loops(model, where: str) -> None:
    """Replace each loop of `model`'s main graph that computes GRU cells by the GRU nodes it
    computes (in place); a note per loop read goes into the model's metadata (`loop_notes`), why a
    loop was not read into its node's doc_string, and the note into each GRU node's (both read by
    `loop_note`)."""
    loops = [n for n in model.graph.node if n.op_type in LOOPS and n.domain in ("", "ai.onnx")]
    for node in loops:
        try:
            anatomy = _anatomy(model.graph, node)
            _read(model, anatomy)
            cells, checked = _cells(model, anatomy, where)
        except NotACell as e:
            node.doc_string = f"{LOOP_NOTE}: {e}"
            continue
        note = (f"node '{_name(node)}' ({node.op_type}) read as {_layers_text(cells)}: qtool's float GRU "
                f"matches the loop on {checked}")
        _replace(model, anatomy, cells, note)
        entry = model.metadata_props.add()
        entry.key, entry.value = LOOP_NOTE, note


def loop_notes(model) -> list[str]:
    """What `rewrite_loops` read, one line per loop."""
    return [p.value for p in model.metadata_props if p.key == LOOP_NOTE]


def _name(node) -> str:
    return node.name or node.output[0]


def _layers_text(cells: list) -> str:
    """`a GRU of 20 units (Keras GRU cell, ...)`, or a stack's layers, alike ones said once."""
    texts = [f"{c.R.shape[1]} units ({kind}, {c.form.describe()})" for c, kind in cells]
    if len(cells) == 1:
        return f"a GRU of {texts[0]}"
    return f"a stack of {len(cells)} GRU layers of " + (texts[0] if len(set(texts)) == 1 else "; ".join(texts))


# ---- the loop's anatomy


def _anatomy(graph, node) -> _Anatomy:
    body = attr(node, "body", None)
    if body is None:
        raise NotACell("it has no body")
    if node.op_type == "Loop":
        return _loop(graph, node, body)
    return _scan(graph, node, body)


def _elem(value_info) -> int:
    return value_info.type.tensor_type.elem_type


def _identity_source(body, name: str, moves: tuple = ("Identity",)) -> str:
    """`name`, followed back through the body's nodes of `moves` (ops that keep the values)."""
    producer = {o: n for n in body.node for o in n.output}
    while name in producer and producer[name].op_type in moves:
        name = producer[name].input[0]
    return name


# ops that keep a state's values in another shape: a per-step output stacks the state so (tf2onnx
# writes a step's output as Squeeze(Unsqueeze(h))); the probe proves the values
RESHAPES = ("Identity", "Squeeze", "Unsqueeze", "Reshape", "Flatten")


def _loop(graph, node, body) -> _Anatomy:
    carried = len(node.input) - 2
    if carried < 1 or len(body.input) != carried + 2 or len(body.output) < carried + 1:
        raise NotACell("its signature is not a loop's (carried values and body inputs differ in number)")
    scans = len(body.output) - 1 - carried
    ins, outs = [i.name for i in body.input[2:]], [o.name for o in body.output[1:]]
    counters = {body.input[0].name}
    states, unused, invariant = [], [], {}
    for k in range(carried):
        final = node.output[k] if k < len(node.output) else ""
        if _identity_source(body, outs[k]) == ins[k]:
            invariant[ins[k]] = node.input[2 + k]
            unused.append(final)
        elif _elem(body.input[2 + k]) == FLOAT:
            states.append(_State(node.input[2 + k], ins[k], outs[k], final, []))
        else:
            counters.add(ins[k])
            unused.append(final)
    sequence = _gathered(body, counters, invariant)
    _scan_outputs(body, node, states, outs[carried:], node.output[carried:carried + scans], [0] * scans)
    return _Anatomy(node, body, sequence, states, unused, invariant)


def _gathered(body, counters: set, invariant: dict) -> str:
    """The outer value a Loop's body reads one step at a time: Gather(value, step counter)."""
    made = {o for n in body.node for o in n.output} | {i.name for i in body.input} | {t.name for t in body.initializer}
    found = []
    for n in body.node:
        index = _identity_source(body, n.input[1], RESHAPES + ("Cast",)) if len(n.input) == 2 else ""
        if n.op_type == "Gather" and index in counters and attr(n, "axis", 0) == 0:
            data = invariant.get(n.input[0], None if n.input[0] in made else n.input[0])
            if data is not None:
                found.append(data)
    if len(set(found)) != 1:
        raise NotACell("its body reads no one sequence a step at a time" if not found else
                       f"its body reads {len(set(found))} sequences a step at a time")
    return found[0]


def _scan(graph, node, body) -> _Anatomy:
    m = attr(node, "num_scan_inputs", 0)
    n_states = len(node.input) - m
    if m != 1:
        raise NotACell(f"it scans {m} inputs; a GRU scans one sequence")
    if any(v != 0 for k in ("scan_input_axes", "scan_input_directions", "scan_output_directions")
           for v in attr(node, k, [])):
        raise NotACell("it scans an axis other than the first, or backward")
    if len(body.input) != len(node.input) or len(body.output) < n_states:
        raise NotACell("its signature is not a scan's (states and body inputs differ in number)")
    ins, outs = [i.name for i in body.input[:n_states]], [o.name for o in body.output]
    states, unused = [], []
    for k in range(n_states):
        final = node.output[k] if k < len(node.output) else ""
        if _elem(body.input[k]) == FLOAT and _identity_source(body, outs[k]) != ins[k]:
            states.append(_State(node.input[k], ins[k], outs[k], final, []))
        else:
            unused.append(final)
    scans = len(body.output) - n_states
    axes = list(attr(node, "scan_output_axes", [])) or [0] * scans
    _scan_outputs(body, node, states, outs[n_states:], node.output[n_states:n_states + scans], axes)
    return _Anatomy(node, body, node.input[n_states], states, unused)


def _scan_outputs(body, node, states: list, body_outs: list, loop_outs: list, axes: list) -> None:
    """Give each per-step output to the state it stacks; one that stacks no state is no GRU's."""
    sources = {_identity_source(body, s.body_out, RESHAPES): s for s in states}
    for out, name, axis in zip(body_outs, loop_outs, axes):
        state = sources.get(_identity_source(body, out, RESHAPES))
        if state is None:
            raise NotACell(f"its per-step output '{name}' is not one of its states")
        if axis not in (0, 1, -3, -2):
            raise NotACell(f"it stacks its per-step output '{name}' on axis {axis}")
        state.scans.append((name, 0 if axis in (0, -3) else 1))
    if not states:
        raise NotACell("it carries no float state from step to step")


# ---- the cells


def _cells(model, a: _Anatomy, where: str) -> tuple[list, str]:
    """Each state's GruCell and cell kind, proved on probe sequences, in stack order (`a.states`
    reordered so); and what was checked."""
    consts = _body_constants(model, a)
    weights = _weights(consts)
    groups = _gate_groups(a, consts)
    runs = [_probe(model, a, where, steps) for steps in _probe_steps(model, a)]
    # a carried value of another rank than [N, H] is a buffer of a state's steps (TFLite's lowered
    # tensor lists: the last step as [1, N, H], or every step as [T, N, H]), not a state
    buffers = [s for s in a.states if runs[0][s.init].ndim != 2]
    a.states = [s for s in a.states if s not in buffers]
    if not a.states:
        raise NotACell("it carries no float state [N, H] from step to step")
    for state in a.states:
        if any(np.any(v[state.init] != 0) for v in runs):
            fed = state.init if state.init in {i.name for i in model.graph.input} else None
            raise NotACell(f"its state '{state.body_in}' starts from " + (
                f"the model's input '{fed}' (a state carried in)" if fed else "a value that is not zero")
                + "; qtool's GRU starts from h0 = 0")
    found, order, worst, left = [], [], 0.0, list(a.states)
    while left:  # layer k reads the sequence or layer k - 1's steps: which state it is, the search says
        k = len(found)
        inputs = [v[a.sequence] if k == 0 else v[("layer", k - 1)] for v in runs]
        hit = next((h for state in left if (h := _cell(weights, groups, state, inputs, runs)) is not None), None)
        if hit is None:
            state = left[0]
            raise NotACell(f"its state '{state.body_in}' ({runs[0][state.init].shape[-1]} wide, reading "
                           f"{inputs[0].shape[-1]} channels) is computed by no GRU cell among its weights (a Keras "
                           "GRU or TF1 GRUCell of sigmoid or hard_sigmoid gates and a tanh, linear or relu candidate)")
        state, cell, kind, got, err = hit
        for v, g in zip(runs, got):
            v[("layer", k)] = g
        found.append((cell, kind))
        order.append(state)
        left.remove(state)
        worst = max(worst, err)
    a.states = order
    for b in buffers:
        _buffer(a, b, runs)
    steps = " and ".join(str(v[a.sequence].shape[0]) for v in runs)
    count = runs[0][a.sequence].shape[1]
    return found, (f"{count} probe sequence{'s' * (count != 1)} x {steps} steps, every step and state within "
                   f"{worst:.2g} (relative to the peak)")


def _cell(weights: list, groups: list, state: _State, inputs: list, runs: list) -> tuple | None:
    """(state, cell, kind, its steps per run, distance) for the first candidate cell among
    `weights` that computes `state` from `inputs`; None when none does."""
    from qtool.numerics.float_gru import run_direction

    H, I = runs[0][state.init].shape[-1], inputs[0].shape[-1]
    for candidate, kind in itertools.chain(_candidates(weights, I, H), _gate_candidates(groups, I, H)):
        got = [run_direction(candidate, np.ascontiguousarray(x, np.float32)) for x in inputs]
        errs = [_distance(g, v, state) for g, v in zip(got, runs)]
        if None not in errs and max(errs) <= TOLERANCE:
            return state, candidate, kind, got, max(errs)
    return None


def _buffer(a: _Anatomy, b: _State, runs: list) -> None:
    """Give buffer `b` to the state whose last step (reshaped) or steps it holds at the loop's end."""
    for k, state in enumerate(a.states):
        for kind in ("last", "all"):
            pairs = [(v[("layer", k)][-1] if kind == "last" else v[("layer", k)], v[b.final]) for v in runs]
            if b.final and all(g.size == w.size and _close(g.reshape(w.shape), w) for g, w in pairs):
                state.copies.append((b.final, kind, runs[0][b.final].shape))
                return
    raise NotACell(f"it carries '{b.body_in}', which is neither a state [N, H] of a GRU nor a buffer of its steps")


def _close(got: np.ndarray, want: np.ndarray) -> bool:
    return float(np.abs(got - want).max(initial=0.0)) <= TOLERANCE * max(1.0, float(np.abs(want).max(initial=0.0)))


def _distance(got: np.ndarray, values: dict, state: _State) -> float | None:
    """The largest difference between a candidate's states [T, N, H] and the loop's, relative to the
    larger of 1 and their peak; None where the shapes differ."""
    pairs = []
    if state.final:
        pairs.append((got[-1], values[state.final]))
    for name, axis in state.scans:
        pairs.append((got if axis == 0 else got.transpose(1, 0, 2), values[name]))
    worst = 0.0
    for mine, theirs in pairs:
        if mine.shape != theirs.shape:
            return None
        scale = max(1.0, float(np.abs(theirs).max(initial=0.0)))
        worst = max(worst, float(np.abs(mine - theirs).max(initial=0.0)) / scale)
    return worst


def _candidates(weights: list, I: int, H: int):
    """GruCells from the weights by their shapes, each with every form qtool computes."""
    def of(shape):
        return [w for w in weights if w.shape == shape]

    forms = [(g, a, b, c) for (g, a, b), c in itertools.product(GATES, CANDIDATES)]
    # Keras: kernel [I, 3H], recurrent kernel [H, 3H] (or its z | r and h blocks apart: TFLite folds
    # the slices of a reset-before cell), gates z | r | h; bias [3H] (reset before) or [2, 3H] (the
    # input's and the recurrent matmul's; TFLite keeps them apart, each on its FULLY_CONNECTED)
    recurrent = of((H, 3 * H)) + [np.concatenate([a, b], axis=1) for a in of((H, 2 * H)) for b in of((H, H))]
    zero = np.zeros(3 * H, np.float32)
    vectors = of((3 * H,))
    after = [(b[0], b[1]) for b in of((2, 3 * H))] + [(a, b) for a in vectors + [zero] for b in vectors + [zero]]
    before = [(b, zero) for b in vectors + [zero]]
    for K, R in itertools.product(of((I, 3 * H)), recurrent):
        for reset_after, biases in ((True, after), (False, before)):
            for bx, br in biases:
                for g, alpha, beta, c in forms:
                    form = CellForm(reset_after, g, alpha, beta, c)
                    yield GruCell(K.T.copy(), R.T.copy(), bx.copy(), br.copy(), form), "Keras GRU cell"
    # TF1 GRUCell: [r | u] = gate([x, h] Kg + bg), c = candidate([x, r h] Kc + bc), z = u
    for Kg, Kc in itertools.product(of((I + H, 2 * H)), of((I + H, H))):
        for bg, bc in itertools.product(of((2 * H,)) + [None], of((H,)) + [None]):
            bg = np.zeros(2 * H, np.float32) if bg is None else bg
            bc = np.zeros(H, np.float32) if bc is None else bc
            W = np.concatenate([Kg[:I, H:], Kg[:I, :H], Kc[:I]], axis=1).T
            R = np.concatenate([Kg[I:, H:], Kg[I:, :H], Kc[I:]], axis=1).T
            bx = np.concatenate([bg[H:], bg[:H], bc])
            for g, alpha, beta, c in forms:
                form = CellForm(False, g, alpha, beta, c)
                yield GruCell(W.copy(), R.copy(), bx.copy(), np.zeros(3 * H, np.float32), form), "TF1 GRUCell"


# ---- a cell of one matmul per gate (Keras 2's implementation=1: Mycroft Precise's files)

# ops that carry a matmul's result on linearly toward its gate (Mul and Div: by a constant)
LINEAR = {"Add", "Sub", "Identity", "Reshape", "Squeeze", "Unsqueeze", "Flatten", "Neg", "Cast", "Mul", "Div"}


def _gate_groups(a: _Anatomy, consts: dict[str, np.ndarray]) -> list[dict]:
    """The body's weights that one matmul or bias add each puts toward one gate, grouped by the
    first nonlinear op they reach (a gate's activation; for a reset-after candidate, the recurrent
    part reaches the product with r first): [{"x": [...], "h": [...], "b": [...]}], the matrices
    as [in, out], "x" those reading the step's input, "h" those reading the state. Empty where the
    body computes its gates otherwise (one matmul for all three, split after)."""
    body = a.body
    on_state = {s.body_in for s in a.states}
    for n in body.node:
        if any(i in on_state for i in n.input):
            on_state.update(o for o in n.output if o)
    readers: dict[str, list] = {}
    for n in body.node:
        for i in n.input:
            readers.setdefault(i, []).append(n)
    outputs = {o.name for o in body.output}

    def sinks(value: str) -> frozenset:
        found, todo, seen = set(), [value], set()
        while todo:
            v = todo.pop()
            if v in seen:
                continue
            seen.add(v)
            if v in outputs:
                found.add("output")
            for r in readers.get(v, []):
                computed = [i for i in r.input if i and i not in consts]
                if r.op_type in LINEAR and (r.op_type not in ("Mul", "Div") or len(computed) == 1):
                    todo.extend(o for o in r.output if o)
                else:
                    found.add(id(r))
        return frozenset(found)

    groups: dict[frozenset, dict] = {}
    for n in body.node:
        ins = list(n.input)
        if n.op_type == "MatMul" and len(ins) == 2 and ins[1] in consts and ins[0] not in consts:
            w, side = np.asarray(consts[ins[1]]), "h" if ins[0] in on_state else "x"
        elif n.op_type == "Add" and len(ins) == 2 and (ins[0] in consts) != (ins[1] in consts):
            w, side = np.asarray(consts[ins[0] if ins[0] in consts else ins[1]]), "b"
            if w.size < 2 or w.size != w.shape[-1]:
                continue
            w = w.reshape(-1)
        else:
            continue
        if w.dtype.kind != "f" or (side != "b" and w.ndim != 2):
            continue
        to = sinks(n.output[0])
        if len(to) != 1:
            return []
        groups.setdefault(to, {"x": [], "h": [], "b": []})[side].append(w.astype(np.float32))
    return list(groups.values())


def _body_constants(model, a: _Anatomy) -> dict[str, np.ndarray]:
    """The values a body reads that are constants: its initializers and Constant nodes, the outer
    graph's constants, values carried unchanged from an outer constant, and what the body computes
    from those alone (slices of a carried kernel, a float16 model's weights cast to float32)."""
    from onnx import numpy_helper

    from qtool.importers.onnx.fold import evaluate, foldable
    from qtool.importers.onnx.graph import Graph

    g = Graph(model.graph, "", None, _opset(model), model)
    consts = {t.name: numpy_helper.to_array(t) for t in a.body.initializer}
    for n in a.body.node:
        if n.op_type == "Constant" and attr(n, "value", None) is not None:
            consts[n.output[0]] = numpy_helper.to_array(attr(n, "value", None))
    for name in _outer_names(a.body):
        if name in g.constant:
            consts[name] = g.array(name)
    for inner, outer in a.invariant.items():
        if outer in g.constant:
            consts[inner] = g.array(outer)
    for n in a.body.node:
        if foldable(n) and n.input and all(i in consts for i in n.input if i):
            try:
                outs = evaluate("loop body", n, [consts[i] if i else None for i in n.input], _opset(model))
            except QtoolError:  # a node the evaluator cannot run is simply not constant
                continue
            consts.update({o: v for o, v in zip(n.output, outs) if o})
    return consts


def _gate_candidates(groups: list, I: int, H: int):
    """GruCells of groups that each feed one gate: z, r and g among them in every order (and for a
    reset-after cell, the group of g's recurrent part, which meets r before g's activation)."""
    def fits(group, x: bool, h: bool) -> bool:
        return (len(group["x"]) == int(x) and (not x or group["x"][0].shape == (I, H))
                and len(group["h"]) == int(h) and (not h or group["h"][0].shape == (H, H))
                and len(group["b"]) <= 2 and all(b.shape == (H,) for b in group["b"]))

    zero = np.zeros(H, np.float32)
    gates = [g for g in groups if fits(g, True, True)]
    inputs = [g for g in groups if fits(g, True, False)]  # g's input part, reset after
    recurrent = [g for g in groups if fits(g, False, True)]  # g's recurrent part, reset after
    forms = [(g, a, b, c) for (g, a, b), c in itertools.product(GATES, CANDIDATES)]

    def bias(group) -> np.ndarray:
        return sum(group["b"], zero)

    for z, r in itertools.permutations(gates, 2):
        zr_W, zr_R = [z["x"][0].T, r["x"][0].T], [z["h"][0].T, r["h"][0].T]
        bx_zr = [bias(z), bias(r)]
        cells = []
        for g in gates:  # reset before: g's recurrent matmul reads r * h
            if g is not z and g is not r:
                cells.append((False, g["x"][0].T, g["h"][0].T, bias(g), zero))
        for gx, gh in itertools.product(inputs, recurrent):
            cells.append((True, gx["x"][0].T, gh["h"][0].T, bias(gx), bias(gh)))
        for reset_after, W_g, R_g, bx_g, br_g in cells:
            W = np.concatenate([*zr_W, W_g]).astype(np.float32)
            R = np.concatenate([*zr_R, R_g]).astype(np.float32)
            bx = np.concatenate([*bx_zr, bx_g]).astype(np.float32)
            br = np.concatenate([zero, zero, br_g]).astype(np.float32)
            for gate, alpha, beta, c in forms:
                form = CellForm(reset_after, gate, alpha, beta, c)
                yield GruCell(W, R, bx, br, form), "Keras GRU cell, a matmul per gate"


def _outer_names(body) -> list[str]:
    """The values of the outer graph a body reads (its nested bodies' too)."""
    made = {o for n in body.node for o in n.output} | {i.name for i in body.input} | {t.name for t in body.initializer}
    names = []
    for n in body.node:
        names += [i for i in n.input if i and i not in made]
        for g in (attr(n, k, None) for k in ("body", "then_branch", "else_branch")):
            if g is not None:
                names += [i for i in _outer_names(g) if i not in made]
    return list(dict.fromkeys(names))


def _weights(consts: dict[str, np.ndarray]) -> list[np.ndarray]:
    """The float matrices and vectors among a body's constants (`_body_constants`)."""
    out = []
    for w in consts.values():
        w = np.asarray(w)
        if w.dtype.kind == "f" and w.ndim in (1, 2) and w.size > 1:
            out.append(w.astype(np.float32))
    return out


def _opset(model) -> int:
    return next((int(o.version) for o in model.opset_import if o.domain in ("", "ai.onnx")), 14)


# ---- running the graph up to the loop


def _probe_steps(model, a: _Anatomy) -> list[int | None]:
    """The input lengths to probe at: the input's steps where fixed, else two lengths."""
    return [None] if _fixed_steps(model) else [PROBE_STEPS, PROBE_STEPS - 3]


def _fixed_steps(model) -> bool:
    for i in model.graph.input:
        dims = i.type.tensor_type.shape.dim
        if len(dims) == 3 and not dims[1].dim_value:
            return False
    return True


def _probe(model, a: _Anatomy, where: str, steps: int | None) -> dict:
    """The values around the loop (its inputs, the sequence, its outputs) on random inputs of the
    model: ONNX's reference evaluator runs the graph from the model's inputs to the loop."""
    from onnx import TensorProto, helper
    from onnx.reference import ReferenceEvaluator

    from qtool.importers.onnx.graph import Graph

    g = Graph(model.graph, where, None, _opset(model), model)
    wanted = [s.init for s in a.states] + [a.sequence] + [s.final for s in a.states if s.final]
    wanted += [name for s in a.states for name, _ in s.scans]
    wanted = list(dict.fromkeys(wanted))
    order = {id(n): k for k, n in enumerate(g.nodes)}
    nodes, todo, seen = {}, list(wanted) + [i for i in a.node.input if i] + _outer_names(a.body), set()
    while todo:
        v = todo.pop()
        if v in seen or v in g.consts or v not in g.producer:
            seen.add(v)
            continue
        seen.add(v)
        n = g.producer[v]
        nodes[id(n)] = n
        todo.extend(i for i in n.input if i)
        for sub in (attr(n, k, None) for k in ("body", "then_branch", "else_branch")):
            if sub is not None:
                todo.extend(_outer_names(sub))
    cone = sorted(nodes.values(), key=lambda n: order[id(n)])
    read = {i for n in cone for i in n.input} | set(_outer_names(a.body)) | set(wanted)
    rng = np.random.default_rng(0)
    feeds, inputs = {}, []
    for i in model.graph.input:
        if i.name in read and i.name not in g.consts:
            feeds[i.name] = _random_input(i, steps, rng)
            inputs.append(helper.make_tensor_value_info(i.name, _elem(i), None))
    inits = [g.tensor(k) for k in g.consts if k in read]
    sub = helper.make_graph(cone, "probe", inputs, [helper.make_tensor_value_info(w, TensorProto.UNDEFINED, None)
                                                    for w in wanted], inits)
    try:
        with quiet():
            got = ReferenceEvaluator(helper.make_model(sub, opset_imports=model.opset_import)).run(None, feeds)
    except Exception as e:  # the evaluator raises many types on graphs it cannot run
        raise NotACell(f"ONNX's reference evaluator cannot run the graph up to it ({reason(e)})") from None
    values = dict(zip(wanted, (np.asarray(v) for v in got)))
    seq = values[a.sequence]
    if seq.ndim != 3 or seq.dtype.kind != "f":
        raise NotACell(f"the sequence it reads has shape {list(seq.shape)}; a GRU reads [T, N, C]")
    if a.node.op_type == "Loop":  # onnx.reference's Loop concatenates its per-step outputs where ONNX stacks them
        for name, _ in (x for s in a.states for x in s.scans):
            values[name] = values[name].reshape(seq.shape[0], -1, values[name].shape[-1])
    return values


def _random_input(info, steps: int | None, rng) -> np.ndarray:
    dims = [d.dim_value or None for d in info.type.tensor_type.shape.dim]
    shape = [PROBE_SEQUENCES if k == 0 and d is None else (steps or PROBE_STEPS) if d is None else d
             for k, d in enumerate(dims)]
    if len(dims) == 3 and steps is not None:
        shape[1] = steps
    if _elem(info) != FLOAT:
        raise NotACell(f"the model's input '{info.name}' is not float")
    return rng.standard_normal(shape).astype(np.float32)


# ---- the rewrite


def _read(model, a: _Anatomy) -> set[str]:
    """The values the graph reads besides the loop; refused when one is a loop output no GRU makes."""
    read = {i for n in model.graph.node if n is not a.node for i in n.input} | {o.name for o in model.graph.output}
    read |= {i for n in model.graph.node for k in ("body", "then_branch", "else_branch")
             if attr(n, k, None) is not None for i in _outer_names(attr(n, k, None))}
    used = [o for o in a.unused if o and o in read]
    if used:
        raise NotACell(f"the graph reads its output '{used[0]}', which is no state of a GRU")
    return read


def _replace(model, a: _Anatomy, cells: list, note: str) -> None:
    """The loop's node becomes its GRU nodes, each loop output the same value computed from them."""
    from onnx import helper, numpy_helper

    read = _read(model, a)
    base, opset = _name(a.node), _opset(model)
    nodes, inits = [], []
    taken = ({o for n in model.graph.node for o in n.output} | {t.name for t in model.graph.initializer}
             | {i.name for i in model.graph.input} | {n.name for n in model.graph.node})

    def fresh(name: str) -> str:  # a name the file does not use already
        k, out = 1, name
        while out in taken:
            k, out = k + 1, f"{name}_{k}"
        taken.add(out)
        return out

    def const(name: str, value: np.ndarray) -> str:
        name = fresh(name)
        inits.append(numpy_helper.from_array(value, name))
        return name

    def squeeze(x: str, axis: int, out: str) -> None:
        if opset >= 13:
            nodes.append(helper.make_node("Squeeze", [x, const(f"{out}/axes", np.array([axis], np.int64))], [out]))
        else:
            nodes.append(helper.make_node("Squeeze", [x], [out], axes=[axis]))

    x = a.sequence
    for k, ((cell, _), state) in enumerate(zip(cells, a.states)):
        name = base if len(cells) == 1 else fresh(f"{base}/cell{k}")
        H, f = cell.R.shape[1], cell.form
        acts = [ONNX_NAMES[f.gate], ONNX_NAMES[f.candidate]]
        alphas = ([f.gate_alpha] if f.gate == "hard_sigmoid" else []) + ([1.0] if f.candidate == "linear" else [])
        betas = ([f.gate_beta] if f.gate == "hard_sigmoid" else []) + ([0.0] if f.candidate == "linear" else [])
        extra = {"activation_alpha": alphas, "activation_beta": betas} if alphas else {}
        W = const(f"{name}/W", cell.W[None].astype(np.float32))
        R = const(f"{name}/R", cell.R[None].astype(np.float32))
        B = const(f"{name}/B", np.concatenate([cell.bx, cell.br])[None].astype(np.float32))
        Y, Y_h = fresh(f"{name}/Y"), fresh(f"{name}/Y_h")
        nodes.append(helper.make_node("GRU", [x, W, R, B], [Y, Y_h], name=name, hidden_size=H,
                                      linear_before_reset=int(f.reset_after), activations=acts,
                                      doc_string=f"{LOOP_NOTE}: {note}", **extra))
        x = fresh(f"{name}/sequence")
        squeeze(Y, 1, x)
        if state.final and state.final in read:
            squeeze(Y_h, 0, state.final)
        for out, kind, shape in state.copies:  # a buffer of its steps: fixed shapes (TFLite's)
            if out in read:
                steps = fresh(f"{name}/{kind}")
                if kind == "last":
                    squeeze(Y_h, 0, steps)
                else:
                    nodes.append(helper.make_node("Identity", [x], [steps]))
                nodes.append(helper.make_node("Reshape", [steps, const(f"{out}/shape", np.array(shape, np.int64))],
                                              [out]))
        for out, axis in state.scans:
            if out in read:
                if axis == 0:
                    nodes.append(helper.make_node("Identity", [x], [out]))
                else:
                    nodes.append(helper.make_node("Transpose", [x], [out], perm=[1, 0, 2]))
    position = list(model.graph.node).index(a.node)
    del model.graph.node[position]
    for k, n in enumerate(nodes):
        model.graph.node.insert(position + k, n)
    model.graph.initializer.extend(inits)


# ---- what the import says of a loop it does not read


def unread_recurrent(nodes) -> str | None:
    """`node 'name' (Op) is ...` for the first recurrent node of `nodes` that qtool does not read; a
    loop says what its body computes and which values of the outer graph it reads."""
    for n in nodes:
        if n.domain not in ("", "ai.onnx"):
            continue
        if n.op_type in UNREAD_RECURRENT:
            return f"node '{n.name or n.output[0]}' ({n.op_type}) is {UNREAD_RECURRENT[n.op_type]}"
        if n.op_type in LOOPS:
            why = loop_note(n)
            return (f"node '{n.name or n.output[0]}' ({n.op_type}) is a recurrent loop{_body(n)}"
                    + (f"; it is no GRU: {why}" if why else "") + _LOOP_TAIL)
    return None


def loop_note(node) -> str | None:
    """What qtool.importers.onnx.loops said of `node`: why it left a loop as it is, or which loop a
    GRU node was read from; None for the file's own nodes."""
    text = node.doc_string or ""
    return text[len(LOOP_NOTE) + 2:] if text.startswith(LOOP_NOTE + ": ") else None


def _body(node) -> str:
    """What a loop's body computes (its ops by type) and the outer values it reads."""
    body = attr(node, "body", None)
    if body is None:
        return ""
    ops: dict[str, int] = {}
    for b in body.node:
        ops[b.op_type] = ops.get(b.op_type, 0) + 1
    made = {o for b in body.node for o in b.output} | {i.name for i in body.input} | {t.name for t in body.initializer}
    outer = list(dict.fromkeys(i for b in body.node for i in b.input if i and i not in made))
    kinds = ", ".join(f"{op} x{k}" if k > 1 else op for op, k in sorted(ops.items(), key=lambda kv: (-kv[1], kv[0])))
    text = f" whose body computes {len(body.node)} op(s) ({kinds})"
    if outer:
        shown = ", ".join(f"'{v}'" for v in outer[:6]) + (f" and {len(outer) - 6} more" if len(outer) > 6 else "")
        text += f" and reads {len(outer)} value(s) of the outer graph ({shown})"
    return text
