"""PyTorch `nn.GRU` state_dicts from `.pt`/`.pth` (weights_only) and `.safetensors`.

PyTorch stores gates r | z | n; the canonical order is z | r | g, so blocks are reordered. Only
the tensors named like nn.GRU's parameters are read, each checked for size and dtype first, and a
QuantGRU checkpoint's cell forms (`cell_form_l{k}`, qtool.importers.torch.forms): a GRU with them
has its cells' forms and is checked against QuantGRU's float forward instead of nn.GRU.
"""

from __future__ import annotations

import re
import zipfile
from dataclasses import replace
from functools import partial
from pathlib import Path

import numpy as np

from qtool.core.model import GruCell
from qtool.errors import QtoolError
from qtool.importers.checks import (
    as_float32,
    check_archive,
    check_size,
    expect_shape,
    framework_run,
    hidden_from_recurrent,
    reason,
    refuse_cut_zip,
)
from qtool.importers.stack import Stack

KEY = re.compile(r"^(?P<prefix>.*?)(?P<kind>weight_ih|weight_hh|bias_ih|bias_hh|weight_hr)_l(?P<layer>\d+)"
                 r"(?P<rev>_reverse)?$")
ANSI = re.compile(r"\x1b\[[0-9;]*m")
SAFETENSORS_FLOATS = {"F16": np.float16, "F32": np.float32, "F64": np.float64}


ROOT = "root"  # the name of a GRU at the top of a state dict that also holds others


def key_prefix(name: str) -> str:
    """The state-dict key prefix of the GRU imported as `name` (read_torch's names)."""
    return "" if name in ("", ROOT) else f"{name}."


def rzn_to_zrg(a: np.ndarray) -> np.ndarray:
    r, z, n = np.split(a, 3, axis=0)
    return np.concatenate([z, r, n], axis=0)


def _flatten(d, prefix: str = "") -> dict:
    out = {}
    for k, v in d.items():
        if isinstance(v, dict):
            out.update(_flatten(v, f"{prefix}{k}."))
        else:
            out[f"{prefix}{k}"] = v
    return out


def load_tensors(path: Path, fmt: str, keep=None, order: list | None = None) -> dict:
    """The tensors of a state dict whose keys `keep` accepts (default: the GRU weights), as
    numpy arrays, each checked for size first; only the GRU weights must be floating point.
    `(key, shape)` of every tensor of the file, read or not, is appended to `order`, in file order."""
    order = [] if order is None else order
    return _load_safetensors(path, keep, order) if fmt == "safetensors" else _load_pt(path, keep, order)


def _is_gru_key(k: str) -> bool:
    return KEY.match(k) is not None


def _load_safetensors(path: Path, keep, order: list) -> dict:
    try:
        from safetensors import safe_open
    except ImportError:
        raise QtoolError("reading .safetensors needs the 'safetensors' package "
                         "(pip install safetensors)") from None
    out = {}
    try:
        with safe_open(str(path), framework="numpy") as f:
            for k in f.keys():
                order.append((k, tuple(f.get_slice(k).get_shape())))
                if not (keep or _is_gru_key)(k):
                    continue  # other tensors of the file are never read
                sl = f.get_slice(k)
                check_size(str(path), k, sl.get_shape())
                if _is_gru_key(k) and sl.get_dtype() not in SAFETENSORS_FLOATS:
                    raise QtoolError(f"{path}: tensor '{k}' has dtype {sl.get_dtype()}; GRU weights must "
                                     "be real floating point (F16, F32 or F64)")
                out[k] = f.get_tensor(k)
    except QtoolError:
        raise
    except Exception as e:  # the library raises several types for corrupt files
        raise QtoolError(f"{path}: not a readable safetensors file ({reason(e)})") from None
    return out


