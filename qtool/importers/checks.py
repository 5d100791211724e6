"""Checks every importer applies before it trusts a framework file: sizes against sane limits
(before anything is allocated), dtypes (real floating point only) and GRU shapes, each failure
one line naming the tensor.

The limits are far beyond any GRU a microcontroller or DSP runs, and small enough that a file
claiming more is refused before it can exhaust memory (docs/importing.md, "Limits").
"""

from __future__ import annotations

import os
import re
import shutil
import sys
import tempfile
import warnings
import zipfile
from collections.abc import Iterator
from contextlib import contextmanager

import numpy as np

from qtool.errors import QtoolError

MAX_TENSOR_ELEMENTS = 1 << 26  # one weight tensor: 64 Mi values (256 MiB as float32)
MAX_ARCHIVE_BYTES = 1 << 30  # everything read from one zip archive (.keras, .npz, .pt), decompressed
MAX_JSON_BYTES = 16 << 20  # a .keras config.json


def check_size(where: str, name: str, shape) -> tuple:
    """Refuse a tensor whose declared shape is negative or holds more than MAX_TENSOR_ELEMENTS."""
    shape = tuple(int(d) for d in shape)
    if any(d < 0 for d in shape):
        raise QtoolError(f"{where}: tensor '{name}' has a negative dimension {shape}")
    n = 1
    for d in shape:
        n *= d
    if n > MAX_TENSOR_ELEMENTS:
        raise QtoolError(f"{where}: tensor '{name}' claims {n:,} values {shape}, beyond qtool's limit "
                         f"of {MAX_TENSOR_ELEMENTS:,} per tensor")
    return shape


def check_float_dtype(where: str, name: str, dtype) -> None:
    """GRU weights must be real floating point: complex would lose its imaginary part, integers
    mean a quantized (not a float) model."""
    if np.dtype(dtype).kind != "f":
        raise QtoolError(f"{where}: tensor '{name}' has dtype {dtype}; GRU weights must be real "
                         "floating point (float16, bfloat16, float32 or float64)")


def as_float32(where: str, name: str, a) -> np.ndarray:
    """A numpy array checked for size and dtype, as float32 (and finite as float32)."""
    a = np.asarray(a)
    check_size(where, name, a.shape)
    check_float_dtype(where, name, a.dtype)
    with np.errstate(over="ignore"):
        a = a.astype(np.float32)
    if not np.isfinite(a).all():
        raise QtoolError(f"{where}: tensor '{name}' contains NaN or Inf (or values beyond float32's range)")
    return a


def expect_shape(where: str, name: str, a: np.ndarray, shape: tuple) -> np.ndarray:
    """`a` must have exactly `shape`; the message names the tensor and both shapes."""
    if tuple(a.shape) != tuple(shape):
        raise QtoolError(f"{where}: tensor '{name}' has shape {tuple(a.shape)}, expected {tuple(shape)}")
    return a


def hidden_from_recurrent(where: str, name: str, r: np.ndarray, rows_first: bool = True) -> int:
    """H from a recurrent weight [3H, H] (or [H, 3H] when not `rows_first`)."""
    if r.ndim == 2:
        three_h, h = r.shape if rows_first else r.shape[::-1]
        if three_h == 3 * h and h > 0:
            return h
    want = "[3H, H]" if rows_first else "[H, 3H]"
    raise QtoolError(f"{where}: tensor '{name}' has shape {tuple(r.shape)}; a GRU's recurrent weights "
                     f"are {want} (an LSTM has 4H)")


def check_archive(path, z: zipfile.ZipFile, members=None) -> None:
    """Refuse a zip archive with an entry that points outside it (an absolute path, a drive, a '..'
    part: a hostile archive, whatever qtool reads of it), or whose members (all, or `members`)
    declare more than MAX_ARCHIVE_BYTES decompressed; zipfile never returns more than a member
    declares, so this bounds every read."""
    for name in z.namelist():
        parts = name.replace("\\", "/").split("/")
        if name.startswith(("/", "\\")) or ".." in parts or re.match(r"^[A-Za-z]:", name):
            raise QtoolError(f"{path}: archive entry '{name[:200]}' points outside the archive (an absolute path "
                             "or '..'); qtool refuses such an archive")
    infos = [i for i in z.infolist() if members is None or i.filename in members]
    total = sum(i.file_size for i in infos)
    if total > MAX_ARCHIVE_BYTES:
        raise QtoolError(f"{path}: archive declares {total:,} bytes of content, beyond qtool's limit "
                         f"of {MAX_ARCHIVE_BYTES:,}")


