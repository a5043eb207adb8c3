"""meshscale: plan, run and verify the training of large transformers across many accelerators.

Three pillars share one contract, the Layout:
  * specs/, cost/, plan/, sim/ -- pure Python; never import torch.
  * models/                    -- the transformer in plain PyTorch, unaware of parallelism.
  * parallel/, runtime/        -- torch.distributed trainer applying a Layout to an unmodified model.
  * the closed loop            -- every run prints what it measured beside the cost model's prediction.

The Python API (meshscale/api.py): meshscale.predict, meshscale.plan, meshscale.simulate, meshscale.scale,
each returning a typed result (Prediction, Plan, Simulation, list of scaling Rows).
"""

__version__ = "0.1.0"
# The version of every --json object's keys (each carries it as "schema_version"): raised when a key is
# renamed or removed, not when one is added.
SCHEMA_VERSION = 1

# The planner package loads first (it imports nothing), so that the function bound below, not the package, is
# what `meshscale.plan` names: a submodule binds its name on the parent when first loaded.
import importlib  # noqa: E402

importlib.import_module("meshscale.plan")
from meshscale.api import ClusterSpec, Layout, ModelSpec, Prediction, plan, predict, scale, simulate  # noqa: E402


def __getattr__(name: str) -> type:
    """Plan, Row and Simulation: their modules (the search, the scaling sweep, the simulator) load when first
    asked for, so that `meshscale predict` does without them."""
    from meshscale import api
    if name in api._LAZY:
        return getattr(api, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


__all__ = ["__version__", "SCHEMA_VERSION", "ClusterSpec", "Layout", "ModelSpec", "Plan", "Prediction", "Row",
           "Simulation", "plan", "predict", "scale", "simulate"]
