"""The qtool command line: import, calibrate, simulate, inspect."""

from __future__ import annotations

import json
import os
import sys
import time
from contextlib import nullcontext
from pathlib import Path
from typing import Annotated

import typer
from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeRemainingColumn

from qtool import __version__
from qtool.errors import QtoolError

app = typer.Typer(
    help="Calibrate, simulate bit-exactly and export integer-only GRUs for microcontrollers and DSPs.",
    no_args_is_help=True,
    pretty_exceptions_enable=False,
    add_completion=False,
)
out = Console()
err = Console(stderr=True)


def interactive() -> bool:
    return sys.stdin is not None and sys.stdin.isatty()


def need(value, what: str, option: str):
    """A required value: asked for at a terminal, an error in scripts."""
    if value is not None:
        return value
    if interactive():
        return typer.prompt(what)
    raise QtoolError(f"missing {option} ({what})")


def writable(path: Path, force: bool) -> Path:
    """Refuse to clobber an existing file unless --force or the user confirms at a terminal."""
    if path.exists() and not force:
        if not interactive():
            raise QtoolError(f"{path} exists; use --force to overwrite it")
        if not typer.confirm(f"{path} exists. Overwrite?", default=False):
            raise QtoolError("not overwritten")
    return path


def progress_bar() -> Progress:
    return Progress(TextColumn("[bold]{task.description}"), BarColumn(), MofNCompleteColumn(),
                    TextColumn("{task.fields[rate]}"), TimeRemainingColumn(), console=err,
                    transient=True, disable=not err.is_terminal)


def load_any_model(path: Path, fmt: str | None = None, name: str | None = None):
    """A qtool model file, or any importable model (imported on the fly)."""
    from qtool.importers import import_model
    from qtool.model import load_model

    if path.suffix.lower() in (".h5", ".hdf5") and fmt is None:
        import h5py

        try:
            with h5py.File(path, "r") as f:
                if str(f.attrs.get("format", "")).startswith("qtool-"):
                    return load_model(path)
        except OSError:
            pass
    return import_model(path, fmt, name)


DataOpt = Annotated[str | None, typer.Option("--dataset", help="Array/dataset name inside .npz/.h5 data.")]
TimeFirst = Annotated[bool, typer.Option("--time-first", help="Data is [T, N, C] instead of [N, T, C].")]
Force = Annotated[bool, typer.Option("--force", "-f", help="Overwrite an existing output file.")]
JsonOpt = Annotated[bool, typer.Option("--json", help="Print results as JSON for scripts.")]


@app.command("import")
def import_cmd(
    src: Annotated[Path | None, typer.Argument(help="A trained GRU: .pt/.pth, .safetensors, .keras/.h5, .onnx, haste .npz.")] = None,
    output: Annotated[Path | None, typer.Option("-o", "--output", help="The qtool model file to write (.h5).")] = None,
    fmt: Annotated[str | None, typer.Option("--format", help="torch, safetensors, keras, onnx or haste (default: from the file name).")] = None,
    name: Annotated[str | None, typer.Option("--name", help="Which GRU, when the file holds several.")] = None,
    force: Force = False,
):
    """Read a float GRU from PyTorch, Keras, ONNX or haste weights into qtool's model file."""
    from qtool.fileio import atomic_path
    from qtool.importers import import_model
    from qtool.model import open_h5, write_model

    src = Path(need(src, "model file to import", "SRC"))
    output = writable(Path(need(output, "output model file (.h5)", "--output")), force)
    model = import_model(src, fmt, name)
    with atomic_path(output) as tmp, open_h5(tmp, "w") as f:
        write_model(f, model)
    dirs = "bidirectional" if model.bidirectional else "unidirectional"
    out.print(f"imported [bold]{model.name}[/]: {model.num_layers} layer(s), {dirs}, "
              f"input {model.input_size}, hidden {model.hidden_size} -> {output}")


