"""Mutators for qtool's inputs: quantized model files (every dataset and attribute, each kind of
damage), framework model files (byte-level damage and structural lies about sizes) and data files.
Each generator is seeded, so a failing case is reproduced by its name.

Used by tests/cli/test_fuzz.py; `python tests/fuzz_inputs.py QMODEL OUT_DIR N` writes N mutated
copies of a quantized model for a longer run by hand.
"""

from __future__ import annotations

import io
import json
import random
import struct
import sys
import zipfile
from collections.abc import Callable, Iterator
from pathlib import Path

import h5py
import numpy as np


def h5_items(path: Path) -> tuple[list[str], list[tuple[str, str]]]:
    """Every dataset path and every (object path, attribute name) of an HDF5 file."""
    datasets, attrs = [], [("/", a) for a in h5py.File(path, "r").attrs]
    with h5py.File(path, "r") as f:
        def visit(name, obj):
            if isinstance(obj, h5py.Dataset):
                datasets.append(name)
            attrs.extend((name, a) for a in obj.attrs)
        f.visititems(visit)
    return datasets, attrs


# --- damage to one dataset: (name, function(array) -> array or None to delete) ---------------

def _cut(a: np.ndarray, axis: int) -> np.ndarray | None:
    if a.ndim <= axis or a.shape[axis] < 2:
        return None
    return np.take(a, range(a.shape[axis] - 1), axis=axis)


def _poke(value) -> Callable:
    def f(a: np.ndarray) -> np.ndarray:
        b = np.array(a, dtype=np.result_type(a.dtype, np.asarray(value).dtype)).copy()
        b.reshape(-1)[0 if b.size else ...] = value
        return b
    return f


DATASET_DAMAGE: dict[str, Callable] = {
    "delete": lambda a: None,
    "cut_rows": lambda a: _cut(a, 0) if a.ndim else np.zeros(0),
    "cut_cols": lambda a: _cut(a, 1) if a.ndim > 1 else np.zeros((2, 2)),
    "poke_huge": _poke(1e12),
    "poke_int_max": _poke(np.int64(2**62)),
    "poke_nan": lambda a: _poke(np.nan)(a.astype(np.float64)),
    "fractions": lambda a: np.asarray(a, np.float64) + 0.5,
    "complex": lambda a: np.asarray(a).astype(np.complex64),
    "strings": lambda a: np.array([b"abc"] * max(np.size(a), 1)),
    "scalar": lambda a: np.array(7),
    "grow": lambda a: np.concatenate([np.atleast_1d(a)] * 2),
    "empty": lambda a: np.zeros((0,), np.asarray(a).dtype) if np.asarray(a).dtype.kind != "S" else np.zeros(0),
}

ATTR_DAMAGE: dict[str, object] = {
    "delete": None, "string": "abc", "huge": 10**12, "negative": -200, "plus_200": 200,
    "float": 1.5, "bits_3": 3, "bits_64": 64, "zp_1000": 1000, "bool": True, "array": np.arange(3),
}


def mutate_h5(src: Path, dst: Path, target: str, damage: str, is_attr: bool) -> None:
    """Copy `src` to `dst` with one dataset or attribute damaged."""
    dst.write_bytes(src.read_bytes())
    with h5py.File(dst, "r+") as f:
        if is_attr:
            obj_path, name = target.split("@")
            obj = f[obj_path]
            value = ATTR_DAMAGE[damage]
            if value is None:
                del obj.attrs[name]
            else:
                obj.attrs[name] = value
            return
        a = f[target][()]
        b = DATASET_DAMAGE[damage](a)
        attrs = dict(f[target].attrs)
        del f[target]
        if b is not None:
            ds = f.create_dataset(target, data=b)
            ds.attrs.update(attrs)


def qmodel_cases(src: Path, seed: int, count: int) -> Iterator[tuple[str, str, str, bool]]:
    """`count` (case name, target, damage, is_attr): every target once first, then random pairs."""
    datasets, attrs = h5_items(src)
    targets = [(d, False) for d in datasets] + [(f"{o}@{a}", True) for o, a in attrs]
    rng = random.Random(seed)
    rng.shuffle(targets)
    for k in range(count):
        target, is_attr = targets[k % len(targets)]
        kinds = list(ATTR_DAMAGE if is_attr else DATASET_DAMAGE)
        damage = rng.choice(kinds)
        yield f"{target}:{damage}", target, damage, is_attr


# --- framework files -----------------------------------------------------------------------

def damage_bytes(data: bytes, rng: random.Random) -> bytes:
    """One of: flip bytes, truncate, zero a run, append junk, duplicate a block."""
    b = bytearray(data)
    kind = rng.randrange(5)
    if kind == 0:
        for _ in range(rng.randint(1, 8)):
            b[rng.randrange(len(b))] ^= 1 << rng.randrange(8)
    elif kind == 1:
        del b[rng.randrange(1, len(b)):]
    elif kind == 2:
        i = rng.randrange(len(b))
        b[i:i + rng.randint(1, 64)] = bytes(min(64, len(b) - i))
    elif kind == 3:
        b += bytes(rng.randrange(256) for _ in range(rng.randint(1, 200)))
    else:
        i = rng.randrange(len(b))
        b[i:i] = b[i:i + rng.randint(1, 128)]
    return bytes(b)


def safetensors_lie(data: bytes, rng: random.Random) -> bytes:
    """A safetensors file whose header lies about one tensor's shape, dtype or offsets."""
    n = struct.unpack("<Q", data[:8])[0]
    header = json.loads(data[8:8 + n])
    name = rng.choice([k for k in header if k != "__metadata__"])
    t = header[name]
    kind = rng.randrange(4)
    if kind == 0:
        t["shape"] = [3 * 10**9, 2]
    elif kind == 1:
        t["shape"] = [t["shape"][0] + 1] + t["shape"][1:]
    elif kind == 2:
        t["dtype"] = rng.choice(["C64", "I64", "BOOL", "F64", "U8"])
    else:
        t["data_offsets"] = [t["data_offsets"][0], t["data_offsets"][1] + 10**9]
    raw = json.dumps(header).encode()
    return struct.pack("<Q", len(raw)) + raw + data[8 + n:]


