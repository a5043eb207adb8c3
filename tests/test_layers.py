"""The layers point one way: specs -> cost -> plan/sim; models -> parallel -> runtime -> commands.

Read from the source (function-local imports included), so a back-import fails here before it
tangles the graph. A new top-level module or package must be placed in LAYERS.
"""

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent / "src" / "meshscale"

PLANNING = {"errors", "specs", "cost"}
# each top-level module or package of meshscale -> what it may import from meshscale
LAYERS = {
    "errors": set(),
    "specs": {"errors"},
    "cost": {"errors", "specs"},
    "plan": PLANNING,
    "sim": PLANNING,
    "plots": PLANNING | {"plan", "sim"},
    "export": PLANNING | {"plan"},
    "check": PLANNING | {"plan", "export", "check"},
    "models": {"errors", "specs"},
    "data": {"errors"},
    "parallel": PLANNING | {"models"},
    "runtime": PLANNING | {"models", "parallel", "plots", "data"},
    "commands": PLANNING | {"plan", "sim", "plots", "export", "check", "models", "parallel", "runtime", "commands",
                 "data"},
    "demo": PLANNING | {"plan", "runtime", "commands"},
    "cli": {"errors", "commands"},
    "api": PLANNING | {"plan", "sim"},
    "__init__": {"api"},
    "__main__": {"cli"},
}


def _imports(path: Path):
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom) and node.module:
            names = [node.module] + [f"{node.module}.{a.name}" for a in node.names]
        elif isinstance(node, ast.Import):
            names = [a.name for a in node.names]
        else:
            continue
        for name in names:
            parts = name.split(".")
            if parts[0] == "meshscale" and len(parts) > 1:
                yield node.lineno, parts[1]


def test_every_import_points_down():
    wrong = []
    for path in sorted(ROOT.rglob("*.py")):
        layer = path.relative_to(ROOT).parts[0].removesuffix(".py")
        assert layer in LAYERS, f"{path.relative_to(ROOT)}: place the new layer '{layer}' in LAYERS"
        for line, target in _imports(path):
            if target != layer and target in LAYERS and target not in LAYERS[layer]:
                wrong.append(f"{path.relative_to(ROOT)}:{line} imports {target}")
    assert not wrong, "imports against the layers:\n" + "\n".join(wrong)


def test_the_layers_have_no_cycle():
    seen, done = set(), set()

    def visit(layer, path):
        assert layer not in seen - done, f"cycle: {' -> '.join(path + [layer])}"
        if layer in done:
            return
        seen.add(layer)
        for below in LAYERS[layer] - {layer}:
            visit(below, path + [layer])
        done.add(layer)

    for layer in LAYERS:
        visit(layer, [])
