"""The advisor's cost and results.

1. Speed: `advise` without a target (the threshold rule) against one `calibrate` (method auto,
   writing the model file) on the same data, in-process, repeated; the ratio per run.
2. Search: for each model and target, `advise --target-snr X --eval TEST` (time, simulations,
   chosen flash), then the bits file re-run independently through `calibrate --bits` and
   `simulate`, against the presets' flash and SNR (calibrated by the default method auto).

    python benchmarks/bench_advise.py [--repeat 5] [--targets 30,35,40,50,60]   # needs torch
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "benchmarks"))

from advise_models import all_models  # noqa: E402

from qtool import api  # noqa: E402
from qtool.api import load_model  # noqa: E402
from qtool.errors import QtoolError  # noqa: E402
from qtool.io.files import open_sequences  # noqa: E402


def speed(model_path: Path, calib_path: Path, repeat: int, limit: int | None = None) -> dict:
    """`api.calibrate` + `api.save` (what `qtool calibrate` does) against `api.advise` with no
    target, alternating, the first round left out (it compiles and warms caches)."""
    model, data = load_model(model_path), open_sequences(calib_path)
    cal, adv = [], []
    with tempfile.TemporaryDirectory() as tmp:
        for _ in range(repeat + 1):
            t0 = time.perf_counter()
            api.save(api.calibrate(model, data, limit=limit), Path(tmp) / "q.h5", force=True)
            t1 = time.perf_counter()
            api.advise(model, data, limit=limit)
            t2 = time.perf_counter()
            cal.append(t1 - t0)
            adv.append(t2 - t1)
    ratios = [a / c for a, c in zip(adv[1:], cal[1:])]
    return {"calibrate_s": cal[1:], "advise_s": adv[1:], "ratio": ratios,
            "ratio_of_best": min(adv[1:]) / min(cal[1:])}


def qtool(*args: str) -> dict:
    p = subprocess.run([sys.executable, "-m", "qtool.cli", *args, "--json"], capture_output=True, text=True)
    if p.returncode:
        raise SystemExit(f"qtool {' '.join(args)}: {p.stderr.strip()}")
    return json.loads(p.stdout)


def search(model_path: Path, calib: Path, test: Path, target: float, tmp: Path, limit: int | None = None) -> dict:
    """One search, and its bits file re-run by separate processes."""
    model, data, ev = load_model(model_path), open_sequences(calib), open_sequences(test)
    t0 = time.perf_counter()
    try:
        adv = api.advise(model, data, ev, target_snr=target, limit=limit)
    except QtoolError as e:  # an unreachable target: the row says so
        return {"target": target, "error": str(e)}
    seconds = time.perf_counter() - t0
    bits = tmp / f"bits_{target:g}.toml"
    bits.write_text(adv.bits_toml)
    q = tmp / f"q_{target:g}.h5"
    qtool("calibrate", str(model_path), str(calib), "--bits", str(bits), "-o", str(q), "--force",
          *(("--limit", str(limit)) if limit else ()))
    sim = qtool("simulate", str(q), str(test), "--no-per-tensor")
    flash = qtool("export", "c", str(q), "-o", str(tmp / f"c_{target:g}"), "--force")["flash_bytes"]
    return {"target": target, "seconds": seconds, "simulations": adv.simulations,
            "flash_bytes": adv.chosen.flash, "snr_db": adv.chosen.snr_db, "rerun_snr_db": sim["output"]["snr_db"],
            "rerun_flash_bytes": flash, "int16_tensors": len(adv.chosen.promoted), "presets": adv.presets}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--repeat", type=int, default=5)
    ap.add_argument("--targets", default="30,35,40,50,60")
    ap.add_argument("--models", default="digits (sample),trained-2x96-relu")
    ap.add_argument("--limit", type=int, default=None, help="calibrate on the first N sequences (default: all)")
    ap.add_argument("--json", type=Path, default=ROOT / "benchmarks" / "out" / "bench_advise.json")
    args = ap.parse_args()
    models = {name: paths for name, *paths in all_models(names=args.models.split(","))}
    out: dict = {"speed": {}, "search": {}}
    for name, (model, calib, _test) in models.items():
        s = speed(model, calib, args.repeat, args.limit)
        out["speed"][name] = s
        print(f"{name}: calibrate {min(s['calibrate_s']):.2f}-{max(s['calibrate_s']):.2f} s, advise (rule) "
              f"{min(s['advise_s']):.2f}-{max(s['advise_s']):.2f} s, ratio per run "
              f"{min(s['ratio']):.2f}-{max(s['ratio']):.2f}, best/best {s['ratio_of_best']:.2f}")
    with tempfile.TemporaryDirectory() as tmp:
        for name, (model, calib, test) in models.items():
            rows = []
            for target in (float(t) for t in args.targets.split(",")):
                r = search(model, calib, test, target, Path(tmp), args.limit)
                rows.append(r)
                if "error" in r:
                    print(f"{name} target {target:g}: {r['error']}")
                    continue
                p = r["presets"]
                print(f"{name} target {target:g} dB: flash {r['flash_bytes']:,} B, SNR {r['snr_db']:.2f} dB "
                      f"(re-run {r['rerun_snr_db']:.2f} dB, {r['rerun_flash_bytes']:,} B), "
                      f"{r['int16_tensors']} tensors at 16 bits, {r['simulations']} simulations, "
                      f"{r['seconds']:.1f} s; presets " + ", ".join(
                          f"{k} {v['flash_bytes']:,} B {v['snr_db']:.2f} dB" for k, v in p.items()))
            out["search"][name] = rows
    args.json.parent.mkdir(parents=True, exist_ok=True)
    args.json.write_text(json.dumps(out, indent=1))
    print(f"-> {args.json}")


if __name__ == "__main__":
    main()
