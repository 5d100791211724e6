"""The advisor's experiment: predicted against measured per-tensor SNR, and the seed's threshold T.

On the bundled sample and the five GRUs of advise_models.py, each calibrated (method auto) to
int8 and to int16: the seed's prediction and the grid-aware prediction of every tensor against
the SNR `qtool simulate` measures on the held-out test data. Then the seed's rule: for each of
its decisions (a product, or a tensor outside products) the predicted int8 SNR against the
measured int8 SNR of that product's output (or tensor); T is the least threshold above which at
least 95% of the decisions measure at least REQUIRED dB (the seed's "signal 100x the noise").

    python benchmarks/advise_threshold.py [--json out.json]      # needs torch for the models
"""

from __future__ import annotations

import argparse
import json
import math
import sys
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "benchmarks"))

from advise_models import all_models  # noqa: E402

from qtool.advisor import seed  # noqa: E402
from qtool.advisor.predict import Predictor  # noqa: E402
from qtool.advisor.search import SINGLE  # noqa: E402
from qtool.advisor.stats import model_stats, new_estimators  # noqa: E402
from qtool.auto_method import AutoCalibrator  # noqa: E402
from qtool.cli import load_any_model  # noqa: E402
from qtool.fileio import open_sequences  # noqa: E402
from qtool.model import GruModel  # noqa: E402
from qtool.simulation import simulate, tensor_key  # noqa: E402
from qtool.tensors import BitsConfig, preset_config  # noqa: E402

REQUIRED = 20.0   # dB: the seed's "safe" (signal energy 100x the noise)
PRECISION = 0.95  # share of the decisions above T that must be safe


def measure_model(model: GruModel, calib, test, seed_value: int = 0) -> dict:
    """Per-tensor rows (bits, key, seed, grid, measured) and the seed rule's decisions."""
    ac = AutoCalibrator(model, calib, calib.num_sequences, extra=[lambda: new_estimators(model, seed_value)])
    stats = model_stats(model, ac.extra_sets[0], seed_value)
    pr = Predictor(model, stats, calib.shape[1])
    rows, decisions = [], []
    for preset in ("int8", "int16"):
        qm, _ = ac.quantize(BitsConfig(preset_config(preset)), {})
        pred = pr.predict(qm.cells)
        res = simulate(qm, test, 256, True).results()
        for (l, d, name), g in pred.grid_db.items():
            m = res["tensors"].get(tensor_key(l, d, name), {}).get("snr_db")
            if name in ("bx", "br") or m is None or not math.isfinite(m):
                continue  # 32-bit biases; inputs that the grid holds exactly measure inf
            rows.append({"bits": 8 if preset == "int8" else 16, "tensor": name, "key": tensor_key(l, d, name),
                         "seed_db": pred.seed_db[(l, d, name)], "grid_db": g, "measured_db": m})
        rows.append({"bits": 8 if preset == "int8" else 16, "tensor": "output", "key": "output",
                     "seed_db": None, "grid_db": pred.output_db, "measured_db": res["output"]["snr_db"]})
        if preset == "int8":
            for l, row in enumerate(stats):
                for d, st in enumerate(row):
                    for name in (*seed.PRODUCTS, *SINGLE):
                        p = seed.tensor_snr_db(st, dict.fromkeys([*st, "one_minus_z"], 8), name)
                        m = res["tensors"][tensor_key(l, d, name)]["snr_db"]
                        decisions.append({"key": tensor_key(l, d, name), "predicted_db": p, "measured_db": m})
    return {"rows": rows, "decisions": decisions}


def fit(pred: np.ndarray, meas: np.ndarray) -> dict:
    err = pred - meas
    return {"n": int(pred.size), "pearson": float(np.corrcoef(pred, meas)[0, 1]) if pred.size > 2 else math.nan,
            "median_abs_error_db": float(np.median(np.abs(err))), "mean_error_db": float(np.mean(err)),
            "p90_abs_error_db": float(np.percentile(np.abs(err), 90))}


def compare(rows: list[dict], bits: int | None = None) -> dict:
    sel = [r for r in rows if r["tensor"] != "output" and (bits is None or r["bits"] == bits)]
    meas = np.array([r["measured_db"] for r in sel])
    return {k: fit(np.array([r[f"{k}_db"] for r in sel]), meas) for k in ("seed", "grid")}


def choose_threshold(decisions: list[dict]) -> dict:
    """The least T (0.5 dB steps) such that >= PRECISION of the decisions predicted above T
    measure at least REQUIRED dB; with the share of the safe decisions it admits (recall)."""
    p = np.array([d["predicted_db"] for d in decisions])
    m = np.array([d["measured_db"] for d in decisions])
    safe = m >= REQUIRED
    sweep = []
    for t in np.arange(np.floor(p.min()), np.ceil(p.max()) + 0.5, 0.5):
        above = p > t
        if above.sum() == 0:
            break
        sweep.append({"T": float(t), "int8": int(above.sum()), "precision": float(safe[above].mean()),
                      "recall": float((above & safe).sum() / max(safe.sum(), 1))})
    best = next((s for s in sweep if s["precision"] >= PRECISION), sweep[-1])
    return {"T": best["T"], "at_T": best, "sweep": sweep, "safe_share": float(safe.mean())}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--json", type=Path, default=ROOT / "benchmarks" / "out" / "advise_threshold.json")
    args = ap.parse_args()
    per_model, rows, decisions = {}, [], []
    for name, model_path, calib_path, test_path in all_models():
        res = measure_model(load_any_model(model_path), open_sequences(calib_path), open_sequences(test_path))
        per_model[name] = {"all": compare(res["rows"]), "int8": compare(res["rows"], 8),
                           "int16": compare(res["rows"], 16),
                           "output": [r for r in res["rows"] if r["tensor"] == "output"]}
        rows += res["rows"]
        decisions += [{**d, "model": name} for d in res["decisions"]]
        a = per_model[name]["all"]
        print(f"{name:24s} seed r={a['seed']['pearson']:.3f} |err| {a['seed']['median_abs_error_db']:.1f} dB  "
              f"grid r={a['grid']['pearson']:.3f} |err| {a['grid']['median_abs_error_db']:.1f} dB  outputs "
              + ", ".join(f"{o['bits']}: pred {o['grid_db']:.1f} meas {o['measured_db']:.1f}"
                          for o in per_model[name]["output"]))
    threshold = choose_threshold(decisions)
    pooled = {"all": compare(rows), "int8": compare(rows, 8), "int16": compare(rows, 16)}
    by_tensor = {t: compare([r for r in rows if r["tensor"] == t]) for t in sorted({r["tensor"] for r in rows})
                 if t != "output"}
    for k, v in pooled.items():
        print(f"pooled {k}: seed {v['seed']}, grid {v['grid']}")
    print(f"T = {threshold['T']} dB: {threshold['at_T']}")
    args.json.parent.mkdir(parents=True, exist_ok=True)
    args.json.write_text(json.dumps({"per_model": per_model, "pooled": pooled, "by_tensor": by_tensor,
                                     "threshold": threshold, "decisions": decisions, "rows": rows}, indent=1))
    print(f"-> {args.json}")


if __name__ == "__main__":
    main()
