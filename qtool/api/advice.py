"""`advise`: the precision advisor, for a GRU alone or a whole model (docs/advisor.md)."""

from __future__ import annotations

import math
import os
from collections.abc import Callable
from pathlib import Path

import numpy as np

from qtool.api.common import DataLike, as_data, count, held_out_notes
from qtool.api.models import is_whole, load_model_for_data, read_graph
from qtool.core.graph import Graph
from qtool.core.model import GruModel
from qtool.errors import QtoolError
from qtool.importers.once import read_once
from qtool.io.files import SequenceData, claim_output


def advise(model: GruModel | Graph | str | os.PathLike, data: DataLike, test: DataLike | None = None, *,
           target_snr: float | None = None, max_flash: int | None = None, threshold: float | None = None,
           seed: int = 0, gamma: float = 0.01, repeats: int = 5, batch_size: int = 64,
           limit: int | None = None, dataset: str | None = None, time_first: bool = False,
           output: str | os.PathLike | None = None, force: bool = False, check: bool = True,
           confirm: Callable[[str], bool] | None = None,
           progress: Callable[[str, int, int | None], None] | None = None):
    """The precision advisor (docs/advisor.md): every tensor's predicted SNR at 8 and 16 bits and
    the int8/int16 threshold rule (docs/advisor.md) at `threshold` dB; with held-out `test` data, the least flash whose
    measured output SNR reaches `target_snr`, or the best SNR within `max_flash` bytes. Returns
    a qtool.advisor.advise.Advice; `output` gets its bits file (TOML, for `calibrate(bits=...)`).
    `progress(stage, done, total or None)`. A whole model: int8 or int16 for each layer's weights
    and output and each GRU tensor, its rows one per such unit (docs/advisor.md, "Whole
    models"). `limit` bounds both `data` and `test` to their first `limit` sequences. `check`: a
    file read here is checked against its framework."""
    from qtool.advisor.advise import THRESHOLD_DB
    from qtool.advisor.advise import advise as run_advise

    if target_snr is not None and not math.isfinite(target_snr):
        raise QtoolError(f"`target_snr` must be a finite number of dB, got {target_snr}")
    if max_flash is not None and (isinstance(max_flash, bool) or max_flash < 1):
        raise QtoolError(f"`max_flash` must be a positive number of bytes, got {max_flash}")
    if threshold is not None and not math.isfinite(threshold):
        raise QtoolError(f"`threshold` must be a finite number of dB, got {threshold}")
    if batch_size < 1:
        raise QtoolError("`batch_size` must be at least 1")
    with read_once():
        if is_whole(model):
            model, source = read_graph(model, check)
        else:
            model = model if isinstance(model, GruModel) else load_model_for_data(Path(model), check=check)
            source = model.extra.get("path")
    data_in, test_in = data, test
    inputs = list(model.inputs) if isinstance(model, Graph) else []
    data = as_data(data, dataset, time_first, inputs)
    test = as_data(test, dataset, time_first, inputs) if test is not None else None
    if test is not None:
        test = test.first(count(test, limit))  # `limit` bounds the held-out data as the calibration
    if isinstance(model, GruModel):  # a whole model's are checked by its float pass
        for d in (data, test) if test is not None else (data,):
            d.check_features(model.input_size)
    if output is not None:  # refuse before the work, not after it
        names = [None if isinstance(d, np.ndarray) or d is None else s.name
                 for d, s in ((data_in, data), (test_in, test))]
        output = claim_output(output, force, [source, *names], confirm, kind="TOML")
    n = count(data, limit)
    args = (target_snr, max_flash, THRESHOLD_DB if threshold is None else threshold, seed, gamma, repeats, batch_size)
    provenance = {"data_file": Path(data.name).name}
    if isinstance(model, Graph):
        from qtool.advisor.graph import advise_graph

        return _advised(lambda: advise_graph(model, data, n, test, *args, progress, provenance),
                        data, test, n, time_first, output)
    return _advised(lambda: run_advise(model, data, test, *args, n, progress, provenance),
                    data, test, n, time_first, output)


def _advised(run: Callable, data: SequenceData, test: SequenceData | None, n: int, time_first: bool,
             output: Path | None):
    """`run()`'s advice, its bits file written to `output`, with what looks wrong in the held-out
    data (`.extra["notes"]`; in the error when the run fails)."""
    from qtool.io.files import write_bytes

    notes = [] if test is None else held_out_notes(data, n, test)
    try:
        adv = run()
    except QtoolError as e:
        if not notes:
            raise
        raise QtoolError(f"{e} (note: {'; '.join(notes)})") from None
    adv.extra["notes"] = notes
    if output is not None:
        write_bytes(output, adv.bits_toml.encode())
        adv.extra["bits_file"] = str(output)
    return adv
