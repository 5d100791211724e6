"""The fully-integral check on the exported C itself: no function of the integer core (the runtime
and the model's step/sequence functions) may use a floating-point type, literal or math function.
Only the prefix (`NAME_quantize_input`) and the suffix (`NAME_dequantize_output`) convert floats.
"""

from __future__ import annotations

import re

from qtool.errors import QtoolError

_COMMENTS = re.compile(r"/\*.*?\*/|//[^\n]*|\"(?:\\.|[^\"\\])*\"|'(?:\\.|[^'\\])*'", re.S)
_FUNCTION = re.compile(r"^[A-Za-z_][\w \t\*]*?\b([A-Za-z_]\w*)\s*\([^;{}]*\)\s*\{", re.M)
_FLOAT = re.compile(r"\b(float|double)\b|\b(floor|ceil|ldexp|exp|expf|tanh|tanhf|sqrt|pow|round|fabs)\s*\("
                    r"|(?<![\w.])(\d+\.\d*|\.\d+|\d+[eE][+-]?\d+)(?![\w.])")


def function_bodies(text: str) -> dict[str, str]:
    """Every function definition of a C file, comments and string literals removed."""
    text = _COMMENTS.sub(" ", text)
    out = {}
    for m in _FUNCTION.finditer(text):
        depth, i = 1, m.end()
        while depth and i < len(text):
            depth += {"{": 1, "}": -1}.get(text[i], 0)
            i += 1
        out[m.group(1)] = text[m.start():i]
    return out


def check_core(files: dict[str, str], outside: set[str]) -> None:
    """Refuse floating point in any function of `files` (C text by file name) but those named in
    `outside`."""
    for name, text in files.items():
        for func, body in function_bodies(text).items():
            if func in outside:
                continue
            m = _FLOAT.search(body)
            if m:
                raise QtoolError(f"the integer core would contain a floating-point operation: {func}() in "
                                 f"{name} uses '{m.group(0).strip('( ')}'")
