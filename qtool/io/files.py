"""Output files written safely, and loading of sequence data (.npy, .npz, .h5).

Outputs: a file is written to a temporary name next to its destination and renamed into place
only when complete, with the permissions a plain write would give it; a full disk, a read-only
directory or a signal leaves nothing behind. An existing file is replaced only when qtool wrote
it (and the user said so); an output that is one of the command's inputs is refused.
"""

from __future__ import annotations

import contextlib
import copy
import datetime
import errno
import hashlib
import io
import math
import os
import shutil
import tempfile
import zipfile
from collections.abc import Callable, Iterable, Iterator
from pathlib import Path
from typing import NamedTuple

import numpy as np

from qtool.errors import QtoolError, signals_held

MAX_IN_MEMORY_BYTES = 4 << 30  # an .npz array is read whole: beyond this, ask for .npy / .h5
MAX_SEQUENCE_VALUES = 1 << 28  # T * C of one sequence
# A text file qtool wrote says so in its first lines, in one of these phrases (a file that merely
# names qtool, a user's script importing it, is not one); an HDF5 file in its "format" attribute.
TEXT_MARKS = (b"enerated by qtool", b'"format": "qtool-', b"# qtool advise:", b'<meta name="generator" content="qtool ')
HEAD_BYTES = 4096


# The last line of a C file qtool writes: the SHA-256 of every line above it, so that a later
# export can tell a file edited by hand from the one it wrote, and say so before replacing it.
SEAL = b"/* qtool: the SHA-256 of the lines above is "


def sealed(name: str, data: bytes) -> bytes:
    """A C source or header with its seal line appended; other files as they are."""
    if not name.endswith((".c", ".h")):
        return data
    return data + SEAL + hashlib.sha256(data).hexdigest().encode() + b" */\n"


def edited_since_written(path: Path) -> bool:
    """Whether a sealed file no longer matches its seal (edited after qtool wrote it): its lines
    changed, or lines added after the seal."""
    try:
        data = path.read_bytes()
    except OSError:
        return False
    at = data.rfind(SEAL)
    if at < 0:
        return False
    return data[at:] != sealed(path.name, data[:at])[at:]  # lines changed above it, or added after it


def sha256_file(path: str | os.PathLike) -> str:
    """The SHA-256 of a file's bytes (provenance of models, data and results)."""
    h = hashlib.sha256()
    with open(path, "rb") as f:
        while chunk := f.read(1 << 22):
            h.update(chunk)
    return h.hexdigest()


def now_utc() -> str:
    """This moment in UTC, to the second, ISO 8601."""
    return datetime.datetime.now(datetime.timezone.utc).replace(microsecond=0).isoformat()


def _ensure_parent(dest: Path) -> tuple[Path, list[Path]]:
    """The directory a file output goes into, created with any missing directories above it (as
    `-o`'s help says), and those it created, outermost last."""
    parent = dest.parent if str(dest.parent) else Path(".")
    created = [p for p in (parent, *parent.parents) if not p.exists()]
    try:
        parent.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        raise QtoolError(os_error_message(e, parent, "creating")) from None
    return parent, created


def _nearest_existing(dest: Path) -> Path:
    """The folder `dest` would go into, or the nearest one above it that exists."""
    parent = dest.parent if str(dest.parent) else Path(".")
    return next((p for p in (parent, *parent.parents) if p.exists()), Path("."))


def _remove_created(created: list[Path]) -> None:
    for d in created:
        with contextlib.suppress(OSError):
            d.rmdir()  # only empty folders go: what another process put there stays


def _mount_point(path: Path) -> Path:
    p = path.resolve()
    while not os.path.ismount(p) and p != p.parent:
        p = p.parent
    return p


