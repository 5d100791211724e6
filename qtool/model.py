"""The canonical float GRU: weights in the seed's layout, gate blocks z | r | g, and its HDF5 file.

File layout (format "qtool-gru", version 1), documented in docs/file-formats.md:

    /                attrs: format, version, input_size, hidden_size, num_layers, bidirectional,
                            name, source
    /layer{l}/{fwd,bwd}/W   [3H, C_l]   input weights
                        R   [3H, H]     recurrent weights
                        bx  [3H]        input bias
                        br  [3H]        recurrent bias
"""

from __future__ import annotations

from dataclasses import dataclass, field

import h5py
import numpy as np

from qtool.errors import QtoolError

FORMAT = "qtool-gru"
VERSION = 1
DIRECTIONS = ("fwd", "bwd")


@dataclass
class GruCell:
    """One direction of one layer: W [3H, C], R [3H, H], bx [3H], br [3H], gates z | r | g."""

    W: np.ndarray
    R: np.ndarray
    bx: np.ndarray
    br: np.ndarray

    def __post_init__(self) -> None:
        self.W, self.R = (np.ascontiguousarray(a, np.float32) for a in (self.W, self.R))
        self.bx, self.br = (np.ascontiguousarray(a, np.float32).reshape(-1) for a in (self.bx, self.br))
        three_h = self.R.shape[0]
        if three_h % 3 or self.R.shape != (three_h, three_h // 3):
            raise QtoolError(f"recurrent weights must be [3H, H], got {self.R.shape}")
        if self.W.ndim != 2 or self.W.shape[0] != three_h:
            raise QtoolError(f"input weights must be [3H, C] with 3H={three_h}, got {self.W.shape}")
        if self.bx.shape != (three_h,) or self.br.shape != (three_h,):
            raise QtoolError(f"biases must have 3H={three_h} entries, got {self.bx.shape}, {self.br.shape}")
        for name in ("W", "R", "bx", "br"):
            if not np.all(np.isfinite(getattr(self, name))):
                raise QtoolError(f"weights '{name}' contain NaN or Inf")


@dataclass
class GruModel:
    """A (possibly stacked, possibly bidirectional) GRU: `layers[l][d]` is a GruCell."""

    layers: list[list[GruCell]]
    name: str = "gru"
    source: str = ""
    extra: dict = field(default_factory=dict)

    def __post_init__(self) -> None:
        if not self.layers:
            raise QtoolError("model has no layers")
        dirs = len(self.layers[0])
        for l, cells in enumerate(self.layers):
            if len(cells) != dirs:
                raise QtoolError(f"layer {l} has {len(cells)} directions, layer 0 has {dirs}; "
                                 "stacks that mix directions are not supported")
            H = cells[0].R.shape[1]
            want_c = self.input_size if l == 0 else self.layers[l - 1][0].R.shape[1] * dirs
            for c in cells:
                if c.R.shape[1] != H:
                    raise QtoolError(f"layer {l}: directions have different hidden sizes")
                if c.W.shape[1] != want_c:
                    raise QtoolError(f"layer {l}: input size {c.W.shape[1]}, expected {want_c}")

    @property
    def input_size(self) -> int:
        return self.layers[0][0].W.shape[1]

    @property
    def hidden_size(self) -> int:
        """The last layer's hidden size (layers of a stack may differ)."""
        return self.layers[-1][0].R.shape[1]

    @property
    def num_layers(self) -> int:
        return len(self.layers)

    @property
    def num_directions(self) -> int:
        return len(self.layers[0])

    @property
    def bidirectional(self) -> bool:
        return self.num_directions == 2

    @property
    def output_size(self) -> int:
        return self.hidden_size * self.num_directions


def write_model(f: h5py.File, model: GruModel) -> None:
    """Write the float model into an open HDF5 file (root attributes and layer groups)."""
    f.attrs.update(
        format=FORMAT,
        version=VERSION,
        input_size=model.input_size,
        hidden_size=model.hidden_size,
        num_layers=model.num_layers,
        bidirectional=model.bidirectional,
        name=model.name,
        source=model.source,
    )
    for l, cells in enumerate(model.layers):
        for d, cell in enumerate(cells):
            g = f.create_group(f"layer{l}/{DIRECTIONS[d]}")
            for name in ("W", "R", "bx", "br"):
                g.create_dataset(name, data=getattr(cell, name))


def read_model(f: h5py.File, formats: tuple = (FORMAT,)) -> GruModel:
    """Read the float model from an open HDF5 file written by `write_model` (a quantized model
    file holds one too)."""
    if f.attrs.get("format") not in formats:
        raise QtoolError(f"{f.filename}: not a qtool model file (run 'qtool import' first)")
    if int(f.attrs["version"]) > VERSION:
        raise QtoolError(f"{f.filename}: model format version {f.attrs['version']} is newer than this qtool")
    dirs = 2 if bool(f.attrs["bidirectional"]) else 1
    layers = []
    for l in range(int(f.attrs["num_layers"])):
        cells = []
        for d in range(dirs):
            g = f[f"layer{l}/{DIRECTIONS[d]}"]
            cells.append(GruCell(*(g[n][()] for n in ("W", "R", "bx", "br"))))
        layers.append(cells)
    return GruModel(layers, name=str(f.attrs["name"]), source=str(f.attrs["source"]))


def open_h5(path, mode: str = "r") -> h5py.File:
    """Open an HDF5 file, turning h5py's low-level errors into one clear line."""
    try:
        return h5py.File(path, mode)
    except FileNotFoundError:
        raise QtoolError(f"file not found: {path}") from None
    except OSError as e:
        raise QtoolError(f"{path}: not a readable HDF5 file ({str(e).split(',')[0]})") from None


def load_model(path) -> GruModel:
    with open_h5(path) as f:
        try:
            return read_model(f)
        except KeyError as e:
            raise QtoolError(f"{path}: model file is incomplete ({e})") from None
