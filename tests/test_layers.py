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
    "units": set(),
    "outputs": {"errors"},
    "specs": {"errors"},
    "cost": {"errors", "specs"},
    "plan": PLANNING | {"units"},
    "sim": PLANNING,
    "plots": PLANNING | {"plan", "sim"},
    "export": PLANNING | {"plan"},
    "check": PLANNING | {"plan", "export", "check"},
    "models": {"errors", "specs"},
    "data": {"errors"},
    "parallel": PLANNING | {"models"},
    "runtime": PLANNING | {"models", "parallel", "plots", "data", "outputs"},
    "commands": PLANNING | {"plan", "sim", "plots", "export", "check", "models", "parallel", "runtime", "commands",
                 "data", "outputs", "units"},
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


PARALLEL = ROOT / "parallel"
MESH_BUILDERS = ("DeviceMesh(", "init_device_mesh(", "._flatten(", "._unflatten(")


def test_every_mesh_is_built_by_the_mesh_owner():
    """parallel/mesh.py owns the device mesh and its sub-meshes: nothing else builds, flattens or cuts one."""
    wrong = [f"{path.relative_to(ROOT)}: {b}" for path in sorted(ROOT.rglob("*.py")) if path != PARALLEL / "mesh.py"
             for b in MESH_BUILDERS if b in path.read_text()]
    assert not wrong, "meshes built outside parallel/mesh.py:\n" + "\n".join(wrong)


def test_the_checkpoint_and_the_replica_check_only_orchestrate_strategies():
    """They drive strategies through parallel.strategy.Strategy: no strategy class imported to dispatch on,
    no private name of the project imported, no private attribute of another object read."""
    strategies = {"Local", "DDP", "PipelinedDDP", "Zero", "FSDP", "ExpertSplit"}
    wrong = []
    for name in ("checkpoint", "sdc"):
        path = ROOT / "runtime" / "resilience" / f"{name}.py"
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ImportFrom) and (node.module or "").startswith("meshscale"):
                wrong += [f"{name}.py:{node.lineno} imports {a.name}" for a in node.names
                          if a.name in strategies or a.name.startswith("_")]
            if (isinstance(node, ast.Attribute) and node.attr.startswith("_") and not node.attr.startswith("__")
                    and not (isinstance(node.value, ast.Name) and node.value.id in ("self", "dist"))):
                wrong.append(f"{name}.py:{node.lineno} reads .{node.attr}")
    assert not wrong, "\n".join(wrong)


def test_every_data_parallel_wrapper_is_a_strategy():
    from meshscale.parallel.data_parallel import DDP, Local, PipelinedDDP
    from meshscale.parallel.expert import ExpertSplit, _AveragedLocal, _ShardedExperts
    from meshscale.parallel.fsdp import FSDP
    from meshscale.parallel.strategy import Strategy
    from meshscale.parallel.zero import Zero

    methods = [n for n, v in vars(Strategy).items() if callable(v) and not n.startswith("_")]
    assert "checkpoint_state" in methods and "accumulate" in methods
    for cls in (Local, DDP, PipelinedDDP, Zero, FSDP, ExpertSplit, _AveragedLocal, _ShardedExperts):
        missing = [m for m in methods if not callable(getattr(cls, m, None))]
        assert not missing, f"{cls.__name__} lacks {missing}"