def os_error_message(e: OSError, path: Path, doing: str = "writing") -> str:
    """One line for an operating-system error on `path` (h5py's errors carry the errno in text)."""
    text = str(e)
    code = e.errno
    if code is None:
        for c in (errno.ENOSPC, errno.EROFS, errno.EACCES, errno.EDQUOT):
            if os.strerror(c) in text or f"errno = {c}," in text:
                code = c
                break
    if code == errno.ENOSPC:
        return f"no space left on {_mount_point(path.parent)} {doing} {path}"
    if code == errno.EDQUOT:
        return f"disk quota exceeded on {_mount_point(path.parent)} {doing} {path}"
    if code == errno.EROFS:
        return f"read-only file system: cannot write {path}"
    if code in (errno.EACCES, errno.EPERM):
        return f"permission denied {doing} {path}"
    if code in (errno.EEXIST, errno.ENOTDIR):  # a file stands where a directory must go
        blocker = next((p for p in (path, *path.parents) if p.exists() and not p.is_dir()), None)
        if blocker is not None:
            return f"cannot write {path}: {blocker} is a file, not a directory"
    reason = e.strerror or text.split("(")[0].strip() or type(e).__name__
    return f"cannot write {path}: {reason}"


def _default_mode() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return 0o666 & ~mask


HDF5_SUFFIXES = (".h5", ".hdf5")  # qtool reads them as models or data: only HDF5 outputs take them
HDF5_SIGNATURE = b"\x89HDF\r\n\x1a\n"


def written_by_qtool(path: Path) -> bool:
    """Whether an existing file is one qtool wrote: a qtool HDF5 file, or a text file that says so
    in its first lines (TEXT_MARKS: every text output qtool writes does) or ends in its seal.
    Never a device, pipe or socket (reading one may never end: /dev/zero, a FIFO)."""
    if not path.is_file():
        return False
    try:
        with open(path, "rb") as f:
            head = f.read(HEAD_BYTES)
            f.seek(max(0, f.seek(0, os.SEEK_END) - 200))
            tail = f.read()
    except OSError:
        return False
    if head.startswith(HDF5_SIGNATURE):
        import h5py

        try:
            with h5py.File(path, "r") as f:
                return str(f.attrs.get("format", "")).startswith("qtool-")
        except (OSError, ValueError):
            return False
    return any(mark in head for mark in TEXT_MARKS) or SEAL in tail


def _same_file(a: Path, b: Path) -> bool:
    try:
        return a.exists() and b.exists() and os.path.samefile(a, b)
    except OSError:
        return False


# the suffixes qtool reads as something no command writes: data, and framework models
READ_AS = {**dict.fromkeys((".npy", ".csv", ".wav"), "data"), ".npz": "data or haste weights",
           **dict.fromkeys((".onnx", ".pt", ".pth", ".keras", ".tflite", ".safetensors", ".pb"), "a framework's model")}


# what each kind of HDF5 output holds, and the formats ("format" attribute) of its files
HDF5_KINDS = {"model": ("a model", ("qtool-gru", "qtool-qgru", "qtool-graph", "qtool-qgraph")),
              "results": ("simulation results", ("qtool-results",)),
              "tables": ("parameter tables", ("qtool-params", "qtool-graph-params"))}


def _hdf5_kind(path: Path) -> str:
    """The kind (HDF5_KINDS) of a qtool HDF5 file."""
    import h5py

    with h5py.File(path, "r") as f:
        fmt = str(f.attrs.get("format", ""))
    return next((k for k, (_, formats) in HDF5_KINDS.items() if fmt in formats), "model")


TEXT_AS = {".json": "JSON", ".toml": "TOML", ".html": "HTML", ".htm": "HTML"}


def _is_hdf5(path: Path) -> bool:
    try:
        with open(path, "rb") as f:
            return f.read(len(HDF5_SIGNATURE)) == HDF5_SIGNATURE
    except OSError:
        return False


