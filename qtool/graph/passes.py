"""The named passes over a whole model, in the order they run (`FLOAT_PASSES` on the float graph
before calibration, then `partition`; the grid passes run in qtool.graph.calibrate). Each
returns one line saying what it did, which `calibrate` and `inspect` show (docs/graph.md,
"Passes")."""

from __future__ import annotations

import copy

import numpy as np

from qtool.core.graph import Graph, Node
from qtool.errors import QtoolError
from qtool.layers import check, layer
from qtool.layers.gru import dual_path
from qtool.layers.gru import form as gru_form
from qtool.layers.norm.batchnorm import affine


def _only_reader(graph: Graph, edge: str) -> Node | None:
    """The one node that reads `edge`, when no other node or model output does."""
    readers = graph.consumers(edge)
    return readers[0] if len(readers) == 1 and edge not in graph.outputs else None


def _bypass(graph: Graph, node: Node) -> None:
    """Remove a one-in one-out node whose output equals its input: its producer writes its
    output edge instead (or its readers read its input, when the input is read elsewhere too)."""
    src, dst = node.inputs[0], node.outputs[0]
    graph.nodes.remove(node)
    producer = next((n for n in graph.nodes if src in n.outputs), None)
    if producer is not None and not graph.consumers(src) and src not in graph.outputs:
        producer.outputs[producer.outputs.index(src)] = dst
        return
    for n in graph.consumers(dst):
        n.inputs = [src if e == dst else e for e in n.inputs]
    graph.outputs = [src if e == dst else e for e in graph.outputs]


def prune(graph: Graph) -> str:
    """Drop what does not change the outputs: linear activations (inference no-ops) and nodes
    whose outputs no model output depends on (training leftovers)."""
    linear = [n for n in graph.nodes if n.op == "activation" and n.attrs.get("kind") == "linear"]
    for n in linear:
        _bypass(graph, n)
    needed, dead = set(graph.outputs), []
    for n in reversed(graph.nodes):
        if needed & set(n.outputs):
            needed |= set(n.inputs)
        else:
            dead.append(n)
    for n in dead:
        graph.nodes.remove(n)
    names = [n.name for n in linear + dead]
    return f"removed {len(names)} node(s): {', '.join(names)}" if names else "nothing to remove"


def fold_batchnorm(graph: Graph) -> str:
    """A batchnorm whose input only a weighted layer computes (one whose module can `fold_affine`)
    and nothing else reads becomes part of that layer's weights: W' = W * a, b' = b * a + c per
    output channel (batchnorm's affine x * a + c). Any other batchnorm stays an integer
    per-channel affine."""
    folded, kept = [], []
    for bn in [n for n in graph.nodes if n.op == "batchnorm"]:
        prev = next((n for n in graph.nodes if bn.inputs[0] in n.outputs), None)
        fold = prev is not None and getattr(layer(prev.op, prev.label), "fold_affine", None)
        if not fold or _only_reader(graph, bn.inputs[0]) is not bn or not fold(prev, *affine(bn)):
            kept.append(bn.name)
            continue
        _bypass(graph, bn)
        folded.append(f"{bn.name} into {prev.name}")
    said = [f"folded {', '.join(folded)}"] if folded else []
    said += [f"kept {', '.join(kept)} as an integer per-channel affine (its input is no dense, conv or layernorm "
             "output that only it reads, or it differs along a map's frequencies)"] if kept else []
    return "; ".join(said) or "no batchnorm to fold"


def stack_grus(graph: Graph) -> str:
    """A GRU returning its sequence that only feeds another GRU of the same directions becomes
    one stacked GRU with it (ONNX writes a stacked GRU as one node a layer): the stacked GRU's
    calibration ties each layer's x to the previous layer's h, so no grid stands between them."""
    merged = []
    for b in [n for n in graph.nodes if n.op == "gru"]:
        a = next((n for n in graph.nodes if b.inputs[0] in n.outputs), None)
        if (a is None or a.op != "gru" or _only_reader(graph, b.inputs[0]) is not b
                or not a.attrs.get("return_sequences", True)
                or bool(a.attrs.get("bidirectional", False)) != bool(b.attrs.get("bidirectional", False))
                or gru_form(a) != gru_form(b)  # a gru node has one cell form
                or dual_path(a)[:2] != dual_path(b)[:2] or dual_path(b)[2] != "fc"):  # b reads a's frames as a did
            continue
        layers_a = a.attrs.get("layers", 1)
        for k, v in b.params.items():
            layer_k, rest = k.split(".", 1)
            a.params[f"l{int(layer_k[1:]) + layers_a}.{rest}"] = v
        a.attrs = {**a.attrs, "layers": layers_a + b.attrs.get("layers", 1),
                   "return_sequences": b.attrs.get("return_sequences", True)}
        graph.nodes.remove(b)
        a.outputs = list(b.outputs)
        merged.append(f"{b.name} onto {a.name}")
    return f"stacked {', '.join(merged)}" if merged else "no GRUs to stack"


