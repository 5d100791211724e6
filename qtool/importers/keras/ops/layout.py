"""Keras' merges (Add, Multiply, Concatenate) and the layout layers (Flatten, Reshape, Permute)
where they leave the channels-last layout as it is."""

from __future__ import annotations

from typing import TYPE_CHECKING

from qtool.core import edges
from qtool.importers.keras.ops.common import last_axis
from qtool.importers.keras.ops.registry import builds

if TYPE_CHECKING:
    from qtool.importers.keras.model_graph import Entry, Reader


MERGES = {"Add": "add", "Multiply": "mul", "Concatenate": "concat"}

LAYOUT = ("Flatten", "Reshape", "Permute")  # only where they leave the layout as it is



@builds(*MERGES)
def _merge(r: Reader, e: Entry, src: list[str]) -> None:
    if len(src) < 2:
        raise r.fail(e, f"merges {len(src)} input(s); it needs two or more")
    if e.cls == "Concatenate":
        last_axis(r, e, "axis", r.shapes[src[0]])
    r.add(e, MERGES[e.cls], src)


@builds(*LAYOUT)
def _layout(r: Reader, e: Entry, src: list[str]) -> None:
    """Flatten, Reshape, Permute: the identity where they leave [N, T, C] or [N, C] as it is."""
    shape = r.shapes[src[0]]
    seq = edges.is_sequence(shape)
    if r.on_map:  # [N, T, F, C] -> [N, T, F * C]: the frames as they are ("fc")
        target = list(e.cfg.get("target_shape") or [])
        if e.cls != "Reshape" or len(target) != 2 or target[-1] != shape[-1]:
            raise r.fail(e, f"changes the layout of a feature map [N, T, {r.on_map}, {shape[-1] // r.on_map}]; qtool "
                         f"reads a Reshape of it into [N, T, {shape[-1]}]")
        r.edge[e.name] = src[0]
        return
    if e.cls == "Flatten":
        same = not seq
    elif e.cls == "Permute":
        same = list(e.cfg.get("dims") or []) == ([1, 2] if seq else [1])
    else:
        # [T, C] -> [a, C] keeps every value where it was (Keras runs it only where a is T or -1)
        target = list(e.cfg.get("target_shape") or [])
        same = len(target) == 2 and target[-1] == shape[-1] if seq else target in ([shape[-1]], [-1])
    if not same:
        what = f"[N, T, {shape[-1]}]" if seq else f"[N, {shape[-1]}]"
        raise r.fail(e, f"changes the layout of its input {what}; Reshape, Permute and Flatten are supported only "
                     "where they leave the channels-last layout as it is")
    r.edge[e.name] = src[0]