def onnx_lie(path: Path, rng: random.Random) -> bytes | None:
    """An ONNX model whose weight initializer claims dims its bytes cannot hold, or a GRU node
    with an attribute or input qtool must not read past."""
    try:
        import onnx
    except ImportError:
        return None
    m = onnx.load(str(path))
    kind = rng.randrange(4)
    if kind == 0:
        init = rng.choice(list(m.graph.initializer))
        del init.dims[:]
        init.dims.extend([1, 3 * 10**9, 2])
    elif kind == 1:
        init = rng.choice(list(m.graph.initializer))
        init.data_type = onnx.TensorProto.COMPLEX64
    elif kind == 2:
        gru = next(n for n in m.graph.node if n.op_type == "GRU")
        gru.attribute.append(onnx.helper.make_attribute("clip", 0.5))
    else:
        gru = next(n for n in m.graph.node if n.op_type == "GRU")
        for a in gru.attribute:
            if a.name == "hidden_size":
                a.i = 10**9
    return m.SerializeToString()


def keras_bomb(size: int = 256 << 20) -> bytes:
    """A small .keras archive whose weights entry inflates to `size` bytes of zeros."""
    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w", zipfile.ZIP_DEFLATED) as z:
        z.writestr("config.json", json.dumps({"class_name": "Sequential", "config": {"layers": []}}))
        z.writestr("metadata.json", "{}")
        with z.open("model.weights.h5", "w", force_zip64=True) as w:
            chunk = bytes(1 << 20)
            for _ in range(size >> 20):
                w.write(chunk)
    return buf.getvalue()


# --- data files ----------------------------------------------------------------------------

def npy_with_header(shape: tuple, descr: str, payload: bytes, fortran: bool = False) -> bytes:
    """A .npy file with any header (it may lie about the payload)."""
    header = repr({"descr": descr, "fortran_order": fortran, "shape": shape}).encode()
    header += b" " * (63 - (len(header) + 10) % 64) + b"\n"
    return b"\x93NUMPY\x01\x00" + struct.pack("<H", len(header)) + header + payload


def data_cases(good: np.ndarray) -> Iterator[tuple[str, str, Callable[[Path], None]]]:
    """(name, file suffix, writer) for data files that are wrong in one way each."""
    n, t, c = good.shape
    raw = good.astype("<f4").tobytes()

    def npy(shape, descr, payload=raw, fortran=False):
        return lambda p: p.write_bytes(npy_with_header(shape, descr, payload, fortran))

    yield "npy_huge_shape", ".npy", npy((10**12, t, c), "<f4")
    yield "npy_truncated", ".npy", npy((n, t, c), "<f4", raw[: len(raw) // 2])
    yield "npy_complex", ".npy", npy((n, t, c // 2 or 1), "<c8")
    yield "npy_object", ".npy", npy((n, t, c), "|O", b"")
    yield "npy_bad_header", ".npy", lambda p: p.write_bytes(b"\x93NUMPY\x01\x00\x10\x00{'descr': <<<}\n" + raw)
    yield "npy_long_sequence", ".npy", npy((1, 10**9, c), "<f4")
    yield "npy_inf", ".npy", lambda p: np.save(p, np.full_like(good, np.inf))
    yield "npy_1e30", ".npy", lambda p: np.save(p, np.full_like(good, 1e30))

    def pm_1e30(p):  # a few huge values among ordinary ones: histograms of very different widths merge
        x = good.astype(np.float32)
        x.reshape(-1)[::97] = 1e30
        x.reshape(-1)[1::101] = -1e30
        np.save(p, x)
    yield "npy_pm_1e30", ".npy", pm_1e30
    yield "npy_float16_max", ".npy", lambda p: np.save(p, np.full(good.shape, 65504, np.float16))
    yield "npy_int64_extremes", ".npy", lambda p: np.save(p, np.full(good.shape, np.iinfo(np.int64).max))
    yield "npy_bool", ".npy", lambda p: np.save(p, good > 0)

    def npz_side(p):
        np.savez(p, x=good, side=np.zeros((64, 1024, 1024), np.uint8))
    yield "npz_side_array", ".npz", npz_side

    def npz_lie(p):
        buf = io.BytesIO()
        with zipfile.ZipFile(buf, "w") as z:
            z.writestr("x.npy", npy_with_header((10**11, t, c), "<f4", raw))
        p.write_bytes(buf.getvalue())
    yield "npz_lying_member", ".npz", npz_lie

    def h5_huge(p):
        with h5py.File(p, "w") as f:
            f.create_dataset("x", shape=(4, 10**9, c), dtype="f4", chunks=(1, 1024, c))
    yield "h5_huge_declared", ".h5", h5_huge

    def h5_strings(p):
        with h5py.File(p, "w") as f:
            f.create_dataset("x", data=np.array([[[b"a"]]]))
    yield "h5_strings", ".h5", h5_strings


if __name__ == "__main__":
    src, out, count = Path(sys.argv[1]), Path(sys.argv[2]), int(sys.argv[3])
    out.mkdir(parents=True, exist_ok=True)
    for k, (name, target, damage, is_attr) in enumerate(qmodel_cases(src, 0, count)):
        mutate_h5(src, out / f"case{k:04d}.h5", target, damage, is_attr)
        print(f"case{k:04d}.h5 {name}")
