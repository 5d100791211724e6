"""Calibration streams its data: a file several times larger than the memory the process may
grow by calibrates with a bounded peak resident set (measured, in a fresh process)."""

import subprocess
import sys

import h5py
import numpy as np
import pytest
from conftest import random_model

N, T, C = 12288, 64, 64  # 192 MiB of float32
ALLOWED_GROWTH = 48 << 20  # the file is 4x this

RUN = """import resource, sys
from qtool.cli.app import main
try:
    main(sys.argv[1:])
finally:
    print("PEAK", resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024, file=sys.stderr)
"""


def write_data(path, n):
    rng = np.random.RandomState(0)
    if path.suffix == ".npy":
        out = np.lib.format.open_memmap(path, "w+", np.float32, (n, T, C))
    else:
        f = h5py.File(path, "w")
        out = f.create_dataset("x", (n, T, C), np.float32, chunks=(64, T, C))
    for i in range(0, n, 1024):
        out[i:i + 1024] = rng.randn(min(1024, n - i), T, C).astype(np.float32)
    if path.suffix == ".npy":
        out.flush()
        del out
    else:
        f.close()


def peak_rss(model, data, out):
    p = subprocess.run([sys.executable, "-c", RUN, "calibrate", str(model), str(data), "-o", str(out),
                        "--method", "kl", "--batch-size", "256", "--force"],
                       capture_output=True, text=True, timeout=600)
    assert p.returncode == 0, p.stderr
    return int(p.stderr.rsplit("PEAK", 1)[1])


@pytest.mark.parametrize("suffix", [".npy", ".h5"])
def test_calibration_memory_does_not_grow_with_the_file(tmp_path, suffix):
    from qtool.core.model import open_h5, write_model

    model = tmp_path / "m.h5"
    with open_h5(model, "w") as f:
        write_model(f, random_model(C=C, H=8, seed=4))
    small, big = tmp_path / f"small{suffix}", tmp_path / f"big{suffix}"
    write_data(small, 256)
    write_data(big, N)
    assert big.stat().st_size >= 4 * ALLOWED_GROWTH
    base = peak_rss(model, small, tmp_path / "q0.h5")
    peak = peak_rss(model, big, tmp_path / "q1.h5")
    assert peak - base < ALLOWED_GROWTH, f"grew by {(peak - base) >> 20} MiB"


def test_npy_reader_slices_like_numpy(tmp_path):
    from qtool.io.files import NpyFile, open_sequences

    a = np.random.RandomState(1).randn(5, 7, 3).astype(">f8")  # any byte order and dtype
    np.save(tmp_path / "a.npy", a)
    r = NpyFile(tmp_path / "a.npy")
    assert np.array_equal(r[1:4], a[1:4]) and np.array_equal(r[3:99], a[3:])
    assert np.array_equal(r[:, 2:6], a[:, 2:6])
    np.save(tmp_path / "f.npy", np.asfortranarray(a))  # Fortran order: numpy's reader
    for name in ("a.npy", "f.npy"):
        d = open_sequences(tmp_path / name, time_first=True)
        assert np.array_equal(d.chunk(1, 5), a.transpose(1, 0, 2)[1:5].astype(np.float32))
    (tmp_path / "t.npy").write_bytes((tmp_path / "a.npy").read_bytes()[:-8])
    from qtool.errors import QtoolError

    with pytest.raises(QtoolError, match="truncated"):
        open_sequences(tmp_path / "t.npy")
