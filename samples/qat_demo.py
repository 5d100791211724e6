"""QAT against post-training calibration, on GRUs that int8 calibration hurts.

    python samples/qat_demo.py --task sum100 --epochs 1 --lr 1e-3  # int8: PTQ loses 3.35 points, QAT wins half back
    python samples/qat_demo.py                   # digits32: PTQ with every method, then QAT
    python samples/qat_demo.py --train           # first retrain the task's float model
    python samples/qat_demo.py --bits samples/w3a8.json   # 3-bit weights: PTQ loses 13.6 points

Tasks (a float classifier head on the GRU's last state):
- digits32: scikit-learn's digits read two pixels per step (32 time steps of 2 inputs, one layer
  of 64; samples/digits32_gru.pt). A fixed permutation (seed 0); the first 1203 digits train (the
  first 400 of them calibrate), the other 594 are the held-out test set.
- sum100: a running sum to classify: 100 steps of one input uniform in [-1, 1]; the class is the
  sum's tercile (below -0.43 sigma, between, above +0.43 sigma of its N(0, 100/3) law), one layer
  of 32 (samples/sum100_gru.pt). 6000 sequences drawn with seed 0: 4000 train (the first 400
  calibrate), 2000 test. The answer needs the whole sum held to a fraction of a step in h.

PTQ: every method of `qtool calibrate --method`, auto included; QAT (qtool.qat.QuantGRU) starts
from the best of them and distills the float GRU's last hidden state (or `--loss ce`). Every
integer accuracy is the integer engine's on a quantized model file. Needs torch and scikit-learn.
"""

from __future__ import annotations

import argparse
import time
from collections.abc import Callable
from pathlib import Path
from typing import NamedTuple

import numpy as np
import torch

from qtool import api
from qtool.engine_cpu import run_int
from qtool.qat import QuantGRU
from qtool.qat.module import gru_model
from qtool.qmodel import load_qmodel
from qtool.qparams import dequantize

HERE = Path(__file__).parent
METHODS = ("minmax", "percentile", "mse", "kl", "auto")


def digits32():
    from sklearn.datasets import load_digits

    d = load_digits()
    x = (d.images / 16.0).astype(np.float32).reshape(-1, 32, 2)
    order = np.random.RandomState(0).permutation(len(x))
    tr, te = order[:1203], order[1203:]
    return x[tr], d.target[tr], x[te], d.target[te]


def sum100():
    T = 100
    x = np.random.RandomState(0).uniform(-1, 1, (6000, T, 1)).astype(np.float32)
    z = x.sum((1, 2)) / np.sqrt(T / 3)           # the sum in standard deviations
    y = np.digitize(z, [-0.4307, 0.4307])        # terciles of N(0, 1)
    return x[:4000], y[:4000], x[4000:], y[4000:]


class Task(NamedTuple):
    data: Callable
    hidden: int
    classes: int
    epochs: int
    cosine: bool  # learning rate annealed to 0 over the training (long sums need the last digits)


TASKS = {"digits32": Task(digits32, 64, 10, 60, False), "sum100": Task(sum100, 32, 3, 30, True)}


def checkpoint(name: str) -> Path:
    return HERE / f"{name}_gru.pt"


def train_float(name: str, x, y) -> tuple[torch.nn.GRU, torch.nn.Linear]:
    task = TASKS[name]
    torch.manual_seed(0)
    gru, head = torch.nn.GRU(x.shape[2], task.hidden, batch_first=True), torch.nn.Linear(task.hidden, task.classes)
    opt = torch.optim.Adam([*gru.parameters(), *head.parameters()], 3e-3)
    xt, yt = torch.from_numpy(x), torch.from_numpy(y).long()
    batches = (len(xt) + 63) // 64
    sched = torch.optim.lr_scheduler.CosineAnnealingLR(opt, task.epochs * batches) if task.cosine else None
    for _ in range(task.epochs):
        perm = torch.randperm(len(xt))
        for i in range(0, len(xt), 64):
            idx = perm[i:i + 64]
            loss = torch.nn.functional.cross_entropy(head(gru(xt[idx])[0][:, -1]), yt[idx])
            opt.zero_grad()
            loss.backward()
            opt.step()
            if sched:
                sched.step()
    torch.save({"gru": gru.state_dict(), "head": head.state_dict()}, checkpoint(name))
    return gru, head


def load_float(name: str, input_size: int) -> tuple[torch.nn.GRU, torch.nn.Linear]:
    task = TASKS[name]
    ck = torch.load(checkpoint(name), weights_only=True)
    gru, head = torch.nn.GRU(input_size, task.hidden, batch_first=True), torch.nn.Linear(task.hidden, task.classes)
    gru.load_state_dict(ck["gru"])
    head.load_state_dict(ck["head"])
    return gru, head