def _torch_error(path: Path, e: Exception) -> QtoolError:
    """torch's unpickling errors are long and coloured: say in one line what the file holds."""
    msg = ANSI.sub("", str(e))
    save = "save the weights instead: torch.save(model.state_dict(), 'model.pt')"
    if "TorchScript" in msg:  # loading one runs its code; its state dict holds the same weights
        return QtoolError(f"{path}: a TorchScript archive (torch.jit.save), which holds code; qtool reads "
                          f"weights only: torch.save(torch.jit.load('{path.name}').state_dict(), 'model.pt') "
                          "and import that")
    glob = re.search(r"GLOBAL ([\w.]+)", msg)
    if glob:
        return QtoolError(f"{path}: holds pickled Python objects ({glob[1]}), not only tensors; loading them "
                          f"would run code from the file, which qtool does not do; {save}")
    detail = re.search(r"WeightsUnpickler error:\s*(.+)", msg)
    if detail:
        return QtoolError(f"{path}: a pickle that PyTorch's weights-only loader refuses "
                          f"({detail[1].strip()[:100]}), not a torch.save'd state_dict; {save}")
    if "zip archive" in msg:  # miniz's words for a cut or damaged file
        return QtoolError(f"{path}: not a whole PyTorch file (its zip archive is truncated or damaged: "
                          f"{_first_sentence(msg)}); save it again")
    return QtoolError(f"{path}: cannot load as a weights-only PyTorch file "
                      f"({_first_sentence(msg) or type(e).__name__})")


def _first_sentence(msg: str) -> str:
    """The first sentence of torch's first line, whole (its later ones are advice for another case)."""
    line = (msg.strip().splitlines() or [""])[0]
    end = re.search(r"\.(\s|$)", line)
    line = line[:end.start()] if end else line
    return line if len(line) <= 200 else line[:line.rfind(" ", 0, 200)] + " ..."


def _load_pt(path: Path, keep, order: list) -> dict:
    try:
        import torch
    except ImportError:
        raise QtoolError("reading .pt/.pth files needs PyTorch (pip install torch==2.13.0, the CPU "
                         "build); or export the state_dict to .safetensors") from None
    mmap = zipfile.is_zipfile(path)  # torch's zip format: tensors are mapped, only the GRU's are read
    with open(path, "rb") as f:
        head = f.read(4)
    refuse_cut_zip(path, "PyTorch file")
    if mmap:
        try:
            with zipfile.ZipFile(path) as z:  # stored members cannot inflate; compressed ones could
                check_archive(path, z, {i.filename for i in z.infolist() if i.compress_type != zipfile.ZIP_STORED})
        except QtoolError:
            raise
        except Exception as e:  # zipfile raises several types for corrupt directories
            raise QtoolError(f"{path}: not a readable PyTorch file ({reason(e)})") from None
    try:
        with framework_run():
            obj = torch.load(str(path), map_location="cpu", weights_only=True, mmap=mmap)
    except Exception as e:  # unpickling errors come in many types
        if not mmap and not head.startswith(b"\x80"):  # torch.save writes a zip, or (legacy) a binary pickle
            raise QtoolError(f"{path}: not a PyTorch file (neither torch.save's zip archive nor a pickle); "
                             "name it by its format or pass the one it holds as `fmt`") from None
        raise _torch_error(path, e) from None
    if not isinstance(obj, dict):
        raise QtoolError(f"{path}: expected a state_dict (a dict of tensors), got {type(obj).__name__}")
    out = {}
    for k, v in _flatten(obj).items():
        if not isinstance(v, torch.Tensor):  # a checkpoint's epoch or step: no part of the model
            continue
        order.append((k, tuple(v.shape)))
        if not (keep or _is_gru_key)(k):
            continue
        check_size(str(path), k, v.shape)
        if v.layout != torch.strided or v.is_quantized or v.is_complex():
            raise QtoolError(f"{path}: tensor '{k}' is {v.dtype} ({v.layout}); expected dense real numbers")
        if _is_gru_key(k) and not v.dtype.is_floating_point:
            raise QtoolError(f"{path}: tensor '{k}' is {v.dtype}; GRU weights must be real floating point")
        keep64 = v.dtype == torch.float64 and not _is_gru_key(k)  # a QuantGRU's recorded ranges, exactly
        out[k] = v.detach().to(v.dtype if keep64 else torch.float32 if v.dtype.is_floating_point
                               else torch.int64).numpy()
    return out


