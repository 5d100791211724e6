"""QuantGRU: a drop-in `nn.GRU` whose forward pass is qtool's quantized GRU (qtool.numerics.fakequant on
the torch backend), trainable, and writable as a quantized model file.

State (docs/qat.md, "Checkpoints"): the float weights under nn.GRU's own names (`weight_ih_l0`,
..., PyTorch's gate order r | z | n), and one quantizer per tensor of the tensor table,
`<slot>_fake_quant` with `exp2_inv` (learned, rounded in the forward pass; per output row for
weights and biases, in PyTorch's row order), `zero_point` (learned for asymmetric tensors, 0
otherwise), `bits`, `symmetric` and the calibrated `range_lo`/`range_hi`. Slots: `weight_ih_l{k}`,
`weight_hh_l{k}`, `bias_ih_l{k}`, `bias_hh_l{k}` (W, R, bx, br), `x_l0`, `h_l{k}` (one h for both
directions; x of layer k > 0 is h of layer k - 1), and the others per direction, `z_pre_l{k}`,
`z_pre_l{k}_reverse`, ...

Cell forms (qtool.core.model.CellForm): the module computes the form of each cell of the model it
is built from, and keeps it when it writes the model back (`to_quant_model`, `to_qtool`). A
reset-before cell has the slots of its own tensor table (`rh_l{k}` for `Rh_add_br_l{k}` and
`rRh_l{k}`); a relu or linear candidate calibrated with g_out on g_pre's grid (calibration ties
them: the table is the identity) has no `g_out` slot, g_pre's quantizer serves both, and relu's
g_pre keeps its zero point at the grid's lowest level (a buffer, not learned). The float weights
keep nn.GRU's names and layout whatever the form; the form itself is a buffer per cell that is
not the haste cell, `cell_form_l{k}[_reverse]` (qtool.importers.torch.forms: int64, exact through
float()/half()), which the torch importer reads; a haste module's state is what it always was.
`float_forward` runs the float GRU of the module's weights and forms (`float_gru`, torch): the
import check of such a checkpoint, where nn.GRU cannot compute the form.
"""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import numpy as np
import torch
from torch import nn

from qtool.core.model import CellForm, GruCell, GruModel
from qtool.core.qmodel import CellQuant, QuantModel, TensorQ
from qtool.errors import QtoolError
from qtool.importers.torch.float_gru import float_gru
from qtool.importers.torch.forms import decode_form, encode_form, form_key
from qtool.numerics.fakequant import ROUNDINGS, CellFQ, activations, run_layers
from qtool.numerics.lut import build_lut, cell_gates
from qtool.numerics.qparams import choose_qparams, qrange
from qtool.qat.ops import TorchGrid, TorchOps, ste_round

WEIGHTS = (("W", "weight_ih"), ("R", "weight_hh"), ("bx", "bias_ih"), ("br", "bias_hh"))
SHARED = ("x", "h")  # one quantizer per layer, not per direction


def torch_rows(H: int) -> np.ndarray:
    """Row k of qtool's z | r | g order is row torch_rows(H)[k] of PyTorch's r | z | n."""
    return np.concatenate([np.arange(H, 2 * H), np.arange(H), np.arange(2 * H, 3 * H)])


def ties_g_out(cq: CellQuant) -> bool:
    """g_out is on g_pre's grid in a relu or linear candidate (as calibration ties them): one
    quantizer then serves both, so the table stays the identity however training moves it."""
    a, b = cq.spec["g_pre"], cq.spec["g_out"]
    same = (a.bits, bool(a.symmetric), int(a.exp2_inv), int(a.zp)) == \
        (b.bits, bool(b.symmetric), int(b.exp2_inv), int(b.zp))
    return cq.form.candidate in ("relu", "linear") and same


def slot(name: str, layer: int, direction: int) -> str:
    """The quantizer's name for a tensor of the tensor table (the checkpoint key's stem)."""
    alias = dict(WEIGHTS).get(name, name)
    if name in SHARED:
        return f"{alias}_l{layer}"
    return f"{alias}_l{layer}" + ("_reverse" if direction else "")


