"""The precision estimator (docs/advisor.md) on every tensor of the tensor table: observers for
the traced tensors of each cell's form (fed by calibration's float pass) and the same estimator
run once over the weights."""

from __future__ import annotations

from qtool.calibration.observe import Observers
from qtool.calibrators.sampled import GAMMA, BulkStats, K, SampledStatsObserver, observer_seed
from qtool.core.model import GruModel
from qtool.numerics.float_gru import traced

Stats = list[list[dict[str, BulkStats]]]  # stats[l][d][tensor]


def new_estimators(model: GruModel, seed: int = 0, gamma: float = GAMMA, k: int = K) -> Observers:
    """One estimator per traced tensor of every cell, each with its own random stream."""
    return [[{n: SampledStatsObserver(gamma, k, observer_seed(seed, f"{l}.{d}.{n}")) for n in traced(cell.form)}
             for d, cell in enumerate(cells)] for l, cells in enumerate(model.layers)]


def model_stats(model: GruModel, obs: Observers, seed: int = 0, gamma: float = GAMMA, k: int = K) -> Stats:
    """The estimates of every tensor of the tensor table: the traced ones from `obs`, the
    weights and biases from one pass over their values. The backward direction reads the same
    inputs as the forward one."""
    out: Stats = []
    for l, cells in enumerate(model.layers):
        row = []
        for d, cell in enumerate(cells):
            st = {n: o.stats() for n, o in obs[l][d].items() if not o.empty}
            for name in ("W", "R", "bx", "br"):
                o = SampledStatsObserver(gamma, k, observer_seed(seed, f"{l}.{d}.{name}"))
                o.observe(getattr(cell, name))
                st[name] = o.stats()
            row.append(st)
        for st in row[1:]:
            st.setdefault("x", row[0]["x"])
        out.append(row)
    return out
