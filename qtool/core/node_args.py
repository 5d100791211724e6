"""What a layer module (qtool.layers) reads from its graph node, for its `out_shape` and `forward`:
attributes, parameters, input shapes and windows of steps, every refusal worded the same way
("node NAME (Source): what is wrong"), so that a module holds its math and little else."""

from __future__ import annotations

import numpy as np

from qtool.core import edges
from qtool.core.graph import Node
from qtool.errors import QtoolError

REQUIRED = object()  # an attribute's default when the op cannot run without it
MAX_STEPS = 1 << 20  # a kernel, pool, stride, dilation or padding of more steps is refused


def fail(node: Node, what: str) -> QtoolError:
    """The error to raise: one line naming the node."""
    return QtoolError(f"node {node.label}: {what}")


def only(node: Node, attrs: tuple = (), params: tuple = (), optional: tuple = ()) -> None:
    """Refuse attributes and params the op does not know: a misspelt `strides` would otherwise
    run silently with the default."""
    extra = sorted(set(node.attrs) - set(attrs))
    if extra:
        raise fail(node, f"unknown attribute '{extra[0]}' (the op takes: {', '.join(attrs) or 'none'})")
    extra = sorted(set(node.params) - set(params) - set(optional))
    if extra:
        raise fail(node, f"unknown param '{extra[0]}' (the op takes: {', '.join(params + optional) or 'none'})")


def want_inputs(node: Node, shapes: list[tuple], count: int | None = 1, seq: bool | None = None) -> None:
    """`count` inputs (None: two or more), all sequences (`seq` True), all vectors (False) or
    either (None)."""
    n = len(shapes)
    if (count is None and n < 2) or (count is not None and n != count):
        raise fail(node, f"takes {'two or more inputs' if count is None else f'{count} input(s)'}, got {n}")
    for s in shapes:
        if seq is not None and edges.is_sequence(s) != seq:
            raise fail(node, f"takes {edges.kind(seq)}, got shape {s}")


def same_steps(node: Node, xs: list[np.ndarray]) -> None:
    """Inputs that meet elementwise or side by side must have the same batch and steps: a graph's
    shapes leave the steps free, so a mismatch shows only when it runs."""
    if any(x.shape[:-1] != xs[0].shape[:-1] for x in xs):
        raise fail(node, "its inputs have different batch or step counts: "
                         + ", ".join(str(list(x.shape[:-1])) for x in xs))


def _int(v) -> int | None:
    if isinstance(v, np.integer):
        v = int(v)
    return v if isinstance(v, int) and not isinstance(v, bool) else None


def attr_int(node: Node, name: str, default=REQUIRED, low: int = 1, high: int = MAX_STEPS) -> int:
    """An integer attribute in low..high: bounded, so that no window or padding it sizes can
    ask for more memory than the data it runs on."""
    v = node.attrs.get(name, default)
    if v is REQUIRED:
        raise fail(node, f"attribute '{name}' is missing")
    if _int(v) is None or not low <= v <= high:
        raise fail(node, f"attribute '{name}' must be an integer in {low}..{high}, got {v!r:.40}")
    return int(v)


def attr_float(node: Node, name: str, default=REQUIRED, positive: bool = False) -> float:
    v = node.attrs.get(name, default)
    if v is REQUIRED:
        raise fail(node, f"attribute '{name}' is missing")
    ok = isinstance(v, (int, float, np.integer, np.floating)) and not isinstance(v, bool) and np.isfinite(v)
    if not ok or (positive and v <= 0):
        raise fail(node, f"attribute '{name}' must be a finite{' positive' if positive else ''} number, got {v!r:.40}")
    return float(v)


def attr_bool(node: Node, name: str, default=REQUIRED) -> bool:
    v = node.attrs.get(name, default)
    if v is REQUIRED:
        raise fail(node, f"attribute '{name}' is missing")
    if not isinstance(v, (bool, np.bool_)):
        raise fail(node, f"attribute '{name}' must be true or false, got {v!r:.40}")
    return bool(v)