@app.command()
def calibrate(
    model_path: Annotated[Path | None, typer.Argument(metavar="MODEL", help="A qtool model file or any importable GRU.")] = None,
    data_path: Annotated[Path | None, typer.Argument(metavar="DATA", help="Calibration sequences: .npy, .npz or .h5, [N, T, C].")] = None,
    output: Annotated[Path | None, typer.Option("-o", "--output", help="The quantized model file to write (.h5). With --compare: optional, gets the method with the best output SNR.")] = None,
    method: Annotated[str, typer.Option(help="Range method for activations: auto (per tensor, the method with the least error on a held-out fifth of DATA, checked at the output; docs/calibration.md), minmax (running union), ema (the seed's per-step EMA on x and h), percentile, mse (least squared error) or kl (least KL divergence).")] = "auto",
    method_weights: Annotated[str, typer.Option(help="Range method for the weights W and R, per output channel.")] = "minmax",
    percentile: Annotated[float, typer.Option(help="With percentile: the share of values kept, two-sided.")] = 99.99,
    compare: Annotated[str | None, typer.Option(help="Calibrate with each of these methods (comma separated, e.g. minmax,percentile,mse,kl) in one pass and compare them on --eval.")] = None,
    eval_path: Annotated[Path | None, typer.Option("--eval", help="With --compare: held-out sequences to score each method on.")] = None,
    bits: Annotated[str, typer.Option(help="Preset int8, w8a16 or int16, or a JSON/TOML file with per-tensor bits.")] = "int8",
    dataset: DataOpt = None,
    time_first: TimeFirst = False,
    batch_size: Annotated[int, typer.Option(help="Sequences per chunk (bounds memory).")] = 64,
    limit: Annotated[int | None, typer.Option(help="Use at most this many sequences.")] = None,
    force: Force = False,
    as_json: JsonOpt = False,
):
    """Observe every tensor of the GRU on calibration data and write the quantized model."""
    from calibrators import METHODS
    from qtool.calibration import MethodPlan, build_quant_model, collect_many
    from qtool.fileio import atomic_path, open_sequences
    from qtool.model import open_h5
    from qtool.qmodel import write_qmodel
    from qtool.report import lut_table, spec_rows, spec_table
    from qtool.tensors import load_bits

    model_path = Path(need(model_path, "model file", "MODEL"))
    data_path = Path(need(data_path, "calibration data file", "DATA"))
    methods = [m.strip() for m in compare.split(",") if m.strip()] if compare is not None else [method]
    if compare is not None and eval_path is None:
        raise QtoolError("--compare needs --eval TEST: held-out sequences to score each method on")
    if compare is None and eval_path is not None:
        raise QtoolError("--eval goes with --compare")
    if output is None and compare is None:
        output = need(output, "output quantized model file (.h5)", "--output")
    if output is not None:
        output = writable(Path(output), force)
    if "auto" in methods and compare is not None:
        raise QtoolError("--compare takes single methods (auto chooses among them itself)")
    for m in [*(m for m in methods if m != "auto"), method_weights]:
        if m not in METHODS:
            raise QtoolError(f"unknown method '{m}' (use one of {', '.join(METHODS)})")
    if not methods or len(set(methods)) != len(methods):
        raise QtoolError("--compare needs distinct methods, e.g. minmax,percentile,mse,kl")
    if batch_size < 1:
        raise QtoolError("--batch-size must be at least 1")
    if not 50.0 < percentile <= 100.0:
        raise QtoolError("--percentile must be in (50, 100]")
    label, config = load_bits(bits)
    model = load_any_model(model_path)
    data = open_sequences(data_path, dataset, time_first)
    data.check_features(model.input_size)
    test = None
    if eval_path is not None:
        test = open_sequences(eval_path, dataset, time_first)
        test.check_features(model.input_size)
        if eval_path.resolve() == data_path.resolve():
            err.print("warning: --eval is the calibration data; the scores are not on held-out data")
    n = data.num_sequences if limit is None else min(limit, data.num_sequences)
    info = {"bits": label, "data_file": data_path.name, "samples": n, "time_steps": data.shape[1]}
    plans = [MethodPlan.from_config(config, m, method_weights, percentile) for m in methods if m != "auto"]
    t0 = time.perf_counter()
    with progress_bar() as bar:
        task = bar.add_task("calibrating", total=n, rate="")

        def tick(done: int) -> None:
            bar.update(task, completed=done, rate=f"{done / (time.perf_counter() - t0):.0f} seq/s")
        if not plans:
            from qtool.auto_method import calibrate_auto

            qm, choice = calibrate_auto(model, data, n, config, method_weights, percentile, batch_size, tick, info)
            qms = [qm]
        else:
            obs_sets = collect_many(model, data, plans, batch_size, n, progress=tick)
            qms = [build_quant_model(model, obs, config, {"method": plan.label(), **info}, plan)
                   for plan, obs in zip(plans, obs_sets)]
    if test is not None:
        _compare(qms, test, batch_size, output, as_json, f"{model.name}: {label}, calibrated on {n} "
                 f"sequences of {data_path.name}, scored on {test.num_sequences} of {eval_path.name}")
        return
    qm = qms[0]
    with atomic_path(output) as tmp, open_h5(tmp, "w") as f:
        write_qmodel(f, qm)
    elapsed = time.perf_counter() - t0
    auto = choice.as_dict() if not plans else None
    if as_json:
        print(json.dumps({"output": str(output), **qm.info, "seconds": elapsed,
                          "tensors": spec_rows(qm), "auto": auto}))
        return
    out.print(spec_table(qm, f"{model.name}: {label}, {qm.info['method']} over {n} sequences"))
    out.print(lut_table(qm))
    if auto is not None:
        from qtool.report import auto_lines

        for line in auto_lines(auto):
            out.print(line)
    out.print(f"calibrated in {elapsed:.2f} s -> {output}")


