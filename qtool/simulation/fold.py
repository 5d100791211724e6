"""Partial simulation statistics, and their fold in chunk order.

A `Simulation` (and, under `--mode fakequant|both`, its `FakeQuantSide`) accumulates statistics
chunk after chunk. Every field named in `STATS` is a sum over chunks (a `Distance`, an
`Agreement`), a list of them (one per time step) or a dict of them (one per tensor). One chunk's
*partial* is those fields filled by that chunk alone, starting from zero.

`fold_in_chunk_order` adds partials into an accumulator in chunk order. One process adds chunk
k's sums into the running sums left by chunk k - 1, and `0 + s == s` exactly, so folding the
partials in chunk order performs the very same float additions: the result equals one
process's to the last bit, whoever computed the partials (MPI ranks, threads, an engine that
accumulates inside its own loops) as long as each partial holds one chunk's sums as one process
forms them. Maxima and counts are exact in any order.
"""

from __future__ import annotations

from collections.abc import Iterable

import numpy as np

# The accumulating fields, by owner: a new accumulator must be listed here to be distributed.
STATS = {"Simulation": ("output", "steps", "tensors"),
         "FakeQuantSide": ("output", "output_agreement", "steps", "tensors", "agreement")}

ChunkStats = list[dict[str, object]]  # one {field: partial} per owner (the simulation, its fake-quant side)


def owners(sim) -> list:
    """The objects whose STATS fields accumulate: the simulation and its fake-quant side."""
    return [sim] + ([sim.fakequant] if sim.fakequant is not None else [])


def _fields(owner) -> tuple[str, ...]:
    return STATS[type(owner).__name__]


def chunk_stats(sim, x: np.ndarray) -> tuple[ChunkStats, tuple]:
    """Simulate one chunk into zeroed accumulators; returns its partial and the chunk's outputs
    (as `run_chunk` returns them). `sim`'s own accumulators are left as they were."""
    kept = [{f: getattr(o, f) for f in _fields(o)} for o in owners(sim)]
    for o in owners(sim):
        for f in _fields(o):
            setattr(o, f, type(getattr(o, f))())
    try:
        outs = sim.run_chunk(x)
        return [{f: getattr(o, f) for f in _fields(o)} for o in owners(sim)], outs
    finally:
        for o, fields in zip(owners(sim), kept):
            for f, v in fields.items():
                setattr(o, f, v)


def merge_stat(acc, part):
    """`acc` with one later chunk's `part` added: sums field by field (Distance.merge,
    Agreement.merge), lists per time step, dicts per tensor."""
    if isinstance(acc, list):
        return [merge_stat(acc[t], p) if t < len(acc) else p for t, p in enumerate(part)] + acc[len(part):]
    if isinstance(acc, dict):
        return {**acc, **{k: merge_stat(acc[k], p) if k in acc else p for k, p in part.items()}}
    return acc.merge(part)


def fold(sim, stats: ChunkStats) -> None:
    """Add the partial of the chunk that follows every chunk `sim` holds."""
    for o, part in zip(owners(sim), stats, strict=True):
        for f, p in part.items():
            setattr(o, f, merge_stat(getattr(o, f), p))


def fold_in_chunk_order(sim, partials: Iterable[tuple[int, ChunkStats]]) -> None:
    """Add `(start, partial)` pairs (start: the chunk's first sequence) into `sim` in chunk
    order, after every chunk it holds: the statistics one process would have."""
    for _, stats in sorted(partials, key=lambda p: p[0]):
        fold(sim, stats)
