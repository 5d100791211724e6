"""Why QAT on sum100 needs its learning rate annealed: the int8 model's accuracy is a rough function
of its weights. Every weight of the float GRU and of its int8 QuantGRU (mse calibration, as
samples/qat_demo.py starts) is moved by +-eps with random signs, the size of one Adam step at
learning rate eps, and the accuracy on the 500 validation sequences of qat_demo's split (the last
500 training sequences) is measured, the int8 one by the integer engine on the model QuantGRU writes.

    python samples/sum100_roughness.py                          # about 15 s on one thread
    python samples/sum100_roughness.py samples/sum100_qat.h5    # around QAT's weights instead

With a quantized model file written by QuantGRU.to_qtool, its weights and grids are the int8 start.
"""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

import numpy as np
import torch

from qtool import api
from qtool.io.qmodel_file import load_qmodel
from qtool.qat import QuantGRU
from qtool.qat.module import gru_model

HERE = Path(__file__).parent
_spec = importlib.util.spec_from_file_location("qat_demo", HERE / "qat_demo.py")
demo = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(demo)


def nudge(module: torch.nn.Module, start: dict, eps: float, seed: int) -> None:
    """Every named weight of `start` moved by +-eps, the signs drawn from `seed`."""
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in module.named_parameters():
            if name in start:
                p.copy_(start[name] + eps * (2 * torch.randint(0, 2, p.shape, generator=g) - 1))


def main(start: str | None = None, draws: int = 16) -> None:
    torch.set_num_threads(1)
    x_tr, y_tr, _, _ = demo.sum100()
    xv, yv = x_tr[-500:], y_tr[-500:]
    gru, head = demo.load_float("sum100", 1)
    qm = load_qmodel(start) if start else api.calibrate(gru_model(gru), x_tr[:400], bits="int8", method="mse")
    qgru = QuantGRU(qm, batch_first=True)
    f0 = {n: p.detach().clone() for n, p in gru.named_parameters()}
    q0 = {n: p.detach().clone() for n, p in qgru.named_parameters() if "_fake_quant." not in n}
    print("eps     float: min..max (sd)        int8: min..max (sd), validation accuracy %")
    for eps in (0.0, 1e-4, 3e-4, 1e-3):
        fl, q8 = [], []
        for k in range(draws if eps else 1):
            nudge(gru, f0, eps, k)
            nudge(qgru, q0, eps, k)
            with torch.no_grad():
                fl.append(100 * demo.accuracy(gru(torch.from_numpy(xv))[0][:, -1].numpy(), head, yv))
            q8.append(100 * demo.int_accuracy(qgru.to_quant_model(), xv, head, yv))
        print(f"{eps:<7g} {min(fl):.1f}..{max(fl):.1f} ({np.std(fl):.2f})"
              f"          {min(q8):.1f}..{max(q8):.1f} ({np.std(q8):.2f})")


if __name__ == "__main__":
    main(*sys.argv[1:2])
