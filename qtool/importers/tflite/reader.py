"""A TFLite file's subgraphs, tensors and operators as plain Python values, read with the `tflite`
package (the flatbuffer schema TensorFlow publishes, generated for Python): qtool does not parse
the flatbuffer itself."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from qtool.errors import QtoolError
from qtool.importers.checks import reason

# TFLite's TensorType -> numpy (the types a float model and its constants use)
DTYPES = {0: np.float32, 1: np.float16, 2: np.int32, 3: np.uint8, 4: np.int64, 6: np.bool_, 7: np.int16,
          9: np.int8, 10: np.float64}


@dataclass
class Tensor:
    name: str
    shape: tuple
    dtype: type | None  # None: a type qtool does not read (strings, resources, variants)
    data: np.ndarray | None  # a constant's value
    scale: np.ndarray | None = None  # a quantized tensor's scales (one, or one per channel on quant_axis)
    zero_point: np.ndarray | None = None
    quant_axis: int = 0
    dynamic: tuple = ()  # the axes the converter left any size (shape signature -1)


@dataclass
class Op:
    kind: str  # the builtin operator's name: "FULLY_CONNECTED", "WHILE", ...
    inputs: list[int]  # tensor indices, -1 for an omitted optional input
    outputs: list[int]
    options: object = None  # the op's BuiltinOptions table, as the tflite package's class for it
    custom: str = ""  # a custom or Flex op's name


@dataclass
class Subgraph:
    name: str
    tensors: list[Tensor]
    ops: list[Op]
    inputs: list[int]
    outputs: list[int]
    index: int = 0
    uses: dict = field(default_factory=dict)


def is_tflite(path: Path) -> bool:
    """Whether the file is a TFLite flatbuffer (its identifier "TFL3" at byte 4), whatever its name."""
    try:
        with open(path, "rb") as f:
            return f.read(8)[4:8] == b"TFL3"
    except OSError:
        return False


def read_tflite(path: Path) -> list[Subgraph]:
    """Every subgraph of the file, the main one first; one line when the file is no TFLite model."""
    try:
        import tflite
    except ImportError:
        raise QtoolError("reading TFLite needs the 'tflite' package (pip install \"qtool[tflite]\")") from None
    buf = Path(path).read_bytes()
    if len(buf) < 8 or buf[4:8] != b"TFL3":
        raise QtoolError(f"{path}: not a TFLite file (no TFL3 identifier)")
    try:
        model = tflite.Model.GetRootAsModel(buf, 0)
        return [_subgraph(tflite, model, model.Subgraphs(k), k) for k in range(model.SubgraphsLength())]
    except QtoolError:
        raise
    except Exception as e:  # a damaged flatbuffer raises struct and index errors of several types
        raise QtoolError(f"{path}: not a readable TFLite file ({reason(e)})") from None


def _subgraph(tflite, model, g, index: int) -> Subgraph:
    names = {v: k for k, v in vars(tflite.BuiltinOperator).items() if not k.startswith("_")}
    options = {v: k for k, v in vars(tflite.BuiltinOptions).items() if not k.startswith("_")}
    tensors = [_tensor(model, g.Tensors(k)) for k in range(g.TensorsLength())]
    ops = []
    for k in range(g.OperatorsLength()):
        op = g.Operators(k)
        code = model.OperatorCodes(op.OpcodeIndex())
        builtin = max(code.BuiltinCode(), code.DeprecatedBuiltinCode())
        kind = names.get(builtin, str(builtin))
        table, opts = op.BuiltinOptions(), None
        if table is not None and op.BuiltinOptionsType() in options:
            cls = getattr(tflite, options[op.BuiltinOptionsType()], None)
            if cls is not None:
                opts = cls()
                opts.Init(table.Bytes, table.Pos)
        custom = code.CustomCode().decode(errors="replace") if code.CustomCode() else ""
        ops.append(Op(kind, [int(i) for i in op.InputsAsNumpy()] if op.InputsLength() else [],
                      [int(i) for i in op.OutputsAsNumpy()] if op.OutputsLength() else [], opts, custom))
    name = g.Name().decode(errors="replace") if g.Name() else f"subgraph{index}"
    return Subgraph(name, tensors, ops, [int(i) for i in g.InputsAsNumpy()] if g.InputsLength() else [],
                    [int(i) for i in g.OutputsAsNumpy()] if g.OutputsLength() else [], index)


def _tensor(model, t) -> Tensor:
    shape = tuple(int(d) for d in t.ShapeAsNumpy()) if t.ShapeLength() else ()
    signature = tuple(int(d) for d in t.ShapeSignatureAsNumpy()) if t.ShapeSignatureLength() else shape
    dtype = DTYPES.get(t.Type())
    buf = model.Buffers(t.Buffer())
    data = None
    if buf is not None and buf.DataLength() and dtype is not None:
        raw = buf.DataAsNumpy().tobytes()
        if len(raw) != int(np.prod(shape, dtype=np.int64)) * np.dtype(dtype).itemsize:
            raise QtoolError(f"tensor '{t.Name().decode(errors='replace')}' holds {len(raw)} bytes for shape "
                             f"{list(shape)}")
        data = np.frombuffer(raw, dtype).reshape(shape).copy()
    q = t.Quantization()
    scale = zero_point = None
    axis = 0
    if q is not None and q.ScaleLength():
        scale, zero_point, axis = q.ScaleAsNumpy().astype(np.float32), q.ZeroPointAsNumpy(), q.QuantizedDimension()
    return Tensor(t.Name().decode(errors="replace"), shape, dtype, data, scale, zero_point, axis,
                  tuple(k for k, d in enumerate(signature) if d == -1))
