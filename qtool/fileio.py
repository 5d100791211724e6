"""Atomic output files and loading of sequence data (.npy, .npz, .h5)."""

from __future__ import annotations

import contextlib
import os
import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path

import numpy as np

from qtool.errors import QtoolError


def _ensure_parent(dest: Path) -> Path:
    parent = dest.parent if str(dest.parent) else Path(".")
    try:
        parent.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        raise QtoolError(f"cannot create output directory {parent}: {e.strerror}") from None
    return parent


@contextlib.contextmanager
def atomic_path(dest: str | os.PathLike) -> Iterator[Path]:
    """Yield a temporary path next to `dest`; rename it onto `dest` only if the block succeeds.

    A failure anywhere leaves neither a partial file nor the temporary behind.
    """
    dest = Path(dest)
    parent = _ensure_parent(dest)
    if dest.is_dir():
        raise QtoolError(f"output path is a directory: {dest}")
    fd, tmp = tempfile.mkstemp(prefix=f".{dest.name}.", suffix=".tmp", dir=parent)
    os.close(fd)
    tmp_path = Path(tmp)
    try:
        yield tmp_path
        os.replace(tmp_path, dest)
    finally:
        if tmp_path.exists():
            tmp_path.unlink()


def _pick_npz(arrays: dict, dataset: str | None, path: Path) -> np.ndarray:
    if dataset is not None:
        if dataset not in arrays:
            raise QtoolError(f"{path}: no array '{dataset}' (has: {', '.join(arrays) or 'none'})")
        return arrays[dataset]
    if len(arrays) == 1:
        return next(iter(arrays.values()))
    if "x" in arrays:
        return arrays["x"]
    raise QtoolError(f"{path}: holds several arrays ({', '.join(arrays)}); choose one with --dataset")


def _h5_datasets(f) -> list[str]:
    import h5py

    names: list[str] = []
    f.visititems(lambda n, o: names.append(n) if isinstance(o, h5py.Dataset) else None)
    return names


class NpyFile:
    """A C-order .npy file read with plain file reads, a slice at a time. Unlike a memory map, the
    pages read do not stay in the process's resident set, so memory stays bounded by the chunk
    however large the file. Supports `a[i:j]` and `a[:, i:j]`."""

    def __init__(self, path: Path):
        from numpy.lib import format as npy

        with open(path, "rb") as f:
            major, _ = npy.read_magic(f)
            read_header = npy.read_array_header_1_0 if major == 1 else npy.read_array_header_2_0
            self.shape, self.fortran, self.dtype = read_header(f)
            self.offset = f.tell()
        self.path = path
        need = self.offset + int(np.prod(self.shape)) * self.dtype.itemsize
        if path.stat().st_size < need:
            raise ValueError(f"file is truncated ({path.stat().st_size} of {need} bytes)")

    def _read(self, f, first: int, count: int) -> np.ndarray:
        f.seek(self.offset + first * self.dtype.itemsize)
        return np.fromfile(f, self.dtype, count)

    def __getitem__(self, key) -> np.ndarray:
        rows = int(np.prod(self.shape[1:]))
        with open(self.path, "rb") as f:
            if isinstance(key, slice):  # a[i:j]: one contiguous block
                i, j, _ = key.indices(self.shape[0])
                return self._read(f, i * rows, max(j - i, 0) * rows).reshape((max(j - i, 0), *self.shape[1:]))
            _, sl = key  # a[:, i:j]: one block per leading index
            i, j, _ = sl.indices(self.shape[1])
            inner = int(np.prod(self.shape[2:]))
            parts = []
            for t in range(self.shape[0]):
                parts.append(self._read(f, (t * self.shape[1] + i) * inner, max(j - i, 0) * inner))
            return np.stack(parts).reshape((self.shape[0], max(j - i, 0), *self.shape[2:]))


