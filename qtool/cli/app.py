"""The qtool command line: it parses arguments, calls the Python API (qtool.api) and prints the
results as rich tables or JSON. Every user error is one line on stderr and a non-zero exit."""

from __future__ import annotations

import json
import os
import signal
import sys
import time
import warnings
from pathlib import Path
from typing import Annotated

import typer
from rich.markup import escape

from qtool.cli import graph_cmds
from qtool.cli.console import (
    NOTES,
    Bar,
    Interrupted,
    as_flags,
    command_over,
    confirm_at_terminal,
    emit_json,
    err,
    need,
    out,
    say_phases,
    stop_on_signals,
    warn,
    wrote,
)
from qtool.errors import QtoolError
from qtool.parallel import check_command, command_scope, stop_every_rank
from qtool.parallel.agree import RankStopped
from qtool.version import __version__

app = typer.Typer(
    help="Calibrate, simulate bit-exactly and export integer-only GRUs for microcontrollers and "
         "DSPs.\n\nThe pipeline: import -> calibrate -> simulate -> export c -> verify. Start with "
         "'qtool calibrate MODEL DATA -o q.h5' and 'qtool simulate q.h5 TEST'.",
    pretty_exceptions_enable=False,
    rich_markup_mode="rich",
)


def _flags_without_type_labels() -> None:
    """typer's rich help labels every option with its type, flags too (`--force -f <bool>`); a
    flag takes no value, so show none (click's own convention)."""
    from typer.core import TyperOption

    shown = getattr(TyperOption, "display_type_rich", None)
    if shown is not None and not getattr(shown, "qtool_flags", False):
        def display(self, ctx):
            return None if getattr(self, "is_flag", False) else shown(self, ctx)
        display.qtool_flags = True
        TyperOption.display_type_rich = display


_flags_without_type_labels()


def _version(value: bool) -> None:
    if value:
        out.print(f"qtool {__version__}")
        raise typer.Exit()


@app.callback(invoke_without_command=True)
def root(ctx: typer.Context,
         version: Annotated[bool, typer.Option("--version", callback=_version, is_eager=True,
                                               help="Print qtool's version and exit.")] = False):
    check_command(ctx.invoked_subcommand)  # under mpiexec: calibrate and simulate only
    if ctx.invoked_subcommand is None:
        out.print(ctx.get_help())
        raise typer.Exit()
    from qtool import api  # here, not at start-up: --help and --version need none of it

    ctx.with_resource(api.read_once())  # a model file is read once per command


def file_output(value: str) -> Path:
    """An output that is one file: a trailing slash names a folder, which Path() would drop."""
    if value.endswith(("/", os.sep)):
        raise typer.BadParameter(f"{value} names a folder; this output is one file: name the file (e.g. {value}NAME)")
    return Path(value)


NameOpt = Annotated[str | None, typer.Option("--name", metavar="NAME", help="Which GRU, when the file holds several (a Keras layer, an ONNX node, a PyTorch module prefix).")]
NoCheckOpt = Annotated[bool, typer.Option("--no-check", help="Skip running the source framework (PyTorch, Keras, ONNX Runtime, when installed) on random inputs to confirm the import of a framework file.")]
ModelArg = Annotated[Path | None, typer.Argument(metavar="MODEL", show_default=False, help="A qtool model file or any importable GRU (.pt/.pth, .safetensors, .keras/.h5, .onnx, .tflite, haste .npz).")]
QModelArg = Annotated[Path | None, typer.Argument(metavar="QMODEL", show_default=False, help="A quantized model from 'qtool calibrate'.")]
DataOpt = Annotated[str | None, typer.Option("--dataset", metavar="NAME", help="Array/dataset name inside .npz/.h5 data.")]
TimeFirst = Annotated[bool, typer.Option("--time-first", help="Data is [T, N, C] instead of [N, T, C].")]
Force = Annotated[bool, typer.Option("--force", "-f", help="Replace an existing output that qtool wrote (files qtool did not write are never replaced).")]
JsonOpt = Annotated[bool, typer.Option("--json", help="Print results as JSON for scripts.")]
LimitOpt = Annotated[int | None, typer.Option(metavar="N", help="Use at most N sequences of each data file.", min=1)]


@app.command("import")
def import_cmd(
    src: Annotated[Path | None, typer.Argument(metavar="MODEL", show_default=False, help="A trained GRU: .pt/.pth, .safetensors, .keras/.h5, .onnx, .tflite, haste .npz.")] = None,
    output: Annotated[Path | None, typer.Option("-o", "--output", metavar="FILE", parser=file_output, help="The qtool model file to write (.h5; its directory is created if needed).")] = None,
    fmt: Annotated[str | None, typer.Option("--format", metavar="FORMAT", help="torch, safetensors, keras, onnx, tflite or haste (default: from the file name).")] = None,
    name: NameOpt = None,
    no_check: NoCheckOpt = False,
    force: Force = False,
    as_json: JsonOpt = False,
):
    """Read a trained model (PyTorch, Keras, ONNX, haste weights) into qtool's model file.

    A Keras or ONNX file with layers around its GRU is read whole (docs/graph.md); --name takes
    one of its GRUs alone."""
    from qtool import api

    src = Path(need(src, "model file to import", "MODEL"))
    output = Path(need(output, "output model file (.h5)", "--output"))
    api.claim_output(output, force, [src], confirm_at_terminal())  # before the import and its check
    model = api.load_model(src, fmt, name, check=not no_check, whole=name is None and _whole_model(src, fmt))
    api.save(model, output, True, inputs=[src])
    if as_json:
        summary = graph_cmds.graph_summary(model) if isinstance(model, api.Graph) else gru_summary(model)
        emit_json({"output": str(output), **summary})
        return
    if isinstance(model, api.Graph):
        graph_cmds.show_graph(model, src)
        out.print(f"imported the whole model -> {escape(str(output))}")
        return
    dirs = "bidirectional" if model.bidirectional else "unidirectional"
    out.print(f"imported [bold]{model.name}[/]: {model.num_layers} layer(s), {dirs}, "
              f"input {model.input_size}, hidden {_hidden(model)} -> {escape(str(output))}")
    for line in api.import_lines(model):
        out.print(escape(as_flags(line)), highlight=False)


