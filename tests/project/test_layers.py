"""The package's structure, held to its design: every import (function-level ones too) points down
the layers below, there is no import cycle, no folder holds more than 12 modules side by side, and
the command line reaches the rest only through the API. Read from the sources with `ast`."""

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
# bottom to top: a module imports its own folder and the folders before it (README's Layout)
LAYERS = ("version", "errors", "core", "numerics", "io", "calibrators", "engine", "layers", "simulation", "importers",
          "calibration", "graph", "exporters", "report", "advisor", "parallel", "qat", "api", "install", "cli")
# what the command line may import besides its own modules (the MPI layer wraps every command)
CLI_MAY_IMPORT = {"api", "errors", "parallel", "version"}


def modules() -> dict[str, Path]:
    out = {}
    for top, prefix in (("qtool", "qtool"), ("calibrators", "qtool.calibrators"), ("exporters", "qtool.exporters")):
        for f in (ROOT / top).rglob("*.py"):
            parts = f.relative_to(ROOT / top).with_suffix("").parts
            name = ".".join((prefix, *parts))
            out[name.removesuffix(".__init__")] = f
    return out


MODULES = modules()


def layer(module: str) -> str:
    parts = module.split(".")
    return parts[1] if len(parts) > 1 else ""


def _type_checking_lines(tree: ast.AST) -> set[int]:
    lines = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test):
            for sub in ast.walk(node):
                lines.add(getattr(sub, "lineno", 0))
    return lines


def imports(module: str) -> set[str]:
    """The qtool modules `module` imports (the package face `qtool` itself left out)."""
    tree = ast.parse(MODULES[module].read_text())
    skip = _type_checking_lines(tree)
    found = set()
    for node in ast.walk(tree):
        if getattr(node, "lineno", 0) in skip:
            continue
        names = []
        if isinstance(node, ast.Import):
            names = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            # `from qtool.x import y`: the module qtool.x.y when there is one, else qtool.x
            names = [f"{node.module}.{a.name}" if f"{node.module}.{a.name}" in MODULES else node.module
                     for a in node.names]
        for name in names:
            while name and name not in MODULES:
                name = name.rpartition(".")[0]
            if name and name != "qtool" and name != module:
                found.add(name)
    return found


GRAPH = {m: imports(m) for m in MODULES}


def test_every_folder_is_a_known_layer():
    assert {layer(m) for m in MODULES if m != "qtool"} == set(LAYERS)


def test_imports_point_down_the_layers():
    wrong = [f"{m} -> {d}" for m, deps in GRAPH.items() for d in deps
             if m != "qtool" and LAYERS.index(layer(d)) > LAYERS.index(layer(m))]
    assert not wrong, "\n".join(sorted(wrong))


def test_no_import_cycle():
    state: dict[str, int] = {}
    cycles = []

    def visit(m: str, path: list[str]) -> None:
        state[m] = 1
        for d in sorted(GRAPH[m]):
            if state.get(d) == 1:
                cycles.append(" -> ".join(path[path.index(d):] + [d]))
            elif d not in state:
                visit(d, path + [d])
        state[m] = 2

    for m in sorted(MODULES):
        if m not in state:
            visit(m, [m])
    assert not cycles, "\n".join(cycles)


def test_no_folder_holds_more_than_12_modules():
    for folder in [ROOT / "calibrators", ROOT / "exporters", *(p for p in (ROOT / "qtool").rglob("*") if p.is_dir())]:
        if folder.name == "__pycache__":
            continue
        count = len([f for f in folder.glob("*.py") if f.name != "__init__.py"])
        assert count <= 12, f"{folder.relative_to(ROOT)} holds {count} modules"


def test_the_command_line_goes_through_the_api():
    wrong = [f"{m} -> {d}" for m, deps in GRAPH.items() if layer(m) == "cli" for d in deps
             if layer(d) not in CLI_MAY_IMPORT | {"cli"}]
    assert not wrong, "\n".join(sorted(wrong))


def _api_names(tree: ast.AST) -> set[str]:
    """The names a module reads from qtool.api: `api.NAME` and `from qtool.api import NAME`."""
    names = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name) and node.value.id == "api":
            names.add(node.attr)
        if isinstance(node, ast.ImportFrom) and node.module == "qtool.api":
            names.update(a.name for a in node.names)
    return names


def test_the_command_line_uses_only_the_public_api():
    import qtool
    from qtool import api

    used = {n for m, f in MODULES.items() if layer(m) == "cli" for n in _api_names(ast.parse(f.read_text()))}
    assert used - set(api.__all__) == set(), sorted(used - set(api.__all__))
    assert set(qtool.API) == set(api.__all__) - set(api.TYPES) - set(api.FRONT_END)


# Where an op may be named outside its layer module: the registry, the stage tables (a module-level
# NAME = {...} or (...)), the importers that write the op, and a pass that works on that op alone.
OP_NAMED_IN = {"qtool.layers", "qtool.graph.passes"}
IMPORTERS = "qtool.importers"


def _op_names(tree: ast.AST, op: str) -> list[int]:
    """Lines that compare a node's `.op` with `op` (==, !=, in, not in a literal), outside a
    module-level table."""
    lines = []
    for node in ast.walk(tree):
        if not isinstance(node, ast.Compare):
            continue
        parts = [node.left, *node.comparators]
        reads_op = any(isinstance(p, ast.Attribute) and p.attr == "op" for p in parts)
        names_op = any(isinstance(c, ast.Constant) and c.value == op for p in parts for c in ast.walk(p))
        if reads_op and names_op:
            lines.append(node.lineno)
    return lines


def test_the_gru_op_is_named_in_its_layer_and_the_stage_tables_only():
    """A second recurrent op extends the stage tables by a line each (qtool.core.qgraph.MODEL_OPS,
    qtool.graph.calibrate.SELF_CALIBRATED): no module outside layers/gru.py, the registry, the
    importers that write the op and the stacking pass asks whether a node is a gru."""
    wrong = []
    for name, path in MODULES.items():
        if name in OP_NAMED_IN or name.startswith(IMPORTERS) or name == "qtool.layers.gru":
            continue
        wrong += [f"{name}:{line}" for line in _op_names(ast.parse(path.read_text()), "gru")]
    assert not wrong, "compares a node's op with 'gru' (use the stage tables): " + ", ".join(wrong)


def test_the_registry_is_static_imports():
    """The layer registry names modules imported at the top of qtool/layers/__init__.py (readers and
    tools see it), not modules loaded by name at run time."""
    text = MODULES["qtool.layers"].read_text()
    assert "importlib" not in text and "__import__" not in text
    from qtool.layers import REGISTRY

    names = {alias.name for node in ast.parse(text).body if isinstance(node, ast.ImportFrom)
             and (node.module or "").startswith("qtool.layers") for alias in node.names}
    assert all(m.__name__.startswith("qtool.layers.") and m.__name__.rpartition(".")[2] in names
               for m in REGISTRY.values())
