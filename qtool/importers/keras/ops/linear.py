"""Keras' weighted layers: Dense, Conv1D, DepthwiseConv1D, Conv2D and DepthwiseConv2D over a map,
QKeras' QDense and QConv1D (their weights through their quantizers)."""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np

from qtool.importers.keras.ops.common import channels_last, ints
from qtool.importers.keras.ops.registry import builds
from qtool.importers.keras.quantizers import quantize, quantizer_config
from qtool.layers import same_pads

if TYPE_CHECKING:
    from qtool.importers.keras.model_graph import Entry, Reader


QKERAS = ("QDense", "QConv1D", "QActivation")  # QKeras layers (.h5 files name them 'qkeras>QDense')



@builds("Dense", "QDense")
def _dense(r: Reader, e: Entry, src: list[str]) -> None:
    use_bias = bool(e.cfg.get("use_bias", True))
    w = _quantized_weights(r, e, r.weights(e, ["kernel", "bias"][:1 + use_bias]))
    if w["kernel"].ndim != 2 or w["kernel"].shape[1] != e.cfg.get("units"):
        raise r.fail(e, f"has a kernel of shape {w['kernel'].shape}, expected [C_in, {e.cfg.get('units')}]")
    params = {"W": np.ascontiguousarray(w["kernel"].T)} | ({"b": w["bias"]} if use_bias else {})
    r.add(e, "dense", src, {}, params, e.cfg.get("activation"))


@builds("Conv1D", "DepthwiseConv1D", "QConv1D")
def _conv(r: Reader, e: Entry, src: list[str]) -> None:
    channels_last(r, e)
    (k,), (s,), (d,) = ints(r, e, "kernel_size"), ints(r, e, "strides", 1), ints(r, e, "dilation_rate", 1)
    padding = e.cfg.get("padding", "valid")
    if padding not in ("valid", "same", "causal"):
        raise r.fail(e, f"has padding={padding!r}; supported: 'valid', 'same', 'causal'")
    if padding == "causal" and e.cls == "QConv1D":  # QConv1D hands it to keras.ops.conv, which does not pad
        raise r.fail(e, "has padding='causal', which QKeras' QConv1D does not compute as Keras' Conv1D does; "
                     "supported there: 'valid', 'same'")
    use_bias = bool(e.cfg.get("use_bias", True))
    w = _quantized_weights(r, e, r.weights(e, ["kernel", "bias"][:1 + use_bias]))
    kernel, c_in = w["kernel"], r.shapes[src[0]][-1]
    if e.cls in ("Conv1D", "QConv1D"):
        (groups,) = ints(r, e, "groups", 1)
        if kernel.ndim != 3 or kernel.shape[0] != k or kernel.shape[2] != e.cfg.get("filters"):
            raise r.fail(e, f"has a kernel of shape {kernel.shape}, expected [{k}, C_in / groups, "
                         f"{e.cfg.get('filters')}]")
        W = kernel.transpose(2, 1, 0)  # [C_out, C_in / groups, kernel]
    else:  # DepthwiseConv1D: kernel [k, C_in, multiplier], output channel c * multiplier + m
        (mult,) = ints(r, e, "depth_multiplier", 1)
        if kernel.shape != (k, c_in, mult):
            raise r.fail(e, f"has a kernel of shape {kernel.shape}, expected [{k}, {c_in}, {mult}]")
        groups, W = c_in, kernel.transpose(1, 2, 0).reshape(c_in * mult, 1, k)
    attrs = {"kernel": k, "stride": s, "dilation": d, "groups": groups, "padding": padding}
    params = {"W": np.ascontiguousarray(W)} | ({"b": w["bias"]} if use_bias else {})
    r.add(e, "conv1d", src, attrs, params, e.cfg.get("activation"))


@builds("Conv2D", "DepthwiseConv2D")
def _conv2d(r: Reader, e: Entry, src: list[str]) -> None:
    """Conv2D and DepthwiseConv2D over a map [N, T, F, C] (time, frequency): conv2d on "fc" frames."""
    if src[0] not in r.maps:
        raise r.fail(e, "reads no feature map; qtool reads Conv2D over a map [N, T, F, C] (a 4-D input)")
    if e.cfg.get("data_format", "channels_last") not in ("channels_last", None):
        raise r.fail(e, f"has data_format={e.cfg.get('data_format')!r}; qtool reads channels_last maps")
    freq = r.maps[src[0]]
    c_in = r.shapes[src[0]][-1] // freq
    kernel, stride = ints(r, e, "kernel_size", None, 2), ints(r, e, "strides", 1, 2)
    dilation = ints(r, e, "dilation_rate", 1, 2)
    padding = e.cfg.get("padding", "valid")
    if padding not in ("valid", "same"):
        raise r.fail(e, f"has padding={padding!r}; supported: 'valid', 'same'")
    use_bias = bool(e.cfg.get("use_bias", True))
    w = r.weights(e, ["kernel", "bias"][:1 + use_bias])
    k = w["kernel"]
    if e.cls == "Conv2D":
        (groups,) = ints(r, e, "groups", 1)
        if k.ndim != 4 or tuple(k.shape[:2]) != tuple(kernel) or k.shape[2] * groups != c_in:
            raise r.fail(e, f"has a kernel of shape {k.shape} for {c_in} channels")
        W = k.transpose(3, 2, 0, 1)  # [C_out, C_in / groups, kt, kf]
    else:  # DepthwiseConv2D: [kt, kf, C_in, multiplier], output channel c * multiplier + m
        (mult,) = ints(r, e, "depth_multiplier", 1)
        if k.shape != (*kernel, c_in, mult):
            raise r.fail(e, f"has a kernel of shape {k.shape}, expected [{kernel[0]}, {kernel[1]}, {c_in}, {mult}]")
        groups, W = c_in, k.transpose(2, 3, 0, 1).reshape(c_in * mult, 1, *kernel)
    freq_pads = same_pads(freq, kernel[1], stride[1], dilation[1]) if padding == "same" else (0, 0)
    attrs = {"kernel": tuple(kernel), "stride": tuple(stride), "dilation": tuple(dilation), "groups": groups,
             "padding": padding, "freq": freq, "freq_pads": freq_pads, "order": "fc"}
    params = {"W": np.ascontiguousarray(W)} | ({"b": w["bias"]} if use_bias else {})
    r.add(e, "conv2d", src, attrs, params, e.cfg.get("activation"))
    span = (kernel[1] - 1) * dilation[1] + 1
    r.maps[r.edge[e.name]] = (freq + sum(freq_pads) - span) // stride[1] + 1


def _quantized_weights(r: Reader, e: Entry, w: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    """A QDense's or QConv1D's kernel and bias as its forward uses them: through its
    kernel_quantizer and bias_quantizer (quantized_bits, qtool's port of QKeras' own arithmetic),
    so a fake-quant on a constant folds into it; other layers' weights as stored."""
    if e.cls not in QKERAS:
        return w
    out = dict(w)
    for key in ("kernel", "bias"):
        c = quantizer_config(e.name, f"{key}_quantizer", e.cfg.get(f"{key}_quantizer"), f"{r.where}: layer {e.label}")
        if c is not None and key in w:
            out[key] = quantize(c, w[key])
    return out
