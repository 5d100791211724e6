"""Layout-only ops: they change which axis is the batch, the time steps or the channels (the
reader's bookkeeping), or take the last step, a part of the channels, or zeros around the steps."""

from __future__ import annotations

import math

import numpy as np

from qtool.importers.onnx.graph import attr
from qtool.importers.onnx.model_layout import FLOAT, FixedSteps, LayoutError, Part, Stack, factor, ints, renumber
from qtool.importers.onnx.ops.registry import handles


@handles("Identity")
def identity(r, node) -> None:
    r.alias(node, *r.input(node))


@handles("Dropout")
def dropout(r, node) -> None:
    if r.const(node, 2, False):
        raise r.fail(node, "runs in training mode")
    if r.used(node, 1):
        raise r.fail(node, "has its mask read; qtool imports inference graphs")
    r.alias(node, *r.input(node))


@handles("Cast")
def cast(r, node) -> None:
    if attr(node, "to", FLOAT) != FLOAT:
        raise r.fail(node, f"casts the data to ONNX type {attr(node, 'to', 0)}; qtool computes in float32")
    r.alias(node, *r.input(node))


@handles("Transpose")
def transpose(r, node) -> None:
    edge, lay = r.input(node)
    perm = attr(node, "perm", None) or list(range(len(lay.axes)))[::-1]
    if sorted(perm) != list(range(len(lay.axes))):
        raise r.fail(node, f"has perm {perm} for a rank-{len(lay.axes)} input")
    r.alias(node, edge, lay.transpose(list(perm)))


@handles("Squeeze")
def squeeze(r, node) -> None:
    edge, lay = r.input(node)
    axes = r.axes_of(node, 1, len(lay.axes))
    if axes is None:
        axes = [k for k, s in enumerate(lay.shape()) if s == 1]
    r.alias(node, edge, lay.squeeze(axes, f"{r.where}: {r.label(node)}") if axes else lay)


@handles("Unsqueeze")
def unsqueeze(r, node) -> None:
    edge, lay = r.input(node)
    raw = ints(r.value(node, 1, attr(node, "axes", [])))
    r.alias(node, edge, lay.unsqueeze([a % (len(lay.axes) + len(raw)) for a in raw]))


@handles("Reshape")
def reshape(r, node) -> None:
    edge, lay = r.input(node)
    target, ins = ints(r.value(node, 1)), lay.shape()
    if not attr(node, "allowzero", 0):
        target = [ins[k] if s == 0 and k < len(ins) else s for k, s in enumerate(target)]
    if target.count(-1) > 1 or any(s < -1 for s in target):
        raise r.fail(node, f"has shape {target}")
    if -1 in target:
        rest = math.prod(s for s in target if s != -1)
        target[target.index(-1)] = math.prod(ins) // rest if rest else 0
    what = f"{r.where}: {r.label(node)}"
    try:
        r.alias(node, edge, lay.reshape(target, what))
    except LayoutError:
        # factors merged out of their order (a channel shuffle): the frames put in the tensor's axis
        # order first (a select), where every merge of neighbouring axes is in order
        seen = [a for a in lay.axes if isinstance(a, int)] + [a[1] for a in lay.axes if isinstance(a, tuple)]
        number = {f: k for k, f in enumerate(seen)}
        if seen == sorted(seen):
            raise
        ordered = lay.replace(axes=tuple(renumber(a, number) for a in lay.axes),
                              cdims=tuple(lay.cdims[f] for f in seen))
        out = ordered.reshape(target, what)
        r.alias(node, conform(r, node, edge, lay, ordered, "_order"), out)


@handles("Flatten")
def flatten(r, node) -> None:
    edge, lay = r.input(node)
    ins = lay.shape()
    axis = attr(node, "axis", 1) % (len(ins) + 1)
    r.alias(node, edge, lay.reshape([math.prod(ins[:axis]), math.prod(ins[axis:])],
                                        f"{r.where}: {r.label(node)}"))


@handles("Expand")
def expand(r, node) -> None:
    edge, lay = r.input(node)
    ins, target = lay.shape(), ints(r.value(node, 1))
    rank = max(len(ins), len(target))
    full = [1] * (rank - len(ins)) + ins
    to = [1] * (rank - len(target)) + target
    if any(t not in (1, s) for s, t in zip(full, to)):
        raise r.fail(node, f"broadcasts {ins} to {target}; qtool only follows an Expand to the data's own shape")
    r.alias(node, edge, lay.unsqueeze(list(range(rank - len(ins)))) if rank > len(ins) else lay)