def _compare(qms: list, test, batch_size: int, output: Path | None, as_json: bool, title: str) -> None:
    """Score each calibration on held-out data; write the best (by output SNR) if asked."""
    from qtool.fileio import atomic_path
    from qtool.model import open_h5
    from qtool.qmodel import write_qmodel
    from qtool.report import compare_table
    from qtool.simulation import simulate as run_simulation

    rows = []
    with progress_bar() as bar:
        task = bar.add_task("scoring", total=len(qms) * test.num_sequences, rate="")
        for k, qm in enumerate(qms):
            def on_chunk(start, *outs, k=k):
                bar.update(task, completed=k * test.num_sequences + start + len(outs[0]))
            sim = run_simulation(qm, test, max(batch_size, 256), False, None, on_chunk)
            rows.append({"method": qm.info["method"], **sim.output.as_dict()})
    best = max(range(len(rows)), key=lambda i: rows[i]["snr_db"])
    if output is not None:
        with atomic_path(output) as tmp, open_h5(tmp, "w") as f:
            write_qmodel(f, qms[best])
    if as_json:
        print(json.dumps({"methods": rows, "best": rows[best]["method"],
                          "output": str(output) if output else None}))
        return
    out.print(compare_table(rows, best, title))
    if output is not None:
        out.print(f"wrote the best, {rows[best]['method']} -> {output}")


