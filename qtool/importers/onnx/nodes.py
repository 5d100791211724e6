"""Reading an ONNX node's attributes as plain Python values."""

from __future__ import annotations


def attr(node, name: str, default):
    from onnx import helper

    for a in node.attribute:
        if a.name == name:
            v = helper.get_attribute_value(a)
            if isinstance(v, bytes):
                return v.decode(errors="replace")
            return [s.decode(errors="replace") if isinstance(s, bytes) else s for s in v] if isinstance(v, list) else v
    return default


# recurrent nodes qtool does not read, and what to say of them
_LOOP_TAIL = ("; qtool cannot read yet a recurrent cell written as a loop (tf2onnx writes a Keras GRU as a Loop "
              "and a TF1 GRUCell as a Scan): a GRU as an ONNX GRU node (torch.onnx.export of nn.GRU) imports")
UNREAD_RECURRENT = {"LSTM": "an LSTM, which qtool does not compute (it quantizes GRUs)",
                    "RNN": "a plain RNN, which qtool does not compute (it quantizes GRUs)"}
LOOPS = ("Loop", "Scan")


def unread_recurrent(nodes) -> str | None:
    """`node 'name' (Op) is ...` for the first recurrent node of `nodes` that qtool does not read; a
    loop says what its body computes and which values of the outer graph it reads."""
    for n in nodes:
        if n.domain not in ("", "ai.onnx"):
            continue
        if n.op_type in UNREAD_RECURRENT:
            return f"node '{n.name or n.output[0]}' ({n.op_type}) is {UNREAD_RECURRENT[n.op_type]}"
        if n.op_type in LOOPS:
            return f"node '{n.name or n.output[0]}' ({n.op_type}) is a recurrent loop{_body(n)}{_LOOP_TAIL}"
    return None


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
