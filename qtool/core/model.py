"""The canonical float GRU: weights in the layout of docs/numerics.md ("Float GRU"), gate
blocks z | r | g, each cell's formulation (CellForm), and its HDF5 file.

File layout (format "qtool-gru", version 1, or 2 when a cell is not the haste form),
documented in docs/file-formats.md:

    /                attrs: format, version, input_size, hidden_size, num_layers, bidirectional,
                            name, source
    /layer{l}/{fwd,bwd}     attrs (version 2, each only where it is not the default):
                            reset_after, gate, gate_alpha, gate_beta, candidate
                        W   [3H, C_l]   input weights
                        R   [3H, H]     recurrent weights
                        bx  [3H]        input bias
                        br  [3H]        recurrent bias
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field, fields
from pathlib import Path

import h5py
import numpy as np

from qtool.errors import QtoolError

FORMAT = "qtool-gru"
VERSION = 2  # the newest this qtool reads; it writes 1 where every cell is the haste form
HASTE_VERSION = 1  # a file of haste cells only: what qtool before CellForm wrote, byte for byte
DIRECTIONS = ("fwd", "bwd")
RESET_BEFORE = "reset before the recurrent matmul (Keras reset_after=False, ONNX linear_before_reset=0)"

GATE_ACTIVATIONS = ("sigmoid", "hard_sigmoid")
CANDIDATE_ACTIVATIONS = ("tanh", "relu", "linear")
# hard_sigmoid = clip(alpha * x + beta, 0, 1): Keras 2 (and ONNX HardSigmoid's defaults) 0.2x + 0.5;
# Keras 3 relu6(x + 3) / 6, i.e. x / 6 + 0.5 (measured on Keras 3.15: hard_sigmoid(1) = 2/3)
KERAS2_HARD_SIGMOID = (0.2, 0.5)
KERAS3_HARD_SIGMOID = (1 / 6, 0.5)


def tensor_key(l: int, d: int, name: str) -> str:
    """How results and reports name one tensor of one layer and direction: `layer0.fwd.h`."""
    return f"layer{l}.{DIRECTIONS[d]}.{name}"


@dataclass(frozen=True)
class CellForm:
    """What a cell computes (docs/numerics.md, "Float GRU"); every form has its integer cell
    (docs/numerics.md, "Integer cell"). The default is the haste/PyTorch form:

        reset_after True:   g = candidate(Wx_g + r * (R_g h + br_g) + bx_g)   (haste, PyTorch,
                            Keras reset_after=True, ONNX linear_before_reset=1)
        reset_after False:  g = candidate(Wx_g + R_g (r * h) + bx_g + br_g)   (Keras
                            reset_after=False, ONNX linear_before_reset=0, TensorFlow 1's GRUCell)

    z and r are gate(...) of their sums as always: `gate` sigmoid, or hard_sigmoid
    clip(gate_alpha * v + gate_beta, 0, 1); `candidate` tanh, relu or linear."""

    reset_after: bool = True
    gate: str = "sigmoid"
    gate_alpha: float | None = None  # hard_sigmoid only
    gate_beta: float | None = None
    candidate: str = "tanh"

    def __post_init__(self) -> None:
        if not isinstance(self.reset_after, (bool, np.bool_)):
            raise QtoolError(f"reset_after must be true or false, got {self.reset_after!r:.40}")
        if self.gate not in GATE_ACTIVATIONS:
            raise QtoolError(f"gate activation {self.gate!r:.40} is not one of {', '.join(GATE_ACTIVATIONS)}")
        if self.candidate not in CANDIDATE_ACTIVATIONS:
            raise QtoolError(f"candidate activation {self.candidate!r:.40} is not one of "
                             f"{', '.join(CANDIDATE_ACTIVATIONS)}")
        params = (self.gate_alpha, self.gate_beta)
        if self.gate == "sigmoid" and params != (None, None):
            raise QtoolError("gate_alpha and gate_beta belong to a hard_sigmoid gate, not to sigmoid")
        if self.gate == "hard_sigmoid" and not (all(_finite(v) for v in params) and self.gate_alpha > 0):
            raise QtoolError(f"a hard_sigmoid gate needs a finite gate_alpha > 0 and a finite gate_beta, "
                             f"got {self.gate_alpha!r:.40}, {self.gate_beta!r:.40}")
        object.__setattr__(self, "reset_after", bool(self.reset_after))

    @property
    def haste(self) -> bool:
        return self == HASTE

    def describe(self) -> str:
        """The settings that differ from the haste form, as a user of any framework reads them:
        `reset before the recurrent matmul, gate hard_sigmoid(0.2x + 0.5), candidate relu`."""
        parts = [] if self.reset_after else [RESET_BEFORE]
        if self.gate != "sigmoid":
            parts.append(f"gate hard_sigmoid({self.gate_alpha:.6g}x + {self.gate_beta:.6g})")
        if self.candidate != "tanh":
            parts.append(f"candidate {self.candidate}")
        return ", ".join(parts) or "the haste form"

    def attrs(self) -> dict:
        """The settings that differ from the default, by field name (the file's attributes and a
        graph node's, so that a haste cell adds nothing)."""
        return {f.name: getattr(self, f.name) for f in fields(self) if getattr(self, f.name) != f.default}


def _finite(v) -> bool:
    return isinstance(v, (int, float, np.integer, np.floating)) and not isinstance(v, bool) and math.isfinite(v)


HASTE = CellForm()


@dataclass
class GruCell:
    """One direction of one layer: W [3H, C], R [3H, H], bx [3H], br [3H], gates z | r | g, and
    what the cell computes with them (`form`, the haste form by default)."""

    W: np.ndarray
    R: np.ndarray
    bx: np.ndarray
    br: np.ndarray
    form: CellForm = HASTE

    def __post_init__(self) -> None:
        self.W, self.R = (np.ascontiguousarray(a, np.float32) for a in (self.W, self.R))
        self.bx, self.br = (np.ascontiguousarray(a, np.float32).reshape(-1) for a in (self.bx, self.br))
        three_h = self.R.shape[0]
        if three_h % 3 or self.R.shape != (three_h, three_h // 3):
            raise QtoolError(f"recurrent weights must be [3H, H], got {self.R.shape}")
        if self.W.ndim != 2 or self.W.shape[0] != three_h:
            raise QtoolError(f"input weights must be [3H, C] with 3H={three_h}, got {self.W.shape}")
        if self.bx.shape != (three_h,) or self.br.shape != (three_h,):
            raise QtoolError(f"biases must have 3H={three_h} entries, got {self.bx.shape}, {self.br.shape}")
        for name in ("W", "R", "bx", "br"):
            if not np.all(np.isfinite(getattr(self, name))):
                raise QtoolError(f"weights '{name}' contain NaN or Inf")
        if not isinstance(self.form, CellForm):
            raise QtoolError(f"a cell's form must be a CellForm, got {type(self.form).__name__}")


@dataclass
class GruModel:
    """A (possibly stacked, possibly bidirectional) GRU: `layers[l][d]` is a GruCell."""

    layers: list[list[GruCell]]
    name: str = "gru"
    source: str = ""
    extra: dict = field(default_factory=dict)

    def __post_init__(self) -> None:
        if not self.layers:
            raise QtoolError("model has no layers")
        dirs = len(self.layers[0])
        for l, cells in enumerate(self.layers):
            if len(cells) != dirs:
                raise QtoolError(f"layer {l} has {len(cells)} directions, layer 0 has {dirs}; "
                                 "stacks that mix directions are not supported")
            H = cells[0].R.shape[1]
            want_c = self.input_size if l == 0 else self.layers[l - 1][0].R.shape[1] * dirs
            for c in cells:
                if c.R.shape[1] != H:
                    raise QtoolError(f"layer {l}: directions have different hidden sizes")
                if c.W.shape[1] != want_c:
                    raise QtoolError(f"layer {l}: input size {c.W.shape[1]}, expected {want_c}")

    @property
    def input_size(self) -> int:
        return self.layers[0][0].W.shape[1]

    @property
    def hidden_size(self) -> int:
        """The last layer's hidden size (layers of a stack may differ)."""
        return self.layers[-1][0].R.shape[1]

    @property
    def num_layers(self) -> int:
        return len(self.layers)

    @property
    def num_directions(self) -> int:
        return len(self.layers[0])

    @property
    def bidirectional(self) -> bool:
        return self.num_directions == 2

    @property
    def output_size(self) -> int:
        return self.hidden_size * self.num_directions

    @property
    def haste(self) -> bool:
        """Every cell is the haste form (the one the integer path computes so far)."""
        return all(c.form.haste for cells in self.layers for c in cells)


def write_model(f: h5py.File, model: GruModel) -> None:
    """Write the float model into an open HDF5 file (root attributes and layer groups). A model of
    haste cells is written as version 1, as before CellForm existed; another form makes the file
    version 2, which a qtool that knows only the haste form refuses instead of misreading."""
    f.attrs.update(
        format=FORMAT,
        version=HASTE_VERSION if model.haste else VERSION,
        input_size=model.input_size,
        hidden_size=model.hidden_size,
        num_layers=model.num_layers,
        bidirectional=model.bidirectional,
        name=model.name,
        source=model.source,
    )
    for l, cells in enumerate(model.layers):
        for d, cell in enumerate(cells):
            g = f.create_group(f"layer{l}/{DIRECTIONS[d]}")
            g.attrs.update(cell.form.attrs())  # nothing for a haste cell
            for name in ("W", "R", "bx", "br"):
                g.create_dataset(name, data=getattr(cell, name))


FORM_ATTRS = {"reset_after": bool, "gate": str, "gate_alpha": float, "gate_beta": float, "candidate": str}


def read_form(g: h5py.Group, where: str) -> CellForm:
    """A cell's CellForm from its group's attributes (absent: the default), each checked."""
    found = {}
    for name, kind in FORM_ATTRS.items():
        if name not in g.attrs:
            continue
        if kind is float:
            v = g.attrs[name]
            v = v.item() if isinstance(v, np.generic) else v
            if not _finite(v):
                raise QtoolError(f"{where}: attribute '{name}' must be a finite number, got {v!r:.40}")
            found[name] = float(v)
        else:
            found[name] = h5_attr(g, name, kind, where)
    try:
        return CellForm(**found)
    except QtoolError as e:
        raise QtoolError(f"{where}: {e}") from None


MAX_LAYERS = 64
MAX_WIDTH = 65536          # hidden or input units of one layer
MAX_ELEMENTS = 1 << 27     # values in one weight array (512 MiB as float32)


def h5_attr(obj, name: str, kind: type, where: str):
    """An attribute of the expected kind (int, bool or str), or one clear error."""
    if name not in obj.attrs:
        raise QtoolError(f"{where}: attribute '{name}' is missing")
    v = obj.attrs[name]
    if isinstance(v, bytes):
        v = v.decode(errors="replace")
    if kind is str:
        if not isinstance(v, str):
            raise QtoolError(f"{where}: attribute '{name}' must be a string")
        return v
    v = v.item() if isinstance(v, np.generic) else v
    ok = isinstance(v, bool) if kind is bool else isinstance(v, int) and not isinstance(v, bool)
    if not ok:
        raise QtoolError(f"{where}: attribute '{name}' must be {'a boolean' if kind is bool else 'an integer'}, "
                         f"got {v!r:.40}")
    return v


def h5_dataset(g, name: str, shape: tuple | None, kinds: str, where: str) -> np.ndarray:
    """Read a dataset after checking (from its metadata, before any allocation) that it exists,
    has the expected shape (None: any of at most MAX_ELEMENTS values) and a dtype kind in `kinds`
    ('f' float, 'i' signed/unsigned integer, 'b' boolean)."""
    import h5py

    obj = g.get(name)
    if not isinstance(obj, h5py.Dataset):
        raise QtoolError(f"{where}/{name} is missing")
    if shape is not None and obj.shape != tuple(shape):
        raise QtoolError(f"{where}/{name} has shape {obj.shape}, expected {tuple(shape)}")
    if obj.size > MAX_ELEMENTS:
        raise QtoolError(f"{where}/{name} holds {obj.size} values, more than qtool accepts ({MAX_ELEMENTS})")
    kind = obj.dtype.kind
    if kind not in kinds.replace("i", "iu"):
        names = {"f": "floating point", "i": "integer", "b": "boolean"}
        raise QtoolError(f"{where}/{name} has dtype {obj.dtype}, expected "
                         f"{' or '.join(names[k] for k in kinds)}")
    try:
        return obj[()]
    except (OSError, ValueError) as e:
        raise QtoolError(f"{where}/{name} cannot be read ({str(e).split(',')[0]})") from None


def read_model(f: h5py.File, formats: tuple = (FORMAT,)) -> GruModel:
    """Read the float model from an open HDF5 file written by `write_model` (a quantized model
    file holds one too), checking every attribute and shape before reading any array."""
    where = str(f.filename) if f.name == "/" else f"{f.file.filename}:{f.name}"
    fmt = f.attrs.get("format")
    if isinstance(fmt, bytes):
        fmt = fmt.decode(errors="replace")
    if fmt not in formats:
        raise QtoolError(f"{where}: not a qtool model file (run 'qtool import' first)")
    version = h5_attr(f, "version", int, where)
    if version > VERSION or version < 1:
        raise QtoolError(f"{where}: model format version {version} is not one this qtool reads (1..{VERSION})")
    num_layers = h5_attr(f, "num_layers", int, where)
    if not 1 <= num_layers <= MAX_LAYERS:
        raise QtoolError(f"{where}: num_layers {num_layers} is outside 1..{MAX_LAYERS}")
    dirs = 2 if h5_attr(f, "bidirectional", bool, where) else 1
    sizes = {k: h5_attr(f, k, int, where) for k in ("input_size", "hidden_size")}
    for k, v in sizes.items():
        if not 1 <= v <= MAX_WIDTH:
            raise QtoolError(f"{where}: {k} {v} is outside 1..{MAX_WIDTH}")
    layers = []
    width = sizes["input_size"]
    for l in range(num_layers):
        cells = []
        for d in range(dirs):
            g_where = f"{where}: layer{l}/{DIRECTIONS[d]}"
            g = f.get(f"layer{l}/{DIRECTIONS[d]}")
            if g is None:
                raise QtoolError(f"{g_where} is missing")
            R_shape = getattr(g.get("R"), "shape", None)
            if R_shape is None or len(R_shape) != 2 or not 1 <= R_shape[1] <= MAX_WIDTH:
                raise QtoolError(f"{g_where}/R must be [3H, H] with H in 1..{MAX_WIDTH}, got {R_shape}")
            H = R_shape[1]
            arrays = [h5_dataset(g, n, shp, "f", g_where) for n, shp in
                      (("W", (3 * H, width)), ("R", (3 * H, H)), ("bx", (3 * H,)), ("br", (3 * H,)))]
            cells.append(GruCell(*arrays, read_form(g, g_where)))
        layers.append(cells)
        width = cells[0].R.shape[1] * dirs
    model = GruModel(layers, name=h5_attr(f, "name", str, where), source=h5_attr(f, "source", str, where))
    if model.hidden_size != sizes["hidden_size"]:
        raise QtoolError(f"{where}: hidden_size attribute {sizes['hidden_size']} does not match the "
                         f"weights ({model.hidden_size})")
    return model


NOT_HDF5 = ("not an HDF5 file (qtool's model files and Keras' .h5 files are HDF5): damaged, cut short, "
            "or another kind of file")


def check_model_file(path: Path) -> None:
    """A model file to read exists, is a file and is not empty."""
    if path.is_dir():
        raise QtoolError(f"{path} is a directory, not a model file")
    if not path.is_file():
        raise QtoolError(f"model file not found: {path}")
    if path.stat().st_size == 0:
        raise QtoolError(f"{path} is empty (0 bytes), not a model file")


def open_h5(path, mode: str = "r") -> h5py.File:
    """Open an HDF5 file, turning h5py's low-level errors into one clear line."""
    try:
        return h5py.File(path, mode)
    except FileNotFoundError:
        raise QtoolError(f"file not found: {path}") from None
    except OSError as e:  # h5py: "Unable to ... (truncated file: eof = 20, sblock->base_addr = 0, ...)"
        reason = str(e).split("(", 1)[-1].split(",")[0].rstrip(")")
        if "signature not found" in reason:
            raise QtoolError(f"{path}: {NOT_HDF5}") from None
        raise QtoolError(f"{path}: not a readable HDF5 file ({reason})") from None


def load_model(path) -> GruModel:
    with open_h5(path) as f:
        return read_model(f)
