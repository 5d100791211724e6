"""The contents of an HDF5 file that two runs writing the same thing must agree on: every
dataset and attribute but the creation time. Used by tests/project/test_dist.py and
benchmarks/bench_dist.py to compare a distributed run's files with one process's."""

from pathlib import Path

import h5py


def h5_contents(path: Path) -> dict:
    """Every dataset and attribute of an HDF5 file, but the creation time."""
    out = {}
    with h5py.File(path) as f:
        def visit(name, obj):
            out.update({f"{name}@{k}": v for k, v in obj.attrs.items() if k != "created"})
            if isinstance(obj, h5py.Dataset):
                out[name] = obj[()]
        visit("/", f)
        f.visititems(visit)
    return out