def claim_output(path: str | os.PathLike, force: bool, inputs: Iterable = (),
                 confirm: Callable[[str], bool] | None = None, kind: str = "model") -> Path:
    """Check that `path` may be written: it is none of `inputs`, not a directory, not named as a
    file qtool reads as something else, and if it exists, qtool wrote it as the same `kind` of
    output and the user agreed (`force`, or `confirm(question)` at a terminal). `kind`: an HDF5
    output's (HDF5_KINDS: a model, simulate's results, export's tables) or a text output's
    format (TEXT_AS: JSON, TOML, HTML), which a .json, .toml or .html name must match."""
    if not str(path).strip() or Path(path) == Path("."):  # typer reads `-o ""` as "."
        raise QtoolError("the output path is empty or the current directory; name a file")
    if str(path).endswith(("/", os.sep)):  # Path() would drop the slash and write a file of the folder's name
        raise QtoolError(f"output {path} names a folder; this output is one file: name the file (e.g. {path}NAME)")
    path = Path(path)
    for i in inputs:
        if i is not None and (_same_file(path, Path(i)) or path.resolve() == Path(i).resolve()):
            raise QtoolError(f"output {path} is also an input of this command; choose another name")
    if path.is_dir():
        raise QtoolError(f"output path is a directory: {path}")
    suffix = path.suffix.lower()
    hdf5 = kind in HDF5_KINDS
    read_as = READ_AS.get(suffix) or (None if hdf5 or suffix not in HDF5_SUFFIXES else "models and data")
    if not read_as and TEXT_AS.get(suffix, kind) != kind:
        read_as = TEXT_AS[suffix]  # a bits file named .json is read back as JSON
    if read_as:  # qtool would then refuse to read back what it wrote
        raise QtoolError(f"output {path}: qtool reads {path.suffix} files as {read_as}, which this output is not; "
                         "choose another name")
    probe_writable(path)
    if path.exists() or path.is_symlink():
        if not written_by_qtool(path):
            raise QtoolError(f"{path} exists and was not written by qtool; it is left alone "
                             "(remove it yourself or choose another output)")
        if _is_hdf5(path) != hdf5:  # a model where a page would go, or the other way round
            raise QtoolError(f"{path} is {'a text' if hdf5 else 'an HDF5'} file qtool wrote for another "
                             "command; this output is not one, so it is left alone (choose another name)")
        other = _hdf5_kind(path) if hdf5 else kind
        if other != kind:  # simulate's results where a model would go, or the other way round
            raise QtoolError(f"{path} holds {HDF5_KINDS[other][0]} qtool wrote; this output is {HDF5_KINDS[kind][0]}, "
                             "so it is left alone (choose another name)")
        if not force:
            if confirm is None:
                raise QtoolError(f"{path} exists; use `force` to overwrite it")
            if not confirm(f"{path} exists. Overwrite?"):
                raise QtoolError(f"{path} exists and was not overwritten")
    return path


def claim_folder(path: str | os.PathLike) -> Path:
    """Check early that `path` may be a folder of outputs: not an existing file, nor named as a
    file qtool reads (`x.h5`, `x.npy`: a folder of that name would be mistaken for one)."""
    path = Path(path)
    if path.exists() and not path.is_dir():
        raise QtoolError(f"output path exists and is not a directory: {path}")
    suffix = path.suffix.lower()
    if not path.exists() and (suffix in READ_AS or suffix in HDF5_SUFFIXES):
        raise QtoolError(f"output {path} is named as a {path.suffix} file; this output is a folder of "
                         "files: name a folder")
    return path


def probe_writable(path: Path) -> None:
    """Refuse now, not after minutes of work, an output whose folder cannot take a file: create
    and remove a temporary in the nearest existing folder (a read-only mount, no permission, a
    file where a folder must go). Nothing is created that stays."""
    existing = _nearest_existing(path)
    if not existing.is_dir():
        raise QtoolError(f"cannot write {path}: {existing} is a file, not a directory")
    with signals_held():  # one between the probe's creation and its removal would leave it
        try:
            fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".probe", dir=existing)
        except OSError as e:
            raise QtoolError(os_error_message(e, path)) from None
        os.close(fd)
        with contextlib.suppress(OSError):
            os.unlink(tmp)


