"""The GRUs the advisor's experiments run on: the bundled sample and five more, of different
sizes (hidden 32 to 128, one to three layers, one bidirectional), inputs (smooth Gaussian,
heavy-tailed Student-t and Laplace with outliers, ReLU-fed) and training (random init, trained
here with PyTorch in seconds). Each is written as a qtool model file with calibration and
held-out test data; everything is seeded.

    python benchmarks/advise_models.py [--out benchmarks/out/models] [--models NAME,...]   # needs torch

Used by advise_threshold.py, bench_advise.py and auto_vs_single.py.
"""

from __future__ import annotations

import argparse
import sys
from dataclasses import dataclass
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from qtool.core.model import GruModel, open_h5, write_model  # noqa: E402

OUT = ROOT / "benchmarks" / "out" / "models"


@dataclass(frozen=True)
class Spec:
    name: str
    C: int
    H: int
    layers: int
    bidirectional: bool
    T: int
    inputs: str        # gauss, student, laplace, relu
    trained: bool
    scale: float = 1.0  # random init: PyTorch's uniform(+-1/sqrt(H)) times this
    n_calib: int = 384
    n_test: int = 256


SPECS = (
    Spec("rand-1x32-gauss", 16, 32, 1, False, 40, "gauss", False, scale=3.0),
    Spec("rand-bi2x48-student", 12, 48, 2, True, 30, "student", False, scale=2.5),
    Spec("rand-1x128-laplace", 40, 128, 1, False, 25, "laplace", False, scale=2.0),
    Spec("trained-2x96-relu", 32, 96, 2, False, 50, "relu", True),
    Spec("trained-3x64-laplace", 20, 64, 3, False, 40, "laplace", True),
)


def inputs(spec: Spec, n: int, rng: np.random.Generator) -> np.ndarray:
    shape = (n, spec.T, spec.C)
    if spec.inputs == "gauss":
        return rng.normal(0.0, 1.0, shape)
    if spec.inputs == "student":  # heavy tails: df 2.5 has a finite variance, rare large values
        return rng.standard_t(2.5, shape)
    if spec.inputs == "laplace":  # Laplace bulk plus one value in a thousand 20x larger
        x = rng.laplace(0.0, 1.0, shape)
        return np.where(rng.random(shape) < 1e-3, 20.0 * x, x)
    # relu: a noisy spectrum-like signal through a random linear layer and a ReLU, as the
    # front end of a speech-enhancement model feeds its GRU (sparse, non-negative, bursts)
    base = np.abs(np.sin(np.linspace(0, 6, spec.T))[None, :, None] * rng.normal(1, 0.3, (n, 1, spec.C)))
    noisy = base + rng.standard_t(3.0, shape) * 0.3
    w = np.random.default_rng(7).normal(0, 1.0 / np.sqrt(spec.C), (spec.C, spec.C))
    return np.maximum(noisy @ w, 0.0) * 2.0


def targets(spec: Spec, x: np.ndarray) -> np.ndarray:
    """The task of a trained model: predict a smoothed, delayed copy of the input features."""
    y = np.zeros_like(x)
    for t in range(1, x.shape[1]):
        y[:, t] = 0.8 * y[:, t - 1] + 0.2 * x[:, t - 1]
    return np.tanh(y)


def torch_gru(spec: Spec, seed: int):
    import torch

    torch.manual_seed(seed)
    torch.set_num_threads(1)  # small models: one thread is as fast, and calmer on a shared machine
    gru = torch.nn.GRU(spec.C, spec.H, spec.layers, batch_first=True, bidirectional=spec.bidirectional)
    if not spec.trained:
        with torch.no_grad():
            for p in gru.parameters():
                p.mul_(spec.scale)
    return gru


def train(spec: Spec, gru, x: np.ndarray, steps: int = 300) -> float:
    import torch

    head = torch.nn.Linear(spec.H * (2 if spec.bidirectional else 1), spec.C)
    opt = torch.optim.Adam(list(gru.parameters()) + list(head.parameters()), lr=3e-3)
    xt = torch.tensor(x, dtype=torch.float32)
    yt = torch.tensor(targets(spec, x), dtype=torch.float32)
    g = torch.Generator().manual_seed(0)
    for _ in range(steps):
        idx = torch.randint(0, len(xt), (64,), generator=g)
        out, _ = gru(xt[idx])
        loss = torch.nn.functional.mse_loss(head(out), yt[idx])
        opt.zero_grad()
        loss.backward()
        opt.step()
    return float(loss)


def to_model(gru, name: str) -> GruModel:
    from qtool.qat.module import gru_model

    model = gru_model(gru)
    model.name, model.source = name, "benchmarks/advise_models.py"
    return model


def make(spec: Spec, out: Path, seed: int = 0) -> Path:
    """Write out/NAME/{model.h5, calib.npy, test.npy} (skipped when they exist)."""
    d = out / spec.name
    if (d / "test.npy").exists():
        return d
    d.mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng(seed)
    train_x = inputs(spec, 2048 if spec.trained else 0, rng).astype(np.float32)
    calib = inputs(spec, spec.n_calib, rng).astype(np.float32)
    test = inputs(spec, spec.n_test, rng).astype(np.float32)
    gru = torch_gru(spec, seed)
    if spec.trained:
        loss = train(spec, gru, train_x)
        print(f"{spec.name}: trained, final loss {loss:.4f}")
    with open_h5(d / "model.h5", "w") as f:
        write_model(f, to_model(gru, spec.name.replace("-", "_")))
    np.save(d / "calib.npy", calib)
    np.save(d / "test.npy", test)
    return d


def all_models(out: Path = OUT, names: list[str] | None = None) -> list[tuple[str, Path, Path, Path]]:
    """(name, model, calib, test) of every model (of those `names`: only they are trained); the
    bundled sample first."""
    sample = ROOT / "samples"
    rows = [("digits (sample)", sample / "digits_gru.safetensors", sample / "calib.npy", sample / "test.npy")]
    rows = [r for r in rows if names is None or r[0] in names]
    for spec in SPECS:
        if names is not None and spec.name not in names:
            continue
        d = make(spec, out)
        rows.append((spec.name, d / "model.h5", d / "calib.npy", d / "test.npy"))
    return rows


if __name__ == "__main__":
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--out", type=Path, default=OUT)
    ap.add_argument("--models", default=None, help="comma-separated names (default: all)")
    args = ap.parse_args()
    for name, *paths in all_models(args.out, args.models.split(",") if args.models else None):
        print(name, *paths)
