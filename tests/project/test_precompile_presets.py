"""`qtool precompile --preset P` repeated: each preset is compiled once, and the advisor's
kernels (compiled with every preset) only when every preset was asked for."""

from qtool.api import compiling as api  # the module whose calls are counted
from qtool.install.precompile import PRESETS
from qtool.install.precompile import precompile as compile_kernels


def _calls(monkeypatch) -> list:
    calls = []
    monkeypatch.setattr(api, "calibrate", lambda model, x, bits, method: calls.append(("calibrate", bits)))
    monkeypatch.setattr(api, "simulate", lambda qm, x, backend, mode: None)
    monkeypatch.setattr(api, "advise", lambda *a: calls.append(("advise", None)))
    return calls


def test_a_repeated_preset_is_compiled_once(monkeypatch):
    calls = _calls(monkeypatch)
    compile_kernels(("int8",) * len(PRESETS))
    assert calls == [("calibrate", "int8")] * 2  # the stacked and the bidirectional model, once


def test_every_preset_in_any_order_adds_the_advisor(monkeypatch):
    calls = _calls(monkeypatch)
    compile_kernels(tuple(reversed(PRESETS)))
    assert calls == [("calibrate", p) for p in reversed(PRESETS) for _ in range(2)] + [("advise", None)]
