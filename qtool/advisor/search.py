"""Decision and search: the threshold rule per tensor, and the least flash that reaches a measured
output SNR (or the best measured SNR within a flash budget).

Predictions order the candidates, simulation confirms them:
1. the presets int8 (nothing promoted), w8a16 and int16 (everything promoted) are measured;
2. the units are ordered greedily by predicted output-SNR gain (grid-aware prediction) per
   byte of flash they add (each unit's flash measured once by the C export), free units first;
3. the shortest prefix of that order that reaches the target is found by bisection, each step
   one simulation on the held-out data;
4. from the smallest-flash configuration measured to reach the target, every promoted unit is
   tried back at 8 bits, most expensive first, and stays there if the target still holds.
Every configuration is calibrated by `--method auto` (the same choice `qtool calibrate` makes).
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Callable
from dataclasses import dataclass
from functools import cached_property

import numpy as np

from qtool.advisor import pzero
from qtool.advisor.configs import (
    HIGH,
    LOW,
    Unit,
    all_units,
    bits_config,
    flash_bytes,
    layer_form,
    lut_bits_config,
    mixed_cells,
    unit_key,
    unit_of,
)
from qtool.advisor.predict import Predictor
from qtool.advisor.stats import Stats
from qtool.calibration.auto import AutoCalibrator, AutoChoice
from qtool.core.model import HASTE, CellForm, GruModel
from qtool.core.qmodel import QuantModel
from qtool.core.tensors import ACTIVATIONS
from qtool.errors import QtoolError
from qtool.io.files import SequenceData
from qtool.io.phases import phase
from qtool.numerics.float_gru import traced
from qtool.simulation.run import Simulation, float_output

WEIGHTS = ("W", "R", "weight")  # the units w8a16 keeps at 8 bits (a GRU's, a layer's)
FLOAT_CACHE = 256 << 20  # keep the float outputs of the evaluation data up to this size
# Tensors that are no operand of a product: the threshold rule's one-vector form decides them.
SINGLE = tuple(n for n in ACTIVATIONS if not any(n in ops for ops in pzero.PRODUCTS.values()))


def single(form: CellForm = HASTE) -> tuple[str, ...]:
    """SINGLE for a cell of this form (its traced tensors that are no operand of its products)."""
    if form.reset_after:
        return SINGLE
    return tuple(n for n in traced(form) if not any(n in ops for _, ops in pzero.products(form)))


@dataclass
class Candidate:
    promoted: frozenset[Unit]
    qm: QuantModel
    choice: AutoChoice
    flash: int
    snr_db: float  # measured output SNR on the evaluation data

    def methods(self) -> dict:
        """What auto chose for each tensor (`advise --json`'s methods)."""
        return self.choice.as_dict()


class Evaluator:
    """Builds a configuration (auto methods), counts its flash and measures its output SNR on
    the evaluation data; remembers every configuration it saw."""

    def __init__(self, ac: AutoCalibrator, data: SequenceData, info: dict, chunk: int = 256,
                 on_simulation: Callable[[int], None] | None = None) -> None:
        self.ac, self.data, self.info, self.chunk = ac, data, info, chunk
        self.seen: dict[frozenset[Unit], Candidate] = {}
        self.simulations = 0
        self.on_simulation = on_simulation
        size = data.num_sequences * data.shape[1] * ac.model.output_size * 4
        self._floats: dict[int, np.ndarray] | None = {} if size <= FLOAT_CACHE else None

    def __call__(self, promoted: frozenset[Unit]) -> Candidate:
        if promoted not in self.seen:
            qm, choice = self.ac.quantize(bits_config(self.ac.model, promoted), self.info)
            self.seen[promoted] = Candidate(promoted, qm, choice, flash_bytes(qm), self._snr(qm))
        return self.seen[promoted]

    def _snr(self, qm: QuantModel) -> float:
        phase(f"advise: simulating a configuration on the held-out data (simulation {self.simulations + 1})")
        sim = Simulation(qm, per_tensor=False, per_step=False)
        for start, x in self.data.chunks(self.chunk):
            y = None
            if self._floats is not None:
                if start not in self._floats:
                    self._floats[start] = float_output(qm, x)
                y = self._floats[start]
            sim.run_chunk(x, y)
        self.simulations += 1
        if self.on_simulation:
            self.on_simulation(self.simulations)
        return sim.output.snr_db

    def flash_only(self, promoted: frozenset[Unit], like: Candidate) -> int:
        """Flash of a configuration built with `like`'s methods (no choice, no simulation)."""
        qm = self.ac.build(bits_config(self.ac.model, promoted), like.choice.plan, {})
        return flash_bytes(qm)


def unit_snr(stats: Stats, model: GruModel | None = None) -> dict[Unit, float]:
    """Per unit, the lowest P_zero SNR (dB) at 8 bits of what it takes part in: each product
    whose operand it is (the product form), and each tensor that is no operand (one-vector form).
    The products and tensors are those of each layer's cell form (`model`; None: haste cells)."""
    out: dict[Unit, float] = {}

    def low(u: Unit | None, db: float) -> None:
        if u is not None:
            out[u] = min(out.get(u, np.inf), db)
    for l, row in enumerate(stats):
        form = HASTE if model is None else layer_form(model, l)
        for st in row:
            for _, operands in pzero.products(form):
                db = pzero.snr_db(*(pzero.p_zero(pzero.operand_stats(st, n), LOW) for n in operands))
                for n in operands:
                    low(unit_of(l, pzero.OPERAND_BITS.get(n, n), form), db)
            for n in single(form):
                low(unit_of(l, n, form), pzero.snr_db(pzero.p_zero(st[n], LOW)))
    return out


def threshold_rule(stats: Stats, threshold_db: float, model: GruModel | None = None) -> frozenset[Unit]:
    """The threshold rule (docs/advisor.md): a product whose predicted int8 SNR is at most T dB
    gets both its operands at 16 bits; every other tensor whose one-vector SNR at 8 bits is at
    most T too (`model`: its cells' forms; None: haste cells)."""
    return frozenset(u for u, db in unit_snr(stats, model).items() if db <= threshold_db)


class UnitSearch(ABC):
    """The target and budget searches over one evaluator (`ev(promoted)` builds and measures a
    configuration; `ev.flash_only` counts one's flash; `ev.seen` holds every one measured).
    A subclass says in which order units are promoted (`order`) and which promoted units that
    cost no flash matter least (`least_important`)."""

    def __init__(self, ev, units: list) -> None:
        self.ev, self.units = ev, units
        self.low = ev(frozenset())

    @cached_property
    def high(self):
        return self.ev(frozenset(self.units))

    @cached_property
    def w8a16(self):
        return self.ev(frozenset(u for u in self.units if u[1] not in WEIGHTS))

    @cached_property
    def cost(self) -> dict:
        """Flash each unit adds on its own to the all-int8 model."""
        return {u: self.ev.flash_only(frozenset([u]), self.low) - self.low.flash for u in self.units}

    @cached_property
    def floor(self):
        """The least flash the searches start from: all int8, but the units whose promotion on
        its own saves flash at 16 bits (a relu on a 16-bit input keeps no table) promoted."""
        saving = frozenset(u for u in self.units if self.cost[u] < 0)
        floor = self.ev(saving) if saving else self.low
        return floor if floor.flash < self.low.flash else self.low  # counted on its own grids: less

    @cached_property
    def order(self) -> list:
        """Units in the order the searches promote them."""
        return self._order()

    @abstractmethod
    def _order(self) -> list:
        """The promotion order (computed once, by `order`)."""

    @abstractmethod
    def least_important(self, promoted: frozenset, free: list) -> list:
        """`free` (promoted units that cost no flash), the least important first."""

    def passing(self, target_db: float) -> list:
        return [c for c in self.ev.seen.values() if c.snr_db >= target_db]

    def check_budget(self, budget: int) -> None:
        """Refuse at once a budget below the floor's flash, the least any configuration needs."""
        if budget < self.floor.flash:
            which = "all-int8" if self.floor is self.low else (
                f"all-int8 but {len(self.floor.promoted)} unit(s) that save flash at 16 bits")
            raise QtoolError(f"`max_flash` {budget:,} bytes is below the {which} flash "
                             f"({self.floor.flash:,} bytes), the least any configuration needs")

    def for_target(self, target_db: float, budget: int | None = None) -> Candidate:
        """The least flash whose measured SNR reaches `target_db`; an error if that is above
        `budget` (checked first against the all-int8 flash, before any search)."""
        if budget is not None:
            self.check_budget(budget)
        chosen = self._for_target(target_db)
        if budget is not None and chosen.flash > budget:
            raise QtoolError(f"reaching {target_db:g} dB needs {chosen.flash:,} bytes of flash, above "
                             f"`max_flash` {budget:,}")
        return chosen

    def _for_target(self, target_db: float) -> Candidate:
        ev, base = self.ev, self.floor.promoted
        reach = [c for c in (self.floor, self.low) if c.snr_db >= target_db]
        if reach:  # the floor has more bits and less flash
            return reach[0]
        best = max([self.high, *ev.seen.values()], key=lambda c: c.snr_db)
        if best.snr_db < target_db:
            raise QtoolError(f"no configuration reaches {target_db:g} dB on the evaluation data: the "
                             f"best measured is {best.snr_db:.2f} dB ({len(best.promoted)} tensors at "
                             f"16 bits, flash {best.flash:,} bytes)")
        lo, hi = 0, len(self.order)  # prefix lengths on the floor: lo misses (the floor), hi reaches (int16)
        while hi - lo > 1:
            mid = (lo + hi) // 2
            if ev(base | frozenset(self.order[:mid])).snr_db >= target_db:
                hi = mid
            else:
                lo = mid
        presets = [self.w8a16]  # a preset may reach the target with less flash than the prefix
        start = min(self.passing(target_db) + [c for c in presets if c.snr_db >= target_db],
                    key=lambda c: (c.flash, len(c.promoted)))
        return self._prune(start, target_db)

    def _prune(self, cand: Candidate, target_db: float) -> Candidate:
        """Units back to 8 bits while the target holds: each unit that costs flash on its own,
        most expensive first; then the free ones, least important (by prediction) first, as
        many as a bisection finds the target allows."""
        # sorted(cand.promoted): a frozenset iterates in PYTHONHASHSEED order, and ties in cost
        # (or in loss below) would make the chosen model differ from one run to the next
        promoted = sorted(cand.promoted, key=unit_key)
        for u in sorted((u for u in promoted if self.cost[u] > 0), key=lambda u: -self.cost[u]):
            trial = self.ev(cand.promoted - {u})
            if trial.snr_db >= target_db and trial.flash <= cand.flash:
                cand = trial
        free = self.least_important(cand.promoted,
                                    [u for u in sorted(cand.promoted, key=unit_key) if self.cost[u] <= 0])
        ok, bad = 0, len(free) + 1  # dropping the first `ok` keeps the target; `bad` does not
        while bad - ok > 1:
            mid = (ok + bad) // 2
            trial = self.ev(cand.promoted - frozenset(free[:mid]))
            if trial.snr_db >= target_db and trial.flash <= cand.flash:
                ok = mid
            else:
                bad = mid
        return self.ev(cand.promoted - frozenset(free[:ok]))

    def within(self, budget: int) -> Candidate:
        """The best measured SNR with flash at most `budget`: the order's longest prefix that
        fits, the order filled greedily with every unit that still fits, and the presets."""
        self.check_budget(budget)
        base = sorted(self.floor.promoted, key=unit_key)
        prefix, fill, spent, blocked = list(base), list(base), self.floor.flash, False
        for u in (u for u in self.order if u not in self.floor.promoted):
            fits = spent + max(self.cost[u], 0) <= budget
            if fits:
                fill.append(u)
                spent += max(self.cost[u], 0)
            blocked = blocked or not fits
            if not blocked:
                prefix.append(u)
        for units in (prefix, fill):
            units = list(units)
            while units and self.ev(frozenset(units)).flash > budget:  # the estimate was short
                units.remove(max(units, key=lambda u: self.cost[u]))
            self.ev(frozenset(units))
        fitting = [c for c in self.ev.seen.values() if c.flash <= budget]
        return max(fitting, key=lambda c: (c.snr_db, -c.flash))


class Search(UnitSearch):
    """The GRU's searches, ordered by the grid-aware prediction (docs/advisor.md)."""

    def __init__(self, ev: Evaluator, predictor: Predictor) -> None:
        self.pr = predictor
        super().__init__(ev, all_units(ev.ac.model))

    @cached_property
    def cross(self) -> dict[tuple[int, int], QuantModel]:
        """Models with every LUT input on one width and its output on the other."""
        model = self.ev.ac.model
        return {(b, LOW + HIGH - b): self.ev.ac.build(bits_config(model, lut_bits_config(model, b)),
                                                      (self.low if b == LOW else self.high).choice.plan, {})
                for b in (LOW, HIGH)}

    def predicted_db(self, promoted: frozenset[Unit]) -> float:
        return self.pr.grid(mixed_cells(self.low.qm, self.high.qm, promoted, self.cross))[1]

    def _order(self) -> list[Unit]:
        """Greedy on predictions: next, the unit with the most predicted dB per byte (free
        units count as 1% of the int8 flash)."""
        c0 = 0.01 * self.low.flash
        chosen: list[Unit] = []
        rest = list(self.units)
        current = self.predicted_db(frozenset())
        while rest:
            gains = {u: self.predicted_db(frozenset(chosen + [u])) - current for u in rest}
            best = max(rest, key=lambda u: gains[u] / (max(self.cost[u], 0) + c0))
            chosen.append(best)
            rest.remove(best)
            current += gains[best]
        return chosen

    def least_important(self, promoted: frozenset[Unit], free: list[Unit]) -> list[Unit]:
        full = self.predicted_db(promoted)
        loss = {u: full - self.predicted_db(promoted - {u}) for u in free}
        return sorted(free, key=lambda u: loss[u])
