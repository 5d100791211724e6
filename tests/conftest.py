import importlib.util
import os
import signal
import sys
from pathlib import Path

# CUDA kernels run under numba's simulator unless a real GPU is asked for; set before numba.cuda
# is imported anywhere.
if os.environ.get("QTOOL_TEST_REAL_GPU") != "1":
    os.environ["NUMBA_ENABLE_CUDASIM"] = "1"
# the phase lines a non-terminal gets (qtool.cli.console.PhaseLines) stay out of the tests' stderr,
# which checks that an error is one line; tests/cli/test_cli_conventions.py checks the lines themselves
os.environ.setdefault("QTOOL_PROGRESS_LINES", "0")

import numpy as np
import pytest

ROOT = Path(__file__).resolve().parent.parent
GOLDEN = ROOT / "tests" / "golden"
SAMPLES = ROOT / "samples"
# a concern's tests import what another's built (test_integer_gru's mixed_config, the graphs of
# test_export_graph_c) by module name, whichever folders a run collects
sys.path += [str(p) for p in sorted((ROOT / "tests").iterdir())
             if p.is_dir() and any(p.glob("test_*.py")) and str(p) not in sys.path]


def pytest_configure(config):
    """A run that tests/engine/test_simd_paths.py started for one SIMD path must be on that path."""
    want = os.environ.get("QTOOL_SIMD_PATH")
    if want:
        from qtool.engine.simd import simd_path

        if simd_path() != want:
            raise pytest.UsageError(f"asked for the {want} SIMD path, the engine takes {simd_path()}")


def has(module: str) -> bool:
    return importlib.util.find_spec(module) is not None


def keras_on_torch(seed: int):
    """Keras 3 on the PyTorch backend (the import checks' setup), seeded; the test is skipped
    where either is missing."""
    pytest.importorskip("torch")
    os.environ.setdefault("KERAS_BACKEND", "torch")
    keras = pytest.importorskip("keras")
    if keras.backend.backend() != "torch":
        pytest.skip("keras is not on the torch backend")
    keras.utils.set_random_seed(seed)
    return keras


def fit_and_save(m, folder: Path, x: np.ndarray, batch_size: int):
    """A compiled Keras model trained one epoch on random targets, saved the ways users save it
    (`m.keras` and legacy `m.h5` in `folder`); returns (m, folder)."""
    rng = np.random.RandomState(0)
    ys = m(x)
    ys = [rng.randn(*y.shape).astype(np.float32) for y in (ys if isinstance(ys, (list, tuple)) else [ys])]
    m.fit(x, ys if len(ys) > 1 else ys[0], epochs=1, batch_size=batch_size, verbose=0)
    folder.mkdir()
    for name in ("m.keras", "m.h5"):
        m.save(folder / name)
    return m, folder


def export_map_model(module, x, path, exporter: str = "torchscript"):
    """`module` on a map [N, C, T, F] through torch.onnx.export as a user runs it: "torchscript"
    (dynamo=False, dynamic batch and time), "dynamo" (dynamic_shapes), "plain" (nothing but the
    module and its example: torch.export fixes the example's batch and steps), "unfolded" (the
    TorchScript exporter keeping BatchNormalization), "opsetK" (the TorchScript exporter at opset
    K). Input "x", output "y"; returns `path`."""
    import warnings

    import torch

    kw = {"dynamo": exporter in ("dynamo", "plain")}
    if exporter == "plain":
        torch._dynamo.reset()
    elif exporter == "dynamo":
        torch._dynamo.reset()  # what an earlier export specialized (a length) is not this one's
        kw["dynamic_shapes"] = {"x": {0: torch.export.Dim("n"), 2: torch.export.Dim("t", min=4)}}
    else:
        kw["dynamic_axes"] = {"x": {0: "n", 2: "t"}}
    if exporter == "unfolded":
        kw.update(do_constant_folding=False, training=torch.onnx.TrainingMode.PRESERVE)
    if exporter.startswith("opset"):
        kw["opset_version"] = int(exporter[5:])
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        torch.onnx.export(module, (torch.as_tensor(x),), str(path), input_names=["x"], output_names=["y"], **kw)
    return path


def random_model(C=5, H=6, layers=1, dirs=1, seed=0, scale=0.5):
    from qtool.core.model import GruCell, GruModel

    rng = np.random.RandomState(seed)
    cells = []
    for l in range(layers):
        c_in = C if l == 0 else H * dirs
        cells.append([GruCell(rng.randn(3 * H, c_in) * scale, rng.randn(3 * H, H) * scale,
                              rng.randn(3 * H) * 0.3, rng.randn(3 * H) * 0.3) for _ in range(dirs)])
    return GruModel(cells)


def calibrated(model, x_calib, preset="int8", method="minmax", config=None):
    from qtool.calibration.observe import build_quant_model, new_observers, observe_batch
    from qtool.core.tensors import preset_config

    obs = new_observers(model, method)
    observe_batch(model, x_calib, obs)
    return build_quant_model(model, obs, config or preset_config(preset), {"method": method})


@pytest.fixture(scope="session")
def qgru_file(tmp_path_factory) -> Path:
    """The bundled sample GRU calibrated (auto) on its calibration data and saved, for the tests
    that run commands on a quantized GRU or damage copies of it; beside it x.npy, three test
    sequences. Read it, never write it."""
    from qtool import api

    if not has("safetensors"):
        pytest.skip("the sample is .safetensors")
    d = tmp_path_factory.mktemp("qgru")
    api.save(api.calibrate(SAMPLES / "digits_gru.safetensors", SAMPLES / "calib.npy"), d / "q.h5")
    np.save(d / "x.npy", np.load(SAMPLES / "test.npy")[:3])
    return d / "q.h5"


@pytest.fixture(scope="module")
def torch():
    """PyTorch, seeded, on one thread (QuantGRU's tensors are small: more threads only wait on each
    other); the test is skipped without it."""
    torch = pytest.importorskip("torch")
    torch.manual_seed(0)
    torch.set_num_threads(1)
    return torch


def fine_tune(module, x, target, batch: int, steps: int = 8) -> None:
    """A few Adam steps of QuantGRU `module` towards `target` on batches of `x`, its weights and
    its quantizers' ranges learning at their own rates."""
    import torch

    opt = torch.optim.Adam([{"params": module.weight_parameters(), "lr": 1e-2},
                            {"params": module.range_parameters(), "lr": 5e-2}])
    for step in range(steps):
        rows = slice(batch * (step % 4), batch * (step % 4 + 1))
        loss = ((module(x[rows])[0] - target[rows]) ** 2).mean()
        opt.zero_grad()
        loss.backward()
        opt.step()


STOP_HANDLERS = {sig: signal.getsignal(sig) for sig in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)}


@pytest.fixture(autouse=True)
def _stop_signals_as_they_were():
    """qtool's main ends ignoring stop signals (a finished command keeps its exit status): after
    each test that ran it in-process the signals are pytest's again, so Ctrl-C stops pytest."""
    hook = sys.unraisablehook
    yield
    for sig, handler in STOP_HANDLERS.items():
        signal.signal(sig, handler)
    sys.unraisablehook = hook


@pytest.fixture
def cli(capsys):
    """Run the qtool CLI in-process: returns (exit code, stdout, stderr)."""
    from qtool.cli.app import main

    def run(*args):
        try:
            main([str(a) for a in args])
            code = 0
        except SystemExit as e:
            code = e.code if isinstance(e.code, int) else (0 if e.code is None else 1)
        cap = capsys.readouterr()
        return code, cap.out, cap.err

    return run