def gru_summary(model) -> dict:
    """A GRU's shape, its import (what was taken, left out, assumed) and its check, for --json."""
    from qtool import api

    imported = model.extra.get("import", {})
    left_out = api.import_note(model)
    return {"name": model.name, "source": model.source, "num_layers": model.num_layers,
            "bidirectional": model.bidirectional, "input_size": model.input_size, "hidden_size": model.hidden_size,
            **imported, "check": model.extra.get("check"),
            "notes": [*imported.get("notes", []), *([left_out] if left_out else [])]}


def _hidden(model) -> str:
    """The hidden size, or each layer's where a stack's layers differ (20, 12)."""
    sizes = [cells[0].R.shape[1] for cells in model.layers]
    return str(sizes[0]) if len(set(sizes)) == 1 else ", ".join(map(str, sizes))


def _whole_model(path: Path, fmt: str | None = None) -> bool:
    from qtool import api

    return api.is_whole_model(path, fmt)


def note_if_quantized(path: Path) -> None:
    """A quantized qtool file given to calibrate or advise: its float model is what they use."""
    from qtool import api

    if api.model_file_format(path) in ("qtool-qgru", "qtool-qgraph"):
        NOTES.append(f"{path.name} is a quantized model already: its float model was calibrated again, "
                     "and none of its grids were kept")


def note_what_was_left_out(model) -> None:
    """A framework file given to calibrate or advise: say what the GRU leaves out of it."""
    from qtool import api

    note = api.import_note(model)
    if note:
        NOTES.append(note)


def say_if_compiling() -> None:
    """One line on stderr when the engine's kernel is not compiled yet (the first run after an
    install), which would otherwise sit silent for several seconds."""
    from qtool import api

    if api.needs_compile():
        err.print("first run: compiling the simulator's kernels (cached for later runs)")


