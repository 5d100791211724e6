"""The advisor's experiment: predicted against measured per-tensor SNR, and the threshold rule's T.

On the bundled sample and the five GRUs of advise_models.py, each calibrated (method auto) to
int8 and to int16: the P_zero prediction and the grid-aware prediction of every tensor against
the SNR `qtool simulate` measures on the held-out test data. Then the threshold rule: each of its
decisions (a product, or a tensor outside products) is measured alone, its operands (or the
tensor) at int8 and everything else at int16, and its predicted int8 SNR set against the SNR
of the product's output (or the tensor); "safe" is at least REQUIRED dB ("signal
energy 100x the noise"), and T is where the rule agrees most often with the measurement.

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

from qtool.advisor import pzero  # noqa: E402
from qtool.advisor.configs import all_units, bits_config, unit_of  # noqa: E402
from qtool.advisor.predict import Predictor  # noqa: E402
from qtool.advisor.search import SINGLE  # noqa: E402
from qtool.advisor.stats import model_stats, new_estimators  # noqa: E402
from qtool.api import load_model  # noqa: E402
from qtool.calibration.auto import AutoCalibrator  # noqa: E402
from qtool.core.model import GruModel  # noqa: E402
from qtool.core.tensors import BitsConfig, preset_config  # noqa: E402
from qtool.io.files import open_sequences  # noqa: E402
from qtool.simulation.run import simulate, tensor_key  # noqa: E402

REQUIRED = 20.0   # dB: "safe" (signal energy 100x the noise)


def measure_model(model: GruModel, calib, test, seed_value: int = 0) -> dict:
    """Per-tensor rows (bits, key, seed: the P_zero prediction, grid, measured) of the int8 and
    int16 presets, and the threshold rule's decisions, each measured alone: its operands (or
    tensor) at int8, the rest int16."""
    ac = AutoCalibrator(model, calib, calib.num_sequences, extra=[lambda: new_estimators(model, seed_value)])
    stats = model_stats(model, ac.extra_sets[0], seed_value)
    pr = Predictor(model, stats, calib.shape[1], ac.all_views.hist)
    rows, decisions = [], []
    plans = {}
    for preset in ("int8", "int16"):
        qm, choice = ac.quantize(BitsConfig(preset_config(preset)), {})
        plans[preset] = choice.plan
        pred = pr.predict(qm.cells)
        res = simulate(qm, test, 256, True).results()
        for (l, d, name), g in pred.grid_db.items():
            m = res["tensors"].get(tensor_key(l, d, name), {}).get("snr_db")
            if name in ("bx", "br") or m is None or not math.isfinite(m):
                continue  # 32-bit biases; inputs that the grid holds exactly measure inf
            rows.append({"bits": 8 if preset == "int8" else 16, "tensor": name, "key": tensor_key(l, d, name),
                         "pzero_db": pred.pzero_db[(l, d, name)], "grid_db": g, "measured_db": m})
        rows.append({"bits": 8 if preset == "int8" else 16, "tensor": "output", "key": "output",
                     "pzero_db": None, "grid_db": pred.output_db, "measured_db": res["output"]["snr_db"]})
    units = frozenset(all_units(model))
    for l in range(model.num_layers):
        for name in (*pzero.PRODUCTS, *SINGLE):
            operands = [pzero.OPERAND_BITS.get(n, n) for n in pzero.PRODUCTS.get(name, (name,))]
            alone = units - {unit_of(l, n) for n in operands}
            qm = ac.build(bits_config(model, alone), plans["int8"], {})
            res = simulate(qm, test, 256, True).results()
            for d, st in enumerate(stats[l]):
                p = pzero.tensor_snr_db(st, dict.fromkeys([*st, "one_minus_z"], 8), name)
                decisions.append({"key": tensor_key(l, d, name), "predicted_db": p,
                                  "measured_db": res["tensors"][tensor_key(l, d, name)]["snr_db"]})
    return {"rows": rows, "decisions": decisions}


def fit(pred: np.ndarray, meas: np.ndarray) -> dict:
    err = pred - meas
    return {"n": int(pred.size), "pearson": float(np.corrcoef(pred, meas)[0, 1]) if pred.size > 2 else math.nan,
            "median_abs_error_db": float(np.median(np.abs(err))), "mean_error_db": float(np.mean(err)),
            "p90_abs_error_db": float(np.percentile(np.abs(err), 90))}


def compare(rows: list[dict], bits: int | None = None) -> dict:
    sel = [r for r in rows if r["tensor"] != "output" and (bits is None or r["bits"] == bits)]
    meas = np.array([r["measured_db"] for r in sel])
    # "seed": the P_zero prediction each row holds as pzero_db
    return {k: fit(np.array([r[f"{row}_db"] for r in sel]), meas) for k, row in (("seed", "pzero"), ("grid", "grid"))}


def choose_threshold(decisions: list[dict]) -> dict:
    """The T (0.5 dB steps) at which the threshold rule agrees most often with the measurement:
    int8 (predicted above T) where the decision measures at least REQUIRED dB alone, int16
    where it does not; with the share of int8 decisions that are safe (precision) and the
    share of the safe ones kept at int8 (recall)."""
    p = np.array([d["predicted_db"] for d in decisions])
    m = np.array([d["measured_db"] for d in decisions])
    safe = m >= REQUIRED
    sweep = []
    for t in np.arange(np.floor(p.min()) - 0.5, np.ceil(p.max()) + 0.5, 0.5):
        above = p > t
        sweep.append({"T": float(t), "int8": int(above.sum()), "agreement": float(np.mean(above == safe)),
                      "precision": float(safe[above].mean()) if above.any() else 1.0,
                      "recall": float((above & safe).sum() / max(safe.sum(), 1))})
    best = max(sweep, key=lambda s: s["agreement"])  # the first (lowest T) of equals
    return {"T": best["T"], "at_T": best, "sweep": sweep, "safe_share": float(safe.mean()),
            "pearson": float(np.corrcoef(p, m)[0, 1]), "median_abs_error_db": float(np.median(np.abs(p - m)))}


def markdown(per_model: dict, pooled: dict, by_tensor: dict, threshold: dict) -> str:
    """The tables of docs/advisor.md."""
    def cells(f: dict) -> str:
        return (f"{f['pearson']:.2f} | {f['median_abs_error_db']:.1f} | {f['mean_error_db']:+.1f} | "
                f"{f['p90_abs_error_db']:.1f}")

    out = ["| model | bits | tensors | seed: r | median abs err dB | mean err dB | p90 abs err dB | "
           "grid: r | median abs err dB | mean err dB | p90 abs err dB | output SNR predicted / measured |",
           "|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for name, m in per_model.items():
        for bits in ("int8", "int16"):
            o = next(r for r in m["output"] if r["bits"] == int(bits[3:]))
            out.append(f"| {name} | {bits} | {m[bits]['seed']['n']} | {cells(m[bits]['seed'])} | "
                       f"{cells(m[bits]['grid'])} | {o['grid_db']:.1f} / {o['measured_db']:.1f} |")
    for k, v in pooled.items():
        out.append(f"| **all models** | {k} | {v['seed']['n']} | {cells(v['seed'])} | {cells(v['grid'])} | |")
    out += ["", "| tensor | seed: r | median abs err dB | mean err dB | p90 | grid: r | median abs err dB | "
            "mean err dB | p90 |", "|---|---|---|---|---|---|---|---|---|"]
    for t, v in by_tensor.items():
        out.append(f"| {t} | {cells(v['seed'])} | {cells(v['grid'])} |")
    out += ["", f"| T (dB) | decisions kept int8 (of {threshold['decisions']}) | "
            "agreement with the measurement | int8 ones measuring >= "
            f"{REQUIRED:g} dB | safe ones kept int8 |", "|---|---|---|---|---|"]
    for s in threshold["sweep"]:
        if s["T"] % 4 == 0 or s["T"] == threshold["T"]:
            bold = "**" if s["T"] == threshold["T"] else ""
            out.append(f"| {bold}{s['T']:g}{bold} | {s['int8']} | {s['agreement']:.2f} | {s['precision']:.2f} | "
                       f"{s['recall']:.2f} |")
    return "\n".join(out)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--json", type=Path, default=ROOT / "benchmarks" / "out" / "advise_threshold.json")
    ap.add_argument("--models", default=None, help="comma-separated names (default: all of advise_models.py)")
    args = ap.parse_args()
    per_model, rows, decisions = {}, [], []
    for name, model_path, calib_path, test_path in all_models(names=args.models.split(",") if args.models else None):
        res = measure_model(load_model(model_path), open_sequences(calib_path), open_sequences(test_path))
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
    threshold = {**choose_threshold(decisions), "decisions": len(decisions)}
    pooled = {"all": compare(rows), "int8": compare(rows, 8), "int16": compare(rows, 16)}
    by_tensor = {t: compare([r for r in rows if r["tensor"] == t]) for t in sorted({r["tensor"] for r in rows})
                 if t != "output"}
    for k, v in pooled.items():
        print(f"pooled {k}: seed {v['seed']}, grid {v['grid']}")
    print(f"T = {threshold['T']} dB: {threshold['at_T']}")
    print(markdown(per_model, pooled, by_tensor, threshold))
    args.json.parent.mkdir(parents=True, exist_ok=True)
    args.json.write_text(json.dumps({"per_model": per_model, "pooled": pooled, "by_tensor": by_tensor,
                                     "threshold": threshold, "decisions": decisions, "rows": rows}, indent=1))
    print(f"-> {args.json}")


if __name__ == "__main__":
    main()
