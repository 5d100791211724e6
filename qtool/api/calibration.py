"""`calibrate` and `observe`: every tensor's range on calibration data, a quantized model from it."""

from __future__ import annotations

import json
import os
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from qtool.api.common import DataLike, Progress, as_data, axes_notes, count, data_range, only_for
from qtool.api.models import is_whole, load_model_for_data, read_graph
from qtool.core.graph import Graph
from qtool.core.model import GruModel
from qtool.core.qgraph import QGraph
from qtool.core.qmodel import QuantModel
from qtool.errors import QtoolError
from qtool.importers.once import read_once
from qtool.io.files import SequenceData, now_utc, sha256_file
from qtool.parallel import world

SNAP_WITHOUT_RANGES = ("`snap` rounds the scales a quantized or QAT-trained file holds (ONNX QDQ, PyTorch "
                       "fake-quant, a QuantGRU checkpoint); this model holds none, so it would change nothing")


def check_calibration_options(methods: Sequence[str], method_weights: str = "minmax", percentile: float = 99.99,
                              batch_size: int = 64, snap: str = "up", *, whole: bool) -> None:
    """Refuse, before any file is read or written, calibration options no model of this kind
    takes: an unknown method (per-edge is a whole model's), a repeated one, a percentile outside
    (50, 100], an empty batch, an unknown rounding of imported ranges."""
    from qtool.calibrators import METHODS

    known = ("auto", "per-edge", *METHODS) if whole else ("auto", *METHODS)
    for m in methods:
        if m not in known:
            also = " (per-edge is a whole model's)" if m == "per-edge" else ""
            raise QtoolError(f"unknown method '{m}' (use {', '.join(known[:-len(METHODS)])} or one of "
                             f"{', '.join(METHODS)}){also}")
    weight_methods = [m for m in METHODS if m != "ema"]  # ema smooths over batches; weights are one tensor
    if method_weights not in weight_methods:
        also = " (ema averages ranges over batches of data; the weights are one tensor: minmax is its range)" \
            if method_weights == "ema" else ""
        raise QtoolError(f"unknown `method_weights` '{method_weights}' (use one of {', '.join(weight_methods)}){also}")
    if not methods or len(set(methods)) != len(methods):
        raise QtoolError("`methods` needs distinct methods, e.g. minmax,percentile,mse,kl")
    if not 50.0 < percentile <= 100.0:
        raise QtoolError("`percentile` must be in (50, 100]")
    if batch_size < 1:
        raise QtoolError("`batch_size` must be at least 1")
    if snap not in ("up", "nearest"):
        raise QtoolError(f"`snap` must be up or nearest, got '{snap}'")

def graph_candidates(model: Graph | str | os.PathLike, data: DataLike, methods: Sequence[str], *,
                     bits: str | dict = "int8", method_weights: str = "minmax", percentile: float = 99.99,
                     batch_size: int = 64, limit: int | None = None, dataset: str | None = None,
                     time_first: bool = False, check: bool = True, snap: str = "up",
                     progress: Progress | None = None) -> list[QGraph]:
    """A whole model (a graph, a whole-model file or a Keras/ONNX file) quantized on calibration
    data `[N, T, C]` of its input with each of `methods`, from one float pass over the data (the
    passes and every edge's values, `prepare`): every edge's grid, each GRU calibrated on its own
    input (docs/graph.md). A method: auto (per-edge, minmax, mse and percentile at 99.9, 99.95 and
    99.99 scored at the output on the last 20% of the data, the best calibrated on all;
    docs/graph.md), per-edge (per edge the method with the
    least error there; each GRU its own auto) or one of minmax, percentile, mse, kl, ema. A QDQ
    file's fake-quant pairs (`Graph.ranges`) give their edges' grids (`snap` as for a GRU's
    imported ranges); the calibration sets the rest."""
    from qtool.graph.calibrate import auto_graph, prepare, quantize_graph

    check_calibration_options(methods, method_weights, percentile, batch_size, snap, whole=True)
    label, config = _bits_config(bits)
    model, source = read_graph(model, check)
    if snap != "up" and model.ranges is None:
        raise QtoolError(SNAP_WITHOUT_RANGES)
    data = as_data(data, dataset, time_first, model.inputs)
    n = count(data, limit)
    tick = (lambda done: progress(done, n)) if progress else None
    path = Path(data.name)
    info = {"bits": label, "samples": n, "time_steps": int(data.shape[1]), "data_file": path.name,
            "data_sha256": sha256_file(path) if path.is_file() else "", "created": now_utc(),
            "source": model.source, "source_file": source.name if source else "",
            "source_sha256": sha256_file(source) if source and source.is_file() else ""}
    info["notes"] = axes_notes(model.steps, data.shape, data.time_first, "declares")
    prep = prepare(model, data, n, config, batch_size, tick)
    info["notes"] += constant_notes({e: prep.values[e] for e in prep.graph.inputs if e in prep.values})
    weights = {} if method_weights == "minmax" else {"method_weights": method_weights}
    return [auto_graph(prep, n, config, percentile, batch_size, {"method": m, **weights, **info}, snap, method_weights)
            if m == "auto" else
            quantize_graph(prep, n, config, m, percentile, batch_size, {"method": m, **weights, **info}, snap,
                           method_weights)
            for m in methods]