def _layer_cell(parts: dict, l: int, rev: bool, where: str) -> tuple[GruCell, int]:
    """One direction of one layer from its nn.GRU tensors, every shape checked against H."""
    sfx = f"_l{l}" + ("_reverse" if rev else "")
    got = {kind: parts.get((l, rev, kind)) for kind in ("weight_ih", "weight_hh", "bias_ih", "bias_hh")}
    for kind in ("weight_ih", "weight_hh"):
        if got[kind] is None:
            raise QtoolError(f"{where} lacks {kind}{sfx}")
    if (got["bias_ih"] is None) != (got["bias_hh"] is None):
        raise QtoolError(f"{where} has only one of bias_ih{sfx} and bias_hh{sfx}")
    H = hidden_from_recurrent(where, f"weight_hh{sfx}", got["weight_hh"])
    w_ih = got["weight_ih"]
    if w_ih.ndim != 2 or w_ih.shape[0] != 3 * H:
        raise QtoolError(f"{where}: tensor 'weight_ih{sfx}' has shape {tuple(w_ih.shape)}, expected "
                         f"[{3 * H}, C] (H={H})")
    b = [np.zeros(3 * H, np.float32) if got[k] is None else expect_shape(where, k + sfx, got[k], (3 * H,))
         for k in ("bias_ih", "bias_hh")]
    return GruCell(rzn_to_zrg(w_ih), rzn_to_zrg(got["weight_hh"]), rzn_to_zrg(b[0]), rzn_to_zrg(b[1])), H


def gru_layers(state: dict, where: str) -> list:
    """The layers of one nn.GRU from its state dict (names without the module prefix), as float
    arrays; gates reordered to z | r | g, every shape checked."""
    parts = {}
    for k, a in state.items():
        m = KEY.match(k)
        parts[(int(m["layer"]), bool(m["rev"]), m["kind"])] = a
    if any(k[2] == "weight_hr" for k in parts):
        raise QtoolError(f"{where} has projection weights (weight_hr): an LSTM with proj_size, not a GRU")
    bidir = any(k[1] for k in parts)
    layers, hidden = [], set()
    for l in range(1 + max(k[0] for k in parts)):
        cells = []
        for rev in (False, True) if bidir else (False,):
            cell, H = _layer_cell(parts, l, rev, where)
            cells.append(cell)
            hidden.add(H)
        layers.append(cells)
    if len(hidden) > 1:  # nn.GRU has one hidden size: such a file was not written by it
        raise QtoolError(f"{where}: layers have different hidden sizes {sorted(hidden)}; not an nn.GRU")
    return layers


def cell_forms(forms: dict, layers: list, where: str) -> list:
    """`layers` with each cell of the form its `cell_form_l{k}[_reverse]` buffer names (a
    QuantGRU checkpoint, qtool.importers.torch.forms; names without the module prefix); a
    buffer for a cell the GRU does not have is refused."""
    from qtool.importers.torch.forms import FORM_KEY, decode_form

    out = [list(row) for row in layers]
    for key, value in forms.items():
        m = FORM_KEY.match(key)
        l, d = int(m["layer"]), int(bool(m["rev"]))
        if l >= len(out) or d >= len(out[l]):
            raise QtoolError(f"{where}: cell form '{key}' is for a cell the GRU does not have ({len(out)} "
                             f"layer(s), {'bidirectional' if len(out[0]) > 1 else 'one direction'})")
        out[l][d] = replace(out[l][d], form=decode_form(value, f"{where}: '{key}'"))
    return out


