"""Keras' Bidirectional GRU as tf2onnx writes it: a forward loop, and a backward loop on the
sequence reversed (ReverseSequence), their outputs joined. Once the loops are GRU nodes (the
backward one a GRU of direction "reverse", its loop-order steps reversed back), this part

- removes the reversals that cancel: the loop's last step of a backward GRU is its final state,
  and a reversal of the loop-order steps is the GRU's own steps;
- joins a forward and a backward GRU node that read the same sequence into one bidirectional GRU
  node where the model concatenates their outputs on the channels;

each step taken only where ONNX's reference evaluator finds the model's outputs unchanged on
probe inputs. What remains (a backward GRU alone: go_backwards) stays, and the import refuses it.
"""

from __future__ import annotations

import numpy as np

from qtool.importers.onnx.fold import attr
from qtool.importers.onnx.loops.probe import random_input
from qtool.importers.onnx.loops.rewrite import LOOP_NOTE

TOLERANCE = 1e-5


def pair_directions(model) -> None:
    """Simplify the reversals around backward GRUs and join forward-backward pairs (in place), or
    leave the model as it was where the result would compute anything else."""
    from onnx import ModelProto

    ours = [n for n in model.graph.node if n.op_type == "ReverseSequence" and n.doc_string.startswith(LOOP_NOTE)]
    if not ours:
        return
    before = ModelProto()
    before.CopyFrom(model)
    feeds = _feeds(model)
    want = _run(model, [o.name for o in model.graph.output], feeds)
    for rs in ours:
        _cancel(model, rs)
    _join(model, feeds)
    _prune(model)
    got = _run(model, [o.name for o in model.graph.output], feeds)
    if got is None or want is None or any(not _close(a, b) for a, b in zip(got, want)):
        model.CopyFrom(before)


def _feeds(model) -> dict:
    rng = np.random.default_rng(1)
    consts = {t.name for t in model.graph.initializer}
    return {i.name: random_input(i, None, rng) for i in model.graph.input if i.name not in consts}


def _run(model, names: list[str], feeds: dict) -> list | None:
    """`names` evaluated by ONNX's reference evaluator on `feeds`; None where it cannot run."""
    from onnx import ModelProto, helper
    from onnx.reference import ReferenceEvaluator

    from qtool.importers.checks import quiet

    m = ModelProto()
    m.CopyFrom(model)
    del m.graph.output[:]
    m.graph.output.extend(helper.make_tensor_value_info(n, 0, None) for n in names)
    try:
        with quiet():
            return [np.asarray(v) for v in ReferenceEvaluator(m).run(None, feeds)]
    except Exception:  # noqa: BLE001 (a model the evaluator cannot run is left as it was)
        return None


def _close(a: np.ndarray, b: np.ndarray) -> bool:
    return a.shape == b.shape and float(np.abs(a - b).max(initial=0.0)) <= TOLERANCE * max(
        1.0, float(np.abs(b).max(initial=0.0)))


def _readers(model, name: str, values: bool = False) -> list:
    """The nodes that read `name`; with `values`, not those that read only its shape."""
    return [n for n in model.graph.node if name in n.input and not (values and n.op_type == "Shape")]


def _ints(model, name: str) -> list[int] | None:
    from onnx import numpy_helper

    t = next((t for t in model.graph.initializer if t.name == name), None)
    return None if t is None else [int(v) for v in numpy_helper.to_array(t).reshape(-1)]


def _cancel(model, rs) -> None:
    """Readers of a backward GRU's loop-order steps `rs`: the last loop step is the GRU's final
    state; a reversal back (through Transposes that keep time first, or the Reshape that moves a
    batch of one before it) is the GRU's own steps."""
    from onnx import helper

    steps, Y_h = rs.input[0], rs.doc_string[len(LOOP_NOTE) + 2:]
    for r in _readers(model, rs.output[0]):
        if r.op_type == "Slice" and len(r.input) >= 4 and _ints(model, r.input[1]) == [-1] and \
                _ints(model, r.input[3]) == [0] and (_ints(model, r.input[2]) or [0])[0] >= 2 ** 31 - 1 and \
                (len(r.input) < 5 or _ints(model, r.input[4]) in ([1], None)):
            r.CopyFrom(helper.make_node("Identity", [Y_h], [r.output[0]], name=r.name))
            continue
        chain, at, perm, moved = [r], r, list(range(3)), False
        while at.op_type in ("Transpose", "Reshape", "Identity") and len(_readers(model, at.output[0], True)) == 1:
            if at.op_type == "Transpose":
                perm = [perm[p] for p in attr(at, "perm", [2, 1, 0])]
            elif at.op_type == "Reshape":  # TFLite's batch of one: [T, 1, H] -> [1, T, H] (checked below)
                moved = True
            at = _readers(model, at.output[0], True)[0]
            chain.append(at)
        time_axis = attr(at, "time_axis", 0)
        if at.op_type == "ReverseSequence" and ((perm[0] == 0 and time_axis == 0) or (moved and time_axis == 1)):
            chain[0].input[list(chain[0].input).index(rs.output[0])] = steps  # time stays first: undo both
            at.CopyFrom(helper.make_node("Identity", [at.input[0]], [at.output[0]], name=at.name))


