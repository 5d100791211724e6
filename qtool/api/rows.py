"""What front ends show of a whole model's layers and edges (the command line's tables, --json)."""

from __future__ import annotations

from qtool.core.graph import Graph
from qtool.core.qgraph import QGraph


def op_text(node) -> str | None:
    """How tables show a graph node's op where its layer says more than the op's name (a gru: its
    layers, direction and a cell other than the haste form); None for the others."""
    from qtool.layers import layer

    describe = getattr(layer(node.op, node.label), "describe", None)
    return describe(node) if describe else None


def qgraph_rows(qg: QGraph, sim=None) -> list[dict]:
    """A row per edge the integer core writes, in graph order: the layer, its op, the edge's shape
    and grid (an input with a grid per channel: `channel_shifts`, channel c's exp2_inv is
    exp2_inv + k_c), how the grid was set, and with a simulation its distances."""
    methods = qg.info.get("edge_methods", {})
    steps = steps_text(qg.graph)
    one = len(qg.graph.inputs) == 1  # several: each row names its input
    edges = [(e, "input" if one else e, "input") for e in qg.graph.inputs]
    edges += [(e, n, qg.node(n)) for n in qg.core for e in qg.node(n).outputs]
    rows = []
    for e, name, node in edges:
        g = qg.grids[e]
        op = node if isinstance(node, str) else (node.attrs.get("kind") or node.op)
        row = {"layer": name, "op": op, "edge": e, "shape": list(qg.graph.shapes.get(e, ())), "steps": steps.get(e),
               "bits": g.bits, "exp2_inv": int(g.exp2_inv), "zp": int(g.zp), "method": methods.get(e, "")}
        if e in qg.graph.input_shifts:  # a grid per channel: channel c's is 2^-(exp2_inv + k_c)
            row["channel_shifts"] = list(qg.graph.input_shifts[e])
        if sim is not None:
            row.update(sim.edges[e].as_dict())
        rows.append(row)
    return rows


def steps_text(graph: Graph) -> dict[str, str]:
    """Each sequence edge's steps against the input's T: "T", "T/2", "T-2" (qtool.layers)."""
    from qtool.layers import steps_text as of_graph

    return of_graph(graph)
