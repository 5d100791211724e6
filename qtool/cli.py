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
    output: Annotated[Path | None, typer.Option("-o", "--output", help="The quantized model file to write (.h5).")] = None,
    method: Annotated[str, typer.Option(help="Range method: minmax (running union) or ema (the seed's per-step EMA on x and h).")] = "minmax",
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
    from qtool.calibrate import build_quant_model, new_observers, observe_batch
    from qtool.fileio import atomic_path, open_sequences
    from qtool.model import open_h5
    from qtool.qmodel import write_qmodel
    from qtool.report import lut_table, spec_rows, spec_table
    from qtool.tensors import load_bits

    model_path = Path(need(model_path, "model file", "MODEL"))
    data_path = Path(need(data_path, "calibration data file", "DATA"))
    output = writable(Path(need(output, "output quantized model file (.h5)", "--output")), force)
    if method not in METHODS:
        raise QtoolError(f"unknown method '{method}' (use one of {', '.join(METHODS)})")
    if batch_size < 1:
        raise QtoolError("--batch-size must be at least 1")
    label, config = load_bits(bits)
    model = load_any_model(model_path)
    data = open_sequences(data_path, dataset, time_first)
    data.check_features(model.input_size)
    n = data.num_sequences if limit is None else min(limit, data.num_sequences)
    obs = new_observers(model, method)
    t0 = time.perf_counter()
    with progress_bar() as bar:
        task = bar.add_task("calibrating", total=n, rate="")
        for start, x in data.chunks(batch_size, n):
            observe_batch(model, x, obs)
            done = start + len(x)
            bar.update(task, completed=done, rate=f"{done / (time.perf_counter() - t0):.0f} seq/s")
    info = {"method": method, "bits": label, "data_file": data_path.name, "samples": n,
            "time_steps": data.shape[1]}
    qm = build_quant_model(model, obs, config, info)
    with atomic_path(output) as tmp, open_h5(tmp, "w") as f:
        write_qmodel(f, qm)
    elapsed = time.perf_counter() - t0
    if as_json:
        print(json.dumps({"output": str(output), **info, "seconds": elapsed,
                          "tensors": spec_rows(qm)}))
        return
    out.print(spec_table(qm, f"{model.name}: {label}, {method} over {n} sequences"))
    out.print(lut_table(qm))
    out.print(f"calibrated in {elapsed:.2f} s -> {output}")


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
    force: Force = False,
    as_json: JsonOpt = False,
):
    """Run the integer GRU and the float GRU on the same data and report how far apart they are."""
    from qtool.fileio import atomic_path, open_sequences
    from qtool.model import open_h5
    from qtool.qmodel import load_qmodel
    from qtool.report import distance_table
    from qtool.simulate import Simulation

    qmodel_path = Path(need(qmodel_path, "quantized model file", "QMODEL"))
    data_path = Path(need(data_path, "test data file", "DATA"))
    if save is not None:
        writable(save, force)
    if batch_size < 1:
        raise QtoolError("--batch-size must be at least 1")
    qm = load_qmodel(qmodel_path)
    data = open_sequences(data_path, dataset, time_first)
    data.check_features(qm.model.input_size)
    n = data.num_sequences if limit is None else min(limit, data.num_sequences)
    sim = Simulation(qm, per_tensor)
    t0 = time.perf_counter()
    with progress_bar() as bar, (atomic_path(save) if save else nullcontext()) as tmp:
        f = open_h5(tmp, "w") if save else None
        try:
            if f is not None:
                shape = (n, data.shape[1], qm.model.output_size)
                ds = {k: f.create_dataset(k, shape, dtype=dt) for k, dt in
                      (("float/y", "f4"), ("quant/y", "f4"), ("quant/y_int", "i4"))}
            task = bar.add_task("simulating", total=n, rate="")
            for start, x in data.chunks(batch_size, n):
                outs = sim.run_chunk(x)
                if f is not None:
                    for d, v in zip(ds.values(), outs):
                        d[start:start + len(x)] = v
                done = start + len(x)
                bar.update(task, completed=done, rate=f"{done / (time.perf_counter() - t0):.0f} seq/s")
        finally:
            if f is not None:
                f.close()
    res = sim.results()
    res.update(samples=n, seconds=time.perf_counter() - t0, backend="cpu")
    if as_json:
        print(json.dumps(res))
        return
    out.print(distance_table(res, f"integer vs float on {n} sequences ({data_path.name})"))
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