@contextlib.contextmanager
def atomic_path(dest: str | os.PathLike) -> Iterator[Path]:
    """Yield a temporary path next to `dest`; rename it onto `dest` only if the block succeeds.

    A failure anywhere (an error, a full disk, a signal) leaves neither a partial file nor the
    temporary behind. The file gets the mode a plain write would give it.
    """
    dest = Path(dest)
    if dest.is_dir():
        raise QtoolError(f"output path is a directory: {dest}")
    parent, created = _ensure_parent(dest)
    tmp_path, done = None, False
    try:
        with signals_held():  # a signal waits until the temporary is in the `finally`'s care
            try:
                fd, tmp = tempfile.mkstemp(prefix=f".{dest.name}.", suffix=".tmp", dir=parent)
            except OSError as e:
                raise QtoolError(os_error_message(e, dest)) from None
            os.close(fd)
            tmp_path = Path(tmp)
        try:
            yield tmp_path
            mode = dest.stat().st_mode & 0o7777 if dest.exists() else _default_mode()
            os.chmod(tmp_path, mode)
            os.replace(tmp_path, dest)
            done = True
        except OSError as e:
            raise QtoolError(os_error_message(e, dest)) from None
    finally:
        if tmp_path is not None:
            with contextlib.suppress(OSError):
                tmp_path.unlink()
        if not done:  # a failed write leaves no directory of ours either
            _remove_created(created)


def write_bytes(dest: str | os.PathLike, data: bytes) -> None:
    """Write a whole file atomically."""
    with atomic_path(dest) as tmp:
        with open(tmp, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())


def h5_bytes(fill: Callable) -> bytes:
    """Build an HDF5 file in memory with `fill(h5py.File)`: writing it to disk is then one plain
    write, whose errors (a full disk) are clean, unlike HDF5's own I/O."""
    import h5py

    buf = io.BytesIO()
    with h5py.File(buf, "w") as f:
        fill(f)
    return buf.getvalue()


def write_h5(dest: str | os.PathLike, fill: Callable) -> None:
    """Write an HDF5 file built by `fill(h5py.File)` atomically."""
    write_bytes(dest, h5_bytes(fill))


def check_free_space(dest: Path, nbytes: int) -> None:
    """Refuse before starting a long write that cannot fit on the disk."""
    parent = _nearest_existing(dest)
    free = shutil.disk_usage(parent).free
    if nbytes > free:
        raise QtoolError(f"no space left on {_mount_point(parent)} for {dest}: it needs about "
                         f"{nbytes / 2**20:.1f} MiB, {free / 2**20:.1f} MiB are free")


class Replaced(NamedTuple):
    names: list[str]  # the files of these names that were there
    edited: list[str]  # those of them edited since qtool wrote them (`edited_since_written`)
    removed: list[str] = []  # `stale` files qtool wrote that this write made obsolete, removed


def write_files(out_dir: str | os.PathLike, files: dict[str, bytes], force: bool,
                confirm: Callable[[str], bool] | None = None, inputs: Iterable = (),
                stale: Iterable[str] = (), fixed: Iterable[str] = ()) -> Replaced:
    """Write several files into `out_dir` (created if needed), replacing only files of these
    names that qtool wrote; every other file in the directory is left as it is. All files are
    staged as temporaries first and renamed into place together. `stale`: names an earlier
    write of the same set made and this one does not (test vectors no longer asked for): where
    qtool wrote them and none was edited since, they are removed with the same consent as a
    replacement, so that no file of an older model stays beside the new ones. `fixed`: names
    that do not follow the export's `name` (the runtime's, shared by every export in a folder):
    one that already holds these very bytes is left as it is, without asking."""
    out_dir = claim_folder(out_dir)
    created = [p for p in (out_dir, *out_dir.parents) if not p.exists()]
    try:
        out_dir.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        raise QtoolError(os_error_message(e, out_dir, "creating")) from None
    try:
        return _write_into(out_dir, files, force, confirm, inputs, stale, set(fixed))
    except BaseException:  # a refusal, a full disk, a signal: no folder of ours stays behind either
        _remove_created(created)
        raise


