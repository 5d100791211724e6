"""ONNX `GRU` nodes: W [dirs, 3H, C], R [dirs, 3H, H], B [dirs, 6H] (Wb then Rb), gates z | r | h
(the canonical order); `linear_before_reset` 1 (the haste form) or 0 (ONNX's default: the reset
gate on h before the recurrent GEMM; Wb and Rb both simply added); `activations` per direction
f (Sigmoid, HardSigmoid) and g (Tanh, Relu, Affine(1, 0) = linear). Needs the optional `onnx` package.

Every attribute and input of a GRU node is either supported or refused: other activations, clip,
direction 'reverse', sequence_lens and a non-zero initial_h change the math.
Weights may be initializers (inline or in external data beside the model) or computed from them
(torch.onnx's default exporter concatenates slices of the PyTorch tensors): constant subgraphs are
evaluated (onnx_fold.py). Several GRU nodes form one stack when each reads the one before's output
through ops that concatenate its directions (onnx_graph.py); each is also available by its node name.
Each Stack says which nodes it took and what else computes in the file (onnx_scope.py).
"""

from __future__ import annotations

from functools import partial
from pathlib import Path

import numpy as np

from qtool.core.model import CellForm
from qtool.errors import QtoolError
from qtool.importers.checks import expect_shape, hidden_from_recurrent, reason
from qtool.importers.onnx.graph import Graph, attr
from qtool.importers.onnx.loops import load_onnx, loop_note, unread_recurrent
from qtool.importers.onnx.scope import Scope
from qtool.importers.stack import Stack

# output_sequence (GRU-1, GRU-3) only says whether Y is produced; activation_alpha/beta
# parameterise HardSigmoid and Affine (the other activations that take them are refused)
ATTRIBUTES = {"activation_alpha", "activation_beta", "activations", "clip", "direction", "hidden_size",
              "layout", "linear_before_reset", "output_sequence"}
GATES = {"sigmoid": "sigmoid", "hardsigmoid": "hard_sigmoid"}  # f, by ONNX name (as ONNX Runtime, any case)
CANDIDATES = {"tanh": "tanh", "relu": "relu", "affine": "linear"}  # g; Affine only as alpha 1, beta 0
# (alpha, beta) when the lists run out: HardSigmoid's operator defaults; Affine's alpha differs
# between runtimes (ONNX Runtime takes 0), so it must be given
DEFAULTS = {"hardsigmoid": (0.2, 0.5), "affine": (None, 0.0)}


def _check_attributes(node, where: str) -> int:
    """Refuse every attribute qtool does not compute; returns the number of directions."""
    unknown = sorted({a.name for a in node.attribute} - ATTRIBUTES)
    if unknown:
        raise QtoolError(f"{where} has attribute(s) {', '.join(unknown)} that qtool does not know")
    if attr(node, "linear_before_reset", 0) not in (0, 1):
        raise QtoolError(f"{where} has linear_before_reset={attr(node, 'linear_before_reset', 0)!r:.40}; "
                         "ONNX defines 0 and 1")
    direction = attr(node, "direction", "forward")
    if direction not in ("forward", "bidirectional"):
        raise QtoolError(f"{where} has direction '{direction}'; only forward and bidirectional are supported"
                         + ("; a GRU run backward alone (Keras' go_backwards=True) has no integer form in qtool"
                            if direction == "reverse" else ""))
    dirs = 2 if direction == "bidirectional" else 1
    forms(node, dirs, where)
    if attr(node, "clip", None) is not None:
        raise QtoolError(f"{where} clips its pre-activations (clip={attr(node, 'clip', None)}); not supported")
    if attr(node, "layout", 0) != 0:  # ONNX Runtime does not run layout=1 either
        raise QtoolError(f"{where} has layout={attr(node, 'layout', 0)}; only layout=0 (time-first) "
                         "is supported")
    return dirs


