"""The advisor's results as rich tables and as JSON-ready dicts."""

from __future__ import annotations

import math
from typing import TYPE_CHECKING

from rich.table import Table

if TYPE_CHECKING:
    from qtool.advisor.advise import Advice


def _db(v: float | None) -> str:
    if v is None or (isinstance(v, float) and math.isnan(v)):
        return "-"
    return "exact" if math.isinf(v) and v > 0 else f"{v:.1f}"  # as simulate says it


def tensor_table(advice: Advice, title: str) -> Table:
    """Per tensor: the SNR predicted on its grid, the measured one and the bits chosen (fits 80
    columns)."""
    t = Table(title=title)
    for c in ("layer", "tensor", "predicted", "measured", "bits", "method"):
        t.add_column(c, justify="left" if c in ("layer", "tensor", "method") else "right",
                     no_wrap=c in ("layer", "tensor"))
    for r in advice.rows:
        t.add_row(f"{r['layer']}.{r['direction']}", r["tensor"], _db(r["predicted_grid_db"]),
                  _db(r["measured_snr_db"]), str(r["bits"]), r["method"] or "",
                  style="bold" if r["bits"] == 16 else None)
    return t


def estimator_table(advice: Advice, title: str) -> Table:
    """Per tensor the estimator's statistics (`advise --verbose`): mean, deviation, largest
    magnitude M, the probabilities P0 of a zero at 8 and 16 bits, and the P_zero SNR prediction
    (a table of its own, so that both fit 80 columns)."""
    t = Table(title=title)
    for c in ("layer", "tensor", "mu", "sigma", "M", "P0 @8", "P0 @16", "P0 SNR"):
        t.add_column(c, justify="left" if c in ("layer", "tensor") else "right", no_wrap=True)
    for r in advice.rows:
        t.add_row(f"{r['layer']}.{r['direction']}", r["tensor"], f"{r['mu']:.2g}", f"{r['sigma']:.2g}",
                  f"{r['M']:.3g}", f"{r['p_zero_8']:.0e}", f"{r['p_zero_16']:.0e}", _db(r["predicted_seed_db"]))
    return t


def summary_line(advice: Advice) -> str:
    """The chosen configuration and the three presets, for a GRU alone or a whole model (which
    predicts no output SNR)."""
    c, predicted = advice.chosen, advice.predicted_output_db
    if not math.isnan(c.snr_db):
        snr = f"output SNR {c.snr_db:.2f} dB measured on {advice.measured_on}"
        snr += f" (predicted {predicted:.1f} dB)" if predicted is not None else ""
    elif predicted is not None:
        snr = f"output SNR {predicted:.1f} dB predicted (--eval TEST measures it)"
    else:
        snr = "output SNR not measured (--eval TEST measures it)"
    parts = [f"chosen: flash {c.flash:,} bytes, {snr}, {len(c.promoted)} of {advice.unit_count} units at 16 bits"]
    for name, p in advice.presets.items():
        snr = (f", {p['snr_db']:.2f} dB" if "snr_db" in p else
               f", {p['predicted_snr_db']:.1f} dB predicted" if "predicted_snr_db" in p else "")
        parts.append(f"all-{name}: {p['flash_bytes']:,} bytes{snr}")
    return "; ".join(parts)


def _searched(advice: Advice) -> str:
    """What the advisor decided by, and what that cost."""
    if advice.mode == "target":
        what = f"target {advice.target_db:g} dB"
    elif advice.mode == "budget":
        what = f"budget {advice.max_flash:,} bytes"
    else:
        what = f"the threshold rule, T = {advice.threshold_db:g} dB"
    return f"{what}: {advice.simulations} simulations in {advice.seconds:.1f} s"


def search_line(advice: Advice) -> str:
    c = advice.chosen
    if hasattr(c, "qm"):  # a GRU alone: auto's methods per tensor
        return f"{_searched(advice)}; methods: {c.qm.info.get('method')}"
    return f"{_searched(advice)}; method auto chose {c.methods()['winner'] or 'per-edge'}"


def unit_table(advice: Advice, title: str) -> Table:
    """A whole model's units: the SNR predicted at 8 bits, the measured SNR of the edge the unit
    sets, the bits chosen (fits 80 columns)."""
    t = Table(title=title)
    for c in ("layer", "tensor", "predicted @8", "measured", "bits"):
        t.add_column(c, justify="left" if c in ("layer", "tensor") else "right", overflow="fold")
    for r in advice.rows:
        t.add_row(r["layer"], r["tensor"], _db(r["predicted_int8_db"]), _db(r["measured_snr_db"]), str(r["bits"]),
                  style="bold" if r["bits"] == 16 else None)
    return t