@app.command()
def advise(
    model_path: Annotated[Path | None, typer.Argument(metavar="MODEL", help="A qtool model file or any importable GRU.")] = None,
    data_path: Annotated[Path | None, typer.Argument(metavar="CALIB", help="Calibration sequences: .npy, .npz or .h5, [N, T, C].")] = None,
    eval_path: Annotated[Path | None, typer.Option("--eval", help="Held-out sequences: the measured output SNR (and the search's) comes from them.")] = None,
    target_snr: Annotated[float | None, typer.Option("--target-snr", help="Find the least flash whose measured output SNR on --eval reaches this many dB.")] = None,
    max_flash: Annotated[int | None, typer.Option("--max-flash", help="Find the best measured output SNR on --eval within this many bytes of flash.")] = None,
    output: Annotated[Path | None, typer.Option("-o", "--output", help="Write the chosen bits file (TOML) for 'qtool calibrate --bits'.")] = None,
    threshold: Annotated[float | None, typer.Option(help="The seed's threshold T in dB: int8 where the predicted SNR is above it (default: the calibrated value, docs/advisor.md).")] = None,
    seed: Annotated[int, typer.Option(help="Seed of the estimator's sampling (same seed, data and --batch-size: same numbers).")] = 0,
    gamma: Annotated[float, typer.Option(help="The estimator's sampling rate.")] = 0.01,
    repeats: Annotated[int, typer.Option(help="The estimator's independent samples K; the least-variance one is kept.")] = 5,
    dataset: DataOpt = None,
    time_first: TimeFirst = False,
    batch_size: Annotated[int, typer.Option(help="Sequences per chunk (bounds memory).")] = 64,
    limit: Annotated[int | None, typer.Option(help="Use at most this many calibration sequences.")] = None,
    force: Force = False,
    as_json: JsonOpt = False,
):
    """Predict every tensor's quantization SNR (the seed's precision estimator), choose int8 or
    int16 per tensor, and with --eval prove the choice: the least flash reaching --target-snr,
    or the best SNR within --max-flash. Writes a bits file for 'qtool calibrate --bits'."""
    from qtool.advisor.advise import THRESHOLD_DB
    from qtool.advisor.advise import advise as run_advise
    from qtool.advisor.report import search_line, summary_line, tensor_table
    from qtool.fileio import atomic_path, open_sequences

    model_path = Path(need(model_path, "model file", "MODEL"))
    data_path = Path(need(data_path, "calibration data file", "CALIB"))
    if target_snr is not None and eval_path is None:
        raise QtoolError("--target-snr needs --eval TEST: held-out sequences to measure the output SNR on")
    if max_flash is not None and eval_path is None:
        raise QtoolError("--max-flash needs --eval TEST: held-out sequences to measure the output SNR on")
    if output is not None:
        output = writable(Path(output), force)
    if batch_size < 1:
        raise QtoolError("--batch-size must be at least 1")
    model = load_any_model(model_path)
    data = open_sequences(data_path, dataset, time_first)
    data.check_features(model.input_size)
    test = open_sequences(eval_path, dataset, time_first) if eval_path is not None else None
    with progress_bar() as bar:
        tasks: dict = {}

        def tick(stage: str, done: int, total: int | None) -> None:
            if stage not in tasks:
                tasks[stage] = bar.add_task(stage, total=total, rate="")
            bar.update(tasks[stage], completed=done, rate="")
        adv = run_advise(model, data, test, target_snr, max_flash,
                         THRESHOLD_DB if threshold is None else threshold, seed, gamma, repeats,
                         batch_size, limit, tick, {"data_file": data_path.name})
    if output is not None:
        with atomic_path(output) as tmp:
            tmp.write_text(adv.bits_toml)
    if as_json:
        print(json.dumps({**adv.summary(), "bits_file": str(output) if output else None,
                          "tensors": adv.rows}))
        return
    out.print(tensor_table(adv, f"{model.name}: predicted and measured SNR per tensor (dB)"))
    out.print(summary_line(adv))
    out.print(search_line(adv))
    if output is not None:
        out.print(f"bits file -> {output} (qtool calibrate MODEL CALIB --bits {output} rebuilds this model)")