@app.command()
def calibrate(
    model_path: ModelArg = None,
    data_path: Annotated[Path | None, typer.Argument(metavar="DATA", show_default=False, help="Calibration sequences: .npy, .npz or .h5, [N, T, C]. A model of several inputs: one .npz or .h5 holding an array per input, named after it.")] = None,
    output: Annotated[Path | None, typer.Option("-o", "--output", metavar="FILE", parser=file_output, help="The quantized model file to write (.h5; its directory is created if needed). With --compare: optional, gets the method with the best output SNR.")] = None,
    method: Annotated[str | None, typer.Option(metavar="METHOD", show_default=False, help="Range method for activations (default auto): auto (per tensor, the method with the least error on held-out data, 5-fold cross-validated over DATA and checked at the output against each single method; docs/calibration.md), minmax (running union), ema (the per-step EMA on x and h, docs/calibration.md), percentile, mse (least squared error) or kl (least KL divergence). A whole model: auto scores per-edge (each edge's least-error method), minmax, mse and percentile 99.9/99.95/99.99 at the output on the last 20% of DATA (under 10 sequences: on DATA) and keeps the best.")] = None,
    method_weights: Annotated[str, typer.Option(metavar="METHOD", help="Range method for the weights, per output channel: a GRU's W and R, each layer's. minmax, percentile, mse (the grid of least squared error, which may clip) or kl.")] = "minmax",
    percentile: Annotated[float | None, typer.Option(metavar="P", help="With percentile (and auto, per-edge, which try it): the share of values kept, two-sided (default 99.99).")] = None,
    compare: Annotated[str | None, typer.Option(metavar="M1,M2,...", help="Calibrate with each of these methods (e.g. minmax,percentile,mse,kl; auto, and for a whole model per-edge) in one pass and compare them at the output on --eval; the best goes to --output.")] = None,
    eval_path: Annotated[Path | None, typer.Option("--eval", metavar="TEST", help="With --compare: held-out sequences to score each method on.")] = None,
    bits: Annotated[str, typer.Option(metavar="PRESET|FILE", help="Preset int8, w8a16 or int16, or a JSON/TOML file with per-tensor bits.")] = "int8",
    dataset: DataOpt = None,
    time_first: TimeFirst = False,
    batch_size: Annotated[int, typer.Option(metavar="N", help="Sequences per chunk (bounds memory).", min=1)] = 64,
    limit: LimitOpt = None,
    snap: Annotated[str, typer.Option(metavar="up|nearest", help="For quantized or QAT-trained models (ONNX QDQ, PyTorch fake-quant, QAT checkpoints): a file scale that is not a power of two goes 'up' to the finest power-of-two grid that does not clip its range, or to the 'nearest' power of two.")] = "up",
    verbose: Annotated[bool, typer.Option("--verbose", "-v", help="Print every tensor's quantization and the activation tables (a whole model: each GRU's).")] = False,
    name: NameOpt = None,
    no_check: NoCheckOpt = False,
    force: Force = False,
    as_json: JsonOpt = False,
):
    """Observe every tensor of the model on calibration data and write the quantized model.

    A whole model (a Keras or ONNX file with layers around its GRU, or `qtool import`'s whole-model
    file) is calibrated whole: every edge's grid, each GRU on its own input (docs/graph.md).

    A quantized or QAT-trained model (ONNX QDQ, PyTorch fake-quant, a QuantGRU checkpoint) keeps
    the ranges its file holds; DATA calibrates the rest (without DATA the file must hold them all)."""
    from qtool import api
    from qtool.cli.tables import auto_lines, calibration_summary, lut_table, ranges_table, spec_rows, spec_table

    model_path = Path(need(model_path, "model file", "MODEL"))
    whole = name is None and _whole_model(model_path)
    note_if_quantized(model_path)
    if compare is not None and eval_path is None:
        raise QtoolError("--compare needs --eval TEST: held-out sequences to score each method on")
    if compare is None and eval_path is not None:
        raise QtoolError("--eval goes with --compare")
    if compare is not None and method is not None:
        raise QtoolError("--method and --compare: name every method to try in --compare (e.g. --compare auto,mse)")
    method = method or "auto"
    methods = [m.strip() for m in compare.split(",") if m.strip()] if compare is not None else [method]
    if percentile is not None and not {"percentile", "auto", "per-edge"} & {*methods, method_weights}:
        raise QtoolError(f"--percentile goes with the percentile method (auto and per-edge try it too); "
                         f"{', '.join(methods)} take{'s' * (len(methods) == 1)} none")
    percentile = 99.99 if percentile is None else percentile
    api.check_calibration_options(methods, method_weights, percentile, batch_size, snap, whole=whole)
    if whole and compare is None:
        data_path = Path(need(data_path, "calibration data file", "DATA"))
        output = Path(need(output, "output quantized model file (.h5)", "--output"))
        api.claim_output(output, force, [model_path, data_path], confirm_at_terminal())
        graph_cmds.calibrate_graph(model_path, data_path, output, bits=bits, method=method,
                                   method_weights=method_weights, percentile=percentile, batch_size=batch_size,
                                   limit=limit, dataset=dataset, time_first=time_first, check=not no_check,
                                   snap=snap, force=True, as_json=as_json, verbose=verbose)
        return
    model, ranges = model_path, None
    if not whole:
        model = api.load_model(model_path, name=name, check=not no_check, whole=False, for_data=True)
        note_what_was_left_out(model)
        ranges = api.file_ranges(model_path, model)
    if ranges is None or compare is not None or data_path is not None:
        data_path = Path(need(data_path, "calibration data file", "DATA"))
    if output is None and compare is None:
        output = Path(need(output, "output quantized model file (.h5)", "--output"))
    inputs = [model_path, data_path, eval_path]
    confirm = confirm_at_terminal()
    if output is not None:  # refuse before the work, not after it
        api.claim_output(output, force, inputs, confirm)
        force = True
    t0 = time.perf_counter()
    if eval_path is not None:
        with Bar("calibrating and scoring", 1) as bar:
            res = api.compare(model, data_path, eval_path, methods, bits=bits, method_weights=method_weights,
                              percentile=percentile, batch_size=batch_size, limit=limit, dataset=dataset,
                              time_first=time_first, check=not no_check, progress=bar.update)
        best = res.models[res.best]
        warn(res.notes + (best.info.get("notes", []) if whole else []))
        if output is not None:
            api.save(best, output, force, inputs=inputs)
        if as_json:
            emit_json({"methods": res.rows, "best": res.rows[res.best]["method"], "scored_sequences": res.scored,
                       "notes": res.notes, "output": str(output) if output else None})
            return
        from qtool.cli.tables import compare_table

        info = best.info
        label = best.graph.name if whole else model.name
        out.print(compare_table(res.rows, res.best, f"{label}: {info['bits']}, calibrated on "
                                f"{info['samples']} sequences of {info['data_file']}, scored on {res.scored} of "
                                f"{eval_path.name}"))
        if output is not None:
            out.print(f"wrote the best, {res.rows[res.best]['method']} -> {escape(str(output))}")
        return
    if method == "auto":  # auto simulates its candidates with the integer engine
        say_if_compiling()
    with Bar("calibrating", 1) as bar:
        cal = api.observe(model, data_path, bits=bits, methods=[method], method_weights=method_weights,
                          percentile=percentile, batch_size=batch_size, limit=limit, dataset=dataset,
                          time_first=time_first, ranges=ranges, snap=snap, progress=bar.update)
        qm = cal.quant_model(0)
    api.save(qm, output, force, inputs=inputs)
    warn(cal.notes)
    elapsed = time.perf_counter() - t0
    imported = {} if ranges is None else {"imported": cal.ranges_used}
    auto = {} if cal.auto is None else {"auto": cal.auto[1].as_dict()}
    if as_json:
        info = {**qm.info, "bits_config": json.loads(qm.info.get("bits_config") or "{}")}  # stored as text
        emit_json({"output": str(output), **info, "seconds": elapsed, "fingerprint": qm.fingerprint(),
                   "tensors": spec_rows(qm), **imported, **auto, "notes": (ranges.notes if ranges else []) + cal.notes})
        return
    title = (f"{model.name}: {qm.info['bits']}, {qm.info['method']}"
             + (f" over {qm.info['samples']} sequence{'s' * (qm.info['samples'] != 1)}" if qm.info["samples"] else ""))
    if verbose:
        out.print(spec_table(qm, title))
        out.print(lut_table(qm))
    else:
        out.print(calibration_summary(qm, title))
    if ranges is not None:
        out.print(ranges_table(cal.ranges_used, f"ranges from the {ranges.kind} file (every other tensor: "
                               + (f"calibrated on {data_path.name})" if data_path else "none)")))
        for note in ranges.notes:
            out.print(f"note: {escape(note)}", highlight=False)
    for line in auto_lines(auto["auto"], per_layer=verbose) if auto else []:
        out.print(escape(line), highlight=False, soft_wrap=True)
    out.print(f"calibrated in {elapsed:.2f} s -> {escape(str(output))}" + ("" if verbose else "  (--verbose: every tensor)"))


