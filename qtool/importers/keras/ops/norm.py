"""Keras' normalizations: BatchNormalization and LayerNormalization (over the channels, or a map's frame)."""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np

from qtool.importers.keras.ops.common import last_axis, per_channel
from qtool.importers.keras.ops.registry import builds

if TYPE_CHECKING:
    from qtool.importers.keras.model_graph import Entry, Reader


@builds("BatchNormalization")
def _batchnorm(r: Reader, e: Entry, src: list[str]) -> None:
    last_axis(r, e, "axis", (None, None, None) if r.on_map else r.shapes[src[0]])
    if e.cfg.get("renorm"):
        raise r.fail(e, "has renorm=True; only plain batch normalization is supported")
    scale, center = bool(e.cfg.get("scale", True)), bool(e.cfg.get("center", True))
    roles = ["gamma"] * scale + ["beta"] * center + ["moving_mean", "moving_variance"]
    w = r.weights(e, roles)
    c = w["moving_mean"].shape
    params = {"gamma": w.get("gamma", np.ones(c, np.float32)), "beta": w.get("beta", np.zeros(c, np.float32)),
              "mean": w["moving_mean"], "var": w["moving_variance"]}
    eps = e.cfg.get("epsilon", 1e-3)
    if not isinstance(eps, (int, float)) or not eps > 0:
        raise r.fail(e, f"has epsilon={eps!r}")
    width = r.shapes[src[0]][-1]
    r.add(e, "batchnorm", src, {"epsilon": float(eps)}, {k: per_channel(r, v, width) for k, v in params.items()})


@builds("LayerNormalization")
def _layernorm(r: Reader, e: Entry, src: list[str]) -> None:
    """Over the channels (axis -1), with its gamma and beta where it has them."""
    axis, c = e.cfg.get("axis", -1), r.shapes[src[0]][-1]
    axes = axis if isinstance(axis, list) else [axis]
    rank = len(r.shapes[src[0]]) + 1 + bool(r.on_map)
    if r.on_map and sorted(a % rank for a in axes) == [2, 3] and not e.cfg.get("rms_scaling"):
        axes = [rank - 1]  # a map's frequencies and channels: the whole frame
    elif r.on_map:
        c //= r.on_map  # each frequency's channels, "fc" frames: groups of C, one after another
    if [a % rank for a in axes] != [rank - 1] or e.cfg.get("rms_scaling"):
        raise r.fail(e, f"normalizes axis {axis}{' by RMS' if e.cfg.get('rms_scaling') else ''}; qtool's "
                     "layernorm normalizes the channels (axis -1)")
    scale, center = e.cfg.get("scale", True), e.cfg.get("center", True)
    w = r.weights(e, ["gamma"] * scale + ["beta"] * center)
    eps = e.cfg.get("epsilon", 1e-3)
    if not isinstance(eps, (int, float)) or not eps > 0:
        raise r.fail(e, f"has epsilon={eps!r}")
    width = r.shapes[src[0]][-1]
    params = {k: per_channel(r, w.get(k, np.full(c, v, np.float32)), width)
              for k, v in (("gamma", 1.0), ("beta", 0.0))}
    r.add(e, "layernorm", src, {"size": c, "epsilon": float(eps)}, params)
