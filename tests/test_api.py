"""The Python API as a notebook user calls it: `import meshscale`, then predict, plan, simulate, scale by
name, typed results back, and torch never imported."""

import subprocess
import sys
from pathlib import Path

NOTEBOOK = '''
import sys
import meshscale
from meshscale.errors import UserError

pred = meshscale.predict("llama3-8b", "h100-80gb", "tp=8,zero=1", global_batch=64, devices=16)
assert isinstance(pred, meshscale.Prediction) and pred.devices == 16 and pred.layout.startswith("dp=2,zero=1,tp=8")
assert 0 < pred.mfu < 1 and pred.memory_per_device_bytes["total"] > 0

plan = meshscale.plan("llama3-8b", "h100-80gb", devices=16, global_batch=64, top=3, fix="tp=8")
assert isinstance(plan, meshscale.Plan) and len(plan.ranked) == 3
assert all(meshscale.Layout.parse(p.layout).tp == 8 for p in plan.ranked)
best = plan.ranked[0]
again = meshscale.predict("llama3-8b", "h100-80gb", best.layout, global_batch=64, devices=16)
assert again.step_time_s == best.step_time_s  # the plan's numbers are predict's

sim = meshscale.simulate("llama3-8b", "h100-80gb", meshscale.Layout(dp=4, zero=1, tp=2, pp=2, mbs=1),
                         global_batch=64, stragglers={0: 1.5})
assert isinstance(sim, meshscale.Simulation) and sim.step_time_s > 0

rows = meshscale.scale(meshscale.specs.model.load_model("llama2-7b"), "h100-80gb", [32, 16],
                       global_batch_tokens=256 * 4096)
assert [r.devices for r in rows] == [16, 32] and all(isinstance(r, meshscale.Row) for r in rows)

try:
    meshscale.predict("llama3-8b", "h100-80gb", "tp=3", global_batch=64)
except UserError as e:  # bad input: a ValueError saying what is wrong
    assert isinstance(e, ValueError) and "does not divide" in str(e)
else:
    raise AssertionError("tp=3 was accepted")
assert "torch" not in sys.modules
print("notebook ok")
'''


def test_notebook_calls_the_api_without_torch():
    src = Path(__file__).parent.parent / "src"
    r = subprocess.run([sys.executable, "-c", NOTEBOOK], capture_output=True, text=True, timeout=600,
                       env={"PYTHONPATH": str(src), "PATH": "/usr/bin:/bin"})
    assert r.returncode == 0 and r.stdout.strip() == "notebook ok", r.stderr[-3000:]


def test_the_package_ships_its_types():
    assert (Path(__file__).parent.parent / "src" / "meshscale" / "py.typed").is_file()