def accuracy(y_last: np.ndarray, head: torch.nn.Linear, labels: np.ndarray) -> float:
    with torch.no_grad():
        logits = head(torch.from_numpy(np.asarray(y_last, np.float32)))
    return float((logits.argmax(1).numpy() == labels).mean())


def int_accuracy(qm, x, head, labels) -> float:
    s = qm.cells[-1][0].spec["h"]
    return accuracy(dequantize(run_int(qm, x), s.exp2_inv, s.zp)[:, -1], head, labels)


def fine_tune(qgru: QuantGRU, gru, head, x, y, a, test) -> tuple[int, float]:
    """QAT: Adam over the weights (a.lr) and the grids (a.grid_lr); returns the steps and seconds. After
    each epoch, the integer engine's accuracy on `test` (x, labels) of the model it would write."""
    groups = [{"params": qgru.weight_parameters(), "lr": a.lr}, {"params": qgru.range_parameters(), "lr": a.grid_lr}]
    if a.loss == "ce":
        groups.append({"params": head.parameters(), "lr": a.lr})
    opt = torch.optim.Adam(groups)
    xt, yt = torch.from_numpy(x), torch.from_numpy(y).long()
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
        spent = time.perf_counter() - t0
        acc = int_accuracy(qgru.to_quant_model(), test[0], head, test[1])
        print(f"QAT epoch {epoch + 1}: {steps} steps, {spent:.0f} s; integer engine {100 * acc:.2f}%", flush=True)
        t0 = time.perf_counter() - spent  # the evaluation is not fine-tuning
    return steps, time.perf_counter() - t0


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--task", choices=tuple(TASKS), default="digits32", help="the model and data set")
    ap.add_argument("--train", action="store_true", help="retrain the float model first")
    ap.add_argument("--epochs", type=int, default=3, help="QAT epochs over the training split")
    ap.add_argument("--loss", choices=("ce", "distill"), default="distill",
                    help="ce: the task loss, fine-tuning the head too; distill: match the float GRU's "
                         "last hidden state, the head unchanged")
    ap.add_argument("--lr", type=float, default=1e-4, help="learning rate of the weights")
    ap.add_argument("--grid-lr", type=float, default=1e-2, help="learning rate of the grids' log2 scales")
    ap.add_argument("--seed", type=int, default=0, help="seed of the QAT batches' order")
    ap.add_argument("--bits", default="int8", help="a preset or a bits file, as `qtool calibrate --bits`")
    ap.add_argument("--out", type=Path, help="the quantized model file QAT writes (out/TASK_qat.h5)")
    a = ap.parse_args()
    out = a.out or HERE.parent / "out" / f"{a.task}_qat.h5"
    torch.set_num_threads(1)  # small tensors: more threads only add synchronisation
    x_tr, y_tr, x_te, y_te = TASKS[a.task].data()
    gru, head = train_float(a.task, x_tr, y_tr) if a.train else load_float(a.task, x_tr.shape[2])
    with torch.no_grad():
        print(f"float: {100 * accuracy(gru(torch.from_numpy(x_te))[0][:, -1].numpy(), head, y_te):.2f}%")
    model, ptq, score = gru_model(gru), {}, {}
    for method in METHODS:
        ptq[method] = api.calibrate(model, x_tr[:400], bits=a.bits, method=method)
        score[method] = int_accuracy(ptq[method], x_te, head, y_te)
        print(f"{a.bits} PTQ {method}: {100 * score[method]:.2f}%")
    best = max(METHODS, key=score.get)  # chosen on the test set: the most PTQ can be credited with
    torch.manual_seed(a.seed)
    qgru = QuantGRU(ptq[best], batch_first=True)
    steps, seconds = fine_tune(qgru, gru, head, x_tr, y_tr, a, (x_te, y_te))
    qgru.to_qtool(out)
    qm = load_qmodel(out)
    with torch.no_grad():
        y_mod = qgru(torch.from_numpy(x_te))[0]
    s = qm.cells[-1][0].spec["h"]
    q_mod = np.floor(y_mod.double().numpy() * 2.0 ** s.exp2_inv + 0.5) + s.zp
    same = float((q_mod == run_int(qm, x_te)).mean())
    print(f"{a.bits} QAT (from {best}, {a.loss}, seed {a.seed}, {steps} steps of 64, "
          f"{seconds:.0f} s): {100 * int_accuracy(qm, x_te, head, y_te):.2f}%; QuantGRU "
          f"and the written file agree on {100 * same:.2f}% of the output integers -> {out}")


if __name__ == "__main__":
    main()
