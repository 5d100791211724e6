"""Where the batch, the time steps and the channels of an ONNX value lie, so that a whole ONNX graph
imports as qtool's channels-last graph (qtool.core.graph) with its layout-only ops absorbed.

A `Layout` names each axis of an ONNX tensor: "N" (batch), "T" (time steps), "NT" (batch and time
merged, `[N * T, C]`, as some exporters flatten before a MatMul), ("N", k) or ("T", k) (the batch
or time merged with channel factor k: `[N * F, T, C]`, a dual-path RNN's GRU along time run per
frequency; `[N, C, T * F]`, PyTorch's Unfold; the factor still the edge's), "1" (a unit axis: an Unsqueeze,
a last step kept as `[N, 1, C]`, a direction count of 1), or an int k: the k-th channel factor.
The qtool edge's channels are the factors' sizes `cdims` flattened row-major in factor order: an
ONNX GRU's Y `[T, dirs, N, H]` is `("T", 0, "N", 1)` with `cdims (dirs, H)`, qtool's `[fwd | bwd]`
channels. A Transpose permutes the names; a Reshape is matched block by block on the concrete
sizes of a probe (the file's declared batch and length, or PROBE_N and PROBE_T where they are
dynamic), and may merge channel factors only in their order (anything else would permute channels).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from qtool.core import edges
from qtool.errors import QtoolError

PROBE_N, PROBE_T = 3, 11  # probe sizes for dynamic batch and time axes (shape subgraphs evaluate on them)
SPECIAL = ("N", "T", "NT")


class LayoutError(QtoolError):
    """A value's axes do not fit what an op reads (the graph input may be laid out otherwise)."""


class FixedSteps(QtoolError):
    """The graph computes on `steps` time steps whatever its input declares (torch.export fixes a
    length it computes on, such as Unfold's): read again with the input of that many steps."""

    def __init__(self, what: str, steps: int) -> None:
        super().__init__(what)
        self.steps = steps


def _name(a) -> str:
    return f"C{a}" if isinstance(a, int) else f"{a[0]}*C{a[1]}" if isinstance(a, tuple) else a


def factor(a) -> int | None:
    """The channel factor axis name `a` holds, on its own or merged with the batch or time."""
    return a if isinstance(a, int) else a[1] if isinstance(a, tuple) else None


def renumber(a, index: dict):
    """Axis name `a` with its channel factor renumbered (a factor gone: a unit axis, or the batch)."""
    if isinstance(a, int):
        return index.get(a, "1")
    if isinstance(a, tuple):
        return (a[0], index[a[1]]) if a[1] in index else a[0]
    return a


