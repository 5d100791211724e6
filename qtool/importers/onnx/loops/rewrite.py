"""The rewrite: a loop's node becomes the ONNX GRU nodes its cells are, each loop output the same
value computed from them."""

from __future__ import annotations

import numpy as np

from qtool.importers.onnx.fold import attr
from qtool.importers.onnx.loops.anatomy import Anatomy, NotACell, name_of, opset, outer_names

ONNX_NAMES = {"sigmoid": "Sigmoid", "hard_sigmoid": "HardSigmoid", "tanh": "Tanh", "linear": "Affine", "relu": "Relu"}
LOOP_NOTE = "qtool.loop"  # how the import marks what it read of a loop (a GRU node's doc_string), and why not


def read_outside(model, a: Anatomy) -> set[str]:
    """The values the graph reads besides the loop; refused when one is a loop output no GRU makes."""
    read = {i for n in model.graph.node if n is not a.node for i in n.input} | {o.name for o in model.graph.output}
    read |= {i for n in model.graph.node for k in ("body", "then_branch", "else_branch")
             if attr(n, k, None) is not None for i in outer_names(attr(n, k, None))}
    used = [o for o in a.unused if o and o in read]
    if used:
        raise NotACell(f"the graph reads its output '{used[0]}', which is no state of a GRU")
    return read


def replace(model, a: Anatomy, cells: list, note: str) -> None:
    """The loop's node becomes its GRU nodes, each loop output the same value computed from them."""
    from onnx import helper, numpy_helper

    read = read_outside(model, a)
    base, version = name_of(a.node), opset(model)
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
        if version >= 13:
            nodes.append(helper.make_node("Squeeze", [x, const(f"{out}/axes", np.array([axis], np.int64))], [out]))
        else:
            nodes.append(helper.make_node("Squeeze", [x], [out], axes=[axis]))

    backward = a.reversed_from is not None  # a GRU run backward on the sequence the loop reverses
    x = a.reversed_from[0] if backward else a.sequence
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
                                      doc_string=f"{LOOP_NOTE}: {note}",
                                      **({"direction": "reverse"} if backward else {}), **extra))
        x = fresh(f"{name}/sequence")
        squeeze(Y, 1, x)
        if backward:  # the loop's steps are the GRU's in reverse order (`pair_directions` undoes it)
            steps = fresh(f"{name}/loop_order")
            nodes.append(helper.make_node("ReverseSequence", [x, a.reversed_from[1]], [steps], batch_axis=1,
                                          time_axis=0, doc_string=f"{LOOP_NOTE}: {Y_h}"))
            x = steps
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
