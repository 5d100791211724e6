"""Keras' activation layers: ReLU, LeakyReLU, PReLU, Activation, Softmax, UnitNormalization and
QKeras' QActivation (its quantizer's float function, its grid the edge's range)."""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np

from qtool.importers.keras.ops.common import activation_of, last_axis, per_channel
from qtool.importers.keras.ops.registry import builds
from qtool.importers.keras.quantizers import activation_grid, is_quantizer

if TYPE_CHECKING:
    from qtool.importers.keras.model_graph import Entry, Reader


@builds("QActivation")
def _qactivation(r: Reader, e: Entry, src: list[str]) -> None:
    """QActivation(quantizer): the quantizer's float function (the identity for quantized_bits,
    a relu for quantized_relu and for quantized_bits(keep_negative=False)); its grid the range of
    the edge it writes."""
    value = e.cfg.get("activation")
    q = activation_grid(f"{r.where}: layer {e.label}", "activation", value if isinstance(value, dict) else str(value))
    if q.kind == "linear":
        r.edge[e.name] = src[0]
    else:
        r.add(e, "activation", src, {"kind": q.kind})
    r.quantized(r.edge[e.name], q, f"{e.cls} '{e.name}' ({q.label})")


@builds("PReLU")
def _prelu(r: Reader, e: Entry, src: list[str]) -> None:
    """A slope per channel, shared over time (`shared_axes=[1]`); one per step is refused."""
    alpha = np.asarray(r.weights(e, ["alpha"])["alpha"], np.float32)
    per = per_channel(r, alpha, r.shapes[src[0]][-1])
    if alpha.ndim < 1 or alpha.shape[0] != 1 or per.size != r.shapes[src[0]][-1]:
        raise r.fail(e, f"has slopes of shape {list(alpha.shape)}; qtool reads one slope per channel (PReLU with "
                     "shared_axes=[1] on a sequence)")
    r.add(e, "prelu", src, {}, {"alpha": per})


@builds("ReLU", "LeakyReLU")
def _relu(r: Reader, e: Entry, src: list[str]) -> None:
    if e.cls == "LeakyReLU":  # Keras 3: negative_slope (default 0.3); Keras 2: alpha
        slope = e.cfg.get("negative_slope", e.cfg.get("alpha", 0.3))
        r.add(e, "activation", src, {"kind": "leaky_relu", "alpha": float(slope)})
        return
    top, slope, threshold = e.cfg.get("max_value"), e.cfg.get("negative_slope") or 0, e.cfg.get("threshold") or 0
    if threshold == 0 and slope == 0 and top in (None, 6):
        r.add(e, "activation", src, {"kind": "relu" if top is None else "relu6"})
    elif threshold == 0 and top is None and isinstance(slope, (int, float)):
        r.add(e, "activation", src, {"kind": "leaky_relu", "alpha": float(slope)})
    else:
        raise r.fail(e, f"has max_value={top!r}, negative_slope={slope!r}, threshold={threshold!r}; supported: "
                     "ReLU(), ReLU(max_value=6) (relu6) and ReLU(negative_slope=a) (leaky_relu)")


@builds("Activation", "Softmax", "UnitNormalization")
def _act_layer(r: Reader, e: Entry, src: list[str]) -> None:
    if e.cls == "Activation" and is_quantizer(e.cfg.get("activation")):  # Activation(quantized_relu(...))
        _qactivation(r, e, src)
        return
    if e.cls == "Activation":
        act = activation_of(r, e, e.cfg.get("activation"))
        if act is None:  # linear: the identity
            r.edge[e.name] = src[0]
        else:
            r.add(e, act[0], src, dict(act[1]))
        return
    last_axis(r, e, "axis", r.shapes[src[0]])
    if e.cls == "Softmax":
        r.add(e, "softmax", src)
    else:  # Keras 3's UnitNormalization: x * min(rsqrt(sum(x^2)), 1e12)
        r.add(e, "l2_normalize", src, {"epsilon": 1e-12})
