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
_LOOP = ("a recurrent loop (tf2onnx writes a Keras GRU as a Loop and a TF1 GRUCell as a Scan), which qtool "
         "cannot read yet; a GRU as an ONNX GRU node (torch.onnx.export of nn.GRU) imports")
UNREAD_RECURRENT = {"LSTM": "an LSTM, which qtool does not compute (it quantizes GRUs)",
                    "RNN": "a plain RNN, which qtool does not compute (it quantizes GRUs)",
                    "Loop": _LOOP, "Scan": _LOOP}


def unread_recurrent(nodes) -> str | None:
    """`node 'name' (Op) is ...` for the first recurrent node of `nodes` that qtool does not read."""
    for n in nodes:
        if n.op_type in UNREAD_RECURRENT and n.domain in ("", "ai.onnx"):
            return f"node '{n.name or n.output[0]}' ({n.op_type}) is {UNREAD_RECURRENT[n.op_type]}"
    return None
