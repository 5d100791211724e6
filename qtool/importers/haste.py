"""haste GRU weights in `.npz`: kernel [C, 3H], recurrent_kernel [H, 3H], bias and
recurrent_bias [3H], gates z | r | g (haste's own order, the canonical one).

Keys may carry a prefix per layer (`layer0/kernel`, `l1_kernel`, ...); prefixes are stacked in
natural order when their shapes chain.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from qtool.errors import QtoolError
from qtool.importers import natural_key, stack_layers
from qtool.model import GruCell

PARTS = ("kernel", "recurrent_kernel", "bias", "recurrent_bias")


def read_haste(path: Path) -> dict:
    try:
        with np.load(path, allow_pickle=False) as z:
            arrays = {k: z[k] for k in z.files}
    except Exception as e:  # zipfile and numpy raise several types for corrupt archives
        raise QtoolError(f"{path}: not a readable .npz file ({e})") from None
    prefixes = sorted({k[: -len("kernel")] for k in arrays
                       if k.endswith("kernel") and not k.endswith("recurrent_kernel")},
                      key=natural_key)
    layers = []
    for p in prefixes:
        missing = [n for n in PARTS if p + n not in arrays]
        if missing:
            raise QtoolError(f"{path}: haste weights '{p}' lack {', '.join(missing)}")
        k, rk, b, rb = (np.asarray(arrays[p + n], np.float32) for n in PARTS)
        if k.ndim != 2 or rk.ndim != 2 or rk.shape[1] != 3 * rk.shape[0]:
            raise QtoolError(f"{path}: '{p}recurrent_kernel' must be [H, 3H], got {rk.shape}")
        layers.append([GruCell(k.T, rk.T, b, rb)])
    if not layers:
        return {}
    return {"": stack_layers(layers, str(path))}