def _parameters(node, names: list[str], where: str) -> list[tuple]:
    """(alpha, beta) of each activation, taken from activation_alpha and activation_beta in
    order by the activations that have them (as ONNX Runtime reads them)."""
    alphas, betas = (list(attr(node, k, [])) for k in ("activation_alpha", "activation_beta"))
    found = []
    for name in names:
        if name not in DEFAULTS:
            found.append((None, None))
            continue
        alpha = alphas.pop(0) if alphas else DEFAULTS[name][0]
        found.append((alpha, betas.pop(0) if betas else DEFAULTS[name][1]))
    if alphas or betas:
        raise QtoolError(f"{where} has {len(alphas)} activation_alpha and {len(betas)} activation_beta values "
                         f"more than its activations {attr(node, 'activations', None)} take")
    return found


def forms(node, dirs: int, where: str) -> list[CellForm]:
    """Each direction's CellForm from linear_before_reset and the activations (f, g per direction)."""
    acts = attr(node, "activations", None)
    names = ["sigmoid", "tanh"] * dirs if acts is None else [str(a).lower() for a in acts]
    if len(names) != 2 * dirs:
        raise QtoolError(f"{where} has activations {acts}; a GRU of {dirs} direction(s) takes {2 * dirs} "
                         "(f for the gates and g for the candidate, per direction)")
    params = _parameters(node, names, where)
    found = []
    for d in range(dirs):
        f, g = names[2 * d], names[2 * d + 1]
        if f not in GATES:
            raise QtoolError(f"{where} has activation {acts[2 * d]!r} for its gates (f); qtool's GRU computes "
                             "Sigmoid or HardSigmoid there")
        if g not in CANDIDATES or g == "affine" and params[2 * d + 1] != (1.0, 0.0):
            what = repr(acts[2 * d + 1]) if g != "affine" else (
                "Affine without an activation_alpha (runtimes differ on its default)"
                if params[2 * d + 1][0] is None else "Affine(alpha={:g}, beta={:g})".format(*params[2 * d + 1]))
            raise QtoolError(f"{where} has activation {what} for its candidate (g); qtool's GRU computes Tanh, "
                             "Relu or Affine with alpha 1 and beta 0 (linear) there")
        alpha, beta = params[2 * d] if f == "hardsigmoid" else (None, None)
        try:
            found.append(CellForm(attr(node, "linear_before_reset", 0) == 1, GATES[f], alpha, beta, CANDIDATES[g]))
        except QtoolError as e:
            raise QtoolError(f"{where}: {e}") from None
    return found


def _check_inputs(graph: Graph, node, where: str) -> None:
    """Refuse the inputs that change the math."""
    inputs = list(node.input) + [""] * (6 - len(node.input))
    if inputs[4]:
        raise QtoolError(f"{where} takes sequence_lens ('{inputs[4]}'); qtool runs every sequence over "
                         "all its time steps (export without sequence lengths)")
    # zeros: a zero constant, ConstantOfShape 0 of any shape, and values moved from them; the graph
    # inputs a state comes from (torch.onnx.export's h0, whole or sliced per layer) are refused
    origin = graph.state_origin(inputs[5]) if inputs[5] else set()
    if origin is None:
        raise QtoolError(f"{where} starts from initial_h '{inputs[5]}', which is not zero; qtool's GRU "
                         "starts every sequence from h = 0")
    if origin:
        # a state carried in from outside changes what the GRU computes: never dropped without a word
        raise QtoolError(f"{where} starts from initial_h '{inputs[5]}', read from the model's input "
                         f"{', '.join(repr(i) for i in sorted(origin))}: a state carried in from outside, which "
                         "qtool does not take (its GRU starts every sequence from h = 0); export the model "
                         "without that input, or with the GRU's final state as an output (a state carried from "
                         "call to call, which qtool reads as the GRU's own)")


