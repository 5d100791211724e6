"""ONNX external data: tensors whose bytes sit in a file beside the model (`torch.onnx.export`'s
default exporter writes `model.onnx.data`; `onnx.save(..., save_as_external_data=True)`).

Read as ONNX Runtime reads them, with every declared number checked before a byte is read: the file
must lie inside the model's own folder (no absolute path, no `..`, no symlink leading out of it),
and its offset and length must agree with the file's size and with the tensor's declared dims
(whose size is checked against qtool's limits first).
"""

from __future__ import annotations

import re
from pathlib import Path

import numpy as np

from qtool.errors import QtoolError
from qtool.importers.checks import check_size

EXTERNAL = 1  # TensorProto.EXTERNAL
BFLOAT16 = 16


def _itemsize(where: str, tp) -> int:
    from onnx import helper

    if tp.data_type == BFLOAT16:
        return 2
    try:
        dtype = np.dtype(helper.tensor_dtype_to_np_dtype(tp.data_type))
    except (KeyError, TypeError, ValueError):
        raise QtoolError(f"{where}: tensor '{tp.name}' has unknown ONNX data type {tp.data_type}") from None
    if dtype.kind not in "biuf" or tp.data_type > BFLOAT16:  # strings, objects, packed sub-byte types
        raise QtoolError(f"{where}: tensor '{tp.name}' of ONNX data type {tp.data_type} cannot be read "
                         "from external data by qtool")
    return dtype.itemsize


def _entries(where: str, tp) -> tuple[str, int, int | None]:
    """(location, offset, length or None) from the tensor's external_data key/value pairs."""
    info = {e.key: e.value for e in tp.external_data}
    try:
        offset = int(info.get("offset", 0))
        length = int(info["length"]) if "length" in info else None
    except ValueError:
        raise QtoolError(f"{where}: tensor '{tp.name}' has a non-numeric external data offset or length") from None
    if offset < 0 or (length is not None and length < 0):
        raise QtoolError(f"{where}: tensor '{tp.name}' has a negative external data offset or length")
    return info.get("location", ""), offset, length


def _file(where: str, name: str, location: str, folder: Path) -> Path:
    """The external file, refused unless it is a file inside the model's folder."""
    parts = re.split(r"[\\/]", location)
    if (not location or "\0" in location or location.startswith(("/", "\\")) or re.match(r"^[A-Za-z]:", location)
            or ".." in parts):
        raise QtoolError(f"{where}: tensor '{name}' points at external data '{location[:200]}' outside the "
                         "model's folder (absolute paths and '..' are refused)")
    base = folder.resolve()
    try:
        target = (base / location).resolve(strict=True)
    except (OSError, RuntimeError):  # missing, or a symlink loop
        raise QtoolError(f"{where}: tensor '{name}': external data file '{location}' not found beside the "
                         "model") from None
    if not target.is_relative_to(base):  # a symlink leading out of the folder
        raise QtoolError(f"{where}: tensor '{name}': external data file '{location}' leads outside the "
                         "model's folder")
    if not target.is_file():
        raise QtoolError(f"{where}: tensor '{name}': external data '{location}' is not a regular file")
    return target


def inline(where: str, tp, folder: Path | None):
    """A copy of TensorProto `tp` holding its external bytes (checked first); `tp` itself when inline."""
    from onnx import TensorProto

    if tp.data_location != EXTERNAL:
        return tp
    if folder is None:
        raise QtoolError(f"{where}: tensor '{tp.name}' is stored in an external file, which is only read "
                         "beside a model file")
    location, offset, length = _entries(where, tp)
    n = 1
    for d in check_size(where, tp.name, tp.dims):
        n *= d
    want = n * _itemsize(where, tp)
    if length is not None and length != want:
        raise QtoolError(f"{where}: tensor '{tp.name}' declares dims {list(tp.dims)} ({want:,} bytes) but "
                         f"{length:,} bytes of external data")
    path = _file(where, tp.name, location, folder)
    size = path.stat().st_size
    if offset + want > size:
        raise QtoolError(f"{where}: tensor '{tp.name}' needs bytes {offset:,}..{offset + want:,} of '{location}', "
                         f"which holds {size:,}")
    with open(path, "rb") as f:
        f.seek(offset)
        data = f.read(want)
    if len(data) != want:  # the file shrank while it was read
        raise QtoolError(f"{where}: tensor '{tp.name}': external data '{location}' ended early")
    out = TensorProto()
    out.CopyFrom(tp)
    del out.external_data[:]
    out.data_location = TensorProto.DEFAULT
    out.raw_data = data
    return out
