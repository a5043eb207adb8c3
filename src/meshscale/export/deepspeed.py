"""DeepSpeed's JSON config (read by `deepspeed.runtime.config.DeepSpeedConfig`).

The JSON holds ZeRO's stage, buckets and overlap, the batch split, precision and AutoTP's tensor-parallel
degree. Pipeline stages (PipelineModule), experts (deepspeed.moe) and sequence parallelism (Ulysses, an
all-to-all over heads, not ring attention) are set in the model's code, so a config cannot express them.
"""

import json

from meshscale.cost.comm import bucket_params
from meshscale.export import Job, change, no_int8
from meshscale.specs.layout import EVEN_CUT, Layout
from meshscale.specs.model import ModelSpec

GPU_ONLY = "DeepSpeed"  # named in the refusal of a TPU slice
NO_FP8 = ("bf16", "DeepSpeed's JSON has no FP8 switch (FP8 GEMMs live in Transformer Engine modules)")
PRECISIONS = {"fp8": NO_FP8, "mxfp8": NO_FP8,
              "int8": no_int8(GPU_ONLY),
              "bf16-pure": ("bf16", "DeepSpeed's bf16 mode keeps fp32 master weights (16 B/param)")}


def adapt(layout: Layout, model: ModelSpec) -> tuple[Layout, list[str]]:
    changes: list[str] = []
    for axis, where in (("pp", "PipelineModule"), ("cp", "its Ulysses all-to-all, not ring attention"),
                        ("ep", "deepspeed.moe layers")):
        degree = getattr(layout, axis)
        if degree > 1:
            values: dict[str, object] = {axis: 1, "dp": layout.dp * (degree if axis != "ep" else 1)}
            if axis == "pp":
                values.update(schedule="1f1b", vpp=1, **EVEN_CUT)
            if layout.shard:
                values["shard"] = 0
            if axis == "ep" and layout.etp:
                values["etp"] = layout.tp  # the default again (Layout.etp)
            layout = change(layout, changes, f"DeepSpeed sets {axis}={degree} in the model's code ({where}), not "
                                             "in its config", **values)
    if layout.shard:
        layout = change(layout, changes, "DeepSpeed's ZeRO shards over every data-parallel rank (MiCS, its hybrid "
                                         "sharding, was removed in 0.19)", shard=0)
    if layout.tp > 1 and layout.sp:
        layout = change(layout, changes, "DeepSpeed's AutoTP keeps activations whole over the TP group", sp=False)
    if layout.tp > 1 and layout.zero == 3:
        layout = change(layout, changes, "DeepSpeed's AutoTP training combines with ZeRO stages 0-2", zero=2)
    if layout.offload and (layout.recompute != "full" or layout.offload != model.layers):
        layout = change(layout, changes, "DeepSpeed offloads every layer's activation checkpoint under full "
                                         "recompute (cpu_checkpointing), nothing else", offload=0)
    if layout.recompute not in ("none", "full"):
        layout = change(layout, changes, "DeepSpeed checkpoints whole layers (deepspeed.checkpointing)",
                                 recompute="full")
    return layout, changes


def config(job: Job) -> dict:
    lay, sw = job.layout, job.cluster.software
    elements = int(bucket_params(sw, lay.dp * lay.cp))  # the buckets the cost model charged, in elements
    zero = {"stage": lay.zero, "overlap_comm": sw.grad_reduce_overlap, "contiguous_gradients": True,
            "reduce_scatter": True, "reduce_bucket_size": elements, "allgather_bucket_size": elements}
    if lay.zero == 3:
        # gather the next layer while this one computes, as the cost model's FSDP prefetch
        zero["stage3_prefetch_bucket_size"] = int(job.model.layer_params(0) / lay.tp)
    out = {
        "train_batch_size": job.global_batch,
        "train_micro_batch_size_per_gpu": lay.mbs,
        "gradient_accumulation_steps": job.microbatches,
        "steps_per_print": 10,
        "zero_optimization": zero,
        "gradient_clipping": 1.0,
        "data_types": {"grad_accum_dtype": "fp32" if sw.grad_reduce_fp32 else "bf16"},
    }
    if job.precision != "fp32":
        out["bf16"] = {"enabled": True}
    if lay.tp > 1:
        out["tensor_parallel"] = {"autotp_size": lay.tp}
    if lay.recompute == "full":
        out["activation_checkpointing"] = {"partition_activations": False, "contiguous_memory_optimization": False,
                                           "cpu_checkpointing": bool(lay.offload)}
    return out


def render(job: Job) -> str:
    return json.dumps(config(job), indent=2) + "\n"


def notes(job: Job) -> list[str]:
    out = [f"DeepSpeed: launch with `deepspeed --num_gpus {job.devices_per_node}` and "
           f"`deepspeed.initialize(model=..., config=<this file>)`; the data path ({job.data or 'yours'}) "
           "goes to your data loader"]
    if job.layout.recompute == "full":
        out.append("DeepSpeed: the model must checkpoint each layer through deepspeed.checkpointing.checkpoint "
                   "(Hugging Face models: gradient_checkpointing_enable())")
    return out