def _cells(graph: Graph, node, dirs: int, where: str) -> list:
    from qtool.core.model import GruCell

    names = list(node.input[1:4]) + [""] * (4 - len(node.input))
    for n in names[:2]:
        if n not in graph.constant:
            raise QtoolError(f"{where}: weight '{n}' is not a constant (nor computed from constants only)")
    W, R = (graph.weight(where, n) for n in names[:2])
    if R.ndim != 3 or R.shape[0] != dirs:
        raise QtoolError(f"{where}: tensor '{names[1]}' has shape {R.shape}, expected [{dirs}, 3H, H]")
    H = hidden_from_recurrent(where, names[1], R[0])
    if attr(node, "hidden_size", H) != H:
        raise QtoolError(f"{where} has hidden_size={attr(node, 'hidden_size', H)} but its weights "
                         f"'{names[1]}' have H={H}")
    if W.ndim != 3 or W.shape[:2] != (dirs, 3 * H):
        raise QtoolError(f"{where}: tensor '{names[0]}' has shape {W.shape}, expected [{dirs}, {3 * H}, C]")
    if names[2] and names[2] not in graph.constant:
        raise QtoolError(f"{where}: bias '{names[2]}' is not a constant (nor computed from constants only)")
    B = (expect_shape(where, names[2], graph.weight(where, names[2]), (dirs, 6 * H))
         if names[2]
         else np.zeros((dirs, 6 * H), np.float32))
    return [GruCell(W[d], R[d], B[d, :3 * H], B[d, 3 * H:], form) for d, form in enumerate(forms(node, dirs, where))]


def read_onnx(path: Path) -> dict[str, Stack]:
    model = load_onnx(path)
    try:
        return _read_graph(path, model)
    except QtoolError:
        raise
    except (ValueError, TypeError, AttributeError, IndexError, KeyError, UnicodeError) as e:  # a malformed graph
        raise QtoolError(f"{path}: malformed ONNX graph ({reason(e)})") from None


def _opset(model) -> int:
    return next((int(o.version) for o in model.opset_import if o.domain in ("", "ai.onnx")), 14)


def _read_graph(path: Path, model) -> dict[str, Stack]:
    graph = Graph(model.graph, str(path), Path(path).parent, _opset(model), model)
    graph.fold_dequantized(model.graph, str(path))
    grus = [n for n in graph.nodes if n.op_type == "GRU"]  # the Graph's node objects: Scope knows them by id
    if not grus:
        unread = unread_recurrent(model.graph.node)
        raise QtoolError(f"{path}: no GRU found" + (f"; {unread}" if unread else " in this onnx file"))
    names = {id(n): n.name or f"GRU_{i}" for i, n in enumerate(grus)}
    scope = Scope(graph, names)
    singles, chain = {}, []
    for node in grus:
        name = names[id(node)]
        where = f"{path}: GRU node '{name}'"
        if name in singles:
            raise QtoolError(f"{where}: two GRU nodes have this name; give them unique names")
        dirs = _check_attributes(node, where)
        _check_inputs(graph, node, where)
        singles[name] = _cells(graph, node, dirs, where)
        chain.append(node)
    # consecutive GRU nodes where each reads the one before's output (its directions concatenated)
    links = [graph.feeds_next(a, b, len(singles[names[id(a)]]), singles[names[id(a)]][0].R.shape[1])
             for a, b in zip(chain, chain[1:])]
    stacks = {}
    for i, node in enumerate(chain):
        j = i
        while j < len(links) and links[j]:
            j += 1
        stacks[names[id(node)]] = _stack(graph, scope, names, chain[i:j + 1], singles)
    if len(chain) > 1 and all(links):
        stacks[""] = stacks[names[id(chain[0])]]
    return stacks


def _stack(graph: Graph, scope: Scope, names: dict, nodes: list, singles: dict) -> Stack:
    """The stack of GRU `nodes` (each reads the one before's output): naming the first takes them all."""
    from qtool.importers.onnx.check import run_onnx

    took = [names[id(n)] for n in nodes]
    notes = [f"GRU node '{took[0]}' starts a stack of {len(took)} GRU layers: took them all"] if len(took) > 1 else []
    looped = list(dict.fromkeys(loop_note(n) for n in nodes if loop_note(n)))
    # a GRU read out of a loop alone: ONNX Runtime runs the GRU nodes it became (the loop itself, and a
    # TFLite file, run whole only: the loop was matched against qtool's float GRU on probes)
    runtime = "ONNX Runtime running the GRU node(s) read from the loop" if looped else "ONNX Runtime"
    return Stack([singles[t] for t in took], runtime, partial(run_onnx, graph, nodes), took=took,
                 left_out=scope.left_out(nodes), input_from=scope.input_from(nodes[0]), notes=notes + looped)