class TensorQuantizer(nn.Module):
    """One tensor's grid: learned exp2_inv (and zero point), rounded in the forward pass; or, for
    the 32-bit biases (`follow=True`), the calibration rule applied to the current values, so
    that a bias never saturates however far training moves it. `learn_zp=False` keeps the zero
    point as calibrated (relu's g_pre: the grid's lowest level)."""

    def __init__(self, t: TensorQ, rows: np.ndarray | None = None, follow: bool = False,
                 learn_zp: bool = True):
        super().__init__()
        self.follow = follow
        e = np.asarray(t.exp2_inv, np.float64)
        lo, hi = np.asarray(t.lo, np.float64), np.asarray(t.hi, np.float64)
        if rows is not None:  # per channel: stored in PyTorch's row order
            canon = (e, lo, hi)
            e, lo, hi = (np.empty(len(rows)) for _ in range(3))
            e[rows], lo[rows], hi[rows] = canon
        e = torch.tensor(e, dtype=torch.float32)
        if follow:
            self.register_buffer("exp2_inv", e)
        else:
            self.exp2_inv = nn.Parameter(e)
        zp = torch.tensor(float(t.zp))
        if t.symmetric or not learn_zp:
            self.register_buffer("zero_point", zp)
        else:
            self.zero_point = nn.Parameter(zp)
        self.register_buffer("bits", torch.tensor(t.bits))
        self.register_buffer("symmetric", torch.tensor(bool(t.symmetric)))
        self.register_buffer("range_lo", torch.tensor(lo))
        self.register_buffer("range_hi", torch.tensor(hi))

    def grid(self, rows: np.ndarray | None = None, column: bool = False,
             values: torch.Tensor | None = None) -> TorchGrid:
        """The grid; `rows` picks per-channel exponents in qtool's row order (`column`: as a
        column, for a matrix); a following quantizer first sets them from `values`."""
        if self.follow and values is not None:
            self.fit(values)
        e = ste_round(self.exp2_inv)
        if rows is not None:
            e = e[torch.as_tensor(rows)]
            e = e[:, None] if column else e
        return TorchGrid(e, ste_round(self.zero_point), int(self.bits))

    @torch.no_grad()
    def fit(self, values: torch.Tensor) -> None:
        """exp2_inv per row from the row's range, as calibration sets it (its min/max rule)."""
        rows = values.detach().reshape(values.shape[0], -1).double().cpu().numpy()
        e = [choose_qparams(r.min(), r.max(), int(self.bits), True)[0] for r in rows]
        self.exp2_inv.copy_(torch.tensor(e, dtype=self.exp2_inv.dtype))

    def tensor_q(self, rows: np.ndarray | None = None) -> TensorQ:
        """The grid as qtool's spec; the recorded range is the calibrated one, within the grid."""
        e = np.floor(self.exp2_inv.detach().cpu().double().numpy() + 0.5).astype(np.int64)
        zp = int(np.floor(self.zero_point.detach().cpu().double().numpy() + 0.5))
        lo, hi = self.range_lo.cpu().numpy(), self.range_hi.cpu().numpy()
        if rows is not None:
            e, lo, hi = e[rows], lo[rows], hi[rows]
        qmin, qmax = qrange(int(self.bits))
        lo, hi = np.maximum(lo, np.ldexp(float(qmin - zp), -e)), np.minimum(hi, np.ldexp(float(qmax - zp), -e))
        if e.ndim == 0:
            e, lo, hi = int(e), float(lo), float(hi)
        return TensorQ(int(self.bits), bool(self.symmetric), e, zp, lo, hi)