@app.command()
def advise(
    model_path: ModelArg = None,
    data_path: Annotated[Path | None, typer.Argument(metavar="CALIB", show_default=False, help="Calibration sequences: .npy, .npz or .h5, [N, T, C]. A model of several inputs: one .npz or .h5 holding an array per input, named after it.")] = None,
    eval_path: Annotated[Path | None, typer.Option("--eval", metavar="TEST", help="Held-out sequences: the measured SNRs (and the search's) come from them.")] = None,
    target_snr: Annotated[float | None, typer.Option("--target-snr", metavar="DB", help="With --eval: the least flash whose measured output SNR reaches this many dB (with --max-flash too: refused where that flash is above the budget).")] = None,
    max_flash: Annotated[int | None, typer.Option("--max-flash", metavar="BYTES", help="With --eval: the best measured output SNR within this many bytes of flash (as 'qtool export c' counts them).")] = None,
    output: Annotated[Path | None, typer.Option("-o", "--output", metavar="FILE", parser=file_output, help="Write the chosen bits file (TOML) for 'qtool calibrate --bits FILE' (its directory is created if needed).")] = None,
    threshold: Annotated[float | None, typer.Option(metavar="DB", help="The threshold rule's T: int8 where the predicted SNR is above it (default: 18.5, from the experiment in docs/advisor.md).")] = None,
    seed: Annotated[int, typer.Option(metavar="N", help="Seed of the estimator's sampling (same seed, data and --batch-size: same numbers).")] = 0,
    gamma: Annotated[float, typer.Option(metavar="RATE", help="The estimator's sampling rate.")] = 0.01,
    repeats: Annotated[int, typer.Option(metavar="K", help="The estimator's independent samples; the least-variance one is kept.")] = 5,
    dataset: DataOpt = None,
    time_first: TimeFirst = False,
    batch_size: Annotated[int, typer.Option(metavar="N", help="Sequences per chunk (bounds memory).", min=1)] = 64,
    limit: LimitOpt = None,
    verbose: Annotated[bool, typer.Option("--verbose", "-v", help="A GRU alone: also print each tensor's statistics (mu, sigma, M, the zero-probabilities P0) and the P_zero SNR prediction.")] = False,
    name: NameOpt = None,
    no_check: NoCheckOpt = False,
    force: Force = False,
    as_json: JsonOpt = False,
):
    """Predict every tensor's quantization SNR (the precision estimator, docs/advisor.md) and choose int8 or
    int16 per tensor; with --eval, prove the choice by simulation: the least flash reaching
    --target-snr, or the best SNR within --max-flash. -o writes a bits file for
    'qtool calibrate --bits FILE', which rebuilds the very same model."""
    from qtool import api
    from qtool.cli.advise_tables import (
        estimator_table,
        search_line,
        summary_line,
        tensor_table,
        unit_table,
    )

    model_path = Path(need(model_path, "model file", "MODEL"))
    data_path = Path(need(data_path, "calibration data file", "CALIB"))
    note_if_quantized(model_path)
    if name is None and _whole_model(model_path):
        if verbose:  # before the work: there is nothing more to show
            raise QtoolError("--verbose shows a GRU alone's estimator statistics per tensor; a whole model's "
                             "units are predicted per edge and measured, and the table shows all of that")
        model = api.load_model(model_path, check=not no_check, whole=True)
    else:
        model = api.load_model(model_path, name=name, check=not no_check, whole=False, for_data=True)
        note_what_was_left_out(model)
    with Bar("advise", 1) as bar:  # the stage and its count; the API's phases beside the stage
        adv = api.advise(model, data_path, eval_path, target_snr=target_snr, max_flash=max_flash,
                         threshold=threshold, seed=seed, gamma=gamma, repeats=repeats, batch_size=batch_size,
                         limit=limit, dataset=dataset, time_first=time_first, output=output, force=force,
                         confirm=confirm_at_terminal(), progress=bar.stage)
    whole = not hasattr(adv.chosen, "qm")
    warn(adv.extra.get("notes", []))
    if as_json:
        emit_json({**adv.summary(), "bits_file": adv.extra.get("bits_file"), "notes": adv.extra.get("notes", []),
                   ("units" if whole else "tensors"): adv.rows})
        return
    if whole:
        out.print(unit_table(adv, f"{model_path.name}: SNR per unit (dB)"))
    else:
        out.print(tensor_table(adv, f"{adv.chosen.qm.model.name}: SNR per tensor (dB)"))
        if verbose:
            out.print(estimator_table(adv, f"{adv.chosen.qm.model.name}: the estimator's statistics"))
    out.print(as_flags(summary_line(adv)), highlight=False)
    out.print(as_flags(search_line(adv)), highlight=False)
    if output is not None:
        out.print(f"bits file -> {escape(str(output))} (qtool calibrate MODEL CALIB --bits "
                  f"{escape(str(output))} rebuilds this model)", highlight=False)


