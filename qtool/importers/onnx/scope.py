"""What an ONNX file holds besides the GRU qtool takes from it (`Stack.left_out`, `Stack.input_from`),
so that a model with a Linear in front of the GRU or a Gemm head after it is not taken for the GRU.

Only nodes that compute on the data are named: a node is listed when one of its inputs carries
values of a graph input or of a GRU, and it does more than move values (layout ops, Slice, Concat,
Gather, ...) or read a shape. Constants, constant subgraphs, shape arithmetic, ConstantOfShape
states and the fake-quant QuantizeLinear -> DequantizeLinear pairs qtool imports as grids are not.
"""

from __future__ import annotations

from qtool.importers.onnx.graph import FAKE_QUANT_OPS, LAYOUT_OPS, MOVING_OPS, SHAPE_OPS, Graph

# ops that do not compute on the values they carry: never listed as left out
PLUMBING = set(MOVING_OPS) | set(SHAPE_OPS) | {"Expand", "Tile", "Pad", "GatherElements", "GatherND"}


class Scope:
    """The data-carrying nodes of a graph; `names` maps each GRU node (by id) to its stack name."""

    def __init__(self, graph: Graph, names: dict) -> None:
        self.graph, self.names = graph, names
        self.data = set(graph.inputs)
        for node in graph.nodes:
            if node.op_type not in SHAPE_OPS + ("ConstantOfShape",) and any(i in self.data for i in node.input if i):
                self.data.update(o for o in node.output if o)
        self.consumers: dict[str, list] = {}
        for node in graph.nodes:
            for i in node.input:
                self.consumers.setdefault(i, []).append(node)

    def label(self, node) -> str:
        name = self.names.get(id(node)) or node.name or (node.output[0] if node.output else "?")
        return f"{name} ({node.op_type})"

    def _fake_quant(self, node) -> bool:
        """A QuantizeLinear feeding only DequantizeLinear nodes, or a DequantizeLinear fed by one."""
        if node.op_type == "QuantizeLinear":
            users = [u for o in node.output if o for u in self.consumers.get(o, [])]
            return bool(users) and all(u.op_type == "DequantizeLinear" for u in users)
        q = self.graph.producer.get(node.input[0]) if node.op_type == "DequantizeLinear" and node.input else None
        return q is not None and q.op_type == "QuantizeLinear"

    def computes(self, node) -> bool:
        """Whether `node` computes on the data (as opposed to constants, shapes or moving values)."""
        if not any(i in self.data for i in node.input if i):
            return False
        return node.op_type not in PLUMBING and not (node.op_type in FAKE_QUANT_OPS and self._fake_quant(node))

    def left_out(self, took: list) -> list[str]:
        """`"name (Op)"` of every computing node that is not one of the GRU nodes `took`."""
        ids = {id(n) for n in took}
        return [self.label(n) for n in self.graph.nodes if id(n) not in ids and self.computes(n)]

    def input_from(self, gru) -> str | None:
        """None when GRU node `gru` reads a graph input through layout ops (and fake-quant) only, else
        `"name (Op)"` of the node whose output it reads."""
        name, seen = gru.input[0] if gru.input else "", set()
        while name not in self.graph.inputs and name not in seen:
            seen.add(name)
            node = self.graph.producer.get(name)
            if node is None:  # a constant or a dangling name: not the model's input
                return f"{name} (constant)" if name in self.graph.constant else f"{name} (undefined)"
            if node.op_type not in LAYOUT_OPS + FAKE_QUANT_OPS or not node.input:
                return self.label(node)
            name = node.input[0]
        return None if name in self.graph.inputs else f"{name} (cycle)"