@handles("Slice")
def slice(r, node) -> None:
    edge, lay = r.input(node)
    shape = lay.shape()
    if len(node.input) > 1:
        starts, ends = ints(r.value(node, 1)), ints(r.value(node, 2))
        axes = r.axes_of(node, 3, len(shape)) or list(range(len(starts)))
        steps = ints(r.value(node, 4, [1] * len(starts)))
    else:  # Slice-1: attributes
        starts, ends = attr(node, "starts", []), attr(node, "ends", [])
        axes = [a % len(shape) for a in attr(node, "axes", list(range(len(starts))))]
        steps = [1] * len(starts)
    for a, s, e, step in zip(axes, starts, ends, steps):
        size = shape[a]
        low, high = (0, size) if step > 0 else (-1, size - 1)  # ONNX's clamping: a reversal reaches index 0
        s = min(max(s + size if s < 0 else s, low), high)
        e = min(max(e + size if e < 0 else e, low), high)
        if step == 1 and s == 0 and e == size:
            continue
        if step == 1 and lay.axes[a] == "T" and s == size - 1 and e == size:
            q = r.emit(node, "last_step", [edge], lay.replace(axes=lay.axes[:a] + ("1",) + lay.axes[a + 1:]),
                           source="Slice")
            edge, lay = q.outputs[0], r.data[q.outputs[0]][1]
            continue
        if isinstance(lay.axes[a], int) and step != 0 and len(range(s, e, step)):
            edge, lay = pick(r, node, edge, lay, a, list(range(s, e, step)), suffix=f"_{a}")
            continue
        part = f"[{s}:{'' if e < 0 else e}:{step}]"
        raise r.fail(node, f"takes {part} of axis {a} ({lay.axes[a]}) of {lay.describe()}; qtool "
                              "follows a Slice of a whole axis, of part of the channels or of the last time step",
                        layout=lay.axes[a] in ("N", "NT") or (lay.axes[a] == "T" and r.declared[1] is not None))
    r.alias(node, edge, lay)


def _indices(lay, a: int, picks) -> tuple[int, ...]:
    """The edge's channels at indices `picks` (any shape; -1: a zero) of channel factor axis `a`, in order."""
    picks = np.asarray(picks, np.int64)
    padded = np.pad(np.arange(lay.channels).reshape(lay.cdims or (1,)), [(0, 1) if k == lay.axes[a] else (0, 0)
                                                                         for k in range(len(lay.cdims or (1,)))],
                    constant_values=-1)  # index -1 takes the appended -1
    index = padded.take(np.where(picks < 0, lay.cdims[lay.axes[a]], picks), axis=lay.axes[a])
    return tuple(int(i) for i in index.reshape(-1))


def select(r, node, edge: str, width: int, lay, index, out: int = 0, suffix: str = "") -> str:
    """A select node taking channels `index` of `edge` (of `width` channels; layout `lay` out), or
    the edge itself where the index takes every channel in order; its edge."""
    index = tuple(int(i) for i in index)
    if index == tuple(range(width)):
        if not suffix:
            r.alias(node, edge, lay, out=out)
        return edge
    return r.emit(node, "select", [edge], lay, {"index": index}, out=out, suffix=suffix).outputs[0]


def pick(r, node, edge, lay, a: int, picks: list[int], out: int = 0, suffix: str = ""):
    """Indices `picks` of channel factor axis `a`: a select node (its edge and layout)."""
    f = lay.axes[a]
    out_lay = lay.replace(cdims=lay.cdims[:f] + (len(picks),) + lay.cdims[f + 1:])
    return select(r, node, edge, lay.channels, out_lay, _indices(lay, a, picks), out, suffix), out_lay


def conform(r, node, edge, lay, target, suffix: str):
    """`edge` (layout `lay`) with its channels in the order of `target`, a layout of the same ONNX
    axes whose channel factors are numbered otherwise (the same map, its frames' order another:
    a select); None where the axes differ in more than that."""
    if len(lay.axes) != len(target.axes) or lay.shape() != target.shape() or len(lay.cdims) != len(target.cdims):
        return None
    for a, b in zip(lay.axes, target.axes):
        if (factor(a) is None) != (factor(b) is None) or (factor(a) is None and a != b) or \
                isinstance(a, tuple) != isinstance(b, tuple) or (isinstance(a, tuple) and a[0] != b[0]):
            return None
    at = {factor(b): k for k, b in enumerate(target.axes) if factor(b) is not None}
    perm = [factor(lay.axes[at[j]]) for j in range(len(target.cdims))]
    index = np.arange(lay.channels).reshape(lay.cdims).transpose(perm).reshape(-1)
    return select(r, node, edge, lay.channels, target, index, suffix=suffix)