@app.command()
def simulate(
    qmodel_path: QModelArg = None,
    data_path: Annotated[Path | None, typer.Argument(metavar="DATA", show_default=False, help="Held-out test sequences: .npy, .npz or .h5. A model of several inputs: one .npz or .h5 holding an array per input, named after it.")] = None,
    dataset: DataOpt = None,
    time_first: TimeFirst = False,
    save: Annotated[Path | None, typer.Option(metavar="FILE", parser=file_output, help="Write float/y, quant/y and quant/y_int to this .h5 file (its directory is created if needed).")] = None,
    no_per_tensor: Annotated[bool, typer.Option("--no-per-tensor", help="A GRU alone: measure the output only, not every tensor (faster; a whole model always measures every edge).")] = False,
    per_tensor: Annotated[bool, typer.Option("--per-tensor", hidden=True, help="Measure every tensor (the default).")] = False,
    tensors: Annotated[str, typer.Option(metavar="summary|all", help="A GRU alone: which tensors to print, a summary (each layer's h and the worst few) or all of them; --json always has all. A whole model shows every edge.")] = "summary",
    batch_size: Annotated[int, typer.Option(metavar="N", help="Sequences per chunk (bounds memory).", min=1)] = 256,
    limit: LimitOpt = None,
    backend: Annotated[str, typer.Option(metavar="auto|cpu|cuda", help="auto (CUDA when a GPU is usable, else CPU), cpu or cuda.")] = "auto",
    mode: Annotated[str, typer.Option(metavar="MODE", help="integer (the default): the integer GRU; fakequant: the float GRU with every tensor rounded onto its grid (simulated quantization); both: the two side by side per tensor, with the share of integers they agree on.")] = "integer",
    labels: Annotated[Path | None, typer.Option(metavar="FILE", help="A whole model's classifier: the class of each sequence (.npy of integers [N]; a tagger's, whose output is a softmax per frame: of each frame, [N, T]), for the float and integer accuracy.")] = None,
    force: Force = False,
    as_json: JsonOpt = False,
):
    """Run the integer model beside the float model on the same data and report how far apart they are.

    A quantized whole model reports every layer's output and the model's: SNR, cosine, saturation,
    and for a classifier the top-1 agreement with float (with --labels, both accuracies)."""
    from qtool import api
    from qtool.cli.tables import both_table, distance_table

    qmodel_path = Path(need(qmodel_path, "quantized model file", "QMODEL"))
    data_path = Path(need(data_path, "test data file", "DATA"))
    whole = api.model_file_format(qmodel_path) == "qtool-qgraph"
    if per_tensor and no_per_tensor:
        raise QtoolError("--per-tensor and --no-per-tensor: give one (every tensor is the default)")
    per_tensor = not no_per_tensor
    if whole and (tensors != "summary" or not per_tensor):
        raise QtoolError("a whole model always measures and shows every edge (no --tensors, --no-per-tensor)")
    if labels is not None and not whole and qmodel_path.exists():
        raise QtoolError("--labels go with a whole model's classifier output (a GRU alone has no classes)")
    if tensors not in ("summary", "all"):
        raise QtoolError(f"--tensors must be summary or all, got '{tensors}'")
    if save is not None:  # before the work, and never onto an input
        api.claim_output(save, force, [qmodel_path, data_path, labels], confirm_at_terminal(), kind="results")
    if backend != "cuda" and mode != "fakequant":
        say_if_compiling()
    t0 = time.perf_counter()
    qg = api.load(qmodel_path) if whole else None  # its rows below; `save` names the file it comes from
    with Bar("simulating", 1) as bar:
        res = api.simulate(qmodel_path if save or not whole else qg, data_path, backend=backend, batch_size=batch_size, limit=limit, save=save,
                           force=True, dataset=dataset, time_first=time_first, mode=mode, progress=bar.update,
                           **({"labels": labels} if whole else {"per_tensor": per_tensor}))
    if whole:
        graph_cmds.show_graph_simulation(res, qg, data_path, mode, save, as_json, t0)
        return
    warn(res.notes)
    if as_json:
        emit_json(res.to_dict())
        return
    where = f"on {res.samples} sequences of {data_path.name}"
    if mode == "both":
        out.print(both_table(res.to_dict(), f"integer and fake-quant vs float {where}"))
    else:
        out.print(distance_table(res.to_dict(), f"{mode} vs float {where}", everything=tensors == "all"))
    if api.mode_explanation(mode):
        out.print(api.mode_explanation(mode), highlight=False)
    snr = res.per_step_snr_db

    def db(v):
        return "exact" if v is None else f"{v:.2f} dB"
    out.print(f"output SNR by time step: first {db(snr[0])}, middle {db(snr[len(snr) // 2])}, last {db(snr[-1])}")
    out.print(f"backend: {res.backend} ({res.backend_reason}); {res.seconds:.2f} s")
    if save:
        out.print(f"saved outputs -> {escape(str(save))}")


@app.command()
def report(
    qmodel_path: QModelArg = None,
    data_path: Annotated[Path | None, typer.Argument(metavar="DATA", show_default=False, help="Held-out test sequences: .npy, .npz or .h5. A model of several inputs: one .npz or .h5 holding an array per input, named after it.")] = None,
    output: Annotated[Path | None, typer.Option("-o", "--output", metavar="FILE", parser=file_output, help="The HTML page to write (one file; opens in a browser without a server; its directory is created if needed).")] = None,
    sequences: Annotated[int | None, typer.Option(metavar="N", show_default=False, help="A GRU alone: draw the float and integer output of the first N sequences (default 3).", min=1)] = None,
    units: Annotated[int | None, typer.Option(metavar="N", show_default=False, help="A GRU alone: output units drawn per sequence, spread over the output (default 4).", min=1)] = None,
    dataset: DataOpt = None,
    time_first: TimeFirst = False,
    batch_size: Annotated[int, typer.Option(metavar="N", help="Sequences per chunk (bounds memory).", min=1)] = 256,
    limit: LimitOpt = None,
    backend: Annotated[str, typer.Option(metavar="auto|cpu|cuda", help="auto (CUDA when a GPU is usable, else CPU), cpu or cuda.")] = "auto",
    force: Force = False,
    as_json: JsonOpt = False,
):
    """Draw what the quantization did, as one HTML page: every tensor's float histogram against its
    grid, the output error by time step, float vs integer output traces (needs: pip install "qtool\\[report]").

    A quantized whole model: the graph as a picture with each edge's error, every edge's grid and
    distances, the passes and the model's output, then each GRU's tensors measured on its own
    input (their histograms need plotly; without it, their table)."""
    from qtool import api

    qmodel_path = Path(need(qmodel_path, "quantized model file", "QMODEL"))
    data_path = Path(need(data_path, "test data file", "DATA"))
    output = Path(need(output, "output HTML file", "--output"))
    with Bar("simulating", 1) as bar:
        res = api.html_report(qmodel_path, data_path, output, limit=limit, sequences=sequences, units=units,
                              backend=backend, batch_size=batch_size, force=force, confirm=confirm_at_terminal(),
                              dataset=dataset, time_first=time_first, progress=bar.update)
    warn(res.notes)
    if as_json:
        emit_json({"output": str(res.path), "bytes": res.size, "samples": res.samples, "backend": res.backend,
                   "metrics": res.output, "per_step_snr_db": res.per_step_snr_db, "notes": res.notes})
        return
    m = res.output
    snr = "exact" if m["exact"] else f"{m['snr_db']:.2f} dB"
    size = f"{res.size / 2**20:.1f} MiB" if res.size >= 2**20 else f"{res.size / 2**10:.1f} KiB"
    out.print(f"output SNR {snr}, cosine {m['cosine']:.6f} on {res.samples} sequences; "
              f"report ({size}) -> {escape(str(res.path))}")


