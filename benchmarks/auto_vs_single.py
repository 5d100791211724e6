"""`calibrate` with no --method (auto) against every single method, on held-out test data.

For each model and preset: the output SNR on the test data of minmax, ema, percentile, mse and kl
(one float pass, as `calibrate --compare`) and of auto (as `calibrate` with no --method).

    python benchmarks/auto_vs_single.py [--models NAME,...] [--presets int8,int16]   # needs torch
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "benchmarks"))

from advise_models import all_models  # noqa: E402
from qtool.calibrators import METHODS  # noqa: E402

from qtool.api import load_model  # noqa: E402
from qtool.calibration.auto import calibrate_auto  # noqa: E402
from qtool.calibration.observe import MethodPlan, build_quant_model, collect_many  # noqa: E402
from qtool.core.tensors import BitsConfig, preset_config  # noqa: E402
from qtool.io.files import open_sequences  # noqa: E402
from qtool.simulation.run import simulate  # noqa: E402


def scores(model_path: Path, calib_path: Path, test_path: Path, preset: str) -> dict:
    model, calib, test = load_model(model_path), open_sequences(calib_path), open_sequences(test_path)
    config = BitsConfig(preset_config(preset))
    n = calib.num_sequences
    plans = [MethodPlan.from_config(config, m) for m in METHODS]
    out = {}
    for plan, obs in zip(plans, collect_many(model, calib, plans, 64, n)):
        qm = build_quant_model(model, obs, config, {}, plan)
        out[plan.activations] = simulate(qm, test, 256, False).output.snr_db
    qm, choice = calibrate_auto(model, calib, n, config)
    out["auto"] = simulate(qm, test, 256, False).output.snr_db
    out["auto_choice"] = choice.winner
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--models", default="digits (sample),trained-2x96-relu,rand-bi2x48-student,"
                                        "trained-3x64-laplace")
    ap.add_argument("--presets", default="int8,int16")
    ap.add_argument("--json", type=Path, default=ROOT / "benchmarks" / "out" / "auto_vs_single.json")
    args = ap.parse_args()
    rows = []
    for name, model, calib, test in all_models(names=args.models.split(",")):
        for preset in args.presets.split(","):
            s = scores(model, calib, test, preset)
            best = max(METHODS, key=lambda m: s[m])
            rows.append({"model": name, "preset": preset, **s, "best_single": best})
            print(f"| {name} | {preset} | " + " | ".join(f"{s[m]:.2f}" for m in METHODS)
                  + f" | **{s['auto']:.2f}** ({s['auto_choice']}) | {s['auto'] - s[best]:+.2f} vs {best} |")
    args.json.parent.mkdir(parents=True, exist_ok=True)
    args.json.write_text(json.dumps(rows, indent=1))


if __name__ == "__main__":
    main()
