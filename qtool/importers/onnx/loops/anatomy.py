"""A loop's anatomy from its signature: which carried value is a float state, which outer value
the body reads one step at a time (the sequence, time first), which per-step output stacks which
state; and the helpers the other parts read bodies with."""

from __future__ import annotations

from dataclasses import dataclass, field

from qtool.importers.onnx.fold import attr

FLOAT = 1  # TensorProto.FLOAT


class NotACell(Exception):
    """Why a loop is not GRU cells (said by the import's refusal of the loop)."""


@dataclass
class State:
    init: str  # the outer value it starts from
    body_in: str
    body_out: str
    final: str  # the loop's output of its last value ("" when not produced)
    scans: list  # (the loop's per-step output, the axis it stacks steps on)
    copies: list = field(default_factory=list)  # (a loop output, "last" or "all" steps, its shape)


@dataclass
class Anatomy:
    node: object
    body: object
    sequence: str  # the outer value read one step at a time, time first [T, N, C]
    states: list
    unused: list  # the loop's other outputs (counters, invariants): nothing may read them
    invariant: dict = field(default_factory=dict)  # a body input carried unchanged -> its outer value
    # (the sequence before, the lengths) where the loop reads a ReverseSequence of it: a GRU run
    # backward (tf2onnx's Keras go_backwards and Bidirectional); the lengths proved whole by the probe
    reversed_from: tuple | None = None


def name_of(node) -> str:
    return node.name or node.output[0]


def anatomy(graph, node) -> Anatomy:
    body = attr(node, "body", None)
    if body is None:
        raise NotACell("it has no body")
    a = _loop(graph, node, body) if node.op_type == "Loop" else _scan(graph, node, body)
    rev = next((n for n in graph.node if a.sequence in n.output and n.op_type == "ReverseSequence"), None)
    if rev is not None and attr(rev, "batch_axis", 1) == 1 and attr(rev, "time_axis", 0) == 0:
        a.reversed_from = (rev.input[0], rev.input[1])
    return a


def elem(value_info) -> int:
    return value_info.type.tensor_type.elem_type


def identity_source(body, name: str, moves: tuple = ("Identity",)) -> str:
    """`name`, followed back through the body's nodes of `moves` (ops that keep the values)."""
    producer = {o: n for n in body.node for o in n.output}
    while name in producer and producer[name].op_type in moves:
        name = producer[name].input[0]
    return name


# ops that keep a state's values in another shape: a per-step output stacks the state so (tf2onnx
# writes a step's output as Squeeze(Unsqueeze(h))); the probe proves the values
RESHAPES = ("Identity", "Squeeze", "Unsqueeze", "Reshape", "Flatten")


def _loop(graph, node, body) -> Anatomy:
    carried = len(node.input) - 2
    if carried < 1 or len(body.input) != carried + 2 or len(body.output) < carried + 1:
        raise NotACell("its signature is not a loop's (carried values and body inputs differ in number)")
    scans = len(body.output) - 1 - carried
    ins, outs = [i.name for i in body.input[2:]], [o.name for o in body.output[1:]]
    counters = {body.input[0].name}
    states, unused, invariant = [], [], {}
    for k in range(carried):
        final = node.output[k] if k < len(node.output) else ""
        if identity_source(body, outs[k]) == ins[k]:
            invariant[ins[k]] = node.input[2 + k]
            unused.append(final)
        elif elem(body.input[2 + k]) == FLOAT:
            states.append(State(node.input[2 + k], ins[k], outs[k], final, []))
        else:
            counters.add(ins[k])
            unused.append(final)
    sequence = _gathered(body, counters, invariant)
    _scan_outputs(body, node, states, outs[carried:], node.output[carried:carried + scans], [0] * scans)
    return Anatomy(node, body, sequence, states, unused, invariant)


def _gathered(body, counters: set, invariant: dict) -> str:
    """The outer value a Loop's body reads one step at a time: Gather(value, step counter)."""
    made = {o for n in body.node for o in n.output} | {i.name for i in body.input} | {t.name for t in body.initializer}
    found = []
    for n in body.node:
        index = identity_source(body, n.input[1], RESHAPES + ("Cast",)) if len(n.input) == 2 else ""
        if n.op_type == "Gather" and index in counters and attr(n, "axis", 0) == 0:
            data = invariant.get(n.input[0], None if n.input[0] in made else n.input[0])
            if data is not None:
                found.append(data)
    if len(set(found)) != 1:
        raise NotACell("its body reads no one sequence a step at a time" if not found else
                       f"its body reads {len(set(found))} sequences a step at a time (a GRU reads one; a "
                       "second, such as Keras' mask of time steps, changes what it computes)")
    return found[0]


def _scan(graph, node, body) -> Anatomy:
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
        if elem(body.input[k]) == FLOAT and identity_source(body, outs[k]) != ins[k]:
            states.append(State(node.input[k], ins[k], outs[k], final, []))
        else:
            unused.append(final)
    scans = len(body.output) - n_states
    axes = list(attr(node, "scan_output_axes", [])) or [0] * scans
    _scan_outputs(body, node, states, outs[n_states:], node.output[n_states:n_states + scans], axes)
    return Anatomy(node, body, node.input[n_states], states, unused)


def _scan_outputs(body, node, states: list, body_outs: list, loop_outs: list, axes: list) -> None:
    """Give each per-step output to the state it stacks; one that stacks no state is no GRU's."""
    sources = {identity_source(body, s.body_out, RESHAPES): s for s in states}
    for out, name, axis in zip(body_outs, loop_outs, axes):
        state = sources.get(identity_source(body, out, RESHAPES))
        if state is None:
            raise NotACell(f"its per-step output '{name}' is not one of its states")
        if axis not in (0, 1, -3, -2):
            raise NotACell(f"it stacks its per-step output '{name}' on axis {axis}")
        state.scans.append((name, 0 if axis in (0, -3) else 1))
    if not states:
        raise NotACell("it carries no float state from step to step")


def outer_names(body) -> list[str]:
    """The values of the outer graph a body reads (its nested bodies' too)."""
    made = {o for n in body.node for o in n.output} | {i.name for i in body.input} | {t.name for t in body.initializer}
    names = []
    for n in body.node:
        names += [i for i in n.input if i and i not in made]
        for g in (attr(n, k, None) for k in ("body", "then_branch", "else_branch")):
            if g is not None:
                names += [i for i in outer_names(g) if i not in made]
    return list(dict.fromkeys(names))


def opset(model) -> int:
    return next((int(o.version) for o in model.opset_import if o.domain in ("", "ai.onnx")), 14)