def _write_into(out_dir: Path, files: dict[str, bytes], force: bool, confirm, inputs: Iterable,
                stale: Iterable[str] = (), fixed: Iterable[str] = ()) -> Replaced:
    targets = {name: out_dir / name for name in files}
    for p in targets.values():
        for i in inputs:
            if i is not None and _same_file(p, Path(i)):
                raise QtoolError(f"output {p} is also an input of this command")
    foreign = [n for n, p in targets.items() if (p.exists() or p.is_symlink()) and not written_by_qtool(p)]
    if foreign:
        renamed = any(n not in fixed for n in foreign)  # `name` changes the model's files, not the runtime's
        they, them = ("it is", "it") if len(foreign) == 1 else ("they are", "them")
        raise QtoolError(f"{out_dir} holds {', '.join(foreign)}, not written by qtool; {they} left alone (move "
                         + (f"{them} or choose another directory or `name`)" if renamed else
                            f"{them} or choose another directory: `name` does not rename the runtime's files)"))
    shared = {n for n in set(fixed) & set(files) if _holds(targets[n], files[n])}  # another export's runtime, the same
    existing = [n for n, p in targets.items() if p.exists() and n not in shared]
    edited = [n for n in existing if edited_since_written(targets[n])]
    old = [n for n in stale if n not in files and (out_dir / n).is_file() and written_by_qtool(out_dir / n)]
    if any(edited_since_written(out_dir / n) for n in old):  # the user's now: the set stays together
        old = []
    note = f" ({', '.join(edited)} edited since qtool wrote {'it' if len(edited) == 1 else 'them'})" if edited else ""
    gone = f" and remove {', '.join(old)} (an earlier export's, not written now)" if old else ""
    if (existing or old) and not force and not (confirm and confirm(
            f"{out_dir}: replace {', '.join(existing) or 'nothing'}{note}{gone}? (other files stay as they are)")):
        raise QtoolError(f"{out_dir} already holds {', '.join(existing + old)}{note}; use `force` to replace them")
    with contextlib.ExitStack() as stack:  # renames every file into place as it unwinds
        for name, data in files.items():
            if name in shared:
                continue
            tmp = stack.enter_context(atomic_path(targets[name]))
            with open(tmp, "wb") as f:
                f.write(data)
    for name in old:
        with contextlib.suppress(FileNotFoundError):
            (out_dir / name).unlink()
    return Replaced(existing, edited, old)


def _holds(path: Path, data: bytes) -> bool:
    """Whether `path` is a plain file holding exactly `data`."""
    try:
        return path.is_file() and not path.is_symlink() and path.stat().st_size == len(data) and \
            path.read_bytes() == data
    except OSError:
        return False


def _pick_npz(names: list[str], dataset: str | None, path: Path) -> str:
    if dataset is not None:
        if dataset not in names:
            raise QtoolError(f"{path}: no array '{dataset}' (has: {', '.join(names) or 'none'})")
        return dataset
    if len(names) == 1:
        return names[0]
    if "x" in names:
        return "x"
    if not names:
        raise QtoolError(f"{path}: holds no arrays")
    raise QtoolError(f"{path}: holds several arrays ({', '.join(names)}); choose one with `dataset`")


