"""Task accuracy of the bundled digits GRU: float vs each integer preset, on the held-out test
split (calibration used samples/calib.npy, drawn from the training split).

    python samples/evaluate.py
"""

from pathlib import Path

import numpy as np

import qtool
from qtool.engine.cpu import run_int
from qtool.engine.metrics import Distance
from qtool.numerics.float_gru import run_float
from qtool.numerics.qparams import dequantize

HERE = Path(__file__).parent


def accuracy(y_seq: np.ndarray, head: dict, labels: np.ndarray) -> float:
    logits = y_seq[:, -1] @ head["weight"].T + head["bias"]
    return float((logits.argmax(1) == labels).mean())


def evaluate() -> list[dict]:
    """Float, then each preset with the default method (auto), then int8 with each single method."""
    model = qtool.load_model(HERE / "digits_gru.safetensors")
    head = dict(np.load(HERE / "digits_head.npz"))
    x = np.load(HERE / "test.npy")
    labels = np.load(HERE / "test_labels.npy")
    y_float = run_float(model, x)
    rows = [{"preset": "float", "accuracy": accuracy(y_float, head, labels)}]
    runs = [(p, "auto") for p in ("int8", "w8a16", "int16")]
    runs += [("int8", m) for m in ("minmax", "ema", "percentile", "mse", "kl")]
    for preset, method in runs:
        qm = qtool.calibrate(model, HERE / "calib.npy", bits=preset, method=method)
        s = qm.cells[-1][0].spec["h"]
        y_q = dequantize(run_int(qm, x), s.exp2_inv, s.zp)
        d = Distance()
        d.add(y_q, y_float)
        rows.append({"preset": f"{preset} {method}", "accuracy": accuracy(y_q, head, labels),
                     "cosine": d.cosine, "snr_db": d.snr_db})
    return rows


if __name__ == "__main__":
    for r in evaluate():
        extra = f"  cosine {r['cosine']:.6f}  SNR {r['snr_db']:.2f} dB" if "cosine" in r else ""
        print(f"{r['preset']:>17}: accuracy {100 * r['accuracy']:.2f}%{extra}")