@app.command()
def simulate(
    qmodel_path: Annotated[Path | None, typer.Argument(metavar="QMODEL", help="A quantized model from 'qtool calibrate'.")] = None,
    data_path: Annotated[Path | None, typer.Argument(metavar="DATA", help="Held-out test sequences: .npy, .npz or .h5.")] = None,
    dataset: DataOpt = None,
    time_first: TimeFirst = False,
    save: Annotated[Path | None, typer.Option(help="Write float/y, quant/y and quant/y_int to this .h5 file.")] = None,
    per_tensor: Annotated[bool, typer.Option(help="Report every tensor, not just the output.")] = True,
    batch_size: Annotated[int, typer.Option(help="Sequences per chunk (bounds memory).")] = 256,
    limit: Annotated[int | None, typer.Option(help="Use at most this many sequences.")] = None,
    backend: Annotated[str, typer.Option(help="auto (CUDA when a GPU is usable, else CPU), cpu or cuda.")] = "auto",
    force: Force = False,
    as_json: JsonOpt = False,
):
    """Run the integer GRU and the float GRU on the same data and report how far apart they are."""
    from qtool.engine_cuda import select_backend
    from qtool.fileio import atomic_path, open_sequences
    from qtool.model import open_h5
    from qtool.qmodel import load_qmodel
    from qtool.report import distance_table
    from qtool.simulation import simulate as run_simulation

    qmodel_path = Path(need(qmodel_path, "quantized model file", "QMODEL"))
    data_path = Path(need(data_path, "test data file", "DATA"))
    if save is not None:
        writable(save, force)
    if batch_size < 1:
        raise QtoolError("--batch-size must be at least 1")
    runner, backend_label = select_backend(backend)
    qm = load_qmodel(qmodel_path)
    data = open_sequences(data_path, dataset, time_first)
    data.check_features(qm.model.input_size)
    n = data.num_sequences if limit is None else min(limit, data.num_sequences)
    t0 = time.perf_counter()
    with progress_bar() as bar, (atomic_path(save) if save else nullcontext()) as tmp:
        f = open_h5(tmp, "w") if save else None
        try:
            shape = (n, data.shape[1], qm.model.output_size)
            ds = [] if f is None else [f.create_dataset(k, shape, dtype=dt) for k, dt in
                                       (("float/y", "f4"), ("quant/y", "f4"), ("quant/y_int", "i4"))]
            task = bar.add_task("simulating", total=n, rate="")

            def on_chunk(start, *outs):
                for d, v in zip(ds, outs):
                    d[start:start + len(v)] = v
                done = start + len(outs[0])
                bar.update(task, completed=done, rate=f"{done / (time.perf_counter() - t0):.0f} seq/s")

            sim = run_simulation(qm, data, batch_size, per_tensor, n, on_chunk, runner)
        finally:
            if f is not None:
                f.close()
    res = sim.results()
    res.update(samples=n, seconds=time.perf_counter() - t0, backend=backend_label)
    if as_json:
        print(json.dumps(res))
        return
    out.print(distance_table(res, f"integer ({backend_label}) vs float on {n} sequences ({data_path.name})"))
    snr = res["per_step_snr_db"]
    out.print(f"output SNR by time step: first {snr[0]:.2f} dB, middle {snr[len(snr) // 2]:.2f} dB, "
              f"last {snr[-1]:.2f} dB")
    if save:
        out.print(f"saved outputs -> {save}")


@app.command()
def inspect(
    path: Annotated[Path | None, typer.Argument(metavar="FILE", help="A model or quantized model file.")] = None,
    as_json: JsonOpt = False,
):
    """Show what a model or quantized model file holds: shapes, bits, scales, ranges, tables."""
    from qtool.model import load_model, open_h5
    from qtool.qmodel import is_qmodel, load_qmodel
    from qtool.report import lut_table, spec_rows, spec_table

    path = Path(need(path, "model file", "FILE"))
    with open_h5(path) as f:
        quantized = is_qmodel(f)
    if quantized:
        qm = load_qmodel(path)
        model = qm.model
    else:
        model, qm = load_model(path), None
    summary = {"name": model.name, "source": model.source, "layers": model.num_layers,
               "bidirectional": model.bidirectional, "input_size": model.input_size,
               "hidden_size": model.hidden_size, "quantized": quantized}
    if qm is not None:
        summary["quant"] = qm.info
    if as_json:
        print(json.dumps({**summary, "tensors": spec_rows(qm) if qm else []}, default=str))
        return
    for k, v in summary.items():
        out.print(f"[bold]{k}[/]: {v}")
    if qm is not None:
        out.print(spec_table(qm, "quantization"))
        out.print(lut_table(qm))


export_app = typer.Typer(help="Write a quantized GRU for a target: C sources, or parameter tables.",
                         no_args_is_help=True)
app.add_typer(export_app, name="export")


def _existing_dir(path: Path, force: bool) -> Path:
    if path.exists() and any(path.iterdir()) if path.is_dir() else path.exists():
        writable(path, force)
    return path