def _check_npz_member(path: Path, name: str) -> None:
    """Before numpy allocates an array from a .npz member, check that its header's size is what
    the member holds and that it fits in memory (an archive can claim any size)."""
    from numpy.lib import format as npy

    with zipfile.ZipFile(path) as z:
        info = z.getinfo(f"{name}.npy")
        with z.open(info) as f:
            major, _ = npy.read_magic(f)
            shape, _, dtype = (npy.read_array_header_1_0 if major == 1 else npy.read_array_header_2_0)(f)
            header = f.tell() if f.seekable() else 128
    need = int(np.prod(shape, dtype=object)) * dtype.itemsize
    if need > info.file_size - header + 64 or need < info.file_size - header - 4096:
        raise QtoolError(f"{path}: array '{name}' claims {need} bytes but its entry holds "
                         f"{info.file_size}; the file is corrupt")
    if need > MAX_IN_MEMORY_BYTES:
        raise QtoolError(f"{path}: array '{name}' is {need / 2**30:.1f} GiB; .npz arrays are read whole, "
                         "so save data this large as .npy or .h5 (both are streamed)")


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
    path: str | os.PathLike, dataset: str | None = None, time_first: bool = False, name: str | None = None
) -> np.ndarray | object:
    """Open a sequence data file lazily: a .npy read by slices, an h5py dataset or an array.

    The returned object supports `.shape` and slicing along the first axis; call `read_chunk`
    to get validated float32 batches `[n, T, C]`.
    """
    path = Path(path)
    if path.is_dir():
        raise QtoolError(f"{path} is a directory, not a data file")
    if not path.is_file():
        raise QtoolError(f"data file not found: {path}")
    if path.stat().st_size == 0:
        raise QtoolError(f"data file is empty: {path}")
    suffix = path.suffix.lower()
    try:
        if suffix == ".npy":
            if dataset is not None:  # one array: a name to pick would be silently ignored
                raise QtoolError(f"{path}: a .npy file holds one array; `dataset` names one in a .npz or .h5 file")
            arr = NpyFile(path)
            if arr.fortran or arr.dtype.hasobject:  # rare layouts: numpy's own (mapped) reader
                arr = np.load(path, mmap_mode="r", allow_pickle=False)
        elif suffix == ".npz":
            if not zipfile.is_zipfile(path):  # numpy would call it a pickle
                raise QtoolError(f"{path}: not a .npz archive (a damaged or cut file, or another format named .npz)")
            with np.load(path, allow_pickle=False) as z:
                member = _pick_npz(z.files, dataset, path)
                _check_npz_member(path, member)
                arr = z[member]  # reads only the array asked for
        elif suffix in (".h5", ".hdf5"):
            import h5py

            f = h5py.File(path, "r")
            fmt = str(f.attrs.get("format", ""))
            if fmt.startswith("qtool-") and fmt != "qtool-results":  # a model where the data go: swapped?
                f.close()
                raise QtoolError(f"{path}: a qtool model file ({fmt}), not data; the model comes first, then the data")
            names = _h5_datasets(f)
            if dataset is None:
                if not names:
                    raise QtoolError(f"{path}: holds no datasets")
                if len(names) != 1:
                    raise QtoolError(
                        f"{path}: holds {len(names)} datasets ({', '.join(names[:6])}); "
                        "choose one with `dataset`"
                    )
                dataset = names[0]
            try:  # a link to another file that is missing raises here
                found = dataset in f and isinstance(f[dataset], h5py.Dataset)
            except KeyError as e:
                raise QtoolError(f"{path}: cannot read dataset '{dataset}' ({str(e).strip(chr(34))})") from None
            if not found:
                raise QtoolError(f"{path}: no dataset '{dataset}' (has: {', '.join(names) or 'none'})")
            arr = f[dataset]
        else:
            raise QtoolError(f"{path}: unknown data format '{suffix}' (use .npy, .npz or .h5)")
    except QtoolError:
        raise
    except (OSError, ValueError, zipfile.BadZipFile, EOFError) as e:  # a damaged archive or a cut file
        raise QtoolError(f"{path}: cannot read data file ({e})") from None
    return SequenceData(arr, time_first, name or str(path))


def map_frame(model_map: tuple) -> tuple[int, int]:
    """The frame [A, B] a map model's data holds, from its input's (order, F, C): [C, F] ("cf")
    or [F, C] ("fc")."""
    order, F, C = model_map
    return (C, F) if order == "cf" else (F, C)


