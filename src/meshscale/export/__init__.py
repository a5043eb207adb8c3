"""A layout written as another framework's own configuration: torchtitan's job TOML, Megatron-LM's
arguments, DeepSpeed's JSON, MaxText's YAML.

Each framework module says what its framework cannot express (`adapt`: the nearest layout it can, and why)
and writes the configuration (`render`) with the switches the cost model assumed for that layout: overlap,
bucket size, recompute, schedule and virtual stages, sharding degrees, CP, EP, precision. `emit` ties them
to a prediction, so a config never claims a layout its framework would not run.
"""

import importlib
from dataclasses import dataclass, field, replace

from meshscale.cost import Prediction, predict
from meshscale.errors import UserError
from meshscale.specs.cluster import ClusterSpec, Software
from meshscale.specs.layout import Layout
from meshscale.specs.model import ModelSpec

FRAMEWORKS = ("torchtitan", "megatron", "deepspeed", "maxtext")


@dataclass(frozen=True)
class Job:
    """What one framework config describes: a model trained under a layout (mbs resolved) on a cluster."""
    model: ModelSpec
    cluster: ClusterSpec
    layout: Layout
    global_batch: int  # sequences per optimizer step
    precision: str
    steps: int
    data: str | None = None  # the user's data path; None: the framework's synthetic or test data

    @property
    def microbatches(self) -> int:
        """Micro-batches per data-parallel replica per step (pipeline depth or gradient accumulation)."""
        return self.layout.microbatches(self.global_batch)

    @property
    def devices_per_node(self) -> int:
        return min(self.layout.devices, self.cluster.fast_domain)


@dataclass
class Emitted:
    framework: str
    asked: str  # the layout asked for
    layout: str  # the layout the config runs
    changes: list[str]  # what the framework cannot express of the asked layout, each with the nearest it can
    config: str
    prediction: Prediction  # of `layout`
    asked_step_s: float | None = None  # the asked layout's predicted step, when it differs
    notes: list[str] = field(default_factory=list)  # what the config leaves to the user (model registration)

    def to_dict(self) -> dict:
        return {"framework": self.framework, "asked_layout": self.asked, "layout": self.layout,
                "changes": self.changes, "notes": self.notes, "asked_step_time_s": self.asked_step_s,
                "config": self.config, "prediction": self.prediction.to_dict()}


def framework_module(framework: str):
    if framework not in FRAMEWORKS:
        raise UserError(f"unknown framework {framework!r}; choose one of {', '.join(FRAMEWORKS)}")
    return importlib.import_module(f"meshscale.export.{framework}")


def adapted(framework: str, layout: Layout, model: ModelSpec) -> tuple[Layout | None, list[str]]:
    """The nearest layout `framework` expresses and the reasons it differs (none: the layout itself); None
    when no layout near it is valid."""
    try:
        return framework_module(framework).adapt(layout, model)
    except UserError:  # the nearest shape breaks a layout rule (e.g. shard no longer divides)
        return None, [f"{framework} cannot express {layout}"]


def emit(framework: str, model: ModelSpec, cluster: ClusterSpec, layout: Layout, global_batch: int,
         precision: str, steps: int, data: str | None = None, **search_options) -> Emitted:
    """`layout` as `framework`'s config or, where it cannot express it, the nearest layout it can (when that
    does not fit, the fastest it expresses on the same devices; `search_options` go to that search)."""
    module = framework_module(framework)
    if cluster.torus and module.GPU_ONLY:
        raise UserError(f"--emit {framework}: {module.GPU_ONLY} runs on GPUs; {cluster.name} is a TPU slice, use "
                        "--emit maxtext")
    if steps <= 0:
        raise UserError(f"--steps must be positive, got {steps}")
    if model.lora:
        raise UserError(f"--emit {framework}: the configs meshscale writes train every parameter; LoRA (lora_rank "
                        f"{model.lora_rank}) is costed by predict and plan, not emitted; drop --lora to emit")
    asked = predict(model, cluster, layout, global_batch, precision)
    changes = []
    runs_in = precision
    if precision in module.PRECISIONS:
        runs_in, why = module.PRECISIONS[precision]
        changes.append(f"{why}; nearest: precision={runs_in}")
    near, layout_changes = adapted(framework, layout, model)
    changes += layout_changes
    if not changes and not asked.fits:
        raise UserError(f"--emit {framework}: layout {asked.layout} needs "
                        f"{asked.memory_per_device_bytes['total'] / 1e9:,.1f} GB per device, more than "
                        f"{cluster.name}'s {cluster.hbm_bytes / 1e9:,.1f} GB; pick a layout that fits")
    options: list[Prediction | None] = (
        [asked] if not changes else [_try_predict(model, cluster, near, global_batch, runs_in)])
    if changes and not (options[0] and options[0].fits):  # the nearest does not fit: the best that does
        options.append(best_expressible(framework, model, cluster, layout.devices, global_batch, runs_in,
                                         search_options))
    fitting = [p for p in options if p is not None and p.fits]
    if not fitting:
        raise UserError(f"--emit {framework}: {'; '.join(changes)}, and no layout it can express fits; add "
                        "devices or lower the batch")
    best = min(fitting, key=lambda p: p.step_time_s)
    chosen = Layout.parse(best.layout).resolve_mbs(global_batch)
    job = Job(model, cluster, chosen, global_batch, runs_in, steps, data)
    return Emitted(framework, asked.layout, best.layout, changes, module.render(job), best,
                   asked.step_time_s if changes else None, module.notes(job) + model_notes(model, framework)
                   + kernel_notes(cluster) + overlap_notes(cluster, framework))


