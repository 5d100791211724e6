"""PyTorch `nn.GRU` state_dicts from `.pt`/`.pth` (weights_only) and `.safetensors`.

PyTorch stores gates r | z | n; the canonical order is z | r | g, so blocks are reordered.
"""

from __future__ import annotations

import re
from pathlib import Path

import numpy as np

from qtool.errors import QtoolError
from qtool.model import GruCell

KEY = re.compile(r"^(?P<prefix>.*?)(?P<kind>weight_ih|weight_hh|bias_ih|bias_hh)_l(?P<layer>\d+)"
                 r"(?P<rev>_reverse)?$")


def rzn_to_zrg(a: np.ndarray) -> np.ndarray:
    r, z, n = np.split(np.asarray(a, np.float32), 3, axis=0)
    return np.concatenate([z, r, n], axis=0)


def _flatten(d, prefix: str = "") -> dict:
    out = {}
    for k, v in d.items():
        if isinstance(v, dict):
            out.update(_flatten(v, f"{prefix}{k}."))
        else:
            out[f"{prefix}{k}"] = v
    return out


def _load(path: Path, fmt: str) -> dict:
    if fmt == "safetensors":
        try:
            from safetensors.numpy import load_file
        except ImportError:
            raise QtoolError("reading .safetensors needs the 'safetensors' package "
                             "(pip install safetensors)") from None
        try:
            return dict(load_file(str(path)))
        except Exception as e:  # the library raises several types for corrupt files
            raise QtoolError(f"{path}: not a readable safetensors file ({e})") from None
    try:
        import torch
    except ImportError:
        raise QtoolError("reading .pt/.pth files needs PyTorch (pip install torch); or export "
                         "the state_dict to .safetensors") from None
    try:
        obj = torch.load(str(path), map_location="cpu", weights_only=True)
    except Exception as e:  # unpickling errors come in many types
        raise QtoolError(f"{path}: cannot load as a weights-only PyTorch file "
                         f"({str(e).splitlines()[0][:200]})") from None
    if not isinstance(obj, dict):
        raise QtoolError(f"{path}: expected a state_dict (a dict of tensors), got {type(obj).__name__}")
    flat = _flatten(obj)
    return {k: v.detach().float().numpy() for k, v in flat.items() if hasattr(v, "detach")}


def read_torch(path: Path, fmt: str) -> dict:
    tensors = _load(path, fmt)
    stacks: dict[str, dict] = {}
    for key, val in tensors.items():
        m = KEY.match(key)
        if m:
            prefix = m["prefix"].rstrip(".")
            stacks.setdefault(prefix, {})[(int(m["layer"]), bool(m["rev"]), m["kind"])] = val
    out = {}
    for prefix, parts in stacks.items():
        num_layers = 1 + max(k[0] for k in parts)
        bidir = any(k[1] for k in parts)
        layers = []
        for l in range(num_layers):
            cells = []
            for rev in ((False, True) if bidir else (False,)):
                try:
                    w_ih, w_hh = parts[(l, rev, "weight_ih")], parts[(l, rev, "weight_hh")]
                except KeyError as e:
                    raise QtoolError(f"{path}: GRU '{prefix}' lacks {e.args[0][2]} of layer {l}") from None
                zeros = np.zeros(w_hh.shape[0], np.float32)
                b_ih = parts.get((l, rev, "bias_ih"), zeros)
                b_hh = parts.get((l, rev, "bias_hh"), zeros)
                if w_hh.ndim != 2 or w_hh.shape[0] != 3 * w_hh.shape[1]:
                    raise QtoolError(f"{path}: '{prefix}' weight_hh_l{l} has shape {w_hh.shape}; "
                                     "not a GRU (an LSTM has 4H rows)")
                cells.append(GruCell(rzn_to_zrg(w_ih), rzn_to_zrg(w_hh), rzn_to_zrg(b_ih),
                                     rzn_to_zrg(b_hh)))
            layers.append(cells)
        out[prefix] = layers
    return out
