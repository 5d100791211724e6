"""QAT against post-training calibration, on a GRU that int8 calibration hurts: scikit-learn's
digits read two pixels per step (32 time steps of 2 inputs, one layer of 64), a longer recurrence
than the bundled 8-step sample.

    python samples/qat_demo.py            # PTQ with every method, then QAT from the best one
    python samples/qat_demo.py --train    # first retrain the float model (samples/digits32_gru.pt)
    python samples/qat_demo.py --bits samples/w3a8.json   # 3-bit weights: PTQ loses 13.6 points

Needs torch and scikit-learn. Split: a fixed permutation (seed 0); the first 1203 digits train (the
first 400 of them calibrate), the other 594 are the held-out test set. The integer accuracies are
the integer engine's on the quantized model files, with the (float) classifier head on top.
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path

import numpy as np
import torch
from sklearn.datasets import load_digits

from qtool.calibration import build_quant_model, collect
from qtool.engine_cpu import run_int
from qtool.fileio import SequenceData
from qtool.qat import QuantGRU
from qtool.qat.module import gru_model
from qtool.qmodel import load_qmodel
from qtool.qparams import dequantize
from qtool.tensors import load_bits

HERE = Path(__file__).parent
METHODS = ("minmax", "percentile", "mse", "kl")


def data():
    d = load_digits()
    x = (d.images / 16.0).astype(np.float32).reshape(-1, 32, 2)
    order = np.random.RandomState(0).permutation(len(x))
    tr, te = order[:1203], order[1203:]
    return x[tr], d.target[tr], x[te], d.target[te]


def train_float(x, y, epochs: int = 60) -> tuple[torch.nn.GRU, torch.nn.Linear]:
    torch.manual_seed(0)
    gru, head = torch.nn.GRU(2, 64, batch_first=True), torch.nn.Linear(64, 10)
    opt = torch.optim.Adam([*gru.parameters(), *head.parameters()], 3e-3)
    xt, yt = torch.from_numpy(x), torch.from_numpy(y).long()
    for _ in range(epochs):
        perm = torch.randperm(len(xt))
        for i in range(0, len(xt), 64):
            idx = perm[i:i + 64]
            loss = torch.nn.functional.cross_entropy(head(gru(xt[idx])[0][:, -1]), yt[idx])
            opt.zero_grad()
            loss.backward()
            opt.step()
    torch.save({"gru": gru.state_dict(), "head": head.state_dict()}, HERE / "digits32_gru.pt")
    return gru, head


def accuracy(y_last: np.ndarray, head: torch.nn.Linear, labels: np.ndarray) -> float:
    with torch.no_grad():
        logits = head(torch.from_numpy(np.asarray(y_last, np.float32)))
    return float((logits.argmax(1).numpy() == labels).mean())


def int_accuracy(qm, x, head, labels) -> float:
    s = qm.cells[-1][0].spec["h"]
    return accuracy(dequantize(run_int(qm, x), s.exp2_inv, s.zp)[:, -1], head, labels)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--train", action="store_true", help="retrain the float model first")
    ap.add_argument("--epochs", type=int, default=3, help="QAT epochs over the training split")
    ap.add_argument("--loss", choices=("ce", "distill"), default="distill",
                    help="ce: the task loss, fine-tuning the head too; distill: match the float GRU's "
                         "last hidden state, the head unchanged")
    ap.add_argument("--lr", type=float, default=1e-4, help="learning rate of the weights")
    ap.add_argument("--bits", default="int8", help="a preset or a bits file, as `qtool calibrate --bits`")
    ap.add_argument("--out", type=Path, default=HERE.parent / "out" / "digits32_qat.h5",
                    help="the quantized model file QAT writes")
    a = ap.parse_args()
    torch.set_num_threads(1)  # small tensors: more threads only add synchronisation
    x_tr, y_tr, x_te, y_te = data()
    if a.train:
        gru, head = train_float(x_tr, y_tr)
    else:
        ck = torch.load(HERE / "digits32_gru.pt", weights_only=True)
        gru, head = torch.nn.GRU(2, 64, batch_first=True), torch.nn.Linear(64, 10)
        gru.load_state_dict(ck["gru"])
        head.load_state_dict(ck["head"])
    with torch.no_grad():
        print(f"float: {100 * accuracy(gru(torch.from_numpy(x_te))[0][:, -1].numpy(), head, y_te):.2f}%")
    model, calib = gru_model(gru), SequenceData(x_tr[:400], False, "calib")
    ptq = {}
    for method in METHODS:
        qm = build_quant_model(model, collect(model, calib, method), load_bits(a.bits)[1], {}, method)
        ptq[method] = int_accuracy(qm, x_te, head, y_te)
        print(f"{a.bits} PTQ {method}: {100 * ptq[method]:.2f}%")
    best = max(METHODS, key=lambda m: ptq[m])
    torch.manual_seed(0)
    qgru = QuantGRU.from_float(gru, x_tr[:400], a.bits, method=best)
    groups = [{"params": qgru.weight_parameters(), "lr": a.lr}, {"params": qgru.range_parameters(), "lr": 1e-2}]
    if a.loss == "ce":
        groups.append({"params": head.parameters(), "lr": a.lr})
    opt = torch.optim.Adam(groups)
    xt, yt = torch.from_numpy(x_tr), torch.from_numpy(y_tr).long()
    with torch.no_grad():
        teacher = gru(xt)[0][:, -1]
    t0, steps = time.perf_counter(), 0
    for epoch in range(a.epochs):
        perm = torch.randperm(len(xt))
        for i in range(0, len(xt), 64):
            idx = perm[i:i + 64]
            last = qgru(xt[idx])[0][:, -1]
            loss = (torch.nn.functional.cross_entropy(head(last), yt[idx]) if a.loss == "ce"
                    else ((last - teacher[idx]) ** 2).mean())
            opt.zero_grad()
            loss.backward()
            opt.step()
            steps += 1
        print(f"QAT epoch {epoch + 1}: {steps} steps, {time.perf_counter() - t0:.0f} s", flush=True)
    out = a.out
    qgru.to_qtool(out)
    qm = load_qmodel(out)
    with torch.no_grad():
        y_mod = qgru(torch.from_numpy(x_te))[0]
    s = qm.cells[-1][0].spec["h"]
    q_mod = np.floor(y_mod.double().numpy() * 2.0 ** s.exp2_inv + 0.5) + s.zp
    same = float((q_mod == run_int(qm, x_te)).mean())
    print(f"{a.bits} QAT (from {best}, {a.loss}, {steps} steps of 64, {time.perf_counter() - t0:.0f} s): "
          f"{100 * int_accuracy(qm, x_te, head, y_te):.2f}%; QuantGRU and the written file agree on "
          f"{100 * same:.2f}% of the output integers -> {out}")


if __name__ == "__main__":
    main()