def refuse_cut_zip(path, what: str) -> None:
    """Refuse a file that starts as a zip archive but is none: a copy cut short, whose central
    directory (at the end) is missing; `what` names the file ("PyTorch file")."""
    with open(path, "rb") as f:
        if f.read(4) == b"PK\x03\x04" and not zipfile.is_zipfile(path):
            raise QtoolError(f"{path}: not a whole {what} (its zip archive is truncated or damaged: its central "
                             "directory is missing); save it again")


def reason(e: BaseException | str) -> str:
    """A library's exception (or its message) as a short one-line reason (they can span pages)."""
    lines = str(e).strip().splitlines()
    kind = "" if isinstance(e, str) else f"{type(e).__name__}: "
    if not lines:
        return kind.rstrip(": ") or "no reason given"
    line = lines[0] if len(lines[0]) <= 300 else lines[0][:300].rsplit(" ", 1)[0] + " ..."
    return f"{kind}{line}"


@contextmanager
def quiet() -> Iterator[None]:
    """Silence library warnings: qtool says what matters in its own one-line messages."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        yield


@contextmanager
def framework_run() -> Iterator[None]:
    """Around a framework's own run (the import check, a load): its warnings silenced (`quiet`), and
    a private temporary folder, removed afterwards, for what the frameworks leave in the user's
    (PyTorch's torchinductor_<user> cache, ONNX Runtime's .ses file): Python's and the C libraries'
    (TMPDIR) both, restored afterwards."""
    folder = tempfile.mkdtemp(prefix="qtool-framework-")
    env, tempdir = os.environ.get("TMPDIR"), tempfile.tempdir
    os.environ["TMPDIR"], tempfile.tempdir = folder, folder
    try:
        with quiet():
            yield
    finally:
        tempfile.tempdir = tempdir
        if env is None:
            os.environ.pop("TMPDIR", None)
        else:
            os.environ["TMPDIR"] = env
        shutil.rmtree(folder, ignore_errors=True)


@contextmanager
def one_torch_thread() -> Iterator[None]:
    """The check's matrices are tiny: PyTorch's worker threads would only spin against numpy's
    (seconds on a busy 2-core machine); restored afterwards. Entered by the framework runners
    once their framework is imported (PyTorch may be loaded only by the check itself)."""
    torch = sys.modules.get("torch")
    threads = torch.get_num_threads() if torch else None
    if torch:
        torch.set_num_threads(1)
    try:
        yield
    finally:
        if torch and threads:
            torch.set_num_threads(threads)


def rounding_spread(run, xs: dict[str, np.ndarray]) -> float:
    """How far the model's own outputs move (relative where above 1, as the checks measure) when
    its inputs move by one float32 rounding step, each value times 1 +- 2^-24 at random: what
    float32 implementations of the same model may disagree by without any misreading. `run`
    maps inputs to a dict of outputs."""
    rng = np.random.default_rng(1)
    nudged = {k: (v * (1 + rng.choice([-1.0, 1.0], v.shape) * 2.0 ** -24)).astype(np.float32)
              for k, v in xs.items()}
    base, moved = run(xs), run(nudged)
    return max((float(np.abs(moved[k] - b).max(initial=0.0)) / max(1.0, float(np.abs(b).max(initial=0.0)))
                for k, b in base.items()), default=0.0)


def wrong_import(what: str, tolerance: float, spread: float) -> QtoolError:
    """The refusal of an import that differs from its framework (`what`: where and by how much).
    Where the model itself moves by more than `tolerance` under float32 rounding of its inputs
    (`rounding_spread`), the check cannot tell a misread file from rounding, and says so."""
    if spread > tolerance:
        return QtoolError(f"{what}; but the model's own output moves by up to {spread:.3g} when its inputs move "
                          "by one float32 rounding step, so float32 implementations disagree on it by as much: "
                          "the check cannot tell a misread file here and refuses it (`check=False` imports it "
                          "unchecked)")
    return QtoolError(f"{what}; refusing a wrong import")