@export_app.command("c")
def export_c_cmd(
    qmodel_path: Annotated[Path | None, typer.Argument(metavar="QMODEL", help="A quantized model from 'qtool calibrate'.")] = None,
    output: Annotated[Path | None, typer.Option("-o", "--output", help="Directory to write the C sources into.")] = None,
    name: Annotated[str | None, typer.Option(help="Prefix of every C identifier and file (default: the model's name).")] = None,
    test_vectors: Annotated[bool, typer.Option("--test-vectors", help="Also write test vectors and a main() that checks them.")] = False,
    data_path: Annotated[Path | None, typer.Option("--data", help="Take the test vectors' inputs from this data file (else random in the calibrated input range).")] = None,
    vectors: Annotated[int, typer.Option(help="Number of test sequences.")] = 4,
    compensation: Annotated[str, typer.Option(
        help="Zero-point compensation: 'table' stores the precomputed W_sum_mul_x_zp / R_sum_mul_h_zp "
             "(int8 x int8 GEMM, for targets with int8 dot-product instructions); 'offset' subtracts "
             "the zero point from the GEMM inputs once per step (CMSIS-NN's input offset): no tables, "
             "less flash, int8 x int16 GEMM. Both give the same integers.")] = "table",
    dataset: DataOpt = None,
    time_first: TimeFirst = False,
    force: Force = False,
    as_json: JsonOpt = False,
):
    """Write C99 headers with the integer parameters and a portable integer-only GRU."""
    import numpy as np

    from exporters.c_export import c_name, export_c
    from exporters.c_vectors import write_test_vectors
    from qtool.fileio import atomic_dir, open_sequences
    from qtool.qmodel import load_qmodel

    qmodel_path = Path(need(qmodel_path, "quantized model file", "QMODEL"))
    output = _existing_dir(Path(need(output, "output directory", "--output")), force)
    qm = load_qmodel(qmodel_path)
    prefix = c_name(name or qm.model.name)
    x = None
    if test_vectors:
        if data_path is not None:
            data = open_sequences(data_path, dataset, time_first)
            data.check_features(qm.model.input_size)
            x = data.chunk(0, min(vectors, data.num_sequences))
        else:
            s = qm.cells[0][0].spec["x"]
            rng = np.random.default_rng(0)
            x = rng.uniform(s.lo, s.hi, (vectors, 16, qm.model.input_size)).astype(np.float32)
    with atomic_dir(output) as tmp:
        fp = export_c(qm, tmp, prefix, compensation)
        if x is not None:
            write_test_vectors(qm, tmp, prefix, x)
    base = fp.int8_weight_bytes + fp.table_bytes
    res = {"directory": str(output), "name": prefix, "compensation": compensation,
           "flash_bytes": fp.flash_bytes,
           "weight_bytes": fp.weight_bytes, "bias_bytes": fp.bias_bytes, "table_bytes": fp.table_bytes,
           "other_bytes": fp.other_bytes, "ram_bytes": fp.ram_bytes, "macs_per_step": fp.macs_per_step,
           "flash_vs_int8_weights_and_tables": fp.flash_bytes / base}
    if as_json:
        print(json.dumps(res))
        return
    from rich.table import Table

    t = Table(title=f"{prefix}: footprint")
    t.add_column("what")
    t.add_column("bytes", justify="right")
    for k in ("weight_bytes", "bias_bytes", "table_bytes", "other_bytes", "flash_bytes", "ram_bytes"):
        t.add_row(k.replace("_bytes", "").replace("other", "shifts, compensation, params"), f"{res[k]:,}")
    out.print(t)
    out.print(f"{fp.macs_per_step:,} multiply-accumulates per time step; flash is "
              f"{100 * (res['flash_vs_int8_weights_and_tables'] - 1):.1f}% above the bare int8 weights "
              f"plus tables ({base:,} bytes)")
    if fp.offset_saves:
        lean = fp.flash_bytes - fp.offset_saves
        out.print(f"--compensation offset would drop the compensation tables: flash {lean:,} bytes "
                  f"({100 * (lean / base - 1):.1f}% above), same integers")
    out.print(f"wrote {prefix}.h, {prefix}.c, {prefix}_params.h, qgru.h, qgru.c"
              + (f", {prefix}_test_vectors.h, {prefix}_test_main.c" if x is not None else "")
              + f" -> {output}")


def _export_tables(qmodel_path: Path | None, output: Path | None, force: bool, kind: str) -> None:
    from exporters.tables import write_h5, write_json
    from qtool.fileio import atomic_path
    from qtool.qmodel import load_qmodel

    qm = load_qmodel(Path(need(qmodel_path, "quantized model file", "QMODEL")))
    output = writable(Path(need(output, f"output {kind} file", "--output")), force)
    with atomic_path(output) as tmp:
        (write_json if kind == "JSON" else write_h5)(qm, tmp)
    out.print(f"parameter tables -> {output}")