def constant_notes(inputs: dict[str, np.ndarray]) -> list[str]:
    """Inputs whose calibration data hold one value throughout (input -> its values, or their
    least and greatest): a grid, and every range after it, fitted to nothing."""
    return [f"input '{e}' is {float(v.flat[0]):.6g} throughout the calibration data: its grid and the ranges "
            "after it are fitted to no variation (are these the data the model reads?)"
            for e, v in inputs.items() if v.size and float(v.min()) == float(v.max())]


def _bits_config(bits: str | dict) -> tuple[str, dict]:
    from qtool.core.tensors import TensorConfig, load_bits

    if isinstance(bits, dict):
        if not all(isinstance(v, TensorConfig) for v in bits.values()):
            raise QtoolError("bits must be a preset name, a bits file or a {tensor: TensorConfig} dict")
        return "custom", bits
    return load_bits(bits)


def _provenance(model: GruModel, data: SequenceData | None, n: int, label: str, config: dict,
                method: str) -> dict:
    config_text = json.dumps({k: {"bits": c.bits, "symmetric": c.symmetric, "method": c.method}
                              for k, c in config.items()}, sort_keys=True)
    path = Path(data.name) if data is not None else None
    return {
        "method": method, "bits": label, "bits_config": config_text,
        "data_file": path.name if path else "", "data_sha256": sha256_file(path) if path and path.is_file() else "",
        "samples": n, "time_steps": data.shape[1] if data is not None else 0, "source": model.source,
        "source_sha256": model.extra.get("sha256", ""), "created": now_utc(),
    }


def file_ranges(path: str | os.PathLike, model: GruModel):
    """The ranges a quantized or QAT-trained model file holds (ONNX QDQ, torch.ao fake-quant, a
    QuantGRU checkpoint) for `model`, imported from it; None for a float model file."""
    from qtool.importers import read_imported

    return read_imported(Path(path), model)


@dataclass
class Calibration:
    """The observations of one float pass and how to turn them into quantized models. With
    `ranges` (a quantized or QAT-trained file's own ranges), those are kept and the observations
    fill in the rest; `ranges_used` then lists where each kept range came from."""

    model: GruModel
    data: SequenceData | None
    samples: int
    label: str
    config: dict
    plans: list
    observers: list
    ranges: object = None
    snap: str = "up"
    ranges_used: list = field(default_factory=list)
    auto: object = None  # method auto: (its quantized model, qtool.calibration.auto.AutoChoice)
    notes: list = field(default_factory=list)  # what looks wrong with the calibration data

    def quant_model(self, k: int = 0) -> QuantModel:
        from qtool.calibration.observe import build_quant_model

        if self.auto is not None:
            return self.auto[0]
        method = self.plans[k].label()
        if self.ranges is not None:
            method = f"ranges from the {self.ranges.kind} file (snap {self.snap})" + (
                f", the rest {method}" if self.data is not None else "")
        info = _provenance(self.model, self.data, self.samples, self.label, self.config, method)
        if self.ranges is None:
            return build_quant_model(self.model, self.observers[k], self.config, info, self.plans[k])
        from qtool.calibration.from_file import build_from_file

        qm, self.ranges_used = build_from_file(self.ranges, self.model, self.config, info, self.snap,
                                               self.observers[k], self.plans[k])
        return qm


