"""What the verbs share: the data argument, the one table of what only one kind of model takes,
the notes on data that look wrong, and how files are told apart and written."""

from __future__ import annotations

import contextlib
import math
import os
from collections.abc import Callable, Sequence
from pathlib import Path

import numpy as np

from qtool.errors import QtoolError
from qtool.io.files import ModelData, SequenceData, open_inputs, open_sequences
from qtool.parallel import world

Progress = Callable[[int, int], None]  # progress(done, total)
DataLike = str | os.PathLike | np.ndarray | SequenceData | ModelData | dict


# What only one kind of model takes. Options: (who takes it, its default); a value other than the
# default given for the other kind is refused in one line. Verbs: what they take, and why.
ONLY_FOR = {"per_tensor": ("a GRU alone", True),
            "labels": ("a whole model", None)}
GRU_ONLY_VERBS = {
    "observe": "it is calibrated whole by calibrate",
}


def only_for(whole: bool, verb: str, **given) -> None:
    """Refuse `verb` for a whole model where it takes a GRU alone, and any option `given` a value
    the model's kind does not take (ONLY_FOR)."""
    kind = "a whole model" if whole else "a GRU alone"
    if whole and verb in GRU_ONLY_VERBS:
        raise QtoolError(f"a whole model: {verb} takes a GRU alone; {GRU_ONLY_VERBS[verb]}")
    for option, value in given.items():
        who, default = ONLY_FOR[option]
        given_default = value is default or (not isinstance(value, np.ndarray) and value == default)
        if who != kind and not given_default:
            raise QtoolError(f"`{option}` applies to {who}; {verb} was given {kind}")


def as_data(data: DataLike, dataset: str | None = None, time_first: bool = False,
            inputs: Sequence[str] = ()) -> SequenceData | ModelData:
    """A file path, an array `[N, T, C]` (or `[T, N, C]` with time_first) or SequenceData; for a
    model of several `inputs`, a .npz/.h5 file of an array per input named after it, a dict of
    arrays or ModelData."""
    if isinstance(data, (list, tuple)):
        raise QtoolError("data: give an array, a file or, for a model of several inputs, a dict {input: array}; "
                         f"got a {type(data).__name__}")
    if len(inputs) > 1:
        return _model_data(data, dataset, time_first, list(inputs))
    if isinstance(data, ModelData) or isinstance(data, dict):
        raise QtoolError("the model has one input: give its data as one array, not one per input")
    if isinstance(data, SequenceData):
        return data
    if isinstance(data, np.ndarray):
        return SequenceData(data, time_first, "array")
    return open_sequences(Path(data), dataset, time_first)


def _model_data(data: DataLike, dataset: str | None, time_first: bool, inputs: list[str]) -> ModelData:
    want = f"the model has {len(inputs)} inputs ({', '.join(inputs)})"
    if dataset is not None:
        raise QtoolError(f"{want}: its data file holds an array per input, named after it; `dataset` picks one "
                         "array of a model of one input")
    if isinstance(data, (SequenceData, np.ndarray)):
        raise QtoolError(f"{want}: give its data as a dict of arrays (or a file of them), one per input")
    if not isinstance(data, (dict, ModelData)):
        return open_inputs(Path(data), inputs, time_first)
    held = [str(e) for e in (data if isinstance(data, dict) else data.parts)]
    missing = [e for e in inputs if e not in held]
    if missing:
        raise QtoolError(f"{want}; the data lack {', '.join(missing)} (they hold {', '.join(held)})")
    if isinstance(data, dict):  # its other arrays are not read, as a file's
        return ModelData.from_arrays({e: np.asarray(data[e]) for e in inputs}, time_first, "arrays")
    return ModelData({e: data.parts[e] for e in inputs}, data.name)


def count(data: SequenceData, limit: int | None) -> int:
    """How many sequences to use: all, or `limit` (at least 1)."""
    if limit is None:
        return data.num_sequences
    if isinstance(limit, bool) or not isinstance(limit, (int, np.integer)) or limit < 1:
        raise QtoolError(f"`limit` must be a positive number of sequences, got {limit}")
    return min(int(limit), data.num_sequences)