@export_app.command("json")
def export_json_cmd(
    qmodel_path: Annotated[Path | None, typer.Argument(metavar="QMODEL", help="A quantized model.")] = None,
    output: Annotated[Path | None, typer.Option("-o", "--output", help="The JSON file to write.")] = None,
    force: Force = False,
):
    """Write every tensor's bits, exp2_inv, zero point and the derived shifts as JSON."""
    _export_tables(qmodel_path, output, force, "JSON")


@export_app.command("h5")
def export_h5_cmd(
    qmodel_path: Annotated[Path | None, typer.Argument(metavar="QMODEL", help="A quantized model.")] = None,
    output: Annotated[Path | None, typer.Option("-o", "--output", help="The HDF5 file to write.")] = None,
    force: Force = False,
):
    """Write every tensor's bits, exp2_inv, zero point and the derived shifts as HDF5."""
    _export_tables(qmodel_path, output, force, "HDF5")


@app.command()
def verify(
    qmodel_path: Annotated[Path | None, typer.Argument(metavar="QMODEL", help="The quantized model that was exported.")] = None,
    export_dir: Annotated[Path | None, typer.Argument(metavar="DIR", help="The directory 'qtool export c' wrote.")] = None,
    data_path: Annotated[Path | None, typer.Argument(metavar="DATA", help="Sequences to run: .npy, .npz or .h5.")] = None,
    name: Annotated[str | None, typer.Option(help="The --name given to 'qtool export c'.")] = None,
    dataset: DataOpt = None,
    time_first: TimeFirst = False,
    limit: Annotated[int | None, typer.Option(help="Use at most this many sequences.")] = None,
    as_json: JsonOpt = False,
):
    """Compile the exported C with the host compiler ($CC, default cc) and check that every output
    integer of every time step, and every final state, equals the simulator's."""
    from exporters.c_export import c_name
    from exporters.c_verify import verify as run_verify
    from qtool.fileio import open_sequences
    from qtool.qmodel import load_qmodel

    qm = load_qmodel(Path(need(qmodel_path, "quantized model file", "QMODEL")))
    export_dir = Path(need(export_dir, "exported C directory", "DIR"))
    if not export_dir.is_dir():
        raise QtoolError(f"export directory not found: {export_dir}")
    data = open_sequences(Path(need(data_path, "data file", "DATA")), dataset, time_first)
    data.check_features(qm.model.input_size)
    n = data.num_sequences if limit is None else min(limit, data.num_sequences)
    res = run_verify(qm, export_dir, c_name(name or qm.model.name), data.chunk(0, n))
    bad = res["output_mismatches"] + res["state_mismatches"] + res["dequantized_mismatches"]
    if as_json:
        print(json.dumps(res))
    else:
        out.print(f"{res['sequences']} sequences x {res['time_steps']} steps: "
                  f"{res['output_mismatches']} mismatches in {res['output_values']:,} output integers, "
                  f"{res['state_mismatches']} in {res['state_values']:,} final-state integers, "
                  f"{res['dequantized_mismatches']} in the dequantized outputs")
        out.print("[green]PASS[/]: the C code computes exactly what the simulator computes" if not bad
                  else "[red]FAIL[/]: the C code differs from the simulator")
    if bad:
        raise typer.Exit(1)


@app.command()
def version():
    """Print qtool's version."""
    out.print(f"qtool {__version__}")


def main(argv: list[str] | None = None) -> None:
    """Entry point: every user-facing error is one line on stderr and a non-zero exit."""
    try:
        app(args=argv, prog_name="qtool")
    except QtoolError as e:
        err.print(f"[red]error:[/] {e}", highlight=False, soft_wrap=True)
        sys.exit(2)
    except KeyboardInterrupt:
        err.print("interrupted")
        sys.exit(130)
    except Exception as e:  # anything else is a bug, but still one line unless debugging
        if os.environ.get("QTOOL_DEBUG"):
            raise
        err.print(f"[red]internal error:[/] {type(e).__name__}: {e} (set QTOOL_DEBUG=1 for a "
                  "traceback)", highlight=False, soft_wrap=True)
        sys.exit(1)


if __name__ == "__main__":
    main()