@app.command()
def inspect(
    path: Annotated[Path | None, typer.Argument(metavar="FILE", show_default=False, help="A quantized or float qtool model file, or any importable GRU (.pt/.pth, .safetensors, .keras/.h5, .onnx, .tflite, haste .npz).")] = None,
    name: NameOpt = None,
    no_check: NoCheckOpt = False,
    graph: Annotated[bool, typer.Option("--graph", help="Show the whole model of a Keras or ONNX file: every layer, its op, what it reads, its output's shape.")] = False,
    as_json: JsonOpt = False,
):
    """Show what a model or quantized model file holds: shapes, bits, scales, ranges, tables.

    A whole model: every layer (--graph for a Keras or ONNX file), and once quantized every
    edge's grid, each GRU's tensors and the passes."""
    from qtool import api
    from qtool.cli.tables import layer_rows, lut_table, provenance_table, shapes_table, spec_rows, spec_table

    path = Path(need(path, "model file", "FILE"))
    kind = api.model_file_format(path)
    if kind in ("qtool-qgraph", "qtool-graph") and name is not None:
        raise QtoolError(f"--name picks one GRU of a framework file; {path.name} is qtool's whole-model file")
    if graph and name is not None:
        raise QtoolError("--name picks one GRU of a file; --graph shows the whole model")
    if graph and kind == "qtool-qgru":
        raise QtoolError(f"--graph shows a float model's layers; {path.name} is a quantized GRU alone, whose "
                         "tensors inspect shows without it")
    found = api.inspect(path, name=name, check=not no_check, whole=True if graph else None)
    if isinstance(found.qm, api.QGraph):
        graph_cmds.show_qgraph(found.qm, as_json)
        return
    if isinstance(found.model, api.Graph):
        graph_cmds.show_graph_file(found.model, path, as_json)
        return
    model, qm = found.model, found.qm
    if as_json:
        emit_json({**gru_summary(model), "quantized": found.quantized, "shapes": layer_rows(model),
                   **({"fingerprint": qm.fingerprint(), "quant": qm.info, "tensors": spec_rows(qm)} if qm else {})})
        return
    out.print(shapes_table(model, f"{model.name} ({model.source})"))
    if api.import_note(model):
        out.print(f"note: {escape(api.import_note(model))}", highlight=False)
    if qm is not None:
        out.print(provenance_table(qm))
        out.print(spec_table(qm, "quantization"))
        out.print(lut_table(qm))


export_app = typer.Typer(help="Write a quantized model (a GRU alone or a whole model) for a target: C sources, or parameter tables (JSON, HDF5) for other toolchains.",
                         invoke_without_command=True)
app.add_typer(export_app, name="export")


@export_app.callback()
def export_root(ctx: typer.Context):
    if ctx.invoked_subcommand is None:  # `qtool export` alone: its help, as `qtool` alone gives its own
        out.print(ctx.get_help())
        raise typer.Exit()


