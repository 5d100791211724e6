"""docs/api.md is held to the API: every public function has a row that gives its signature as
the code has it (every parameter, every default), and the row's function is public."""

import inspect
import re

from conftest import ROOT

import qtool
from qtool import api

DOC = (ROOT / "docs" / "api.md").read_text()


def signature(f) -> str:
    parts = []
    for p in inspect.signature(f).parameters.values():
        if p.default is inspect.Parameter.empty:
            parts.append(p.name)
        elif callable(p.default):
            parts.append(f"{p.name}=None")  # a no-op callback reads as None
        else:
            parts.append(f"{p.name}={p.default!r}".replace("'", '"'))
    return f"{f.__name__}({', '.join(parts)})"


def test_every_public_function_has_its_signature_in_the_docs():
    missing = [signature(getattr(api, n)) for n in qtool.API if f"`{signature(getattr(api, n))}`" not in DOC]
    assert not missing, "docs/api.md lacks (or has another signature for):\n" + "\n".join(missing)


def test_every_documented_function_is_public():
    documented = set(re.findall(r"^\| `(\w+)\(", DOC, re.M))
    assert documented <= set(qtool.API), documented - set(qtool.API)


def test_every_front_end_name_is_documented():
    section = DOC[DOC.index("## For front ends"):]
    missing = [n for n in api.FRONT_END if f"`{n}" not in section]
    assert not missing, missing