def read_torch(path: Path, fmt: str) -> dict[str, Stack]:
    from qtool.importers.torch.check import run_quant_gru_float, run_torch
    from qtool.importers.torch.forms import FORM_KEY

    order: list[tuple[str, tuple]] = []
    tensors = load_tensors(path, fmt, keep=lambda k: _is_gru_key(k) or FORM_KEY.match(k) is not None,
                           order=order)
    form_keys = {k: FORM_KEY.match(k) for k in tensors if not _is_gru_key(k)}
    form_values = {k: tensors.pop(k) for k in form_keys}  # integers stay integers (load_tensors)
    groups: dict[str, dict] = {}
    for key, val in tensors.items():
        m = KEY.match(key)
        groups.setdefault(m["prefix"].rstrip("."), {})[key[len(m["prefix"]):]] = val
    forms: dict[str, dict] = {}
    for key, m in form_keys.items():
        if m["prefix"].rstrip(".") not in groups:
            raise QtoolError(f"{path}: cell form '{key}' belongs to no GRU (no weights under "
                             f"'{m['prefix'] or 'the top level'}')")
        forms.setdefault(m["prefix"].rstrip("."), {})[key[len(m["prefix"]):]] = form_values[key]
    from qtool.importers.torch.slots import SLOT, check_slots

    others = [k for k, _ in order if k not in tensors and k not in form_keys and not SLOT.match(k)]
    out = {}  # quantizers (SLOT) are read as ranges, cell forms as the cells' forms
    for prefix, state in groups.items():
        where = f"{path}: GRU '{prefix}'" if prefix else f"{path}: GRU"
        name = ROOT if not prefix and len(groups) > 1 else prefix  # "" means "the only GRU"
        state = {k: as_float32(where, k, v) for k, v in state.items()}
        rest = [f"{p or ROOT} (GRU)" for p in groups if p != prefix]
        layers = cell_forms(forms.get(prefix, {}), gru_layers(state, where), where)
        check_slots([k for k, _ in order], f"{prefix}." if prefix else "", layers, where)
        if not forms.get(prefix):  # chosen by the file's keys, not by how the forms were read
            framework, run = "PyTorch nn.GRU", partial(run_torch, state)
        else:  # nn.GRU computes the haste cell only: QuantGRU's float forward computes the forms
            framework, run = "PyTorch QuantGRU.float_forward", partial(run_quant_gru_float, state,
                                                                       forms.get(prefix, {}))
        out[name] = Stack(layers, framework, run, took=[prefix or ROOT], left_out=rest + modules(others),
                          input_from=_before(order, tensors, others, prefix))
    return out


STORED_BEFORE = (", stored before it (a state dict does not record what feeds a GRU; modules are usually "
                 "stored in the order they run)")


def _before(order: list[tuple[str, tuple]], tensors: dict, others: list[str], prefix: str) -> str | None:
    """A state dict does not say what feeds its GRU; modules are stored in the order the model
    defines them, which is usually the order they run in: the nearest module stored before the
    GRU's first tensor whose width can be the GRU's input (another GRU's H * directions, or a
    tensor with C rows or columns) is taken as its possible feeder; None when there is none."""
    keys = [k for k, _ in order]
    mine = [k for k in keys if k in tensors and KEY.match(k)["prefix"].rstrip(".") == prefix]
    width = next(tensors[k].shape[1] for k in mine if k.endswith("weight_ih_l0"))
    shape = dict(order)
    seen: set[str] = set()
    for k in reversed(keys[:keys.index(mine[0])]):
        m = KEY.match(k) if k in tensors else None
        module = (m["prefix"].rstrip(".") or ROOT) if m else (k.rpartition(".")[0] or k)
        if module in seen or not (m or k in others):
            continue
        seen.add(module)
        if m:
            p = m["prefix"]
            hidden = tensors[f"{p}weight_hh_l0"].shape[1]
            dirs = 2 if f"{p}weight_hh_l0_reverse" in tensors else 1
            if hidden * dirs == width:
                return f"{module} (GRU){STORED_BEFORE}"
        elif any(shape[o] and width in (shape[o][0], shape[o][-1]) for o in others
                 if (o.rpartition(".")[0] or o) == module):
            return f"{modules([o for o in others if (o.rpartition('.')[0] or o) == module])[0]}{STORED_BEFORE}"
    return None


def modules(keys: list[str]) -> list[str]:
    """The modules a state dict holds besides its GRUs, as `"name (N tensors)"`, in file order."""
    count: dict[str, int] = {}
    for k in keys:
        count[k.rpartition(".")[0] or k] = count.get(k.rpartition(".")[0] or k, 0) + 1
    return [f"{m} ({n} tensor{'s' * (n != 1)})" for m, n in count.items()]
