"""The space the advisor searches: per layer, each tensor of the layer's cell form's tensor table
(biases stay 32-bit) is int8 or int16. A configuration is the set of (layer, tensor) units
promoted to 16 bits; its flash is what `qtool export c` counts for it.

A cell's form (qtool.core.model.CellForm) sets its tensors: a reset-before cell has rh for
Rh_add_br and rRh. A relu or linear candidate's g_out shares g_pre's grid, bits included
(qtool.calibration.observe._tied), so it is no unit of its own: g_pre's unit sets both."""

from __future__ import annotations

from dataclasses import replace

from qtool.core.model import HASTE, CellForm, GruModel
from qtool.core.qmodel import CellQuant, QuantModel
from qtool.core.tensors import BY_NAME, NAMES, BitsConfig, TensorConfig, cell_names, preset_config
from qtool.exporters.c_export import footprint
from qtool.numerics.lut import GATES

Unit = tuple[int, str]
UNIT_NAMES = tuple(n for n in NAMES if BY_NAME[n].kind != "bias")  # the haste cell's
LOW, HIGH = 8, 16
TIED = {"g_out": "g_pre"}  # a relu or linear candidate's: the tensor -> the tensor whose grid it takes


def tied(form: CellForm) -> bool:
    """Whether g_out shares g_pre's grid (a relu or linear candidate)."""
    return form.candidate in ("relu", "linear")


def unit_names(form: CellForm = HASTE) -> tuple[str, ...]:
    """The tensors of a cell of this form whose bits the advisor chooses."""
    if form.haste:
        return UNIT_NAMES
    return tuple(n for n in cell_names(form) if BY_NAME[n].kind != "bias" and not (tied(form) and n in TIED))


def layer_form(model: GruModel, l: int) -> CellForm:
    return model.layers[l][0].form


def all_units(model: GruModel) -> list[Unit]:
    """Every (layer, tensor) that can change bits; the x of layer l > 0 is the h of layer l - 1."""
    return [(l, n) for l in range(model.num_layers) for n in unit_names(layer_form(model, l))
            if n != "x" or l == 0]


def unit_of(l: int, name: str, form: CellForm = HASTE) -> Unit | None:
    """The unit that sets a tensor's bits (None for the 32-bit biases)."""
    if BY_NAME[name].kind == "bias":
        return None
    if tied(form) and name in TIED:
        return (l, TIED[name])
    return (l - 1, "h") if name == "x" and l > 0 else (l, name)


def tied_layers(model: GruModel) -> frozenset[int]:
    return frozenset(l for l in range(model.num_layers) if tied(layer_form(model, l)))


def unit_key(u: tuple) -> tuple:
    """A sort key for units of a GRU, (layer, tensor), and of a whole model's other layers,
    (name, "weight" or "activation"): the GRU's first, each kind in its natural order."""
    return (isinstance(u[0], str), u[0], u[1])


def bits_config(model: GruModel | None, promoted: frozenset[Unit], tied_at: frozenset[int] | None = None
                ) -> BitsConfig:
    """int8 everywhere, 16 bits on the promoted units. In the layers `tied_at` (default: those of
    `model` whose g_out is tied to g_pre) a tied tensor follows its unit, so that the file says
    the bits the cell has."""
    tied_at = (tied_layers(model) if model is not None else frozenset()) if tied_at is None else tied_at
    layers: dict[int, dict[str, TensorConfig]] = {}
    for l, name in promoted:
        layers.setdefault(l, {})[name] = TensorConfig(HIGH, BY_NAME[name].symmetric)
        for t, unit in TIED.items():
            if l in tied_at and name == unit:
                layers[l][t] = TensorConfig(HIGH, BY_NAME[t].symmetric)
    return BitsConfig(preset_config("int8"), layers)


def flash_bytes(qm: QuantModel) -> int:
    """Flash of the exported C (weights, biases, tables, shifts, compensation, parameters), as
    `qtool export c` counts it with its default options; computed, nothing rendered or written."""
    return footprint(qm).flash_bytes


def mixed_cells(low: QuantModel, high: QuantModel, promoted: frozenset[Unit],
                cross: dict[tuple[int, int], QuantModel]) -> list[list[CellQuant]]:
    """Cells whose grids, weights and LUT errors come from `high` for the promoted units and
    from `low` elsewhere: what the predictions read for a config not built yet. A LUT input's
    grid also depends on its output's bits (its saturation bound): `cross[(in_bits, out_bits)]`
    holds models built with those bits on every LUT."""
    out = []
    for l, row in enumerate(low.cells):
        cells = []
        for d, a in enumerate(row):
            pick = {n: (high if unit_of(l, n, a.form) in promoted else low).cells[l][d] for n in a.spec}
            spec = {n: c.spec[n] for n, c in pick.items()}
            lut_error = {}
            for lut, _, src, dst in GATES:
                bits = (spec[src].bits, spec[dst].bits)
                c = pick[src] if bits[0] == bits[1] else cross[bits].cells[l][d]
                spec[src] = c.spec[src]
                lut_error[lut] = c.lut_error[lut]
            cells.append(replace(a, spec=spec, qW=pick["W"].qW, qR=pick["R"].qR, lut_error=lut_error))
        out.append(cells)
    return out


def lut_bits_config(model: GruModel, in_bits: int) -> frozenset[Unit]:
    """Units of a config with LUT inputs on `in_bits` and outputs on the other width (a tied
    g_out, which takes g_pre's bits, left out)."""
    side = [src if in_bits == HIGH else dst for _, _, src, dst in GATES]
    units = set(all_units(model))
    return frozenset((l, n) for l in range(model.num_layers) for n in side if (l, n) in units)