def frames_fit(frame: tuple, model_map: tuple) -> bool:
    """Whether data frames `frame` are the model's (a map of one channel either way round)."""
    want = map_frame(model_map)
    return tuple(frame) == want or (model_map[2] == 1 and sorted(frame) == sorted(want))


def _frame_text(frame: tuple) -> str:
    """A map model's data, from its input's (order, F, C) (qtool.layers.input_map)."""
    order, F, C = frame
    return (f"data [N, T, {C}, {F}]: channels then frequencies, a PyTorch [N, C, T, F] input's" if order == "cf"
            else f"data [N, T, {F}, {C}]: frequencies then channels, a TensorFlow [N, T, F, C] input's")


def check_array(arr, name: str) -> None:
    """Sequence data must be a non-empty numeric 3-D array, or 4-D for a feature map's frames."""
    if len(arr.shape) not in (3, 4):
        raise QtoolError(f"{name}: data must be 3-D [N, T, C] (or [T, N, C] with `time_first`), or 4-D for a "
                         "model that reads feature maps ([N, T, C, F] for a PyTorch model's [N, C, T, F] input, "
                         f"[N, T, F, C] for a TensorFlow one), got shape {tuple(arr.shape)}")
    if min(arr.shape) == 0:
        raise QtoolError(f"{name}: data has an empty dimension, shape {tuple(arr.shape)}")
    if arr.dtype.kind not in "fiu":
        raise QtoolError(f"{name}: data must be numeric, got dtype {arr.dtype}")


class SequenceData:
    """A lazily read `[N, T, C]` view of a data file, read in chunks of sequences. A 4-D file
    `[N, T, A, B]` holds feature maps, each frame `[A, B]` read as its A * B channels in that
    order: `[N, T, F, C]` for a model whose input is TensorFlow's `[N, T, F, C]`, `[N, T, C, F]`
    for PyTorch's `[N, C, T, F]` (qtool.layers.conv.conv2d)."""

    def __init__(self, arr, time_first: bool, name: str):
        check_array(arr, name)
        self.arr = arr
        self.time_first = time_first
        self.name = name
        shape = tuple(int(n) for n in arr.shape[:2]) + (math.prod(int(n) for n in arr.shape[2:]),)
        self.shape = (shape[1], shape[0], shape[2]) if time_first else shape
        self.file_shape = tuple(int(n) for n in arr.shape)  # as the file holds it
        self.frame = tuple(int(n) for n in arr.shape[2:]) if len(arr.shape) == 4 else ()  # a map's [A, B]
        if self.shape[1] * self.shape[2] > MAX_SEQUENCE_VALUES:
            raise QtoolError(f"{name}: one sequence holds {self.shape[1]} x {self.shape[2]} values, more "
                             f"than qtool accepts ({MAX_SEQUENCE_VALUES}); check the layout (`time_first`?)")

    @property
    def num_sequences(self) -> int:
        return self.shape[0]

    def check_features(self, input_size: int, frame: tuple | None = None) -> None:
        """The data's channels are the model's input's; a map's frames in the model's order
        (`frame`: the input's (order, F, C), qtool.layers.input_map; one channel either way round);
        maps only for a model that reads maps."""
        read_as = "[N, T, A, B]" if self.frame else "[N, T, C]"
        if self.frame and not frame:  # which axis of a frame is which would be a guess
            raise QtoolError(f"{self.name}: data {list(self.file_shape)} are feature maps [N, T, A, B]; the model "
                             f"reads sequences [N, T, {input_size}]: give the data as [N, T, {input_size}]")
        if self.shape[2] != input_size:
            hint = f"; the model reads feature maps, {_frame_text(frame)}" if frame else ""
            raise QtoolError(
                f"{self.name}: feature size {self.shape[2]} does not match the model's input size "
                f"{input_size} (data shape {self.file_shape} read as {read_as}{', time first' * self.time_first})"
                + hint)
        if frame and self.frame and not frames_fit(self.frame, frame):
            raise QtoolError(f"{self.name}: its frames are {list(self.frame)} but the model reads "
                             f"{_frame_text(frame)}; transpose the data to that order")

    def first(self, n: int) -> SequenceData:
        """The first `n` sequences, read as lazily as the whole file."""
        if n >= self.num_sequences:
            return self
        part = copy.copy(self)
        part.shape = (n, *self.shape[1:])
        return part

    def chunk(self, start: int, stop: int) -> np.ndarray:
        """Sequences [start, stop) as float32 `[n, T, C]`, refusing NaN and Inf."""
        part = self.arr[:, start:stop] if self.time_first else self.arr[start:stop]
        x = np.asarray(part, dtype=np.float32)
        x = x.reshape(*x.shape[:2], -1)
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


