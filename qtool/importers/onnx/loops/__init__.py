"""GRU cells written as loops. tf2onnx writes a Keras GRU that it cannot map to an ONNX GRU node
(reset before the recurrent matmul, hard_sigmoid gates, a linear candidate) as a `Loop`, and
TensorFlow 1's `GRUCell` (alone or stacked in a `MultiRNNCell`, all cells in one body) as a `Scan`.

Each such loop is replaced, before the import reads the graph, by the ONNX GRU nodes it computes.
Nothing is matched against the body's op patterns (they change from one exporter release to the
next): the loop's anatomy (which carried value is a state, which per-step read is the input
sequence, which per-step output is which state) is read from its signature; each state's cell is
found among the body's constant weights by their shapes (a Keras kernel [I, 3H] and recurrent
kernel [H, 3H], or a GRUCell's gates kernel [I + H, 2H] and candidate kernel [I + H, H]) and every
activation qtool's GRU computes; and a candidate is taken only when qtool's float GRU reproduces
what the loop computes (ONNX's reference evaluator running the graph up to it) on probe sequences,
every step and every state. A loop that is no GRU stays as it is, with why on the node, and the
import refuses it saying what its body does.

The parts: `anatomy` (the loop's signature), `probe` (the graph run up to the loop), `cells` (the
candidates and their proof), `rewrite` (the GRU nodes in the loop's place).
"""

from __future__ import annotations

from pathlib import Path

from qtool.errors import QtoolError
from qtool.importers.checks import reason
from qtool.importers.once import once
from qtool.importers.onnx.fold import attr
from qtool.importers.onnx.loops.anatomy import NotACell, anatomy, name_of
from qtool.importers.onnx.loops.cells import find_cells
from qtool.importers.onnx.loops.directions import pair_directions
from qtool.importers.onnx.loops.rewrite import LOOP_NOTE, read_outside, replace
from qtool.importers.onnx.streaming import rewrite_caches

_LOOP_TAIL = ("; qtool reads a loop whose states are GRU cells (tf2onnx writes a Keras GRU as a Loop and a TF1 "
              "GRUCell as a Scan), and a GRU as an ONNX GRU node (torch.onnx.export of nn.GRU)")
UNREAD_RECURRENT = {"LSTM": "an LSTM, which qtool does not compute (it quantizes GRUs)",
                    "RNN": "a plain RNN, which qtool does not compute (it quantizes GRUs)"}
LOOPS = ("Loop", "Scan")


def load_onnx(path: Path, loops: bool = True):
    """The ModelProto of an ONNX file, its external data left to qtool's own checked reader
    (external.py), or the one a TFLite file computes (qtool.importers.tflite); with `loops`, its
    GRU cells written as loops read as GRU nodes (`rewrite_loops`). Read, and its loops proved,
    once per command (qtool.importers.once): the GRU import and its QDQ reader both ask."""
    kind = "onnx-model" if loops else "onnx-model-as-written"
    return once(kind, path, lambda: (_read(Path(path), loops),))[0]


def _read(path: Path, loops: bool):
    try:
        import onnx
    except ImportError:
        raise QtoolError("reading ONNX needs the 'onnx' package (pip install onnx)") from None
    from qtool.importers.tflite.reader import is_tflite

    if is_tflite(Path(path)):  # whatever its name: the ONNX graph a TFLite file computes
        from qtool.importers.tflite.to_onnx import to_onnx

        model = to_onnx(Path(path))
    else:
        try:
            model = onnx.load(str(path), load_external_data=False)
        except Exception as e:  # protobuf decode errors have several types
            if Path(path).suffix.lower() == ".tflite":
                raise QtoolError(f"{path}: not a TFLite file (no TFL3 identifier), nor an ONNX file") from None
            raise QtoolError(f"{path}: not a readable ONNX file ({reason(e)})") from None
        if not model.graph.node and Path(path).suffix.lower() == ".tflite":
            raise QtoolError(f"{path}: not a TFLite file (no TFL3 identifier)")
    if loops:
        rewrite_loops(model, str(path))  # GRU cells written as loops become the GRU nodes they compute
        opset = next((int(o.version) for o in model.opset_import if o.domain in ("", "ai.onnx")), 14)
        rewrite_caches(model, str(path), opset, Path(path).parent)  # a streaming file: the model over whole sequences
    return model


