"""The integer type in which `qtool.numerics.intops` computes: the lane type of the cell.

numba widens every integer operation to int64, so a cell that reads int32 values still runs in
int64 lanes (8 per AVX-512 register). The intops primitives instead compute in the type of the
model's constant they are given (a shift count, a saturation bound: rows of `P` and `CH`):
with the usual int64 constants nothing changes; with int32 constants every value is kept in
int32 (`lane`), shifts included (`shl`, `shr`), and LLVM vectorises the cell over 16 int32
lanes. Additions, subtractions and products need no care: LLVM narrows them, since their low
32 bits do not depend on the high ones.

The int32 constants are given only to a cell whose every intermediate value provably fits int32
(`qtool.numerics.lane_bounds`, from the interval proof of `qtool.numerics.interval` that also chooses the
exported C's types), so both give the same integers. Plain Python (numba's CUDA simulator,
tests) runs the functions as written: int64 semantics.
"""

from __future__ import annotations

import numpy as np
from numba import types
from numba.extending import intrinsic, overload


def lane(x, like):
    """x in the integer type of `like` (the lane type); x must fit it."""
    return x


def shl(v, n):
    """v << n in v's own type (numba would widen an int32 v to int64 first)."""
    return v << n


def shr(v, n):
    """v >> n (arithmetic) in v's own type."""
    return v >> n


@overload(lane, target="generic", inline="always")
def _lane(x, like):
    if not isinstance(x, types.Integer) or not isinstance(like, types.Integer):
        return None
    to = np.dtype(str(types.unliteral(like))).type
    return lambda x, like: to(x)


def _shift(op: str):
    def shift(typingctx, v, n):
        if not isinstance(v, types.Integer) or not isinstance(n, types.Integer) or not v.signed:
            return None  # signed values only: shr is an arithmetic shift
        vt, nt = types.unliteral(v), types.unliteral(n)

        def codegen(context, builder, signature, args):
            return getattr(builder, op)(args[0], context.cast(builder, args[1], nt, vt))

        return vt(vt, nt), codegen

    return intrinsic(target="generic")(shift)


_shl, _shr = _shift("shl"), _shift("ashr")


@overload(shl, target="generic", inline="always")
def _shl_ov(v, n):
    return lambda v, n: _shl(v, n)


@overload(shr, target="generic", inline="always")
def _shr_ov(v, n):
    return lambda v, n: _shr(v, n)