def observe(model: GruModel | str | os.PathLike, data: DataLike | None, *, bits: str | dict = "int8",
            methods: Sequence[str] = ("minmax",), method_weights: str = "minmax",
            percentile: float = 99.99, batch_size: int = 64, limit: int | None = None,
            dataset: str | None = None, time_first: bool = False, ranges=None, snap: str = "up",
            progress: Progress | None = None) -> Calibration:
    """One float pass over the calibration data feeding the observers of every method asked for.
    A model file that holds ranges (`file_ranges`; looked up when `model` is a path) keeps them,
    and `data` may then be None when the file holds every range. `methods=("auto",)`: per tensor
    the method with the least held-out error (qtool.calibration.auto); beside a file's own ranges,
    minmax fills in the rest."""
    from qtool.calibration.observe import MethodPlan, collect_many

    only_for(is_whole(model), "observe")
    if "auto" in methods and len(methods) > 1:
        raise QtoolError("`methods` takes single methods (auto chooses among them itself)")
    check_calibration_options(methods, method_weights, percentile, batch_size, snap, whole=False)
    label, config = _bits_config(bits)
    if not isinstance(model, GruModel):
        path = Path(model)
        model = load_model_for_data(path)
        ranges = file_ranges(path, model) if ranges is None else ranges
    if snap != "up" and ranges is None:
        raise QtoolError(SNAP_WITHOUT_RANGES)
    auto = list(methods) == ["auto"] and ranges is None
    methods = ["minmax" if m == "auto" else m for m in methods]
    plans = [MethodPlan.from_config(config, m, method_weights, percentile) for m in methods]
    if data is None:
        if ranges is None:
            raise QtoolError("missing DATA (calibration data file)")
        return Calibration(model, None, 0, label, config, plans, [None] * len(plans), ranges, snap)
    data = as_data(data, dataset, time_first)
    data.check_features(model.input_size)
    n = count(data, limit)
    notes = constant_notes({"x": np.array(data_range(data, n))})
    tick = (lambda done: progress(done, n)) if progress else None
    comm = world()
    if auto:  # not distributed: under mpiexec every rank runs it over all the data, rank 0 writes
        from qtool.calibration.auto import calibrate_auto

        info = _provenance(model, data, n, label, config, "auto")
        qm, choice = calibrate_auto(model, data, n, config, method_weights, percentile, batch_size, tick, info)
        return Calibration(model, data, n, label, config, [choice.plan], [None], auto=(qm, choice), notes=notes)
    if comm is None:
        obs = collect_many(model, data, plans, batch_size, n, progress=tick)
    else:  # under mpiexec: each rank observes its chunks; every rank gets the merged observers
        from qtool.parallel.calibrate import collect_many as collect_ranks

        obs = collect_ranks(comm, model, data, plans, batch_size, n, progress=tick)
    return Calibration(model, data, n, label, config, plans, obs, ranges, snap, notes=notes)


def calibrate(model: GruModel | Graph | str | os.PathLike, data: DataLike | None, *, bits: str | dict = "int8",
              method: str = "auto", method_weights: str = "minmax", percentile: float = 99.99,
              batch_size: int = 64, limit: int | None = None, dataset: str | None = None,
              time_first: bool = False, snap: str = "up", check: bool = True,
              progress: Progress | None = None) -> QuantModel | QGraph:
    """Observe every tensor of the float model on calibration data; return the quantized model:
    a `QuantModel` for a GRU alone, a `QGraph` for a whole model (every edge's grid, each GRU
    calibrated on its own input; docs/graph.md). `method`: "auto" (a GRU: per tensor the method
    with the least error on held-out folds of the data, checked at the output against every
    single method, docs/calibration.md; a whole model: per-edge, minmax, mse and three percentiles
    scored at the output on the last 20% of the data, the best calibrated on all), "per-edge" (a whole model:
    per edge its least-error method) or one method. A quantized, QAT-trained or QDQ file keeps
    its own ranges (`snap`: how a scale that is not a power of two becomes one, "up" without
    clipping or "nearest"); `data` fills in the rest. `check`: a file read here is checked
    against its framework."""
    with read_once():
        whole = is_whole(model)
        if whole:
            return graph_candidates(model, data, [method], bits=bits, method_weights=method_weights,
                                    percentile=percentile, batch_size=batch_size, limit=limit, dataset=dataset,
                                    time_first=time_first, check=check, snap=snap, progress=progress)[0]
        ranges = None
        if not isinstance(model, GruModel):
            path = Path(model)
            model = load_model_for_data(path, check=check)
            ranges = file_ranges(path, model)
    return observe(model, data, bits=bits, methods=(method,), method_weights=method_weights,
                   percentile=percentile, batch_size=batch_size, limit=limit, dataset=dataset,
                   time_first=time_first, ranges=ranges, snap=snap, progress=progress).quant_model(0)
