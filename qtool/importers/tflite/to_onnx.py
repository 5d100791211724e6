"""A float TFLite model as the ONNX graph it computes, op for op, so that one reader (qtool's ONNX
importer, with its layouts, its loops read as GRUs and its checks) takes both formats. A `WHILE`
becomes an ONNX `Loop` whose body computes the loop's condition subgraph on the body's outputs;
`FULLY_CONNECTED` a MatMul against its weights transposed; fused activations the ops they are.

An op this table does not hold is refused naming it, the subgraph and what the table holds: no
part of a model is converted silently."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import numpy as np

from qtool.errors import QtoolError
from qtool.importers.tflite.reader import Op, Subgraph, Tensor, read_tflite

OPSET = 17
FLOAT, BOOL, INT64 = 1, 9, 7  # TensorProto types
BIG = np.iinfo(np.int64).max
# TFLite's fused activations: the ops they are after an op's result
FUSED = {0: None, 1: ("Relu", None), 2: ("Clip", (-1.0, 1.0)), 3: ("Clip", (0.0, 6.0)), 4: ("Tanh", None)}
ELEMENTWISE = {"ADD": "Add", "SUB": "Sub", "MUL": "Mul", "DIV": "Div", "MINIMUM": "Min", "MAXIMUM": "Max",
               "LESS": "Less", "GREATER": "Greater", "LESS_EQUAL": "LessOrEqual",
               "GREATER_EQUAL": "GreaterOrEqual", "EQUAL": "Equal", "LOGICAL_AND": "And", "LOGICAL_OR": "Or",
               "POW": "Pow", "SQUARED_DIFFERENCE": None}
UNARY = {"LOGISTIC": "Sigmoid", "TANH": "Tanh", "RELU": "Relu", "EXP": "Exp", "ABS": "Abs", "NEG": "Neg",
         "SQRT": "Sqrt", "RSQRT": None, "HARD_SWISH": "HardSwish", "LOGICAL_NOT": "Not", "IDENTITY": "Identity",
         "CAST": None}


class _Scope:
    """One subgraph being written as an ONNX graph: value names, nodes and constants."""

    def __init__(self, model: list[Subgraph], sub: Subgraph, taken: set[str], prefix: str = "") -> None:
        self.model, self.sub, self.taken, self.prefix = model, sub, taken, prefix
        self.nodes: list = []
        self.inits: list = []
        self.names: dict[int, str] = {}

    def fresh(self, name: str) -> str:
        k, out = 1, name
        while out in self.taken:
            k, out = k + 1, f"{name}_{k}"
        self.taken.add(out)
        return out

    def name(self, i: int) -> str:
        """The ONNX value of tensor `i` ("" for an omitted input); a constant becomes an initializer."""
        if i < 0:
            return ""
        if i not in self.names:
            t = self.sub.tensors[i]
            self.names[i] = self.fresh(self.prefix + t.name)
            if t.data is not None:
                self.inits.append(_initializer(self.names[i], t.data))
        return self.names[i]

    def const(self, hint: str, value) -> str:
        name = self.fresh(f"{self.prefix}{hint}")
        self.inits.append(_initializer(name, np.asarray(value)))
        return name

    def tensor(self, i: int) -> Tensor:
        return self.sub.tensors[i]

    def array(self, op: Op, k: int, what: str) -> np.ndarray:
        """Input k of `op`, which must be a constant (a shape, axes, a slice's bounds)."""
        t = self.tensor(op.inputs[k])
        if t.data is None:
            raise QtoolError(f"{self.where(op)} takes its {what} from a computed tensor; qtool reads a constant there")
        return t.data

    def node(self, kind: str, inputs: list, outputs: list | None = None, **attrs) -> list[str]:
        from onnx import helper

        outputs = outputs or [self.fresh(f"{self.prefix}{kind.lower()}")]
        attrs.setdefault("name", outputs[0])  # messages name a node after the TFLite tensor it computes
        self.nodes.append(helper.make_node(kind, inputs, outputs, **attrs))
        return outputs

    def where(self, op: Op) -> str:
        out = self.sub.tensors[op.outputs[0]].name if op.outputs else "?"
        return f"subgraph '{self.sub.name}': {op.kind} '{out}'"


def _initializer(name: str, value: np.ndarray):
    from onnx import numpy_helper

    return numpy_helper.from_array(np.array(value, order="C"), name)  # ascontiguousarray makes a scalar [1]


def to_onnx(path: Path):
    """The ONNX ModelProto that computes the float TFLite model in `path`."""
    from onnx import helper

    subs = read_tflite(path)
    if not subs:
        raise QtoolError(f"{path}: a TFLite file that holds no model (no subgraph)")
    main = subs[0]
    quantized = [t.name for s in subs for t in s.tensors if t.scale is not None and t.dtype is not np.float32]
    if quantized:
        raise QtoolError(f"{path}: a quantized TFLite model ('{quantized[0]}' and {len(quantized) - 1} more tensors "
                         "are integers); qtool reads float TFLite models: give it the float .tflite, or the model "
                         "the converter took")
    flex = sorted({op.custom[4:] for s in subs for op in s.ops if op.custom.startswith("Flex")})
    if flex:
        raise QtoolError(f"{path}: runs TensorFlow ops inside TFLite ({', '.join(flex[:4])}"
                         f"{' ...' if len(flex) > 4 else ''}: converted with SELECT_TF_OPS), which qtool does not "
                         "read; convert with TFLite's builtin ops only, or import the model the converter took")
    taken: set[str] = set()
    scope = _Scope(subs, main, taken)
    inputs = []
    for i in main.inputs:
        t = main.tensors[i]
        if t.dtype is not np.float32:
            raise QtoolError(f"{path}: input '{t.name}' is {np.dtype(t.dtype).name if t.dtype else 'not numeric'}; "
                             "qtool reads float models (a quantized model's ranges: its float file with them)")
        # the batch stays as the converter sized the graph (its tensor lists are one sequence wide,
        # whatever the signature says); another dynamic axis (the steps) stays dynamic
        dims = [f"{t.name}_{k}" if k in t.dynamic and k else d for k, d in enumerate(t.shape)]
        inputs.append(helper.make_tensor_value_info(scope.name(i), FLOAT, dims))
    try:
        _ops(scope)
    except QtoolError as e:
        raise QtoolError(f"{path}: {e}") from None
    outputs = [helper.make_tensor_value_info(scope.name(i), FLOAT, None) for i in main.outputs]
    graph = helper.make_graph(scope.nodes, Path(path).stem, inputs, outputs, scope.inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", OPSET)], producer_name="TFLite")
    return model


def _ops(scope: _Scope) -> None:
    for op in scope.sub.ops:
        handler = HANDLERS.get(op.kind)
        if handler is None:
            what = f"the custom op '{op.custom}'" if op.custom else f"the op {op.kind}"
            raise QtoolError(f"{scope.where(op)} is {what}, which qtool does not read from TFLite "
                             f"(docs/importing.md lists the {len(HANDLERS)} ops it reads; the model's SavedModel "
                             "through tf2onnx may: python -m tf2onnx.convert --saved-model DIR --output m.onnx)")
        handler(scope, op)


# ---- the ops


def _fused(scope: _Scope, op: Op, kind: str, inputs: list, **attrs) -> None:
    """Node `kind` and the op's fused activation after it, into the op's output."""
    code = op.options.FusedActivationFunction() if op.options is not None and hasattr(
        op.options, "FusedActivationFunction") else 0
    if code not in FUSED:
        raise QtoolError(f"{scope.where(op)} has fused activation {code}, which qtool does not read")
    out = scope.name(op.outputs[0])
    if FUSED[code] is None:
        scope.node(kind, inputs, [out], **attrs)
        return
    value = scope.node(kind, inputs, **attrs)[0]
    act, bounds = FUSED[code]
    ins = [value] + ([scope.const("lo", np.float32(bounds[0])), scope.const("hi", np.float32(bounds[1]))]
                     if bounds else [])
    scope.node(act, ins, [out])


def _elementwise(scope: _Scope, op: Op) -> None:
    kind = ELEMENTWISE[op.kind]
    a, b = (scope.name(i) for i in op.inputs[:2])
    if kind is None:  # SQUARED_DIFFERENCE
        d = scope.node("Sub", [a, b])[0]
        scope.node("Mul", [d, d], [scope.name(op.outputs[0])])
        return
    if op.kind in ("ADD", "SUB", "MUL", "DIV"):
        _fused(scope, op, kind, [a, b])
    else:
        scope.node(kind, [a, b], [scope.name(op.outputs[0])])


def _unary(scope: _Scope, op: Op) -> None:
    x, out = scope.name(op.inputs[0]), scope.name(op.outputs[0])
    if op.kind == "RSQRT":
        scope.node("Reciprocal", scope.node("Sqrt", [x]), [out])
    elif op.kind == "CAST":
        t = scope.tensor(op.outputs[0])
        to = {np.float32: FLOAT, np.bool_: BOOL, np.int64: INT64, np.int32: 6}.get(t.dtype)
        if to is None:
            raise QtoolError(f"{scope.where(op)} casts to {t.dtype}, which qtool does not read")
        scope.node("Cast", [x], [out], to=to)
    else:
        scope.node(UNARY[op.kind], [x], [out])


def _shape(scope: _Scope, op: Op) -> None:
    shape = scope.node("Shape", [scope.name(op.inputs[0])])[0]
    scope.node("Cast", [shape], [scope.name(op.outputs[0])], to=_onnx_type(scope, op, scope.tensor(op.outputs[0])))


def _fill(scope: _Scope, op: Op) -> None:
    """FILL(dims, value): `value` everywhere in a tensor of shape `dims`."""
    dims = scope.node("Cast", [scope.name(op.inputs[0])], to=INT64)[0]
    scope.node("Expand", [scope.name(op.inputs[1]), dims], [scope.name(op.outputs[0])])


def _pack(scope: _Scope, op: Op) -> None:
    """PACK: the inputs stacked on a new axis."""
    axis = int(op.options.Axis()) if op.options is not None else 0
    axes = scope.const("axes", np.array([axis], np.int64))
    parts = [scope.node("Unsqueeze", [scope.name(i), axes])[0] for i in op.inputs]
    scope.node("Concat", parts, [scope.name(op.outputs[0])], axis=axis)


def _dequantize(scope: _Scope, op: Op) -> None:
    """DEQUANTIZE of float16 weights (a float16-quantized model): the float32 values they stand for.
    An integer DEQUANTIZE makes the model a quantized one, refused before (to_onnx)."""
    t = scope.tensor(op.inputs[0])
    if t.dtype is not np.float16:
        raise QtoolError(f"{scope.where(op)} dequantizes {np.dtype(t.dtype).name if t.dtype else 'a non-numeric'} "
                         "values; qtool reads float models and float16 weights")
    scope.node("Cast", [scope.name(op.inputs[0])], [scope.name(op.outputs[0])], to=FLOAT)


def _relu6(scope: _Scope, op: Op) -> None:
    lo, hi = (-1.0, 1.0) if op.kind == "RELU_N1_TO_1" else (0.0, 6.0)
    scope.node("Clip", [scope.name(op.inputs[0]), scope.const("lo", np.float32(lo)), scope.const("hi", np.float32(hi))],
               [scope.name(op.outputs[0])])


def _leaky(scope: _Scope, op: Op) -> None:
    scope.node("LeakyRelu", [scope.name(op.inputs[0])], [scope.name(op.outputs[0])], alpha=float(op.options.Alpha()))


def _shape_of(scope: _Scope, i: int) -> list[int]:
    return list(scope.tensor(i).shape)


def _reshape(scope: _Scope, op: Op) -> None:
    if len(op.inputs) > 1 and op.inputs[1] >= 0 and scope.tensor(op.inputs[1]).data is None:  # a computed shape
        shape = scope.node("Cast", [scope.name(op.inputs[1])], to=INT64)[0]
        scope.node("Reshape", [scope.name(op.inputs[0]), shape], [scope.name(op.outputs[0])])
        return
    if len(op.inputs) > 1 and op.inputs[1] >= 0:
        shape = scope.array(op, 1, "shape")
    else:
        shape = op.options.NewShapeAsNumpy() if op.options is not None and op.options.NewShapeLength() else \
            np.array(_shape_of(scope, op.outputs[0]))
    scope.node("Reshape", [scope.name(op.inputs[0]), scope.const("shape", np.asarray(shape, np.int64))],
               [scope.name(op.outputs[0])])


def _squeeze(scope: _Scope, op: Op) -> None:
    axes = list(op.options.SqueezeDimsAsNumpy()) if op.options is not None and op.options.SqueezeDimsLength() else \
        [k for k, d in enumerate(_shape_of(scope, op.inputs[0])) if d == 1]
    scope.node("Squeeze", [scope.name(op.inputs[0]), scope.const("axes", np.asarray(axes, np.int64))],
               [scope.name(op.outputs[0])])


def _expand_dims(scope: _Scope, op: Op) -> None:
    axis = np.asarray(scope.array(op, 1, "axis"), np.int64).reshape(-1)
    scope.node("Unsqueeze", [scope.name(op.inputs[0]), scope.const("axes", axis)], [scope.name(op.outputs[0])])


def _transpose(scope: _Scope, op: Op) -> None:
    perm = [int(p) for p in scope.array(op, 1, "permutation").reshape(-1)]
    scope.node("Transpose", [scope.name(op.inputs[0])], [scope.name(op.outputs[0])], perm=perm)


def _concat(scope: _Scope, op: Op) -> None:
    _fused(scope, op, "Concat", [scope.name(i) for i in op.inputs], axis=int(op.options.Axis()))


def _split(scope: _Scope, op: Op) -> None:
    if op.kind == "SPLIT":
        axis, x = int(scope.array(op, 0, "axis")), op.inputs[1]
        n = int(op.options.NumSplits())
        dim = _shape_of(scope, x)[axis]
        sizes = [dim // n] * n
    else:
        x, axis = op.inputs[0], int(scope.array(op, 2, "axis"))
        sizes = [int(s) for s in scope.array(op, 1, "sizes").reshape(-1)]
        if -1 in sizes:
            sizes[sizes.index(-1)] = _shape_of(scope, x)[axis] - sum(s for s in sizes if s != -1)
    scope.node("Split", [scope.name(x), scope.const("split", np.asarray(sizes, np.int64))],
               [scope.name(o) for o in op.outputs], axis=axis)


def _reverse(scope: _Scope, op: Op) -> None:
    """REVERSE_V2 along one of the first two axes (the steps of a backward GRU, which Keras'
    Bidirectional reverses before and after its loop) as ONNX's ReverseSequence over every
    sequence's whole length, the other of the two axes its batch."""
    x = op.inputs[0]
    rank = len(_shape_of(scope, x))
    axes = [int(a) % rank for a in np.asarray(scope.array(op, 1, "axis")).reshape(-1)] if rank else []
    if len(axes) != 1 or axes[0] > 1 or rank < 2:
        raise QtoolError(f"{scope.where(op)} reverses axes {axes} of a rank-{rank} tensor; qtool reads one of the "
                         "first two axes (a sequence's steps)")
    t, b = axes[0], 1 - axes[0]
    shape = scope.node("Shape", [scope.name(x)])[0]
    steps = scope.node("Gather", [shape, scope.const("time_axis", np.array(t, np.int64))], axis=0)[0]
    batch = scope.node("Gather", [shape, scope.const("batch_axis", np.array([b], np.int64))], axis=0)[0]
    lens = scope.node("Expand", [steps, batch])[0]
    scope.node("ReverseSequence", [scope.name(x), lens], [scope.name(op.outputs[0])], batch_axis=b, time_axis=t)


def _gather(scope: _Scope, op: Op) -> None:
    if op.options is not None and op.options.BatchDims():
        raise QtoolError(f"{scope.where(op)} gathers with batch_dims {op.options.BatchDims()}; qtool reads 0")
    axis = int(op.options.Axis()) if op.options is not None else 0
    scope.node("Gather", [scope.name(op.inputs[0]), scope.name(op.inputs[1])], [scope.name(op.outputs[0])],
               axis=axis)


def _strided_slice(scope: _Scope, op: Op) -> None:
    o = op.options
    begin, end, strides = (np.asarray(scope.array(op, k, w), np.int64).reshape(-1).copy()
                           for k, w in ((1, "begin"), (2, "end"), (3, "strides")))
    if o is not None and (o.EllipsisMask() or o.NewAxisMask() or getattr(o, "Offset", lambda: False)()):
        raise QtoolError(f"{scope.where(op)} has an ellipsis, new-axis or offset mask; qtool reads begin, end "
                         "and shrink masks")
    bm, em, sm = (o.BeginMask(), o.EndMask(), o.ShrinkAxisMask()) if o is not None else (0, 0, 0)
    for k in range(len(begin)):
        if bm >> k & 1:
            begin[k] = 0 if strides[k] > 0 else BIG
        if em >> k & 1:
            end[k] = BIG if strides[k] > 0 else -BIG
        if sm >> k & 1:
            end[k] = begin[k] + 1 if begin[k] != -1 else BIG
    x = scope.name(op.inputs[0])
    axes = np.arange(len(begin), dtype=np.int64)
    shrink = [k for k in range(len(begin)) if sm >> k & 1]
    out = scope.name(op.outputs[0])
    sliced = scope.node("Slice", [x, scope.const("starts", begin), scope.const("ends", end),
                                  scope.const("axes", axes), scope.const("steps", strides)],
                        None if shrink else [out])[0]
    if shrink:
        scope.node("Squeeze", [sliced, scope.const("axes", np.asarray(shrink, np.int64))], [out])


def _slice(scope: _Scope, op: Op) -> None:
    """SLICE(x, begin, size): size -1 runs to the end. Bounds may be computed (TFLite writes a tensor
    list's SetItem as slices around the step)."""
    x, out = scope.name(op.inputs[0]), scope.name(op.outputs[0])
    b, s = (scope.tensor(op.inputs[k]) for k in (1, 2))
    if b.data is not None and s.data is not None:
        begin, size = (np.asarray(t.data, np.int64).reshape(-1) for t in (b, s))
        end = np.where(size < 0, BIG, begin + size)
        scope.node("Slice", [x, scope.const("starts", begin), scope.const("ends", end)], [out])
        return
    begin, size = (scope.node("Cast", [scope.name(i)], to=INT64)[0] for i in op.inputs[1:3])
    to_end = scope.node("Less", [size, scope.const("zero", np.zeros(1, np.int64))])[0]
    end = scope.node("Where", [to_end, scope.const("end", np.array([BIG], np.int64)),
                               scope.node("Add", [begin, size])[0]])[0]
    scope.node("Slice", [x, begin, end], [out])


def _fully_connected(scope: _Scope, op: Op) -> None:
    o = op.options
    if o is not None and o.WeightsFormat():
        raise QtoolError(f"{scope.where(op)} stores its weights shuffled; qtool reads the default format")
    W = scope.tensor(op.inputs[1])
    if W.data is not None and W.data.dtype != np.float32:
        raise QtoolError(f"{scope.where(op)} reads {W.data.dtype.name} weights; qtool reads float32 ones")
    x = scope.name(op.inputs[0])
    in_shape = _shape_of(scope, op.inputs[0])
    if len(in_shape) > 2 and not (o is not None and o.KeepNumDims()):
        x = scope.node("Reshape", [x, scope.const("shape", np.array([-1, W.shape[1]], np.int64))])[0]
    # weights stored, or computed from stored ones (a float16 model's DEQUANTIZE): transposed to [in, out]
    Wt = (scope.const(f"{W.name}_T", W.data.T) if W.data is not None else
          scope.node("Transpose", [scope.name(op.inputs[1])], perm=[1, 0])[0])
    if len(op.inputs) > 2 and op.inputs[2] >= 0:
        _fused(scope, op, "Add", [scope.node("MatMul", [x, Wt])[0], scope.name(op.inputs[2])])
    else:
        _fused(scope, op, "MatMul", [x, Wt])


def _conv2d(scope: _Scope, op: Op) -> None:
    """CONV_2D and DEPTHWISE_CONV_2D (NHWC) as ONNX's Conv (NCHW) between two Transposes; TFLite's
    SAME padding puts the odd step after, as ONNX's SAME_UPPER."""
    o = op.options
    W = scope.tensor(op.inputs[1])
    depthwise = op.kind == "DEPTHWISE_CONV_2D"
    c_in = scope.tensor(op.inputs[0]).shape[-1]
    # OHWI (conv) or 1HW(I*M) (depthwise) -> OIHW; stored, or computed (a float16 model's DEQUANTIZE)
    perm = [3, 0, 1, 2] if depthwise else [0, 3, 1, 2]
    w = (scope.const(f"{W.name}_oihw", np.ascontiguousarray(W.data.transpose(perm))) if W.data is not None else
         scope.node("Transpose", [scope.name(op.inputs[1])], perm=perm)[0])
    x = scope.node("Transpose", [scope.name(op.inputs[0])], perm=[0, 3, 1, 2])[0]
    ins = [x, w]
    if len(op.inputs) > 2 and op.inputs[2] >= 0:
        ins.append(scope.name(op.inputs[2]))
    attrs = dict(strides=[int(o.StrideH()), int(o.StrideW())], group=int(c_in) if depthwise else 1,
                 dilations=[int(o.DilationHFactor()), int(o.DilationWFactor())],
                 auto_pad="SAME_UPPER" if o.Padding() == 0 else "VALID",
                 kernel_shape=[int(W.shape[1]), int(W.shape[2])])
    # back to NHWC, then the fused activation (it acts per value: the order does not matter)
    _fused(scope, op, "Transpose", [scope.node("Conv", ins, **attrs)[0]], perm=[0, 2, 3, 1])


def _pad(scope: _Scope, op: Op) -> None:
    """PAD and PADV2: constant padding, paddings [rank, 2] as ONNX's pads (all befores, then afters)."""
    pads = np.asarray(scope.array(op, 1, "paddings"), np.int64).reshape(-1, 2)
    ins = [scope.name(op.inputs[0]), scope.const("pads", np.concatenate([pads[:, 0], pads[:, 1]]))]
    if op.kind == "PADV2" and len(op.inputs) > 2:
        ins.append(scope.name(op.inputs[2]))
    scope.node("Pad", ins, [scope.name(op.outputs[0])], mode="constant")


def _softmax(scope: _Scope, op: Op) -> None:
    beta = float(op.options.Beta()) if op.options is not None else 1.0
    x = scope.name(op.inputs[0])
    if beta != 1.0:
        x = scope.node("Mul", [x, scope.const("beta", np.float32(beta))])[0]
    scope.node("Softmax", [x], [scope.name(op.outputs[0])], axis=-1)


def _mean(scope: _Scope, op: Op) -> None:
    axes = [int(a) for a in np.asarray(scope.array(op, 1, "axes")).reshape(-1)]
    keep = int(bool(op.options.KeepDims())) if op.options is not None else 0
    kind = {"MEAN": "ReduceMean", "SUM": "ReduceSum", "REDUCE_MAX": "ReduceMax", "REDUCE_MIN": "ReduceMin"}[op.kind]
    scope.node(kind, [scope.name(op.inputs[0])], [scope.name(op.outputs[0])], axes=axes, keepdims=keep)


def _while(scope: _Scope, op: Op) -> None:
    """WHILE(cond, body, vars) as an ONNX Loop: the body computes the condition on its outputs."""
    from onnx import helper

    cond, body = scope.model[op.options.CondSubgraphIndex()], scope.model[op.options.BodySubgraphIndex()]
    if len(body.inputs) != len(op.inputs) or len(body.outputs) != len(op.inputs) or len(cond.inputs) != len(op.inputs):
        raise QtoolError(f"{scope.where(op)}: its body and condition do not take its {len(op.inputs)} values")
    first = _inline(scope, cond, [scope.name(i) for i in op.inputs])[0]  # whether the loop runs at all
    inner = _Scope(scope.model, body, scope.taken, prefix=f"{body.name}/")
    step, go = inner.fresh(f"{body.name}/iteration"), inner.fresh(f"{body.name}/cond_in")
    ins = [helper.make_tensor_value_info(step, INT64, []), helper.make_tensor_value_info(go, BOOL, None)]
    for i in body.inputs:
        t = body.tensors[i]
        ins.append(helper.make_tensor_value_info(inner.name(i), _onnx_type(scope, op, t), list(t.shape)))
    _ops(inner)
    outs = [inner.name(i) for i in body.outputs]
    again = _inline(inner, cond, outs)[0]
    value_infos = [helper.make_tensor_value_info(again, BOOL, None)]
    value_infos += [helper.make_tensor_value_info(o, _onnx_type(scope, op, body.tensors[i]), None)
                    for o, i in zip(outs, body.outputs)]
    graph = helper.make_graph(inner.nodes, body.name, ins, value_infos, inner.inits)
    scope.node("Loop", ["", first, *[scope.name(i) for i in op.inputs]], [scope.name(o) for o in op.outputs],
               body=graph, name=scope.sub.tensors[op.outputs[0]].name if op.outputs else "while")


def _onnx_type(scope: _Scope, op: Op, t: Tensor) -> int:
    types = {np.float32: FLOAT, np.int32: 6, np.int64: INT64, np.bool_: BOOL}
    if t.dtype not in types:
        raise QtoolError(f"{scope.where(op)} carries '{t.name}' of a type qtool does not read")
    return types[t.dtype]


def _inline(scope: _Scope, sub: Subgraph, inputs: list[str]) -> list[str]:
    """Subgraph `sub`'s ops written into `scope`, its inputs bound to `inputs`; its outputs' names."""
    inner = _Scope(scope.model, sub, scope.taken, prefix=f"{scope.prefix}{sub.name}/")
    inner.names.update(dict(zip(sub.inputs, inputs)))
    _ops(inner)
    scope.nodes += inner.nodes
    scope.inits += inner.inits
    return [inner.name(i) for i in sub.outputs]


HANDLERS: dict[str, Callable[[_Scope, Op], None]] = {
    **{k: _elementwise for k in ELEMENTWISE}, **{k: _unary for k in UNARY},
    "RELU6": _relu6, "RELU_N1_TO_1": _relu6, "LEAKY_RELU": _leaky, "RESHAPE": _reshape, "SQUEEZE": _squeeze,
    "EXPAND_DIMS": _expand_dims, "TRANSPOSE": _transpose, "CONCATENATION": _concat, "SPLIT": _split,
    "SPLIT_V": _split, "GATHER": _gather, "REVERSE_V2": _reverse, "STRIDED_SLICE": _strided_slice, "SLICE": _slice,
    "FULLY_CONNECTED": _fully_connected, "SOFTMAX": _softmax, "MEAN": _mean, "SUM": _mean, "REDUCE_MAX": _mean,
    "REDUCE_MIN": _mean, "WHILE": _while, "SHAPE": _shape, "FILL": _fill, "PACK": _pack, "DEQUANTIZE": _dequantize,
    "CONV_2D": _conv2d, "DEPTHWISE_CONV_2D": _conv2d, "PAD": _pad, "PADV2": _pad,
}