@dataclass(frozen=True)
class Layout:
    axes: tuple  # per ONNX axis: "N", "T", "NT", "1" or a channel factor's index
    cdims: tuple  # channel factor sizes (the qtool edge's channel order); () is one channel
    n: int  # the probe's batch size
    t: int  # the probe's steps of this value (convolutions, pools and pads change it)

    @staticmethod
    def make(axes, cdims, n: int, t: int) -> Layout:
        """A layout with its unit channel factors made unit axes, factors renumbered in order."""
        keep = [k for k, d in enumerate(cdims) if d != 1]
        index = {k: i for i, k in enumerate(keep)}
        axes = tuple(renumber(a, index) for a in axes)
        return Layout(axes, tuple(cdims[k] for k in keep), n, t)

    @property
    def seq(self) -> bool:
        return "T" in self.axes or "NT" in self.axes or ("T", self.merged("T")) in self.axes

    def merged(self, role: str) -> int | None:
        """The channel factor merged with the batch ("N") or time ("T"), if one is."""
        return next((a[1] for a in self.axes if isinstance(a, tuple) and a[0] == role), None)

    @property
    def channels(self) -> int:
        return math.prod(self.cdims)

    def edge_shape(self) -> tuple:
        """The qtool edge's shape: (None, C) for a sequence, (C,) for a vector."""
        return edges.sequence(self.channels) if self.seq else edges.vector(self.channels)

    def describe(self) -> str:
        return "[" + ", ".join(_name(a) for a in self.axes) + "]"

    def size(self, a) -> int:
        if isinstance(a, tuple):
            return (self.n if a[0] == "N" else self.t) * self.cdims[a[1]]
        return {"N": self.n, "T": self.t, "NT": self.n * self.t, "1": 1}[a] if isinstance(a, str) else self.cdims[a]


    def shape(self) -> list[int]:
        """The probe's concrete shape."""
        return [self.size(a) for a in self.axes]

    def replace(self, **kw) -> Layout:
        fields = dict(axes=self.axes, cdims=self.cdims, n=self.n, t=self.t)
        fields.update(kw)
        return Layout.make(**fields)

    def holds_channels(self, axis: int) -> bool:
        """Whether ONNX axis `axis` holds all the channels (one factor, or a unit axis for one channel)."""
        a = self.axes[axis]
        return (a == 0 and len(self.cdims) == 1) or (a == "1" and not self.cdims)

    def with_channels(self, axis: int, c: int) -> Layout:
        """This layout with `c` channels on `axis` (which held all of them)."""
        return self.replace(axes=self.axes[:axis] + (0,) + self.axes[axis + 1:], cdims=(c,))

    def take(self, axis: int, keep: bool) -> Layout:
        """This layout with one index taken on `axis` (kept as a unit axis with `keep`); when the axis is a
        channel factor, that factor goes (the part's channels are the remaining factors)."""
        f = self.axes[axis]
        axes = [(a - 1 if isinstance(f, int) and isinstance(a, int) and a > f else a) for a in self.axes]
        axes[axis:axis + 1] = ["1"] if keep else []
        cdims = self.cdims[:f] + self.cdims[f + 1:] if isinstance(f, int) else self.cdims
        return self.replace(axes=tuple(axes), cdims=cdims)

    def transpose(self, perm: list[int]) -> Layout:
        return self.replace(axes=tuple(self.axes[p] for p in perm))

    def unsqueeze(self, axes: list[int]) -> Layout:
        rank = len(self.axes) + len(axes)
        at = sorted(a % rank for a in axes)
        out = list(self.axes)
        for a in at:
            out.insert(a, "1")
        return self.replace(axes=tuple(out))

    def squeeze(self, axes: list[int], what: str) -> Layout:
        shape, at = self.shape(), {a % len(self.axes) for a in axes}
        units = [k for k, r in enumerate(self.axes) if r == "1" and k not in at]
        if self.n == 1 and units and any(self.axes[a] == "N" for a in at):
            # a file fixed at one sequence (TFLite's): its batch and a unit axis hold the same values,
            # and which one it squeezes says nothing; the batch stays, on the unit axis nearest it
            n = next(a for a in at if self.axes[a] == "N")
            keep = min(units, key=lambda k: abs(k - n))
            axes_ = list(self.axes)
            axes_[n], axes_[keep] = "1", "N"
            return self.replace(axes=tuple(axes_)).squeeze(axes, what)
        for a in at:
            if self.axes[a] in SPECIAL or shape[a] != 1:
                raise LayoutError(f"{what} squeezes axis {a} of {self.describe()}, which is not a unit axis")
        return self.replace(axes=tuple(r for k, r in enumerate(self.axes) if k not in at))

    def reshape(self, out: list[int], what: str, merged: frozenset = frozenset()) -> Layout:
        """The layout of this value reshaped to the concrete `out` (no 0 or -1 left in it). A batch or
        time axis fixed at 1 that finds no unit axis of `out` to stay on is merged with the block of
        axes after it (`merged`): [1, F, T, C] reshaped to [1 * F, T, C], [1, 1, F, C] to [1 * 1, F, C]
        of a file fixed at one sequence and one frame."""
        ins = self.shape()
        if min(out, default=1) < 1:
            raise LayoutError(f"{what} reshapes {ins} to {list(out)}, an empty or malformed shape")
        if math.prod(ins) != math.prod(out):
            raise LayoutError(f"{what} reshapes {ins} to {list(out)}, which does not fit (a size fixed "
                              "when the file was exported, or time folded into another axis?)")
        big_in = [k for k, s in enumerate(ins) if s != 1 or k in merged]
        big_out = [k for k, s in enumerate(out) if s != 1]
        roles: dict[int, object] = {}
        pieces: list[tuple] = []  # (sort key in factor order, output axis, size)
        blocks, spans, i, j = [], [], 0, 0
        while i < len(big_in):
            bi, bj = [big_in[i]], [big_out[j]]
            pi, pj = ins[bi[0]], out[bj[0]]
            while pi != pj:
                if pi < pj:
                    i += 1
                    bi.append(big_in[i])
                    pi *= ins[big_in[i]]
                else:
                    j += 1
                    bj.append(big_out[j])
                    pj *= out[big_out[j]]
            blocks.append((bi[-1], bj[-1]))
            spans.append((bi[0], bi[-1]))
            self._block([self.axes[k] for k in bi], bj, out, roles, pieces, what)
            i, j = i + 1, j + 1
        # a batch or time axis of size 1 (a file exported with a fixed batch of 1) keeps its place
        # between the same blocks of larger axes; else it takes a unit axis left, else it merges
        free = [k for k, s in enumerate(out) if s == 1]
        units = [k for k, s in enumerate(ins) if s == 1 and self.axes[k] in SPECIAL and k not in merged]
        placed: dict[int, int] = {}  # input axis -> the output axis it stays on

        def gap(k: int, side: int) -> int:
            return sum(1 for block in blocks if block[side] < k)

        for k in units:
            spot = next((f for f in free if gap(f, 1) == gap(k, 0)), None)
            if spot is not None:
                placed[k] = spot
                free.remove(spot)
        for k in units:
            a = self.axes[k]
            if k in placed:
                roles[placed[k]] = a
                if a == "NT" and placed[k] + 1 in free:  # [1 * 1, ...] -> [1, 1, ...]: split again
                    roles[placed[k]], roles[placed[k] + 1] = "N", "T"
                    free.remove(placed[k] + 1)
                continue
            if free:
                roles[free.pop(0)] = a
                continue
            if a == "T" and k > 0 and self.axes[k - 1] == "N" and k - 1 in placed:  # [1, 1, ...] -> [1 * 1, ...]
                roles[placed[k - 1]] = "NT"
                continue
            inside = any(first < k < last for first, last in spans)
            if not inside and any(ins[b] != 1 for b in range(k + 1, len(ins))):
                return self.reshape(out, what, merged | {k})  # [1, F, ...] -> [1 * F, ...]
            nxt = next((first for first, _ in spans if first > k), None) if inside else None
            if nxt is not None:  # a unit axis's place among a block's says nothing: it joins the next block
                perm = [i for i in range(len(ins)) if i != k]
                perm.insert(perm.index(nxt), k)
                return self.transpose(perm).reshape(out, what, frozenset(perm.index(m) for m in merged | {k}))
            raise LayoutError(f"{what} reshapes {self.describe()} {ins} to {list(out)}, dropping the "
                              f"{'batch' if a == 'N' else 'time'} axis (its size was fixed at 1 when "
                              "the file was exported: export with a dynamic "
                              f"{'batch' if a == 'N' else 'length'}, or with "
                              "torch.onnx.export(dynamo=False), whose dynamic axes stay dynamic)")
        if self.n == 1:  # [N * T] of one sequence reshaped to [1, T]: the unit axis before is its batch
            for k in [k for k, r in roles.items() if r == "NT"]:
                spot = next((f for f in reversed(free) if f < k), None)
                if spot is not None:
                    roles[spot], roles[k] = "N", "T"
                    free.remove(spot)
        # [N * F] (or [T * F]) of a size 1 reshaped to [1, F]: the unit axis before it is the batch (time)
        for idx, (key, k, size) in enumerate(pieces):
            one = isinstance(k, tuple) and {"N": self.n, "T": self.t}[k[0]] == 1
            spot = next((f for f in reversed(free) if f < k[1]), None) if one else None
            if spot is not None:
                roles[spot], pieces[idx] = k[0], (key, k[1], size)
                free.remove(spot)
        order = {p[1]: idx for idx, p in enumerate(sorted(pieces))}
        cdims = [0] * len(pieces)
        for _, k, s in pieces:
            cdims[order[k]] = s
        def role(k):
            merged = next((m for m in ("N", "T") if (m, k) in order), None)
            return order[k] if k in order else (merged, order[(merged, k)]) if merged else roles.get(k, "1")

        axes = tuple(role(k) for k in range(len(out)))
        return Layout.make(axes, tuple(cdims), self.n, self.t)

    def _block(self, roles_in: list, outs: list[int], out: list[int], roles: dict, pieces: list, what: str) -> None:
        """One block of a Reshape: input axes `roles_in` (sizes > 1) become output axes `outs`."""
        first = roles_in[0]
        if isinstance(first, int) and roles_in == list(range(first, first + len(roles_in))):
            for s, k in enumerate(outs):  # channel factors merged in their order, then split
                pieces.append(((roles_in[0], s), k, out[k]))
            return
        if len(roles_in) == 1 and len(outs) == 1 and isinstance(first, tuple):  # [N * F] kept, F still a factor
            pieces.append(((first[1], 0), (first[0], outs[0]), self.cdims[first[1]]))
        elif len(roles_in) == 1 and len(outs) == 1:
            roles[outs[0]] = roles_in[0]
        elif roles_in == ["N", "T"] and len(outs) == 1:
            roles[outs[0]] = "NT"
        elif roles_in == ["NT"] and [out[k] for k in outs] == [self.n, self.t]:
            roles[outs[0]], roles[outs[1]] = "N", "T"
        elif len(roles_in) == 2 and roles_in[0] in ("N", "T") and isinstance(roles_in[1], int) and len(outs) == 1:
            f = roles_in[1]  # [N, F, ...] -> [N * F, ...]: the factor stays the edge's
            pieces.append(((f, 0), (roles_in[0], outs[0]), self.cdims[f]))
        elif (len(roles_in) == 1 and isinstance(first, tuple)
              and [out[k] for k in outs] == [self.size(first[0]), self.cdims[first[1]]]):
            f = first[1]  # [N * F, ...] -> [N, F, ...]
            roles[outs[0]] = first[0]
            pieces.append(((f, 0), outs[1], self.cdims[f]))
        else:
            raise LayoutError(f"{what} reshapes {self.describe()} to {list(out)}, mixing "
                              f"{', '.join(_name(r) for r in roles_in)} (qtool keeps batch, time and channels apart)")

    def per_channel(self, c: np.ndarray) -> tuple[np.ndarray, int] | None:
        """A constant broadcast against this value as one number per channel (in the qtool edge's
        channel order) and the number of unit axes it prepends; None when it varies along another axis."""
        c = np.asarray(c, np.float32)
        extra = max(c.ndim - len(self.axes), 0)
        if extra and any(d != 1 for d in c.shape[:extra]):
            return None
        c = c.reshape(c.shape[extra:])
        c = c.reshape((1,) * (len(self.axes) - c.ndim) + c.shape)
        for a, d in zip(self.axes, c.shape):
            if d != 1 and not (isinstance(a, int) and d == self.cdims[a]):
                return None
        factors = [a for a in self.axes if isinstance(a, int)]
        sub = c[tuple(slice(None) if isinstance(a, int) else 0 for a in self.axes)]
        merged = [a[1] for a in self.axes if isinstance(a, tuple)]  # the same for each of its values
        sub = sub.reshape(sub.shape + (1,) * len(merged))
        factors += merged
        sub = np.broadcast_to(sub, [self.cdims[f] for f in factors])
        return np.ascontiguousarray(sub.transpose(np.argsort(factors))).reshape(-1), extra

    def to_qtool(self, a: np.ndarray, n: int) -> np.ndarray:
        """An array laid out as this value (batch `n`) as the qtool edge holds it: `[N, T, C]` or `[N, C]`."""
        axes, shape = list(self.axes), list(a.shape)
        if "NT" in axes:
            k = axes.index("NT")
            a = a.reshape(shape[:k] + [n, shape[k] // max(n, 1)] + shape[k + 1:])
            axes[k:k + 1] = ["N", "T"]
        order = [axes.index("N")] + ([axes.index("T")] if "T" in axes else [])
        order += [axes.index(f) for f in range(len(self.cdims))]
        order += [k for k, r in enumerate(axes) if r == "1"]
        a = a.transpose(order)
        return a.reshape(a.shape[:2] + (-1,) if "T" in axes else a.shape[:1] + (-1,))

    def from_qtool(self, x: np.ndarray) -> np.ndarray:
        """A qtool edge's array `[N, T, C]` or `[N, C]` laid out as this value (no "NT" axis)."""
        lead = ["N", "T"] if self.seq else ["N"]
        x = x.reshape(x.shape[:len(lead)] + tuple(self.cdims))
        names = lead + list(range(len(self.cdims)))
        x = x.transpose([names.index(a) for a in self.axes if a != "1"])
        return x.reshape([x.shape[[a for a in self.axes if a != "1"].index(a)] if a != "1" else 1
                          for a in self.axes])


FLOAT = 1  # TensorProto.FLOAT


def ints(a) -> list[int]:
    return [int(v) for v in np.asarray(a).reshape(-1)]


@dataclass(frozen=True)
class Part:
    """Channels [lo, hi) of edge `edge` (of `full` channels): PyTorch's `h_n[-2]` of a bidirectional GRU.
    Only a Concat that puts the parts back together (or layout ops) may read it."""

    edge: str
    lo: int
    hi: int
    full: int


@dataclass(frozen=True)
class Stack:
    """Values joined on ONNX axis `axis` that is not their channel axis: PyTorch's `h_n` of a stacked GRU
    (each layer's final state). Only a Gather of one of them may read it."""

    axis: int
    parts: tuple  # ((edge, Layout), ...)
