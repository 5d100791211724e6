"""Result tables stay readable at 80 columns (a pipe, CI log or default terminal): tensor names
are printed whole, never cut to 'layer0.fw…'."""

import io

from rich.console import Console

from qtool.report import both_table


def _render(table) -> str:
    console = Console(width=80, file=io.StringIO())
    console.print(table)
    return console.file.getvalue()


def test_both_table_keeps_tensor_names_whole_at_80_columns():
    names = [f"layer{layer}.bwd.{t}" for layer in (0, 1) for t in ("h", "old_contrib", "Rh_add_br")]
    integer = {"snr_db": 23.38, "exact": False}
    fake = {"snr_db": 29.38, "exact": False}
    results = {"output": integer, "tensors": {n: integer for n in names},
               "fakequant": {"output": fake, "tensors": {n: fake for n in names},
                             "agreement": {n: {"identical": 0.5, "max_lsb": 4} for n in ["output", *names]}}}
    text = _render(both_table(results, "integer and fake-quant vs float"))
    lines = text.splitlines()
    assert all(len(line) <= 80 for line in lines)
    for name in names:
        assert any(f"│ {name} " in line for line in lines), name
    assert "…" not in text
