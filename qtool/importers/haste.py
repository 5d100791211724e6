"""haste GRU weights in `.npz`: kernel [C, 3H], recurrent_kernel [H, 3H], bias and
recurrent_bias [3H], gates z | r | g (haste's own order, the canonical one).

Keys may carry a prefix per layer (`layer0/kernel`, `l1_kernel`, ...); prefixes are stacked in
natural order and must chain. Only these arrays are read, each after its header was checked.
"""

from __future__ import annotations

import zipfile
from pathlib import Path

import numpy as np

from qtool.core.model import GruCell
from qtool.errors import QtoolError
from qtool.importers.checks import (
    as_float32,
    check_archive,
    check_float_dtype,
    check_size,
    expect_shape,
    hidden_from_recurrent,
    reason,
)
from qtool.importers.stack import Stack, chained, natural_key

PARTS = ("kernel", "recurrent_kernel", "bias", "recurrent_bias")
# haste's LayerNormGRU adds these per layer: a different cell, refused rather than half-read
LAYER_NORM = ("gamma", "gamma_h", "beta", "beta_h")


def _read_member(path: Path, z: zipfile.ZipFile, key: str) -> np.ndarray:
    """One array of the archive, its .npy header checked before the data is read."""
    with z.open(key + ".npy") as f:
        version = np.lib.format.read_magic(f)
        if version not in ((1, 0), (2, 0)):
            raise QtoolError(f"{path}: array '{key}' has .npy format version {version}; expected 1.0 or 2.0")
        header = np.lib.format.read_array_header_1_0 if version == (1, 0) else np.lib.format.read_array_header_2_0
        shape, _, dtype = header(f)
        check_size(str(path), key, shape)
        check_float_dtype(str(path), key, dtype)
    with z.open(key + ".npy") as f:
        return np.lib.format.read_array(f, allow_pickle=False)


def refuse_data(path: Path) -> None:
    """A .npz that holds no haste weights (no `kernel`) but arrays: data given where the model goes."""
    try:
        with zipfile.ZipFile(path) as z:
            names = [n[:-4] for n in z.namelist() if n.endswith(".npy")]
    except (OSError, zipfile.BadZipFile):
        return
    if names and not any(n.endswith("kernel") for n in names):
        shown = ", ".join(names[:4]) + (" ..." if len(names) > 4 else "")
        raise QtoolError(f"{path}: data (arrays {shown}), not a model's weights: the model comes first, then the "
                         "data")


def _read_arrays(path: Path) -> tuple[dict, list]:
    try:
        with zipfile.ZipFile(path) as z:
            names = [n[:-4] for n in z.namelist() if n.endswith(".npy")]
            prefixes = sorted({k[: -len("kernel")] for k in names
                               if k.endswith("kernel") and not k.endswith("recurrent_kernel")}, key=natural_key)
            wanted = [p + n for p in prefixes for n in PARTS if p + n in names]
            check_archive(path, z, {k + ".npy" for k in wanted})
            arrays = {k: _read_member(path, z, k) for k in wanted}
            extra = [p + n for p in prefixes for n in LAYER_NORM if p + n in names]
    except QtoolError:
        raise
    except Exception as e:  # zipfile and numpy raise several types for corrupt archives
        raise QtoolError(f"{path}: not a readable .npz file ({reason(e)})") from None
    if extra:
        raise QtoolError(f"{path}: '{extra[0]}' is a layer-norm parameter (haste LayerNormGRU); only "
                         "the plain haste GRU is supported")
    return arrays, prefixes


def read_haste(path: Path) -> dict[str, Stack]:
    arrays, prefixes = _read_arrays(path)
    where = str(path)
    layers = []
    for p in prefixes:
        missing = [n for n in PARTS if p + n not in arrays]
        if missing:
            raise QtoolError(f"{path}: haste weights '{p}' lack {', '.join(missing)}")
        k, rk, b, rb = (as_float32(where, p + n, arrays[p + n]) for n in PARTS)
        H = hidden_from_recurrent(where, p + "recurrent_kernel", rk, rows_first=False)
        if k.ndim != 2 or k.shape[1] != 3 * H:
            raise QtoolError(f"{path}: tensor '{p}kernel' has shape {k.shape}, expected [C, {3 * H}] (H={H})")
        for n, a in (("bias", b), ("recurrent_bias", rb)):
            expect_shape(where, p + n, a, (3 * H,))
        layers.append([GruCell(k.T, rk.T, b, rb)])
    if not layers:
        return {}
    if not chained(layers):
        raise QtoolError(f"{path}: the haste layers ({', '.join(p or '(no prefix)' for p in prefixes)}) do "
                         "not chain: each layer's input size must be the hidden size of the one before")
    return {"": Stack(layers)}