def _join(model, feeds: dict) -> None:
    """A forward and a backward GRU node (read from loops) on the same sequence, whose outputs the
    model concatenates on the channels: one bidirectional GRU node computing that concatenation."""
    from onnx import helper, numpy_helper

    grus = [n for n in model.graph.node if n.op_type == "GRU" and n.doc_string.startswith(LOOP_NOTE)]
    inits = {t.name: t for t in model.graph.initializer}
    for f in [g for g in grus if attr(g, "direction", "forward") == "forward"]:
        for b in [g for g in grus if attr(g, "direction", "forward") == "reverse" and g.input[0] == f.input[0]]:
            same = [(a.name, helper.get_attribute_value(a)) for a in f.attribute]
            other = [(a.name, helper.get_attribute_value(a)) for a in b.attribute if a.name != "direction"]
            if same != other:
                continue
            both = [np.concatenate([numpy_helper.to_array(inits[f.input[k]]), numpy_helper.to_array(inits[b.input[k]])])
                    for k in (1, 2, 3)]
            names = [f"{f.name}+{b.name}/{k}" for k in ("W", "R", "B", "Y", "Y_h", "seq", "seq_t", "last", "last_t")]
            model.graph.initializer.extend(numpy_helper.from_array(w.astype(np.float32), n)
                                           for w, n in zip(both, names[:3]))
            shape_seq, shape_last = f"{names[0]}/shape_seq", f"{names[0]}/shape_last"
            model.graph.initializer.extend([numpy_helper.from_array(np.array([0, 0, -1], np.int64), shape_seq),
                                            numpy_helper.from_array(np.array([0, -1], np.int64), shape_last)])
            attrs = dict(same, direction="bidirectional")
            for k in ("activations", "activation_alpha", "activation_beta"):  # per direction, each listed
                if k in attrs:
                    attrs[k] = list(attrs[k]) * 2
            new = [helper.make_node("GRU", [f.input[0], *names[:3]], names[3:5], name=f"{f.name}+{b.name}",
                                    doc_string=f.doc_string, **attrs),
                   helper.make_node("Transpose", [names[3]], [names[6]], perm=[0, 2, 1, 3]),
                   helper.make_node("Reshape", [names[6], shape_seq], [names[5]]),
                   helper.make_node("Transpose", [names[4]], [names[8]], perm=[1, 0, 2]),
                   helper.make_node("Reshape", [names[8], shape_last], [names[7]])]
            at = list(model.graph.node).index(f)
            for k, n in enumerate(new):
                model.graph.node.insert(at + k, n)
            concats = [n for n in model.graph.node if n.op_type == "Concat"]
            got = _run(model, [c.output[0] for c in concats] + [names[5], names[7]], feeds)
            if got is None:
                continue
            for c, value in zip(concats, got):
                for joined, candidate in ((names[5], got[-2]), (names[7], got[-1])):
                    if _close(candidate, value):
                        c.CopyFrom(helper.make_node("Identity", [joined], [c.output[0]], name=c.name))
                        break
                    if candidate.ndim == 3 and _close(candidate.transpose(1, 0, 2), value):  # joined batch first
                        c.CopyFrom(helper.make_node("Transpose", [joined], [c.output[0]], name=c.name, perm=[1, 0, 2]))
                        break


def _prune(model) -> None:
    """Nodes nothing reads and no model output is: gone (the GRU importer takes every GRU node)."""
    while True:
        read = {i for n in model.graph.node for i in n.input} | {o.name for o in model.graph.output}
        dead = [n for n in model.graph.node if not any(o in read for o in n.output if o)]
        if not dead:
            return
        for n in dead:
            model.graph.node.remove(n)
