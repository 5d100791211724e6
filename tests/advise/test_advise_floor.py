"""The advisor's searches start from the least flash they know: all-int8 with every unit whose
16 bits save flash on their own promoted (a whole model's relu reads a 16-bit input by a clamp,
with no table). A stand-in evaluator whose flash and SNR add up per unit makes the answers
exact: unit a saves 248 bytes and adds 0.5 dB, b costs 100 bytes for 6 dB, c 1,000 for 1 dB."""

from types import SimpleNamespace

import pytest

from qtool.advisor.search import UnitSearch
from qtool.errors import QtoolError

A, B, C = ("a", "activation"), ("b", "weight"), ("c", "weight")
COST, GAIN = {A: -248, B: 100, C: 1000}, {A: 0.5, B: 6.0, C: 1.0}


class Additive:
    def __init__(self):
        self.seen = {}

    def __call__(self, promoted):
        p = frozenset(promoted)
        return self.seen.setdefault(p, SimpleNamespace(promoted=p, flash=self.flash_only(p, None),
                                                       snr_db=30 + sum(GAIN[u] for u in p)))

    def flash_only(self, promoted, like):
        return 1000 + sum(COST[u] for u in promoted)


class Stand(UnitSearch):
    def _order(self):
        return [B, C, A]  # the saving unit last: only the floor brings it in early

    def least_important(self, promoted, free):
        return list(free)


def search() -> Stand:
    s = Stand(Additive(), [A, B, C])
    s.__dict__["w8a16"] = s.ev({A})
    return s


def test_a_target_above_all_int8_is_met_from_the_floor():
    got = search().for_target(33.0)
    assert got.promoted == {A, B} and got.flash == 852  # not {b} alone at 1,100 bytes


def test_a_target_all_int8_misses_and_the_floor_meets_is_the_floor():
    got = search().for_target(30.2)
    assert got.promoted == {A} and got.flash == 752


def test_a_budget_between_the_floor_and_all_int8_is_met():
    assert search().for_target(33.0, budget=900).flash == 852
    got = search().within(900)
    assert got.promoted == {A, B} and got.flash == 852


def test_a_budget_below_the_floor_is_refused_naming_it():
    with pytest.raises(QtoolError) as e:
        search().within(700)
    assert "below the all-int8 but 1 unit(s) that save flash at 16 bits flash (752 bytes)" in str(e.value)
