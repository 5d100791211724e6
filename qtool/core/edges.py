"""An edge's shape, the one place that reads it. Edges carry batch-first float tensors, channels
last; a shape leaves out the batch axis:

- a sequence `[N, T, C]` is `(None, C)`: any number of steps T (None), C channels;
- a vector `[N, C]` is `(C,)`: after a layer that takes the last step or pools over time.

A feature map `[N, T, F, C]` travels as a sequence of its frames flattened, `(None, F * C)`; the
layers that read it as a map know F (qtool.layers.input_map). Every module asks this one what a
shape is, so that another kind of edge is a change here and in the layers that take it."""

from __future__ import annotations

Shape = tuple  # (None, C) or (C,)


def sequence(c: int) -> Shape:
    return (None, c)


def vector(c: int) -> Shape:
    return (c,)


def is_sequence(shape: Shape) -> bool:
    return len(shape) == 2


def channels(shape: Shape) -> int:
    return shape[-1]


def with_channels(shape: Shape, c: int) -> Shape:
    """The same kind of edge with `c` channels."""
    return sequence(c) if is_sequence(shape) else vector(c)


def well_formed(shape) -> bool:
    """A tuple that is a sequence or a vector of a whole number of channels."""
    return (isinstance(shape, tuple) and len(shape) in (1, 2) and isinstance(shape[-1], int)
            and (len(shape) == 1 or shape[0] is None))


def kind(sequences: bool) -> str:
    """How a refusal names what a layer takes: "a sequence (None, C)" or "a vector (C,)"."""
    return "a sequence (None, C)" if sequences else "a vector (C,)"


def array_text(shape: Shape) -> str:
    """The arrays of the edge, batch first: `[N, T, 12]` or `[N, 12]`."""
    return f"[N, T, {channels(shape)}]" if is_sequence(shape) else f"[N, {channels(shape)}]"


def array_rank(shape: Shape) -> int:
    """The number of axes of its arrays, batch included."""
    return len(shape) + 1


def zeros_shape(shape: Shape, n: int, t: int) -> tuple[int, ...]:
    """The array shape of `n` of its values (sequences of `t` steps)."""
    return (n, t, channels(shape)) if is_sequence(shape) else (n, channels(shape))


def classes(shape: Shape) -> int | None:
    """The classes a vector of two or more values scores; None for any other edge."""
    return channels(shape) if not is_sequence(shape) and channels(shape) >= 2 else None


def from_list(v) -> Shape | None:
    """A shape as a file stores it (`[null, C]` or `[C]`), or None when it is not one."""
    shape = tuple(v) if isinstance(v, list) else None
    return shape if shape is not None and well_formed(shape) else None
