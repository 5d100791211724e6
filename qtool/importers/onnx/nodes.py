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
