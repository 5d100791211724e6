"""`qtool simulate --save`: the float output, the dequantized integer output and the raw output
integers of every sequence, streamed into an HDF5 file (format "qtool-results") as they are
computed, with the provenance of the run."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import numpy as np

from qtool.core.qmodel import QuantModel
from qtool.io.files import SequenceData, atomic_path, check_free_space, now_utc, sha256_file
from qtool.version import __version__

RESULTS_FORMAT = "qtool-results"
DATASETS = (("float/y", "f4"), ("quant/y", "f4"), ("quant/y_int", "i4"))


def write_results(path: Path, qm: QuantModel, data: SequenceData, n: int,
                  run: Callable[[Callable], object], progress: Callable[[int, int], None] | None = None,
                  mode: str = "integer"):
    """Call `run(on_chunk)` (a simulation that reports each chunk's outputs) while streaming the
    outputs into `path`; the file appears only when complete. Returns what `run` returns. `mode`
    is recorded: under "fakequant" `quant/` holds the fake-quant GRU's outputs, not the integers'."""
    import h5py


    shape = (n, data.shape[1], qm.model.output_size)
    check_free_space(path, int(np.prod(shape)) * 12 + (1 << 20))
    data_path = Path(data.name)
    with atomic_path(path) as tmp:
        with h5py.File(tmp, "w") as f:
            f.attrs.update(format=RESULTS_FORMAT, version=1, qtool_version=__version__,
                           qmodel_fingerprint=qm.fingerprint(), model=qm.model.name,
                           data_file=data_path.name,
                           data_sha256=sha256_file(data_path) if data_path.is_file() else "",
                           samples=n, mode=mode, created=now_utc())
            ds = [f.create_dataset(k, shape, dtype=dt) for k, dt in DATASETS]

            def on_chunk(start, *outs):
                for d, v in zip(ds, outs):
                    d[start:start + len(v)] = v
                if progress:
                    progress(start + len(outs[0]), n)

            result = run(on_chunk)
    return result
