"""The written orders (qtool.core.tensors' cell and parameter orders, the statistics columns) and
the copies that cannot be derived from them: index constants, the C runtime's enum."""

import re

import numpy as np
from qtool.exporters.c_source import RUNTIME

from qtool.core.tensors import ACTIVATIONS, CELL_OUTPUTS, CELL_TRACE, CHANNEL_ROWS, COMPUTED, NAMES, PARAMS
from qtool.engine import metrics
from qtool.engine.layout import MEASURED, ROW_TENSOR, ROWS
from qtool.numerics import rescale


def test_the_table_lists_the_cell_in_its_order():
    """TENSORS names the cell's tensors once each, in gru_cell's order (h, an input too, second)."""
    assert set(CELL_OUTPUTS) <= set(NAMES) and len(CELL_OUTPUTS) == len(set(CELL_OUTPUTS))
    assert ACTIVATIONS == ("x", "h", *(n for n in COMPUTED if n != "h"))
    # the engines read h as the cell's last output (the last row of their buffers)
    assert CELL_TRACE[-1] == "h" and MEASURED[ROW_TENSOR[ROWS - 1]] == "h"


def test_rescale_index_constants_follow_params():
    for i, name in enumerate(PARAMS):
        assert getattr(rescale, name.upper()) == i, name
    for i, name in enumerate(CHANNEL_ROWS):
        assert getattr(rescale, "CH_" + name.upper()) == i, name


def test_c_runtime_enum_is_params():
    src = (RUNTIME / "qgru.h").read_text()
    body = re.search(r"enum\s*{([^}]*)}", src).group(1)
    names = [n for n in re.split(r"[\s,]+", re.sub(r"/\*.*?\*/", "", body, flags=re.S)) if n]
    assert names == [f"QGRU_{p.upper()}" for p in PARAMS] + ["QGRU_NUM_PARAMS"]
    assert "CH_" not in src  # the channel rows are the cell struct's fields, by name (NAME_params.h)


def test_stat_and_grid_columns_are_named():
    for i, c in enumerate(metrics.STATS):
        assert getattr(metrics, "STAT_" + c.upper()) == i, c
    for i, c in enumerate(metrics.GRID):
        assert getattr(metrics, "GRID_" + c.upper()) == i, c
    row = np.arange(1.0, len(metrics.STATS) + 1)
    d = metrics.Distance.of_stats([row, row])
    assert set(vars(d)) == set(metrics.STATS)
    for i, c in enumerate(metrics.STATS):
        assert getattr(d, c) == (row[i] if c == "max_abs" else 2 * row[i]), c