def attr_steps(node: Node, name: str, v=None) -> tuple[int, int] | None:
    """A (before, after) pair of step counts in 0..MAX_STEPS (`v`: the attribute's value, if
    already read), or None when it is not one."""
    v = node.attrs.get(name) if v is None else v
    if isinstance(v, (tuple, list)) and len(v) == 2 and all(_int(p) is not None and 0 <= p <= MAX_STEPS for p in v):
        return int(v[0]), int(v[1])
    return None


def attr_padding(node: Node, names: tuple) -> str | tuple[int, int]:
    """`padding`: one of `names` or explicit (left, right) steps of zeros."""
    v = node.attrs.get("padding", "valid")
    if isinstance(v, str) and v in names:
        return v
    pair = attr_steps(node, "padding", v)
    if pair is None:
        raise fail(node, f"attribute 'padding' must be one of {', '.join(names)} or (left, right) steps in "
                         f"0..{MAX_STEPS}, got {v!r:.40}")
    return pair


def param(node: Node, name: str, shape: tuple, optional: bool = False) -> np.ndarray | None:
    """A float param of `shape` (None in it: any size there), finite; None when `optional` and
    absent."""
    a = node.params.get(name)
    if a is None:
        if optional:
            return None
        raise fail(node, f"param '{name}' is missing")
    if not isinstance(a, np.ndarray) or a.dtype.kind != "f":
        raise fail(node, f"param '{name}' must be a float array, got {type(a).__name__} "
                         f"{getattr(a, 'dtype', '')}".rstrip())
    if a.ndim != len(shape) or any(w is not None and w != s for w, s in zip(shape, a.shape)):
        want = "[" + ", ".join("?" if w is None else str(w) for w in shape) + "]"
        raise fail(node, f"param '{name}' has shape {list(a.shape)}, expected {want}")
    if not np.all(np.isfinite(a)):
        raise fail(node, f"param '{name}' contains NaN or Inf")
    return a


def f32(a: np.ndarray | None) -> np.ndarray | None:
    return None if a is None else np.asarray(a, np.float32)


def same_pads(steps: int, kernel: int, stride: int, dilation: int = 1) -> tuple[int, int]:
    """Keras' (and TensorFlow's) "same": the output has ceil(T / stride) steps; the zeros that
    takes are split with the odd one after."""
    span = (kernel - 1) * dilation + 1
    total = max((-(-steps // stride) - 1) * stride + span - steps, 0)
    return total // 2, total - total // 2


def window_pads(padding: str | tuple[int, int], steps: int, kernel: int, stride: int, dilation: int = 1
                ) -> tuple[int, int]:
    """The (before, after) steps of zeros a convolution's `padding` adds to `steps` steps: none
    ("valid"), Keras' "same", "causal" ((kernel - 1) * dilation before) or explicit (left, right)."""
    if padding == "valid":
        return 0, 0
    if padding == "same":
        return same_pads(steps, kernel, stride, dilation)
    if padding == "causal":
        return (kernel - 1) * dilation, 0
    return padding


def windows(node: Node, x: np.ndarray, kernel: int, stride: int, dilation: int = 1) -> np.ndarray:
    """The sliding windows of an already padded `x [N, T, C]`: `[N, T_out, kernel, C]`, tap j of
    output step t being step t * stride + j * dilation; a read-only view of `x` (nothing copied)."""
    span = (kernel - 1) * dilation + 1
    if x.shape[1] < span:
        raise fail(node, f"{x.shape[1]} steps (after padding) are fewer than the window's {span}")
    t_out = (x.shape[1] - span) // stride + 1
    s0, s1, s2 = x.strides
    return np.lib.stride_tricks.as_strided(x, (x.shape[0], t_out, kernel, x.shape[2]),
                                           (s0, stride * s1, dilation * s1, s2), writeable=False)