class ModelData:
    """The data of a model of several inputs: one SequenceData per input, by the input's name,
    each holding the same sequences (N, and T steps) in the same order. Read like a SequenceData,
    but each chunk is a dict {input: [n, T, C]} (qtool.layers.run takes it as it is)."""

    def __init__(self, parts: dict[str, SequenceData], name: str):
        counts = {e: d.num_sequences for e, d in parts.items()}
        if len(set(counts.values())) > 1:
            raise QtoolError(f"{name}: the inputs hold different numbers of sequences "
                             f"({', '.join(f'{e}: {c}' for e, c in counts.items())}); each holds the same ones")
        steps = {e: d.shape[1] for e, d in parts.items()}
        if len(set(steps.values())) > 1:
            raise QtoolError(f"{name}: the inputs hold sequences of different lengths "
                             f"({', '.join(f'{e}: {t} steps' for e, t in steps.items())}); each input's sequences "
                             "have the model's steps")
        self.parts = parts
        self.name = name
        self.time_first = next(iter(parts.values())).time_first

    @classmethod
    def from_arrays(cls, arrays: dict[str, np.ndarray], time_first: bool, name: str) -> ModelData:
        return cls({e: SequenceData(a, time_first, f"{name} '{e}'") for e, a in arrays.items()}, name)

    @property
    def num_sequences(self) -> int:
        return next(iter(self.parts.values())).num_sequences

    @property
    def shape(self) -> tuple[int, int, int]:
        """The first input's [N, T, C] (N and, for sequences, T: every input's)."""
        return next(iter(self.parts.values())).shape

    def first(self, n: int) -> ModelData:
        part = copy.copy(self)
        part.parts = {e: d.first(n) for e, d in self.parts.items()}
        return part

    def chunk(self, start: int, stop: int) -> dict[str, np.ndarray]:
        return {e: d.chunk(start, stop) for e, d in self.parts.items()}

    def chunks(self, size: int, limit: int | None = None) -> Iterator[tuple[int, dict[str, np.ndarray]]]:
        n = self.num_sequences if limit is None else min(limit, self.num_sequences)
        for start in range(0, n, size):
            yield start, self.chunk(start, min(start + size, n))


def rows(x: np.ndarray | dict[str, np.ndarray]) -> int:
    """The number of sequences in a chunk of data, one array or a model's several inputs."""
    return len(next(iter(x.values())) if isinstance(x, dict) else x)


def open_inputs(path: str | os.PathLike, inputs: list[str], time_first: bool = False) -> ModelData:
    """The data of a model of several inputs from one .npz or .h5 file holding an array (dataset)
    per input, named after it."""
    path = Path(path)
    want = f"the model has {len(inputs)} inputs ({', '.join(inputs)})"
    if path.is_file() and path.suffix.lower() not in (".npz", ".h5", ".hdf5"):
        raise QtoolError(f"{path}: {want}; give their data as one .npz or .h5 file holding an array per input, "
                         "named after it")
    parts = {}
    for e in inputs:
        try:
            parts[e] = open_sequences(path, e, time_first, f"{path} '{e}'")
        except QtoolError as err:
            if "no array '" not in str(err) and "no dataset '" not in str(err):
                raise
            raise QtoolError(f"{err}: {want}, an array for each") from None
    return ModelData(parts, str(path))
