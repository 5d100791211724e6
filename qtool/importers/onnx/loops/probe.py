"""Running the graph up to a loop on random inputs of the model (ONNX's reference evaluator): the
values around the loop that its cells are proved on."""

from __future__ import annotations

import numpy as np

from qtool.importers.checks import quiet, reason
from qtool.importers.onnx.fold import attr
from qtool.importers.onnx.loops.anatomy import FLOAT, Anatomy, NotACell, elem, opset, outer_names

PROBE_SEQUENCES = 3
PROBE_STEPS = 8  # where the input's steps are not fixed; a second length checks the trip count


def probe_steps(model, a: Anatomy) -> list[int | None]:
    """The input lengths to probe at: the input's steps where fixed, else two lengths."""
    return [None] if _fixed_steps(model) else [PROBE_STEPS, PROBE_STEPS - 3]


def _fixed_steps(model) -> bool:
    for i in model.graph.input:
        dims = i.type.tensor_type.shape.dim
        if len(dims) == 3 and not dims[1].dim_value:
            return False
    return True


def probe(model, a: Anatomy, where: str, steps: int | None) -> dict:
    """The values around the loop (its inputs, the sequence, its outputs) on random inputs of the
    model: ONNX's reference evaluator runs the graph from the model's inputs to the loop."""
    from onnx import TensorProto, helper
    from onnx.reference import ReferenceEvaluator

    from qtool.importers.onnx.graph import Graph

    g = Graph(model.graph, where, None, opset(model), model)
    wanted = [s.init for s in a.states] + [a.sequence] + [s.final for s in a.states if s.final]
    wanted += [name for s in a.states for name, _ in s.scans]
    wanted += list(a.reversed_from or ())
    wanted = list(dict.fromkeys(wanted))
    order = {id(n): k for k, n in enumerate(g.nodes)}
    nodes, todo, seen = {}, list(wanted) + [i for i in a.node.input if i] + outer_names(a.body), set()
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
                todo.extend(outer_names(sub))
    cone = sorted(nodes.values(), key=lambda n: order[id(n)])
    read = {i for n in cone for i in n.input} | set(outer_names(a.body)) | set(wanted)
    rng = np.random.default_rng(0)
    feeds, inputs = {}, []
    for i in model.graph.input:
        if i.name in read and i.name not in g.consts:
            feeds[i.name] = random_input(i, steps, rng)
            inputs.append(helper.make_tensor_value_info(i.name, elem(i), None))
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
    if a.reversed_from and np.any(np.asarray(values[a.reversed_from[1]]).reshape(-1) != seq.shape[0]):
        raise NotACell("it reads a sequence reversed over lengths other than the whole sequence's")
    if a.node.op_type == "Loop":  # onnx.reference's Loop concatenates its per-step outputs where ONNX stacks them
        for name, _ in (x for s in a.states for x in s.scans):
            values[name] = values[name].reshape(seq.shape[0], -1, values[name].shape[-1])
    return values


def random_input(info, steps: int | None, rng) -> np.ndarray:
    dims = [d.dim_value or None for d in info.type.tensor_type.shape.dim]
    shape = [PROBE_SEQUENCES if k == 0 and d is None else (steps or PROBE_STEPS) if d is None else d
             for k, d in enumerate(dims)]
    if len(dims) == 3 and steps is not None:
        shape[1] = steps
    if elem(info) != FLOAT:
        raise NotACell(f"the model's input '{info.name}' is not float")
    return rng.standard_normal(shape).astype(np.float32)