def _parts(d: SequenceData | ModelData) -> dict[str, SequenceData]:
    """Each input's data: a model of several inputs' ModelData, or the one input's ("")."""
    return d.parts if isinstance(d, ModelData) else {"": d}


def shared_sequences(data: SequenceData | ModelData, test: SequenceData | ModelData, limit: int | None = None) -> int:
    """How many of `test`'s first `limit` sequences are also among `data`'s (equal value for
    value, in every input): held-out scores on them are not held out."""
    import hashlib

    if [d.shape[1:] for d in _parts(data).values()] != [d.shape[1:] for d in _parts(test).values()]:
        return 0

    def digests(d: SequenceData | ModelData) -> list[bytes]:
        out = []
        for _, x in d.chunks(256, count(d, limit)):
            arrays = list(x.values()) if isinstance(x, dict) else [x]
            out += [hashlib.blake2b(b"".join(a[i].tobytes() for a in arrays), digest_size=16).digest()
                    for i in range(len(arrays[0]))]
        return out
    seen = set(digests(data))
    return sum(h in seen for h in digests(test))


def shared_notes(data: SequenceData, test: SequenceData, limit: int | None = None) -> list[str]:
    """The note for held-out data that is not held out (`shared_sequences`)."""
    shared, scored = shared_sequences(data, test, limit), count(test, limit)
    if shared == scored:
        return ["every held-out sequence is also in the calibration data: the scores are not on held-out data"]
    return [f"{shared} of the {scored} held-out sequences are also in the calibration data: their scores "
            "are not held out"] if shared else []


SATURATED_NOTE = 0.02  # more than this share of an input's values outside its grid is said


def axes_notes(steps: int | None, shape: tuple, time_first: bool, source: str = "was calibrated on") -> list[str]:
    """Data `[N, T, C]` (as read, after `time_first`) whose first axis is the number of steps the
    model expects (`steps`: what it `source`, calibrated on or declared by its file) and whose
    second is not: batch and steps look swapped (the command says it, and runs on)."""
    n, t = shape[0], shape[1]
    if steps and t != steps and n != steps and source == "declares":
        return [f"the model declares sequences of {steps} steps; the data [{n}, {t}, {shape[2]}] have {t} per "
                "sequence (qtool runs any length: are these the data the model was made for?)"]
    if not steps or n != steps or t == steps:
        return []
    if time_first:
        return [f"the data read time-first are [{n}, {t}, {shape[2]}] sequences x steps: the model {source} "
                f"sequences of {steps} steps, their first axis, not their second; if they are [N, T, C], "
                "drop `time_first`"]
    return [f"the data [{n}, {t}, {shape[2]}] look time-first: the model {source} sequences of {steps} steps, "
            "which is their first axis, not their second; if they are [T, N, C], pass `time_first`"]


def saturation_notes(saturated: dict[str, float], worst: dict[str, str] | None = None, of: str = "the ") -> list[str]:
    """Inputs with more than 2% of their values outside their grid (input -> share): data scaled
    unlike the calibration data (`simulate` and `export_c` say it, and run on); `worst`: an input
    with a grid per channel -> the channel most outside its own; `of`: whose values they are."""
    worst = worst or {}
    return [f"{share:.1%} of {of}values of input '{name}' lie outside its grid (saturated"
            + (f"; most on {worst[name]}" if name in worst else "") + "): are the data scaled as the calibration "
            "data were?" for name, share in saturated.items() if share > SATURATED_NOTE]


def data_range(data: SequenceData, n: int) -> tuple[float, float]:
    """The least and the greatest value of the first `n` sequences, one pass over the chunks."""
    lo, hi = math.inf, -math.inf
    for _, x in data.chunks(256, n):
        lo, hi = min(lo, float(np.nanmin(x))), max(hi, float(np.nanmax(x)))
    return lo, hi


def range_notes(data: SequenceData | ModelData, n: int, test: SequenceData | ModelData) -> list[str]:
    """Held-out data with more than 2% of an input's values outside the range of the first `n`
    calibration sequences: data scaled unlike the calibration data (advise says it)."""
    notes = []
    tests = _parts(test)
    for name, part in _parts(data).items():
        lo, hi = data_range(part, n)
        outside = total = 0
        for _, x in tests[name].chunks(256):
            outside += int(np.count_nonzero((x < lo) | (x > hi)))
            total += x.size
        share = outside / max(total, 1)
        if share > SATURATED_NOTE:
            of = f"the held-out values of input '{name}'" if name else "the held-out values"
            notes.append(f"{share:.1%} of {of} lie outside the calibration data's range [{lo:.4g}, {hi:.4g}]: "
                         "are they scaled as the calibration data are?")
    return notes