def no_int8(framework: str) -> tuple[str, str]:
    """A GPU framework's PRECISIONS entry for int8: it writes bf16, and why."""
    return "bf16", f"{framework} has no int8 training (AQT's int8 GEMMs are MaxText's)"


def model_notes(model: ModelSpec, framework: str) -> list[str]:
    """What of the model the emitted config cannot carry, whatever the framework."""
    notes = []
    if not model.causal:
        notes.append(f"{framework}'s decoder masks attention causally, where {model.name} attends to every "
                     "position (causal = false): the run does about half the attention work the prediction counts")
    if model.packed_samples:
        notes.append(f"the prediction attends within packed samples of {model.packed_samples} tokens "
                     f"(packed_samples); the {framework} config packs no data: each sequence attends across itself, "
                     f"more attention work than predicted")
    return notes


# [software] kernel choices: no emitted config picks a stack's kernels
KERNEL_CHOICES = ("attention_kernel", "attention_unpad", "low_precision_norm", "fused_cross_entropy",
                  "metric_cross_entropies", "fp8_attention")


def kernel_notes(cluster: ClusterSpec) -> list[str]:
    """What the prediction assumed of the software stack's kernels (the choices off Software's defaults) that
    the emitted config does not select."""
    sw, default = cluster.software, Software()
    chosen = [f"{key} = {getattr(sw, key)!r}" for key in KERNEL_CHOICES if getattr(sw, key) != getattr(default, key)]
    return [f"the prediction assumed [software] {', '.join(chosen)}; the config does not choose kernels, so the "
            f"run matches it only with the same ones installed and selected"] if chosen else []


def overlap_notes(cluster: ClusterSpec, framework: str) -> list[str]:
    """What the prediction assumed of TP's overlap that no emitted switch selects."""
    sw = cluster.software
    notes = []
    if sw.tp_comm_overlap and not sw.tp_overlap_scatters:
        notes.append(f"the prediction split TP's all-gathers alone behind their GEMMs ([software] "
                     f"tp_overlap_scatters = false, XLA's collective matmul); no {framework} switch written here "
                     f"splits them so")
    if sw.tp_comm_overlap and sw.tp_overlap_disable_qkv:
        notes.append(f"the prediction ran each QKV projection's all-gather alone ([software] tp_overlap_disable_qkv, "
                     f"Megatron-Core's ModelParallelConfig field, no command-line switch); the {framework} run "
                     f"writes no such setting and overlaps it")
    return notes


def best_expressible(framework, model, cluster, devices, global_batch, precision, options) -> Prediction | None:
    """The fastest layout of `devices` that `framework` expresses, among the search's top 64 as it would run
    them."""
    from meshscale.plan.search import search

    def keeps_shape(tp, pp, cp, dp, ep):  # the framework expresses these degrees under some ZeRO stage
        near = adapted(framework, Layout(dp=dp, zero=3, tp=tp, sp=tp > 1, pp=pp, cp=cp, ep=ep), model)[0]
        return near is not None and (near.tp, near.pp, near.cp, near.dp, near.ep) == (tp, pp, cp, dp, ep)

    # each of the top 64 as the framework would run it (MaxText's FSDP for a ZeRO-1 winner, say), the fastest
    # that keeps its parallel shape and fits
    best = None
    for pred in search(model, cluster, devices, global_batch, precision, top=64, where=keeps_shape,
                       **options).ranked:
        shape = Layout.parse(pred.layout)
        near, changes = adapted(framework, shape, model)
        if changes and near is not None and (near.tp, near.pp, near.cp, near.dp, near.ep) == \
                (shape.tp, shape.pp, shape.cp, shape.dp, shape.ep):
            pred = _try_predict(model, cluster, near, global_batch, precision)
        elif changes:
            continue
        if pred is not None and pred.fits and (best is None or pred.step_time_s < best.step_time_s):
            best = pred
    return best


def _try_predict(model, cluster, layout, global_batch, precision) -> Prediction | None:
    try:
        return predict(model, cluster, layout, global_batch, precision)
    except UserError:
        return None


def change(layout: Layout, changes: list[str], why: str, **values) -> Layout:
    """`layout` with `values` replaced; the sentence saying so appended to `changes`."""
    said = ",".join(f"{k}={str(v).lower() if isinstance(v, bool) else v}" for k, v in values.items())
    changes.append(f"{why}; nearest: {said}")
    return replace(layout, **values)


def summary(e: Emitted) -> list[str]:
    """The lines printed beside a config (stderr): what was changed and both predictions."""
    p = e.prediction
    lines = [f"{e.framework}: layout {e.layout}, predicted step {p.step_time_s * 1e3:,.1f} ms, MFU {p.mfu:.1%}, "
             f"{p.memory_per_device_bytes['total'] / 1e9:,.1f} GB per device"]
    if e.changes and e.asked_step_s is not None:
        lines.append(f"{e.framework} cannot express {e.asked} (predicted {e.asked_step_s * 1e3:,.1f} ms): "
                     + "; ".join(e.changes))
    return lines + e.notes




@dataclass(frozen=True)
class Shape:
    """What a framework config says of a job: its layout, batch and precision, and the model when it names
    one (torchtitan's flavor) or spells it out (Megatron-LM's arguments)."""
    layout: Layout
    global_batch: int
    precision: str
    seq: int
    model: ModelSpec | None = None


def read(framework: str, text: str, devices: int | None) -> Shape:
    """The job a `framework` config describes (the reverse of `render`)."""
    module = framework_module(framework)
    if not hasattr(module, "read"):
        raise UserError(f"reading a {framework} config is not supported; check reads torchtitan and megatron")
    return module.read(text, devices)


__all__ = ["FRAMEWORKS", "Emitted", "Job", "Shape", "emit", "adapted", "best_expressible", "read", "summary"]
