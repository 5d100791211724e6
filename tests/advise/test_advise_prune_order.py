"""The advisor's pruning must not depend on a frozenset's iteration order (PYTHONHASHSEED):
units tied in cost are tried in one fixed order, so the same command gives the same model."""

from types import SimpleNamespace

from qtool.advisor.search import Search


class Iterated(frozenset):
    """A frozenset that iterates in a chosen order, as another hash seed might."""

    def __new__(cls, items, reverse):
        s = super().__new__(cls, items)
        s.reverse = reverse
        return s

    def __iter__(self):
        return iter(sorted(frozenset.__iter__(self), reverse=self.reverse))


def test_prune_keeps_the_same_unit_whatever_the_set_order():
    a, b = (0, "h"), (0, "x")  # same flash cost: a tie the order used to break

    def ev(promoted):  # the target holds with either unit alone, not with none
        return SimpleNamespace(promoted=frozenset(promoted), snr_db=10.0 if promoted else 0.0,
                               flash=len(promoted))

    fake = SimpleNamespace(cost={a: 1, b: 1}, ev=ev, predicted_db=lambda promoted: 0.0)
    fake.least_important = lambda promoted, free: Search.least_important(fake, promoted, free)
    kept = set()
    for reverse in (False, True):
        cand = SimpleNamespace(promoted=Iterated({a, b}, reverse), snr_db=10.0, flash=2)
        kept.add(Search._prune(fake, cand, 5.0).promoted)
    assert len(kept) == 1 and len(next(iter(kept))) == 1