def output_notes(output: dict) -> list[str]:
    """An output SNR below LOW_SNR_DB (10 dB): the integer output's error is near the output's
    own size, which more bits or other weights and data explain, not the data's scale alone."""
    from qtool.engine.metrics import LOW_SNR_DB

    snr = output.get("snr_db")
    if output.get("exact") or snr is None or snr >= LOW_SNR_DB:
        return []
    return [f"the output SNR is {snr:.1f} dB, below {LOW_SNR_DB:g} dB: the integer output's error is near the "
            "output's own size (calibrate with more `bits`, w8a16 or int16, or run `qtool advise`; check that the "
            "weights and data are the ones the model was trained with)"]


def held_out_notes(data: SequenceData, n: int, test: SequenceData) -> list[str]:
    """What looks wrong in held-out data `test` beside the first `n` calibration sequences of
    `data`: steps and batch swapped, values outside the calibration range, sequences shared."""
    return (axes_notes(int(data.shape[1]), test.shape, test.time_first, "is calibrated here on")
            + range_notes(data, n, test) + shared_notes(data, test, n))


def check_mode(mode: str) -> None:
    from qtool.simulation.fakequant import MODES

    if mode not in MODES:
        raise QtoolError(f"unknown `mode` '{mode}' (use one of {', '.join(MODES)})")


def model_file_format(path: str | os.PathLike) -> str | None:
    """The format of a qtool HDF5 file ("qtool-gru", "qtool-qgru", "qtool-graph", "qtool-qgraph"),
    "keras" for a Keras HDF5 file, "" for another HDF5 file, None for no HDF5 file."""
    return h5_format(Path(path))


def describe_check(check: dict | None) -> str:
    """One line on what an import was checked against and how closely."""
    from qtool.importers.crosscheck import describe

    return describe(check)


def mode_explanation(mode: str) -> str | None:
    """What a fake-quant simulation measures, for `mode` "fakequant" or "both"; None for "integer"."""
    if mode == "integer":
        return None
    from qtool.simulation.fakequant import EXPLANATION

    return EXPLANATION


def h5_format(path: Path) -> str | None:
    """The `format` attribute of an HDF5 file ("qtool-gru", "qtool-qgru", "" for others such as
    Keras'), or None when `path` is no HDF5 file."""
    import h5py

    from qtool.core.model import open_h5

    if not (path.is_file() and h5py.is_hdf5(path)):
        return None
    with open_h5(path) as f:
        fmt = f.attrs.get("format", "")
        keras = "keras_version" in f.attrs or "model_config" in f.attrs
    fmt = fmt.decode(errors="replace") if isinstance(fmt, bytes) else str(fmt)
    return "keras" if keras and not fmt else fmt


def other_model(path: Path) -> str | None:
    """What a file that is no quantized model is, when it is a model of another kind."""
    from qtool.importers import detect_format

    if not path.is_file() or path.stat().st_size == 0:  # qtool.core.model.check_model_file says so
        return None
    fmt = h5_format(path)
    if fmt is None:
        with contextlib.suppress(QtoolError):
            fmt = detect_format(path)
    if fmt == "haste":
        from qtool.importers.haste import refuse_data

        refuse_data(path)
    return {"qtool-gru": "a float qtool model", "qtool-graph": "a float whole model",
            "keras": "a Keras model", "torch": "a PyTorch file",
            "safetensors": "a safetensors file", "onnx": "an ONNX model", "tflite": "a TFLite model",
            "haste": "haste weights"}.get(fmt)


def write_once(write: Callable[[], None]) -> None:
    """Write an output file; under mpiexec rank 0 writes it and every rank learns the outcome."""
    comm = world()
    if comm is None:
        write()
    else:
        from qtool.parallel.agree import on_root

        on_root(comm, write)