class QuantGRU(nn.Module):
    """An `nn.GRU` that runs qtool's quantized GRU: every tensor of the tensor table on its
    power-of-two grid, rounded as the integer engine rounds ("integer", the default) or once per
    tensor ("tensor", simulated quantization). Build it with `QuantGRU.from_float`, or from a
    quantized model, `QuantGRU(qm)`, whose cells may be of any form (qtool.core.model.CellForm):
    each cell computes its own."""

    def __init__(self, qm: QuantModel, batch_first: bool = False, dropout: float = 0.0,
                 rounding: str = "integer"):
        super().__init__()
        if rounding not in ROUNDINGS:
            raise ValueError(f"rounding must be one of {ROUNDINGS}")
        model = qm.model
        self.input_size, self.hidden_size = model.input_size, model.hidden_size
        self.num_layers, self.bidirectional = model.num_layers, model.bidirectional
        self.batch_first, self.dropout, self.rounding = batch_first, dropout, rounding
        self.info = dict(qm.info)
        self._luts: dict = {}
        # what each cell computes, and the cells whose g_out is g_pre's quantizer (ties_g_out)
        self.forms: list[list[CellForm]] = [[cq.form for cq in row] for row in qm.cells]
        self._tied = {(l, d) for l, row in enumerate(qm.cells) for d, cq in enumerate(row) if ties_g_out(cq)}
        for l, row in enumerate(qm.cells):
            H = row[0].hidden_size
            for d, cq in enumerate(row):
                cell = model.layers[l][d]
                for name, alias in WEIGHTS:
                    values = np.empty_like(getattr(cell, name))
                    values[torch_rows(H)] = getattr(cell, name)  # back to r | z | n
                    sfx = "_reverse" if d else ""
                    self.register_parameter(f"{alias}_l{l}{sfx}", nn.Parameter(torch.tensor(values)))
                    self.add_module(f"{slot(name, l, d)}_fake_quant",
                                    TensorQuantizer(cq.spec[name], torch_rows(H), follow=name in ("bx", "br")))
                if not cq.form.haste:  # the form, in the checkpoint (a haste cell adds nothing)
                    self.register_buffer(form_key(l, d), torch.from_numpy(encode_form(cq.form)))
                for name in activations(cq.form):
                    key = f"{slot(name, l, d)}_fake_quant"
                    if (name == "x" and l > 0) or hasattr(self, key) or (name == "g_out" and (l, d) in self._tied):
                        continue  # tied: x of layer l > 0 is h of layer l - 1; h is shared; g_out above
                    relu_pre = name == "g_pre" and cq.form.candidate == "relu"
                    self.add_module(key, TensorQuantizer(cq.spec[name], learn_zp=not relu_pre))

    def _load_from_state_dict(self, state_dict, prefix, local_metadata, strict, missing_keys,
                              unexpected_keys, error_msgs):
        """A checkpoint's cell forms must be this module's (the keys alone cannot tell a relu from
        a linear candidate, or two hard_sigmoid constants): another form is an error, as a wrong
        shape is, and the module keeps its own form."""
        mine = {form_key(l, d): form for l, row in enumerate(self.forms) for d, form in enumerate(row)
                if not form.haste}
        for name, form in mine.items():
            if prefix + name not in state_dict:
                continue
            try:
                got = decode_form(state_dict[prefix + name].detach().cpu().numpy(), prefix + name)
            except QtoolError as e:
                error_msgs.append(str(e))
                continue
            if got != form:
                error_msgs.append(f"{prefix + name}: the checkpoint's cell is {got.describe()}, this "
                                  f"module's {form.describe()}; build QuantGRU from a model of the "
                                  "checkpoint's form")
        super()._load_from_state_dict(state_dict, prefix, local_metadata, strict, missing_keys,
                                      unexpected_keys, error_msgs)
        with torch.no_grad():
            for name, form in mine.items():
                getattr(self, name).copy_(torch.from_numpy(encode_form(form)))

    @classmethod
    def from_float(cls, gru: nn.GRU, calib, bits: str = "int8", method: str = "minmax",
                   rounding: str = "integer", batch_size: int = 64) -> QuantGRU:
        """Wrap a trained `nn.GRU`; its initial grids come from qtool's calibration on `calib`
        (float `[N, T, C]`, batch-first, a tensor or an array), `bits` a preset or a bits file as
        `qtool calibrate --bits` takes, `method` as `--method`."""
        from qtool.calibration.observe import MethodPlan, build_quant_model, collect
        from qtool.core.tensors import load_bits
        from qtool.io.files import SequenceData

        if not isinstance(gru, nn.GRU):
            raise QtoolError(f"from_float needs a torch.nn.GRU, got {type(gru).__name__}")
        model = gru_model(gru)
        label, config = load_bits(bits)
        x = calib.detach().cpu().numpy() if isinstance(calib, torch.Tensor) else np.asarray(calib)
        data = SequenceData(x, False, "calib")
        plan = MethodPlan.from_config(config, method)
        obs = collect(model, data, plan, batch_size)
        info = {"method": f"qat from {plan.label()}", "bits": label, "data_file": "QuantGRU calib",
                "samples": data.num_sequences, "time_steps": data.shape[1]}
        qm = build_quant_model(model, obs, config, info, plan)
        module = cls(qm, gru.batch_first, gru.dropout, rounding)
        return module.to(next(gru.parameters()).device)

    def weight_parameters(self) -> list[nn.Parameter]:
        """The float weights and biases (nn.GRU's parameters)."""
        return [p for n, p in self.named_parameters() if "_fake_quant." not in n]

    def range_parameters(self) -> list[nn.Parameter]:
        """The grids' learned exp2_inv and zero points: one unit moves a grid by a factor of two
        (or one step), so they want a larger learning rate than the weights (docs/qat.md)."""
        return [p for n, p in self.named_parameters() if "_fake_quant." in n]

    def _quantizer(self, name: str, l: int, d: int) -> TensorQuantizer:
        if name == "x" and l > 0:
            return getattr(self, f"{slot('h', l - 1, 0)}_fake_quant")
        if name == "g_out" and (l, d) in self._tied:
            return getattr(self, f"{slot('g_pre', l, d)}_fake_quant")
        return getattr(self, f"{slot(name, l, d)}_fake_quant")

    def _float(self, name: str, l: int, d: int) -> torch.Tensor:
        alias = dict(WEIGHTS)[name]
        return getattr(self, f"{alias}_l{l}" + ("_reverse" if d else ""))

    def _lut(self, func: str, a: TorchGrid, b: TorchGrid, device) -> tuple:
        key = (func, a.bits, *(int(t.detach()) for t in (a.exp2_inv, a.zp)), b.bits,
               *(int(t.detach()) for t in (b.exp2_inv, b.zp)))
        if key not in self._luts:
            table, shift, _ = build_lut(func, *key[1:])
            self._luts[key] = (torch.as_tensor(np.append(table, table[-1])), shift)
        table, shift = self._luts[key]
        return table.to(device), shift

    def _cell(self, ops: TorchOps, l: int, d: int) -> CellFQ:
        H = self.hidden_size_of(l)
        rows = torch_rows(H)
        consts = []
        for name, _ in WEIGHTS:
            values = self._float(name, l, d)
            v = values[torch.as_tensor(rows)]
            g = self._quantizer(name, l, d).grid(rows, column=v.dim() == 2, values=values)
            consts.append(ops.qdq(v, g))
        form = self.forms[l][d]
        grids = {n: self._quantizer(n, l, d).grid() for n in activations(form)}
        luts = {}
        if self.rounding == "integer":
            for lut, func, src, dst in cell_gates(form):
                luts[lut] = self._lut(func, grids[src], grids[dst], consts[0].device)
        return CellFQ(*consts, grids, luts, form)

    def hidden_size_of(self, l: int) -> int:
        return self._float("R", l, 0).shape[1]

    def forward(self, x: torch.Tensor, hx: torch.Tensor | None = None):
        """`(y, h_n)` as `nn.GRU` returns them: y `[N, T, D H]` (batch_first) or `[T, N, D H]`,
        h_n `[layers x D, N, H]`. The initial state is 0 (qtool's integer GRU starts from it)."""
        if hx is not None and bool(torch.any(hx != 0)):
            raise ValueError("QuantGRU starts from h0 = 0, as qtool's integer GRU does")
        if x.dim() != 3:
            raise ValueError(f"QuantGRU takes batched 3-D input, got shape {tuple(x.shape)}")
        seq = x.transpose(0, 1) if self.batch_first else x
        ops = TorchOps()
        D = 2 if self.bidirectional else 1
        cells = [[self._cell(ops, l, d) for d in range(D)] for l in range(self.num_layers)]

        def between(l: int, s: torch.Tensor) -> torch.Tensor:  # nn.GRU's dropout between layers
            if not (self.training and self.dropout):
                return s
            return ops.qdq(nn.functional.dropout(s, self.dropout, True), cells[l][0].grids["x"])

        finals: list = []
        y = run_layers(ops, cells, seq, self.rounding, between=between, finals=finals)
        y = y.transpose(0, 1) if self.batch_first else y
        return y, torch.stack(finals)

    def float_forward(self, x: torch.Tensor) -> torch.Tensor:
        """The float GRU this module quantizes (its float weights, each cell of its form, no
        rounding), as nn.GRU's y: `[N, T, D H]` (batch_first) or `[T, N, D H]`."""
        seq = x if self.batch_first else x.transpose(0, 1)
        weights = dict(self.named_parameters(recurse=False))
        y = float_gru(weights, self.forms, seq)
        return y if self.batch_first else y.transpose(0, 1)

    def float_model(self) -> GruModel:
        """The current float weights as qtool's model (gate order z | r | g), each cell of its form."""
        layers = [[replace(cell, form=self.forms[l][d]) for d, cell in enumerate(row)]
                  for l, row in enumerate(_layers(self))]
        return GruModel(layers, name="quant_gru", source="qtool.qat.QuantGRU")

    def to_quant_model(self) -> QuantModel:
        """The quantized model this module computes: its grids, the integer weights quantized on
        them, the tables and shifts from `rescale.derive_cell` (via calibration.cell_from_spec),
        each cell of the form it was built with."""
        from qtool.calibration.observe import cell_from_spec

        model = self.float_model()
        cells = []
        for l, layer in enumerate(model.layers):
            rows = torch_rows(layer[0].R.shape[1])
            row = []
            for d, cell in enumerate(layer):
                for n in ("bx", "br"):
                    self._quantizer(n, l, d).fit(self._float(n, l, d))
                spec = {n: self._quantizer(n, l, d).tensor_q(rows) for n, _ in WEIGHTS}
                spec.update({n: self._quantizer(n, l, d).tensor_q() for n in activations(cell.form)})
                row.append(cell_from_spec(cell, spec))
            cells.append(row)
        return QuantModel(model, cells, dict(self.info))

    def to_qtool(self, path: str | Path) -> QuantModel:
        """Write the quantized model file (for simulate, export c, verify); returns the model."""
        from qtool.core.model import open_h5
        from qtool.io.files import atomic_path
        from qtool.io.qmodel_file import write_qmodel

        qm = self.to_quant_model()
        with atomic_path(path) as tmp, open_h5(tmp, "w") as f:
            write_qmodel(f, qm)
        return qm


def _layers(module: nn.Module) -> list[list[GruCell]]:
    """The float layers of a module holding nn.GRU's own parameters (`weight_ih_l0`, ...) as its
    direct parameters, through the PyTorch importer's gate reordering and shape checks."""
    from qtool.importers.torch.state_dict import gru_layers

    state = {n: p.detach().cpu().float().numpy() for n, p in module.named_parameters(recurse=False)}
    return gru_layers(state, type(module).__name__)


def gru_model(gru: nn.GRU) -> GruModel:
    """An nn.GRU's weights as qtool's float model (via the PyTorch importer's gate reordering)."""
    return GruModel(_layers(gru), name="gru", source="torch.nn.GRU")