@export_app.command("c")
def export_c_cmd(
    qmodel_path: QModelArg = None,
    output: Annotated[Path | None, typer.Option("-o", "--output", metavar="DIR", help="Directory to write the C sources into (created if needed; other files in it are left alone).")] = None,
    name: Annotated[str | None, typer.Option(metavar="NAME", help="Prefix of every C identifier and file (default: the model's name).")] = None,
    test_vectors: Annotated[bool, typer.Option("--test-vectors", help="Also write test vectors and a main() that checks them.")] = False,
    data_path: Annotated[Path | None, typer.Option("--data", metavar="DATA", help="Take the test vectors' inputs from this data file (else random in the calibrated input range).")] = None,
    vectors: Annotated[int | None, typer.Option(metavar="N", help="With --test-vectors: the number of test sequences (default 4).", min=1)] = None,
    compensation: Annotated[str, typer.Option(metavar="table|offset",
        help="Zero-point compensation: 'table' stores the precomputed W_sum_mul_x_zp / R_sum_mul_h_zp "
             "(raw int8 inputs, for targets with int8 dot-product instructions); 'offset' subtracts "
             "the zero point from each GEMM input as it is read (CMSIS-NN's input offset): no tables, "
             "less flash. Both give the same integers.")] = "table",
    allow_float: Annotated[bool, typer.Option("--allow-float", help="Write the export even where its integer core (everything but quantize_input and dequantize_output) would contain a floating-point operation, in the program after the passes or in the C written; by default (--fully-integral) such an export is refused.")] = False,
    fully_integral: Annotated[bool, typer.Option("--fully-integral", hidden=True, help="Refuse a core with a floating-point operation (the default).")] = False,
    dataset: DataOpt = None,
    time_first: TimeFirst = False,
    force: Force = False,
    as_json: JsonOpt = False,
):
    """Write C99 headers with the integer parameters and a portable integer-only GRU, or a whole
    model's every layer (a quantized whole-model file: run whole and, where it is causal, frame
    by frame; each output after the first with its own NAME_outputK; docs/embedded.md)."""
    from qtool import api

    qmodel_path = Path(need(qmodel_path, "quantized model file", "QMODEL"))
    output = Path(need(output, "output directory", "--output"))
    if fully_integral and allow_float:
        raise QtoolError("--fully-integral and --allow-float: give one (--fully-integral is the default)")
    if not test_vectors and (vectors is not None or data_path is not None):
        raise QtoolError(f"{'--vectors' if vectors is not None else '--data'} goes with --test-vectors")
    if data_path is None and (dataset is not None or time_first):
        raise QtoolError(f"{'--dataset' if dataset is not None else '--time-first'} goes with --data (the file of "
                         "the test vectors' inputs)")
    qm = api.load(qmodel_path)
    given = data_path if data_path is not None else test_vectors or None
    res = api.export_c(qm, output, name=name, compensation=compensation, test_vectors=given, vectors=vectors,
                       dataset=dataset, time_first=time_first, force=force, confirm=confirm_at_terminal(),
                       fully_integral=not allow_float)
    warn(res.notes)
    if hasattr(res.footprint, "layers"):  # a whole model's, per layer
        graph_cmds.show_graph_export(res, qm, output, name, as_json)
        return
    fp = res.footprint
    base = fp.int8_weight_bytes + fp.table_bytes
    summary = {"directory": str(output), "name": res.name, "files": res.files, "replaced": res.replaced,
               "edited": res.edited, "removed": res.removed,
               "fingerprint": res.fingerprint, "compensation": compensation, "flash_bytes": fp.flash_bytes,
               "weight_bytes": fp.weight_bytes, "bias_bytes": fp.bias_bytes, "table_bytes": fp.table_bytes,
               "other_bytes": fp.other_bytes, "ram_bytes": fp.ram_bytes, "macs_per_step": fp.macs_per_step,
               "flash_vs_int8_weights_and_tables": fp.flash_bytes / base, **fp.passes, "notes": res.notes}
    if as_json:
        emit_json(summary)
        wrote(res, output, as_json, name)
        return
    from qtool.cli.tables import footprint_table, passes_table

    out.print(passes_table(fp.passes, f"{res.name}: compiler passes"))
    out.print(footprint_table(summary, f"{res.name}: footprint"))
    out.print(f"{fp.macs_per_step:,} multiply-accumulates per time step; flash is "
              f"{100 * (summary['flash_vs_int8_weights_and_tables'] - 1):.1f}% above the bare int8 weights "
              f"plus tables ({base:,} bytes)")
    if fp.offset_saves:
        lean = fp.flash_bytes - fp.offset_saves
        out.print(f"--compensation offset would drop the compensation tables: flash {lean:,} bytes "
                  f"({100 * (lean / base - 1):.1f}% above), same integers")
    wrote(res, output, name=name)


def _export_tables(qmodel_path: Path | None, output: Path | None, force: bool, kind: str) -> None:
    from qtool import api

    qmodel_path = Path(need(qmodel_path, "quantized model file", "QMODEL"))
    output = Path(need(output, f"output {kind} file", "--output"))
    output = api.export_tables(qmodel_path, output, "json" if kind == "JSON" else "h5", force=force,
                               confirm=confirm_at_terminal())
    out.print(f"parameter tables -> {escape(str(output))}")


@export_app.command("json")
def export_json_cmd(
    qmodel_path: QModelArg = None,
    output: Annotated[Path | None, typer.Option("-o", "--output", metavar="FILE", parser=file_output, help="The JSON file to write (its directory is created if needed).")] = None,
    force: Force = False,
):
    """Write every tensor's bits, exp2_inv, zero point and the derived shifts as JSON.

    A whole model: every core edge's grid and every integer layer's integers, in order, a GRU's
    cells as a GRU alone's (docs/file-formats.md)."""
    _export_tables(qmodel_path, output, force, "JSON")


@export_app.command("h5")
def export_h5_cmd(
    qmodel_path: QModelArg = None,
    output: Annotated[Path | None, typer.Option("-o", "--output", metavar="FILE", parser=file_output, help="The HDF5 file to write (its directory is created if needed).")] = None,
    force: Force = False,
):
    """Write every tensor's bits, exp2_inv, zero point and the derived shifts as HDF5.

    A whole model: every core edge's grid and every integer layer's integers, in order, a GRU's
    cells as a GRU alone's (docs/file-formats.md)."""
    _export_tables(qmodel_path, output, force, "HDF5")


@app.command()
def verify(
    qmodel_path: Annotated[Path | None, typer.Argument(metavar="QMODEL", show_default=False, help="The quantized model that was exported.")] = None,
    export_dir: Annotated[Path | None, typer.Argument(metavar="DIR", show_default=False, help="The directory 'qtool export c' wrote.")] = None,
    data_path: Annotated[Path | None, typer.Argument(metavar="DATA", show_default=False, help="Sequences to run: .npy, .npz or .h5 (a model of several inputs: one .npz or .h5 of an array per input, named after it).")] = None,
    name: Annotated[str | None, typer.Option(metavar="NAME", help="The --name given to 'qtool export c' (default: the only export in DIR, else the one made from QMODEL).")] = None,
    dataset: DataOpt = None,
    time_first: TimeFirst = False,
    limit: LimitOpt = None,
    target: Annotated[str, typer.Option(metavar="TARGET",
        help="Where to run: 'host' ($CC), or 'cortex-m4' / 'cortex-m33' / 'cortex-m55': "
             "arm-none-eabi-gcc with picolibc, run on an emulated MPS2/MPS3 board under "
             "qemu-system-arm.")] = "host",
    as_json: JsonOpt = False,
):
    """Compile the exported C for the host ($CC, default cc) or an emulated Cortex-M, run it, and
    check every output and final-state integer against the simulator's."""
    from qtool import api

    qmodel_path = Path(need(qmodel_path, "quantized model file", "QMODEL"))
    export_dir = Path(need(export_dir, "exported C directory", "DIR"))
    data_path = Path(need(data_path, "data file", "DATA"))
    with Bar("verify", 1):  # its phases: compiling, running (whole and frame by frame), comparing
        res = api.verify(api.load(qmodel_path), export_dir, data_path, name=name, limit=limit, dataset=dataset,
                         time_first=time_first, target=target)
    if as_json:
        emit_json(res.to_dict())
    else:
        from qtool.cli.tables import verify_lines

        for line in verify_lines(res):
            out.print(line)
        out.print("[green]PASS[/]: the C code computes exactly what the simulator computes" if not res.mismatches
                  else "[red]FAIL[/]: the C code differs from the simulator")
    if res.mismatches:
        raise typer.Exit(1)