def rewrite_loops(model, where: str) -> None:
    """Replace each loop of `model`'s main graph that computes GRU cells by the GRU nodes it
    computes (in place); a note per loop read goes into the model's metadata (`loop_notes`), why a
    loop was not read into its node's doc_string, and the note into each GRU node's (both read by
    `loop_note`)."""
    loops = [n for n in model.graph.node if n.op_type in LOOPS and n.domain in ("", "ai.onnx")]
    for node in loops:
        try:
            parts = anatomy(model.graph, node)
            read_outside(model, parts)
            cells, checked = find_cells(model, parts, where)
        except NotACell as e:
            node.doc_string = f"{LOOP_NOTE}: {e}"
            continue
        backward = " run backward on the sequence it reverses" if parts.reversed_from else ""
        note = (f"node '{name_of(node)}' ({node.op_type}) read as {_layers_text(cells)}{backward}: qtool's float "
                f"GRU matches the loop on {checked}")
        replace(model, parts, cells, note)
        entry = model.metadata_props.add()
        entry.key, entry.value = LOOP_NOTE, note
    pair_directions(model)  # a backward GRU's reversals, and a Bidirectional's two halves joined


def loop_notes(model) -> list[str]:
    """What `rewrite_loops` read, one line per loop."""
    return [p.value for p in model.metadata_props if p.key == LOOP_NOTE]


def _layers_text(cells: list) -> str:
    """`a GRU of 20 units (Keras GRU cell, ...)`, or a stack's layers, alike ones said once."""
    texts = [f"{c.R.shape[1]} units ({kind}, {c.form.describe()})" for c, kind in cells]
    if len(cells) == 1:
        return f"a GRU of {texts[0]}"
    return f"a stack of {len(cells)} GRU layers of " + (texts[0] if len(set(texts)) == 1 else "; ".join(texts))


# ---- what the import says of a loop it does not read


def unread_recurrent(nodes) -> str | None:
    """`node 'name' (Op) is ...` for the first recurrent node of `nodes` that qtool does not read; a
    loop says what its body computes and which values of the outer graph it reads."""
    for n in nodes:
        if n.domain not in ("", "ai.onnx"):
            continue
        if n.op_type in UNREAD_RECURRENT:
            return f"node '{n.name or n.output[0]}' ({n.op_type}) is {UNREAD_RECURRENT[n.op_type]}"
        if n.op_type in LOOPS:
            why = loop_note(n)
            return (f"node '{n.name or n.output[0]}' ({n.op_type}) is a recurrent loop{_body(n)}"
                    + (f"; it is no GRU: {why}" if why else "") + _LOOP_TAIL)
    return None


def loop_note(node) -> str | None:
    """What qtool.importers.onnx.loops said of `node`: why it left a loop as it is, or which loop a
    GRU node was read from; None for the file's own nodes."""
    text = node.doc_string or ""
    return text[len(LOOP_NOTE) + 2:] if text.startswith(LOOP_NOTE + ": ") else None


def _body(node) -> str:
    """What a loop's body computes (its ops by type) and the outer values it reads."""
    body = attr(node, "body", None)
    if body is None:
        return ""
    ops: dict[str, int] = {}
    for b in body.node:
        ops[b.op_type] = ops.get(b.op_type, 0) + 1
    made = {o for b in body.node for o in b.output} | {i.name for i in body.input} | {t.name for t in body.initializer}
    outer = list(dict.fromkeys(i for b in body.node for i in b.input if i and i not in made))
    kinds = ", ".join(f"{op} x{k}" if k > 1 else op for op, k in sorted(ops.items(), key=lambda kv: (-kv[1], kv[0])))
    text = f" whose body computes {len(body.node)} op(s) ({kinds})"
    if outer:
        shown = ", ".join(f"'{v}'" for v in outer[:6]) + (f" and {len(outer) - 6} more" if len(outer) > 6 else "")
        text += f" and reads {len(outer)} value(s) of the outer graph ({shown})"
    return text