@handles("Split")
def split(r, node) -> None:
    """Parts of a channel factor axis, each output a select."""
    edge, lay = r.input(node)
    a = attr(node, "axis", 0) % len(lay.axes)
    size = lay.shape()[a]
    sizes = ints(r.value(node, 1)) if len(node.input) > 1 and node.input[1] else attr(node, "split", [])
    if not sizes:
        k = attr(node, "num_outputs", len(node.output))
        sizes = [-(-size // k)] * (k - 1) + [size - (k - 1) * -(-size // k)]
    if not isinstance(lay.axes[a], int) or sum(sizes) != size or len(sizes) != len(node.output):
        raise r.fail(node, f"splits axis {a} ({lay.describe()}) into {sizes}; qtool splits a map's channel "
                           "axis", layout=not isinstance(lay.axes[a], int))
    at = 0
    for k, n in enumerate(sizes):
        if r.used(node, k):
            pick(r, node, edge, lay, a, list(range(at, at + n)), out=k)
        at += n


def _gather_many(r, node, edge, lay, index: np.ndarray) -> bool:
    """A Gather of an index array: every step in order along time (an identity with unit axes, as
    PyTorch's Unfold writes it), or any indices of a channel factor (a select, the index's axes new
    factors in its place: Unfold's windows of frequencies)."""
    axis = attr(node, "axis", 0) % len(lay.axes)
    role, size = lay.axes[axis], lay.shape()[axis]
    if role == "T" and index.size != size and np.array_equal(index.reshape(-1), np.arange(index.size)) \
            and r.fixed_steps is None:
        raise FixedSteps(f"{r.where}: {r.label(node)} takes steps 0..{index.size - 1} of {size}", index.size)
    index = np.where(index < 0, index + size, index).astype(np.int64)
    if index.size and (index.min() < 0 or index.max() >= size):
        return False
    units = ("1",) * (index.ndim - 1)
    if role == "T" and index.size == size and np.array_equal(index.reshape(-1), np.arange(size)):
        at = next(k for k, d in enumerate(index.shape) if d == size)
        new = units[:at] + ("T",) + units[at:]
        r.alias(node, edge, lay.replace(axes=lay.axes[:axis] + new + lay.axes[axis + 1:]))
        return True
    if not isinstance(role, int) or index.ndim == 0:
        return False
    k = index.ndim
    shift = {f: f if f < role else f + k - 1 for f in range(len(lay.cdims)) if f != role}  # the index's axes at role
    axes = tuple(renumber(a, shift) for a in lay.axes[:axis]) + tuple(range(role, role + k)) + \
        tuple(renumber(a, shift) for a in lay.axes[axis + 1:])
    out = lay.replace(axes=axes, cdims=lay.cdims[:role] + index.shape + lay.cdims[role + 1:])
    select(r, node, edge, lay.channels, out, _indices(lay, axis, index))
    return True


@handles("Gather")
def gather(r, node) -> None:
    edge, lay = r.input(node)
    index = np.asarray(r.value(node, 1))
    if (index.size != 1 or index.ndim > 1) and not isinstance(edge, Stack) and _gather_many(r, node, edge, lay, index):
        return
    if index.size != 1 or index.ndim > 1:
        role = None if isinstance(edge, Stack) else lay.axes[attr(node, "axis", 0) % len(lay.axes)]
        raise r.fail(node, f"gathers {index.size} indices of axis {attr(node, 'axis', 0)} ({lay.describe()}); qtool "
                           "follows one index (the last time step) or indices of a channel or frequency axis",
                     layout=role is not None and not isinstance(role, int))
    i, keep = int(index.reshape(())), index.ndim == 1
    axis = attr(node, "axis", 0)
    if isinstance(edge, Stack):  # one of the joined values, then the index within it
        sizes = [la.shape()[edge.axis] for _, la in edge.parts]
        if axis % (len(edge.parts[0][1].axes)) != edge.axis or not -sum(sizes) <= i < sum(sizes):
            raise r.fail(node, f"takes index {i} of axis {axis} of values joined on axis {edge.axis}")
        i %= sum(sizes)
        k = next(k for k in range(len(sizes)) if i < sum(sizes[:k + 1]))
        (edge, lay), i = edge.parts[k], i - sum(sizes[:k])
    axis %= len(lay.axes)
    role, size = lay.axes[axis], lay.shape()[axis]
    if not -size <= i < size:
        raise r.fail(node, f"takes index {i} of axis {axis}, of size {size} ({lay.describe()})")
    i %= size
    if role == "1":
        r.alias(node, edge, lay.take(axis, keep))
    elif role == "T" and i == size - 1:
        r.emit(node, "last_step", [edge], lay.take(axis, keep), source="Gather")
    elif role == 0:  # the outermost channel factor: a part of the channels
        inner = math.prod(lay.cdims[1:])
        base, full = (edge.lo, edge.full) if isinstance(edge, Part) else (0, lay.channels)
        name = edge.edge if isinstance(edge, Part) else edge
        lo, hi = base + i * inner, base + (i + 1) * inner
        r.alias(node, name if (lo, hi) == (0, full) else Part(name, lo, hi, full), lay.take(axis, keep))
    elif isinstance(role, int) and not isinstance(edge, Part):  # one index of an inner factor: a select
        select(r, node, edge, lay.channels, lay.take(axis, keep), _indices(lay, axis, [i]))
    else:
        raise r.fail(node, f"takes index {i} of axis {axis} ({role}) of {lay.describe()}; qtool follows the "
                              "last time step, and an index of a GRU's directions or layers",
                        layout=role in ("N", "NT"))


@handles("Concat")
def concat(r, node) -> None:
    ins = [i for i in node.input if i]
    if any(i not in r.data for i in ins):
        raise r.fail(node, "joins the data with a constant; qtool's concat joins computed tensors")
    edges, lays = [r.data[i][0] for i in ins], [r.data[i][1] for i in ins]
    axis = attr(node, "axis", 0) % len(lays[0].axes)
    if not all(la.holds_channels(axis) for la in lays):
        rest = {(la.take(axis, False).axes, la.take(axis, False).cdims) for la in lays}
        readers = r.readers.get(node.output[0], [])
        if all(la.axes[axis] in ("1", 0) for la in lays) and len(rest) == 1 and \
                all(x.op_type == "Gather" for x in readers):  # PyTorch's h_n of a stack: one of them is read
            r.alias(node, Stack(axis, tuple(zip(edges, lays))), lays[0])
            return
        if all(la.axes[axis] == "1" for la in lays) and len(rest) == 1:
            # torch.stack of maps read as one: the stacked values a new outermost channel factor
            later = {f: f + 1 for f in range(len(lays[0].cdims))}
            axes = tuple(0 if k == axis else renumber(a, later) for k, a in enumerate(lays[0].axes))
            r.emit(node, "concat", edges, lays[0].replace(axes=axes, cdims=(len(lays), *lays[0].cdims)))
            return
        if _inner_concat(r, node, edges, lays, axis):
            return
        raise r.fail(node, f"joins {', '.join(la.describe() for la in lays)} on axis {axis}; qtool joins "
                              "tensors of one layout on their channel axis", layout=True)
    for lay in lays:
        rest = [r for k, r in enumerate(lay.axes) if k != axis]
        if rest != [r for k, r in enumerate(lays[0].axes) if k != axis] or (lay.seq and lay.t != lays[0].t):
            raise r.fail(node, f"joins {', '.join(la.describe() for la in lays)} on axis {axis}; qtool "
                                  "joins tensors of one layout on their channel axis", layout=True)
    out = lays[0].with_channels(axis, sum(la.channels for la in lays))
    if any(isinstance(e, Part) for e in edges):  # parts of one edge put back together, in order
        names = {e.edge if isinstance(e, Part) else e for e in edges}
        parts = [e if isinstance(e, Part) else None for e in edges]
        whole = (len(names) == 1 and None not in parts and parts[0].lo == 0 and parts[-1].hi == parts[0].full and
                 all(a.hi == b.lo for a, b in zip(parts, parts[1:])))
        if whole:
            r.alias(node, names.pop(), out)
            return
        if len(names) == 1 and None not in parts:  # other parts of one edge: a select of them
            select(r, node, parts[0].edge, parts[0].full, out, [c for p in parts for c in range(p.lo, p.hi)])
            return
    r.emit(node, "concat", edges, out)


def _inner_concat(r, node, edges, lays, axis: int) -> bool:
    """A Concat along one channel factor of maps alike in every other (GTCRN's two GRUs' outputs
    joined on the channels of [N * T, F, C]): qtool's concat, then a select into the map's order."""
    f = lays[0].axes[axis]
    if not isinstance(f, int) or any(isinstance(e, Part) for e in edges):
        return False
    other = {(la.axes, la.cdims[:f], la.cdims[f + 1:], la.t if la.seq else 0) for la in lays}
    if len(other) != 1:
        return False
    blocks, at = [], 0
    for la in lays:
        blocks.append(at + np.arange(la.channels).reshape(la.cdims))
        at += la.channels
    index = np.concatenate(blocks, axis=f).reshape(-1)
    joined = lays[0].replace(axes=tuple(0 if k == axis else "1" if isinstance(x, int) else x
                                        for k, x in enumerate(lays[0].axes)), cdims=(at,))
    q = r.emit(node, "concat", list(edges), joined, suffix="_join")
    joined_f = sum(la.cdims[f] for la in lays)
    out = lays[0].replace(cdims=lays[0].cdims[:f] + (joined_f,) + lays[0].cdims[f + 1:])
    select(r, node, q.outputs[0], at, out, index)
    return True


@handles("Pad")
def pad(r, node) -> None:
    edge, lay = r.input(node)
    if attr(node, "mode", "constant") != "constant":
        raise r.fail(node, f"pads in mode '{attr(node, 'mode', '')}'; qtool pads with zeros")
    rank = len(lay.axes)
    if len(node.input) > 1:
        pads = ints(r.value(node, 1))
        value = r.const(node, 2, 0.0)
        axes = r.axes_of(node, 3, rank) or list(range(rank))
    else:  # Pad-2: attributes
        pads, value, axes = list(attr(node, "pads", [])), attr(node, "value", 0.0), list(range(rank))
    if np.any(np.asarray(value) != 0) or len(pads) != 2 * len(axes):
        raise r.fail(node, f"pads with {value} ({len(pads)} pads for {len(axes)} axes); qtool pads with zeros")
    before, after = {}, {}
    for k, a in enumerate(axes):
        before[a], after[a] = pads[k], pads[k + len(axes)]
    freq = [a for a in axes if (before[a] or after[a]) and isinstance(lay.axes[a], int)]
    readers = r.readers.get(node.output[0], [])
    t = lay.axes.index("T") if "T" in lay.axes else None
    if len(freq) == 1 and before[freq[0]] >= 0 and after[freq[0]] >= 0 and len(readers) == 1 and \
            readers[0].op_type == "Conv" and node.output[0] not in r.outputs and \
            not any(before[a] or after[a] for a in axes if a not in (freq[0], t)) and \
            min(before.get(t, 0), after.get(t, 0)) >= 0:
        # zeros along a map's frequencies, read by a Conv alone: that conv2d's own freq_pads (after
        # the steps' padding, where the Pad pads them too)
        f = lay.axes[freq[0]]
        pads = (int(before[freq[0]]), int(after[freq[0]]))
        if t is not None and (before.get(t) or after.get(t)):
            steps = (int(before[t]), int(after[t]))
            lay = lay.replace(t=lay.t + sum(steps))
            edge = r.emit(node, "zero_pad1d", [edge], lay, {"pad": steps}, suffix="/steps").outputs[0]
        r.freq_pads[node.output[0]] = (edge, lay, pads)
        r.data[node.output[0]] = (edge, lay.replace(cdims=lay.cdims[:f] + (lay.cdims[f] + sum(pads),) +
                                                    lay.cdims[f + 1:]))
        return
    for a in freq:  # zeros along a channel factor otherwise: a select of -1s there
        if before[a] >= 0 and after[a] >= 0:
            n = lay.shape()[a]
            edge, lay = pick(r, node, edge, lay, a, [-1] * before[a] + list(range(n)) + [-1] * after[a],
                             suffix=f"_pad{a}")
            before[a] = after[a] = 0
    bad = [a for a in axes if (before[a] or after[a]) and (lay.axes[a] != "T" or before[a] < 0 or after[a] < 0)]
    if bad:
        raise r.fail(node, f"pads axis {bad[0]} ({lay.axes[bad[0]]}) of {lay.describe()} by "
                              f"({before[bad[0]]}, {after[bad[0]]}); qtool pads the time steps with zeros",
                        layout=lay.axes[bad[0]] in ("N", "NT", "1"))  # a unit axis: time in another reading
    a = lay.axes.index("T") if "T" in lay.axes else None
    if a is None or not (before.get(a) or after.get(a)):
        r.alias(node, edge, lay)
        return
    pad = (int(before[a]), int(after[a]))
    r.emit(node, "zero_pad1d", [edge], lay.replace(t=lay.t + sum(pad)), {"pad": pad})