@app.command()
def precompile(
    preset: Annotated[list[str] | None, typer.Option("--preset", metavar="PRESET", help="Compile for this preset only (repeatable); default: int8, w8a16 and int16.")] = None,
):
    """Compile the CPU kernels now, into numba's cache, so that no later command waits for them.

    `pip install .` does this already; run it after an editable install or a numba upgrade. The
    cache holds code for this machine's CPU: elsewhere the kernels compile again on first use."""
    from qtool import api

    presets = tuple(preset or api.PRESETS)
    for p in presets:
        if p not in api.PRESETS:
            raise QtoolError(f"unknown preset '{p}' (use one of {', '.join(api.PRESETS)})")
    with err.status("compiling the CPU kernels (numba)"):
        seconds = api.precompile(presets, say=lambda line: err.print(f"  {line}"))
    out.print(f"kernels ready ({seconds:.1f} s)")


@app.command()
def version():
    """Print qtool's version."""
    out.print(f"qtool {__version__}")


def _reflowed_help() -> None:
    """typer's rich help keeps the line breaks inside a docstring's later paragraphs; join each
    paragraph's lines so that every paragraph wraps to the terminal's width."""
    import inspect as pyinspect

    for group in (app, export_app):
        for cmd in group.registered_commands:
            doc = pyinspect.getdoc(cmd.callback)
            if doc and cmd.help is None:
                cmd.help = "\n\n".join(" ".join(p.split()) for p in doc.split("\n\n"))


_reflowed_help()


def _one_line(text) -> str:
    """A message as one line, with rich markup escaped (brackets are common in shapes)."""
    return escape(" ".join(str(text).split()))


def _json_error(text: str, code: int, argv: list[str] | None) -> None:
    """With --json, a failed command's error as a JSON object on stdout too (`error`,
    `exit_code`), so that a script that reads stdout gets one object either way."""
    if "--json" in (sys.argv[1:] if argv is None else argv):
        out.print(json.dumps({"error": text, "exit_code": code}), markup=False, highlight=False, soft_wrap=True)


def _internal_error(e: BaseException, argv: list[str] | None) -> None:
    """A bug, still one line (QTOOL_DEBUG=1 shows its traceback); exits 1."""
    err.print(f"[red]internal error:[/] {type(e).__name__}: {_one_line(e)} (please report it; set "
              "QTOOL_DEBUG=1 for a traceback)", highlight=False, soft_wrap=True)
    _json_error(f"internal error: {type(e).__name__}: {_one_line(e)}", 1, argv)
    sys.exit(1)


def main(argv: list[str] | None = None) -> None:
    """Entry point: every user-facing error is one line on stderr and a non-zero exit; Ctrl-C,
    SIGTERM and SIGHUP remove temporary files and exit 128 + the signal number."""
    stop_on_signals()
    say_phases()
    NOTES.clear()  # in-process callers (tests) run several commands
    if not os.environ.get("QTOOL_DEBUG"):  # libraries' warnings would break the one-line rule
        warnings.simplefilter("ignore")
    try:
        try:
            with command_scope(out, err):  # under mpiexec: rank 0 prints, the ranks agree on errors
                code = app(args=argv, prog_name="qtool", standalone_mode=False)
                for note in NOTES:
                    err.print(f"note: {escape(as_flags(note))}", highlight=False)  # wrapped at word boundaries
                NOTES.clear()
        finally:
            command_over()
    except typer.Exit as e:
        sys.exit(e.exit_code)
    except typer.Abort as e:
        if isinstance(e.__cause__, EOFError):  # click takes any EOFError for Ctrl-D; a prompt's has no cause
            if os.environ.get("QTOOL_DEBUG"):
                raise e.__cause__ from None
            _internal_error(e.__cause__, argv)
        err.print("interrupted")
        sys.exit(130)
    except typer.TyperException as e:  # usage errors: typer's own message, on one line
        ctx = getattr(e, "ctx", None)
        hint = f" (see '{ctx.command_path} --help')" if ctx is not None else ""
        err.print(f"[red]error:[/] {_one_line(e.format_message())}{hint}", highlight=False, soft_wrap=True)
        _json_error(f"{_one_line(e.format_message())}{hint}", e.exit_code, argv)
        sys.exit(e.exit_code)
    except QtoolError as e:
        err.print(f"[red]error:[/] {_one_line(as_flags(e))}", highlight=False, soft_wrap=True)
        _json_error(_one_line(as_flags(e)), 2, argv)
        sys.exit(2)
    except (Interrupted, KeyboardInterrupt, RankStopped) as e:
        signum = getattr(e, "signum", signal.SIGINT)
        where = f" on rank {e.rank}" if isinstance(e, RankStopped) else ""
        err.print(f"interrupted ({signal.Signals(signum).name}{where}); no output was left half written")
        stop_every_rank(128 + signum)  # under mpiexec a rank blocked in a collective would wait on
    except Exception as e:  # anything else is a bug, but still one line unless debugging
        if os.environ.get("QTOOL_DEBUG"):
            raise
        _internal_error(e, argv)
    sys.exit(code if isinstance(code, int) else 0)  # typer returns the code of a typer.Exit


if __name__ == "__main__":
    main()