def open_sequences(
    path: str | os.PathLike, dataset: str | None = None, time_first: bool = False
) -> np.ndarray | object:
    """Open a sequence data file lazily: a .npy read by slices, an h5py dataset or an array.

    The returned object supports `.shape` and slicing along the first axis; call `read_chunk`
    to get validated float32 batches `[n, T, C]`.
    """
    path = Path(path)
    if not path.is_file():
        raise QtoolError(f"data file not found: {path}")
    if path.stat().st_size == 0:
        raise QtoolError(f"data file is empty: {path}")
    suffix = path.suffix.lower()
    try:
        if suffix == ".npy":
            arr = NpyFile(path)
            if arr.fortran or arr.dtype.hasobject:  # rare layouts: numpy's own (mapped) reader
                arr = np.load(path, mmap_mode="r", allow_pickle=False)
        elif suffix == ".npz":
            with np.load(path, allow_pickle=False) as z:
                arr = _pick_npz({k: z[k] for k in z.files}, dataset, path)
        elif suffix in (".h5", ".hdf5"):
            import h5py

            f = h5py.File(path, "r")
            names = _h5_datasets(f)
            if dataset is None:
                if len(names) != 1:
                    raise QtoolError(
                        f"{path}: holds {len(names)} datasets ({', '.join(names[:6])}); "
                        "choose one with --dataset"
                    )
                dataset = names[0]
            if dataset not in f or not isinstance(f[dataset], h5py.Dataset):
                raise QtoolError(f"{path}: no dataset '{dataset}' (has: {', '.join(names)})")
            arr = f[dataset]
        else:
            raise QtoolError(f"{path}: unknown data format '{suffix}' (use .npy, .npz or .h5)")
    except QtoolError:
        raise
    except (OSError, ValueError) as e:
        raise QtoolError(f"{path}: cannot read data file ({e})") from None
    if len(arr.shape) != 3:
        raise QtoolError(
            f"{path}: data must be 3-D [N, T, C] (or [T, N, C] with --time-first), "
            f"got shape {tuple(arr.shape)}"
        )
    if min(arr.shape) == 0:
        raise QtoolError(f"{path}: data has an empty dimension, shape {tuple(arr.shape)}")
    if arr.dtype.kind not in "fiu":
        raise QtoolError(f"{path}: data must be numeric, got dtype {arr.dtype}")
    return SequenceData(arr, time_first, str(path))


class SequenceData:
    """A lazily read `[N, T, C]` view of a data file, read in chunks of sequences."""

    def __init__(self, arr, time_first: bool, name: str):
        self.arr = arr
        self.time_first = time_first
        self.name = name
        shape = tuple(arr.shape)
        self.shape = (shape[1], shape[0], shape[2]) if time_first else shape

    @property
    def num_sequences(self) -> int:
        return self.shape[0]

    def check_features(self, input_size: int) -> None:
        if self.shape[2] != input_size:
            raise QtoolError(
                f"{self.name}: feature size {self.shape[2]} does not match the model's input size "
                f"{input_size} (data shape {self.shape} read as [N, T, C])"
            )

    def chunk(self, start: int, stop: int) -> np.ndarray:
        """Sequences [start, stop) as float32 `[n, T, C]`, refusing NaN and Inf."""
        part = self.arr[:, start:stop] if self.time_first else self.arr[start:stop]
        x = np.asarray(part, dtype=np.float32)
        if self.time_first:
            x = x.transpose(1, 0, 2)
        if not np.all(np.isfinite(x)):
            bad = int(np.argmax(~np.isfinite(x).reshape(x.shape[0], -1).all(axis=1)))
            raise QtoolError(f"{self.name}: sequence {start + bad} contains NaN or Inf")
        return np.ascontiguousarray(x)

    def chunks(self, size: int, limit: int | None = None) -> Iterator[tuple[int, np.ndarray]]:
        n = self.num_sequences if limit is None else min(limit, self.num_sequences)
        for start in range(0, n, size):
            yield start, self.chunk(start, min(start + size, n))


@contextlib.contextmanager
def atomic_dir(dest: str | os.PathLike) -> Iterator[Path]:
    """Yield a temporary directory next to `dest`; it replaces `dest` only if the block succeeds."""
    dest = Path(dest)
    parent = _ensure_parent(dest)
    if dest.exists() and not dest.is_dir():
        raise QtoolError(f"output path exists and is not a directory: {dest}")
    tmp = Path(tempfile.mkdtemp(prefix=f".{dest.name}.", dir=parent))
    try:
        yield tmp
        if dest.exists():
            old = Path(tempfile.mkdtemp(prefix=f".{dest.name}.old.", dir=parent))
            os.replace(dest, old / "d")
            os.replace(tmp, dest)
            shutil.rmtree(old)
        else:
            os.replace(tmp, dest)
    finally:
        if tmp.exists():
            shutil.rmtree(tmp)
