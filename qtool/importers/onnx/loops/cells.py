"""The GRU cell of each state of a loop: candidates from the body's weights by their shapes (a
concatenated kernel, or a matmul per gate grouped by the gate it reaches), each with every form
qtool's GRU computes, taken only when qtool's float GRU reproduces the loop on probe sequences."""

from __future__ import annotations

import itertools

import numpy as np

from qtool.core.model import CellForm, GruCell
from qtool.errors import QtoolError
from qtool.importers.onnx.fold import attr
from qtool.importers.onnx.loops.anatomy import Anatomy, NotACell, State, opset, outer_names
from qtool.importers.onnx.loops.probe import probe, probe_steps

TOLERANCE = 1e-4  # of the larger of 1 and the state's peak: float32 rounding, not a different cell
# what a cell's gates and candidate may compute: qtool's CellForm and how an ONNX GRU node says it
GATES = (("sigmoid", None, None), ("hard_sigmoid", 0.2, 0.5), ("hard_sigmoid", 1 / 6, 0.5))
CANDIDATES = ("tanh", "linear", "relu")
FORMS = [(g, a, b, c) for (g, a, b), c in itertools.product(GATES, CANDIDATES)]  # every (gate, candidate)


def find_cells(model, a: Anatomy, where: str) -> tuple[list, str]:
    """Each state's GruCell and cell kind, proved on probe sequences, in stack order (`a.states`
    reordered so); and what was checked."""
    consts = _body_constants(model, a)
    weights = _weights(consts)
    groups = _gate_groups(a, consts)
    runs = [probe(model, a, where, steps) for steps in probe_steps(model, a)]
    # a carried value of another rank than [N, H] is a buffer of a state's steps (TFLite's lowered
    # tensor lists: the last step as [1, N, H], or every step as [T, N, H]), not a state
    buffers = [s for s in a.states if runs[0][s.init].ndim != 2]
    a.states = [s for s in a.states if s not in buffers]
    if not a.states:
        raise NotACell("it carries no float state [N, H] from step to step")
    if a.reversed_from and len(a.states) > 1:
        raise NotACell("it runs a stack of cells backward; qtool reads one GRU layer run backward")
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


def _cell(weights: list, groups: list, state: State, inputs: list, runs: list) -> tuple | None:
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


def _buffer(a: Anatomy, b: State, runs: list) -> None:
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


def _distance(got: np.ndarray, values: dict, state: State) -> float | None:
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
                for g, alpha, beta, c in FORMS:
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
            for g, alpha, beta, c in FORMS:
                form = CellForm(False, g, alpha, beta, c)
                yield GruCell(W.copy(), R.copy(), bx.copy(), np.zeros(3 * H, np.float32), form), "TF1 GRUCell"


# ---- a cell of one matmul per gate (Keras 2's implementation=1: Mycroft Precise's files)

# ops that carry a matmul's result on linearly toward its gate (Mul and Div: by a constant)
LINEAR = {"Add", "Sub", "Identity", "Reshape", "Squeeze", "Unsqueeze", "Flatten", "Neg", "Cast", "Mul", "Div"}


def _gate_groups(a: Anatomy, consts: dict[str, np.ndarray]) -> list[dict]:
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


def _body_constants(model, a: Anatomy) -> dict[str, np.ndarray]:
    """The values a body reads that are constants: its initializers and Constant nodes, the outer
    graph's constants, values carried unchanged from an outer constant, and what the body computes
    from those alone (slices of a carried kernel, a float16 model's weights cast to float32)."""
    from onnx import numpy_helper

    from qtool.importers.onnx.fold import evaluate, foldable
    from qtool.importers.onnx.graph import Graph

    g = Graph(model.graph, "", None, opset(model), model)
    consts = {t.name: numpy_helper.to_array(t) for t in a.body.initializer}
    for n in a.body.node:
        if n.op_type == "Constant" and attr(n, "value", None) is not None:
            consts[n.output[0]] = numpy_helper.to_array(attr(n, "value", None))
    for name in outer_names(a.body):
        if name in g.constant:
            consts[name] = g.array(name)
    for inner, outer in a.invariant.items():
        if outer in g.constant:
            consts[inner] = g.array(outer)
    for n in a.body.node:
        if foldable(n) and n.input and all(i in consts for i in n.input if i):
            try:
                outs = evaluate("loop body", n, [consts[i] if i else None for i in n.input], opset(model))
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
            for gate, alpha, beta, c in FORMS:
                form = CellForm(reset_after, gate, alpha, beta, c)
                yield GruCell(W, R, bx, br, form), "Keras GRU cell, a matmul per gate"







def _weights(consts: dict[str, np.ndarray]) -> list[np.ndarray]:
    """The float matrices and vectors among a body's constants (`_body_constants`)."""
    out = []
    for w in consts.values():
        w = np.asarray(w)
        if w.dtype.kind == "f" and w.ndim in (1, 2) and w.size > 1:
            out.append(w.astype(np.float32))
    return out