def _producer(graph: Graph, edge: str, op: str, kind: str | None = None) -> Node | None:
    """The node of `op` (activation `kind`) that writes `edge`, where only one node reads it."""
    n = next((n for n in graph.nodes if edge in n.outputs), None)
    ok = n is not None and n.op == op and (kind is None or n.attrs.get("kind") == kind)
    return n if ok and _only_reader(graph, edge) is not None else None


def fuse_hypot(graph: Graph) -> str:
    """sqrt(a^2 + b^2 + epsilon) written as square, square, add, a per-channel shift and sqrt (a
    spectrum's magnitude) becomes one hypot node: its integers keep the sum of squares exact
    instead of rounding the power onto a grid, which squares the range."""
    fused = []
    for root in [n for n in graph.nodes if n.op == "activation" and n.attrs.get("kind") == "sqrt"]:
        edge, eps, chain = root.inputs[0], 0.0, [root]
        shift = _producer(graph, edge, "batchnorm")
        if shift is not None:
            a, c = affine(shift)
            if not (np.allclose(a, 1, rtol=1e-6, atol=0) and np.all(c == c[0]) and c[0] >= 0):
                continue
            eps, edge = float(c[0]), shift.inputs[0]
            chain.append(shift)
        total = _producer(graph, edge, "add")
        if total is None or len(total.inputs) != 2 or total.attrs.get("repeat"):
            continue
        squares = [_producer(graph, e, "activation", "square") for e in total.inputs]
        if None in squares:
            continue
        chain += [total, *squares]
        graph.nodes[graph.nodes.index(root)] = Node(  # where the sqrt was: after every input, before every reader
            root.name, "hypot", [sq.inputs[0] for sq in squares], list(root.outputs), {"epsilon": eps}, {},
            "+".join(n.source or n.op for n in reversed(chain)))
        for n in chain[1:]:
            graph.nodes.remove(n)
        fused.append(root.name)
    return f"fused {', '.join(fused)} into hypot" if fused else "no magnitude to fuse"


FLOAT_PASSES = (prune, fuse_hypot, fold_batchnorm, stack_grus)


def run_float_passes(graph: Graph) -> tuple[Graph, list[tuple[str, str]]]:
    """A copy of `graph` after FLOAT_PASSES (proved well formed again), and what each did."""
    g = copy.deepcopy(graph)
    done = [(p.__name__, p(g)) for p in FLOAT_PASSES]
    g.shapes = {}
    return check(g), done


def partition(graph: Graph) -> tuple[list[str], list[str], str]:
    """(core, tail, what it did): the float tail is the ops run on dequantized values
    (`FLOAT_TAIL`: softmax, L2 normalization) that only lead to model outputs; everything else
    runs in integers. A float-tail op with integer layers after it is refused."""
    tail: set[str] = set()
    for n in reversed(graph.nodes):
        readers = [r for e in n.outputs for r in graph.consumers(e)]
        if getattr(layer(n.op, n.label), "FLOAT_TAIL", False) and all(r.name in tail for r in readers):
            tail.add(n.name)
    for n in graph.nodes:
        mod = layer(n.op, n.label)
        if n.name not in tail and getattr(mod, "FLOAT_TAIL", False):
            raise QtoolError(f"node {n.label}: {n.op} runs in float at the model's output only; here layers "
                             "read its result")
        if n.name not in tail and not hasattr(mod, "forward_int"):
            raise QtoolError(f"node {n.label}: {n.op} has no integer form")
    core = [n.name for n in graph.nodes if n.name not in tail]
    tail_names = [n.name for n in graph.nodes if n.name in tail]
    what = f"{len(core)} integer node(s)" + (f", float tail: {', '.join(tail_names)}" if tail_names else "")
    return core, tail_names, what
