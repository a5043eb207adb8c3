"""The Python API: what `meshscale predict|plan|simulate|scale` do, as functions returning typed results.

    import meshscale
    pred = meshscale.predict("llama3-8b", "h100-80gb", "tp=8,dp=2,zero=1", global_batch=64)
    pred.step_time_s, pred.mfu, pred.memory_per_device_bytes["total"]
    best = meshscale.plan("llama3-70b", "h100-80gb", devices=64, global_batch=256).ranked[0]
    sim = meshscale.simulate("llama3-70b", "h100-80gb", best.layout, global_batch=256, stragglers={0: 1.2})
    rows = meshscale.scale("llama2-7b", "h100-80gb", [64, 128, 256], global_batch_tokens=4 * 2**20)

A model is a preset name, a spec file (meshscale JSON/TOML or a Hugging Face config.json) or a ModelSpec;
a cluster a preset name, a ClusterSpec file or a ClusterSpec; a layout a string or a Layout. Bad input
raises meshscale.errors.UserError (a ValueError) saying what is wrong. Pure Python: torch is never imported.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING

from meshscale.cost import Prediction
from meshscale.errors import UserError
from meshscale.cost import predict as _predict
from meshscale.specs.cluster import ClusterSpec, load_cluster
from meshscale.specs.layout import Layout
from meshscale.specs.model import ModelSpec, load_model

if TYPE_CHECKING:
    from meshscale.plan.scaling import Row
    from meshscale.plan.search import Plan
    from meshscale.sim.step import Simulation

# The search, the simulator and the scaling sweep load when first used: `meshscale predict` needs none of
# them, and the search brings numpy (70 ms of a 200 ms command)
_LAZY = {"Plan": "meshscale.plan.search", "Row": "meshscale.plan.scaling", "Simulation": "meshscale.sim.step"}


def __getattr__(name: str) -> type:
    if name in _LAZY:
        return getattr(importlib.import_module(_LAZY[name]), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def predict(model: str | ModelSpec, cluster: str | ClusterSpec, layout: str | Layout, global_batch: int,
            precision: str = "bf16", devices: int | None = None) -> Prediction:
    """One optimizer step of `global_batch` sequences under `layout`: time, MFU, memory, every collective.
    A layout string leaves dp to fill `devices` (default: the cluster preset's count)."""
    m, c = _model(model), _cluster(cluster)
    return _predict(m, c, _layout(layout, devices or c.default_devices), global_batch, precision)


def plan(model: str | ModelSpec, cluster: str | ClusterSpec, devices: int | None = None, global_batch: int = 0,
         precision: str = "bf16", top: int = 5, fix: str | None = None) -> Plan:
    """Every hybrid layout of `devices` ranked by predicted step time; `fix` as the CLI's, e.g. "pp=1,tp=8"."""
    from meshscale.plan.search import parse_fix, search
    m, c = _model(model), _cluster(cluster)
    if global_batch <= 0:
        raise UserError(f"plan: global_batch must be a positive number of sequences, got {global_batch}")
    return search(m, c, devices or c.default_devices, global_batch, precision, top=top,
                  fix=parse_fix(fix) if fix else None)


def simulate(model: str | ModelSpec, cluster: str | ClusterSpec, layout: str | Layout, global_batch: int,
             precision: str = "bf16", devices: int | None = None, stragglers: dict[int, float] | None = None,
             slow_links: dict[int, float] | None = None) -> Simulation:
    """One step event by event: each rank's busy and idle time, the bubble; `stragglers` maps ranks to
    compute slow-downs, `slow_links` to link slow-downs."""
    from meshscale.sim.step import simulate as _simulate
    m, c = _model(model), _cluster(cluster)
    return _simulate(m, c, _layout(layout, devices or c.default_devices), global_batch, precision, stragglers,
                     slow_links)


def scale(model: str | ModelSpec, cluster: str | ClusterSpec, devices: list[int],
          global_batch_tokens: int | None = None, tokens_per_device: int | None = None,
          precision: str = "bf16") -> list[Row]:
    """The best layout at each device count: strong scaling (global_batch_tokens held) or weak
    (tokens_per_device held), with throughput, efficiency, cost and energy per row."""
    from meshscale.plan.scaling import scale as _scale
    return _scale(_model(model), _cluster(cluster), sorted(devices), global_batch_tokens, tokens_per_device,
                  precision)


def _model(model: str | ModelSpec) -> ModelSpec:
    return model if isinstance(model, ModelSpec) else load_model(model)


def _cluster(cluster: str | ClusterSpec) -> ClusterSpec:
    return cluster if isinstance(cluster, ClusterSpec) else load_cluster(cluster)


def _layout(layout: str | Layout, devices: int) -> Layout:
    return layout if isinstance(layout, Layout) else Layout.parse(layout, devices)


__all__ = ["Layout", "ModelSpec", "ClusterSpec", "Plan", "Prediction", "Row", "Simulation", "plan", "predict",
           "scale", "simulate"]
