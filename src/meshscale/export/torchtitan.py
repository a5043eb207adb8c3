"""torchtitan's job TOML (JobConfig, read by `torchtitan.config.ConfigManager` through `--job.config_file`;
torchtitan 0.1-0.2, before its configs became Python registries).

torchtitan's mesh is [pp, dp_replicate, dp_shard, cp, tp]: FSDP2 shards over dp_shard x cp (so CP ranks
always shard the parameters), HSDP replicates the shard groups, TP always shards the norms' activations over
the sequence, and EP folds over dp_shard x cp x tp within each replicate group, etp innermost (ParallelDims'
sparse mesh [pp, dp_replicate, efsdp, ep, etp]; etp is tp or 1, as ours).
"""

import json
import tomllib

from meshscale.cost.comm import bucket_params
from meshscale.errors import UserError
from meshscale.export import Job, Shape, change, no_int8
from meshscale.specs.layout import KEEPS_MATMULS, V_SCHEDULES, Layout
from meshscale.specs.model import ModelSpec, load_model
from meshscale.specs.placement import chunk_ranges, layout_ends

GPU_ONLY = "torchtitan"  # named in the refusal of a TPU slice
PRECISIONS = {"int8": no_int8(GPU_ONLY)}
# torchao's linear layers each FP8 precision converts to (torchtitan's model converters; float8 is tensor-wise with
# current scaling, mx block-scaled, its default recipe mxfp8_cublas)
CONVERTERS = {"fp8": "quantize.linear.float8", "mxfp8": "quantize.linear.mx"}
SCHEDULES = {"gpipe": "GPipe", "1f1b": "1F1B", "interleaved": "Interleaved1F1B",
             "zb": "InterleavedZeroBubble", "zbv": "ZBVZeroBubble", "dualpipev": "DualPipeV"}
# torchtitan's own model flavors of our presets (torchtitan/models/*/__init__.py; 0.2.2's shapes are the presets':
# Llama 4's "_irope" flavors attend in chunks of 8192 with every 4th layer whole and unrotated, as the presets do)
FLAVORS = {"llama3-8b": ("llama3", "8B"), "llama3-70b": ("llama3", "70B"), "llama3-405b": ("llama3", "405B"),
           "deepseek-v2": ("deepseek_v3", "236B"), "deepseek-v3": ("deepseek_v3", "671B"),
           "qwen3-30b-a3b": ("qwen3", "30B-A3B"), "qwen3-235b-a22b": ("qwen3", "235B-A22B"),
           "gpt-oss-120b": ("gpt_oss", "120b"), "llama4-scout-17b-16e": ("llama4", "17bx16e_irope"),
           "llama4-maverick-17b-128e": ("llama4", "17bx128e_irope")}


def adapt(layout: Layout, model: ModelSpec) -> tuple[Layout, list[str]]:
    changes: list[str] = []
    if layout.zero == 0 and (layout.cp > 1 or layout.ep > 1):
        layout = change(layout, changes, "torchtitan shards parameters over its CP and EP ranks (FSDP2 over "
                                         "dp_shard x cp)", zero=3)
    if layout.zero == 1:
        layout = change(layout, changes, "torchtitan has no ZeRO-1; FSDP2 that keeps parameters gathered from "
                                         "forward to backward (reshard_after_forward=never) is ZeRO-2", zero=2)
    if layout.shard and layout.shard % layout.cp:
        layout = change(layout, changes, f"torchtitan's shard groups span all cp={layout.cp} ranks, so shard "
                                         "must be a multiple of cp", shard=0)
    if layout.ep > 1 and layout.zero >= 2 and (layout.shard_size * layout.tp) % (layout.ep * layout.expert_tp):
        layout = change(layout, changes, f"torchtitan folds EP over one shard group's dp_shard x cp x tp ranks "
                                         f"({layout.shard_size * layout.tp}), which ep*etp must divide", shard=0)
    if layout.tp > 1 and not layout.sp:
        layout = change(layout, changes, "torchtitan's TP always shards norms and residuals over the sequence",
                                 sp=True)
    if layout.offload:
        layout = change(layout, changes, "torchtitan keeps activations on the device", offload=0)
    if layout.recompute in KEEPS_MATMULS:
        nearest = "op" if layout.tp == 1 and layout.cp == 1 else "full"
        layout = change(layout, changes, "torchtitan's op-level policy keeps every other matmul's output, not each "
                                         "one's (and runs at tp=1, cp=1)", recompute=nearest)
    if layout.recompute not in ("none", "full", "op"):
        layout = change(layout, changes, "torchtitan's selective recompute is op-level (recompute=op) or per "
                                         "layer, not named modules such as the attention core", recompute="full")
    return layout, changes


def render(job: Job) -> str:
    lay, model, sw = job.layout, job.model, job.cluster.software
    name, flavor = FLAVORS.get(model.name, ("llama3", model.name))
    dp_shard = lay.shard_size // lay.cp if lay.zero >= 2 else 1
    replicate = lay.replicas if lay.zero >= 2 else lay.dp
    parallelism: dict[str, object] = {
        "data_parallel_replicate_degree": replicate,
        "data_parallel_shard_degree": dp_shard,
        # ZeRO-2: parameters stay gathered from forward through backward; ZeRO-3 reshards them after forward
        "fsdp_reshard_after_forward": "never" if lay.zero == 2 else "default",
        "tensor_parallel_degree": lay.tp,
        "enable_async_tensor_parallel": lay.tp > 1 and sw.tp_comm_overlap,
        "pipeline_parallel_degree": lay.pp,
        "context_parallel_degree": lay.cp,
        # K,V travel around the ring of CP ranks cp-1 times, as the cost model charges
        "context_parallel_rotate_method": "alltoall",
        "expert_parallel_degree": lay.ep,
        "expert_tensor_parallel_degree": lay.expert_tp if lay.ep > 1 else 1,
    }
    if lay.pp > 1:
        parallelism.update({
            "pipeline_parallel_schedule": SCHEDULES[lay.schedule],
            "pipeline_parallel_microbatch_size": lay.mbs,
            # the cut the cost model charged (specs.layout.split_layers), one list per model chunk
            "module_fqns_per_model_part": chunk_modules(model, lay),
        })
    training = {
        "local_batch_size": job.global_batch // lay.dp if lay.pp > 1 else lay.mbs,
        "global_batch_size": job.global_batch,
        "seq_len": model.seq,
        "steps": job.steps,
        "mixed_precision_param": "float32" if job.precision == "fp32" else "bfloat16",
        "mixed_precision_reduce": "float32",
    }
    if job.precision == "bf16-pure":
        training["dtype"] = "bfloat16"
    if job.data:
        training["dataset_path"] = job.data
    mode = {"none": "none", "full": "full", "op": "selective"}[lay.recompute]
    recompute = {"mode": mode} | ({"selective_ac_option": "op"} if mode == "selective" else {})
    sections = {
        "job": {"description": f"meshscale: {model.name} on {lay.devices} x {job.cluster.name}, {lay}"},
        "model": {"name": name, "flavor": flavor}
        | ({"converters": [CONVERTERS[job.precision]]} if job.precision in CONVERTERS else {}),
        "training": training,
        "parallelism": parallelism,
        "activation_checkpoint": recompute,
        "compile": {"enable": bool(parallelism["enable_async_tensor_parallel"])},  # async TP needs compile
    }
    header = [f"# meshscale: {model.name}, {job.global_batch} x {model.seq} tokens a step on {lay.devices} x "
              f"{job.cluster.name}, layout {lay}",
              f"# The cost model assumed FSDP2's prefetch of the next block (on: {sw.fsdp_prefetch}), gradients "
              f"reduced in fp32, DDP buckets of {bucket_params(sw, lay.dp * lay.cp) / 1e6:.1f}M parameters "
              f"({sw.framework}'s default unless [software] grad_bucket_params says otherwise)."]
    return "\n".join(header) + "\n\n" + toml(sections)


def notes(job: Job) -> list[str]:
    out = [] if job.model.name in FLAVORS else [
        f"torchtitan has no flavor {job.model.name!r}: register one with its shapes (layers {job.model.layers}, dim "
        f"{job.model.hidden}, heads {job.model.heads}, kv heads {job.model.kv_heads}) in torchtitan/models/llama3 or "
        f"name an existing flavor"]
    if job.precision == "fp8" and job.cluster.fp8_recipe(job.precision) == "blockwise":
        out.append("torchao's float8 converter scales tensor-wise from the current amax: the prediction assumed "
                   "blockwise scaling, whose GEMMs are slower")
    return out


def chunk_modules(model: ModelSpec, layout: Layout) -> list[list[str]]:
    """torchtitan's module names per model chunk: the embedding with the first, norm and head with the last."""
    chunks = [[f"layers.{i}" for i in r] for r in chunk_ranges(model.layers, layout.stages, 0, layout.pp,
                                                                layout_ends(layout))]
    chunks[0].insert(0, "tok_embeddings")
    chunks[-1] += ["norm", "output"]
    return chunks


def toml(sections: dict) -> str:
    """A TOML document of tables of scalars and (nested) lists."""
    out = []
    for name, table in sections.items():
        out.append(f"[{name}]")
        out += [f"{key} = {_value(value)}" for key, value in table.items()]
        out.append("")
    return "\n".join(out)


def _value(v) -> str:
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, list):
        return "[" + ", ".join(_value(x) for x in v) + "]"
    return json.dumps(v)


def read(text: str, devices: int | None) -> Shape:
    """The job a torchtitan job TOML describes; `devices` fills a data_parallel_shard_degree of -1."""
    try:
        job = tomllib.loads(text)
    except tomllib.TOMLDecodeError as e:
        raise UserError(f"torchtitan config: not TOML ({e})") from None
    par, training = job.get("parallelism", {}), job.get("training", {})
    tp, pp, cp = (par.get(k, 1) for k in ("tensor_parallel_degree", "pipeline_parallel_degree",
                                           "context_parallel_degree"))
    replicate, shard = par.get("data_parallel_replicate_degree", 1), par.get("data_parallel_shard_degree", -1)
    if shard == -1:
        if devices is None:
            raise UserError("torchtitan config: data_parallel_shard_degree is -1 (the devices left over); give "
                            "--devices")
        shard = devices // (replicate * tp * pp * cp)
    fsdp = shard * cp > 1
    zero = (2 if par.get("fsdp_reshard_after_forward") == "never" else 3) if fsdp else 0
    schedule = {v: k for k, v in SCHEDULES.items()}.get(par.get("pipeline_parallel_schedule", "1F1B"), "1f1b")
    chunks = par.get("module_fqns_per_model_part")
    vpp = len(chunks) // pp if chunks and pp > 1 else (2 if schedule == "interleaved" or schedule in V_SCHEDULES else 1)
    mode = job.get("activation_checkpoint", {}).get("mode", "selective")
    option = job.get("activation_checkpoint", {}).get("selective_ac_option", "2")
    recompute = {"none": "none", "full": "full"}.get(mode, "op" if option == "op" else "full")
    dp = replicate * shard
    local = training.get("local_batch_size", 8)
    layout = Layout(dp=dp, zero=zero, shard=shard * cp if fsdp and replicate > 1 else 0, tp=tp, sp=tp > 1,
                    pp=pp, vpp=vpp if pp > 1 else 1, schedule=schedule if pp > 1 else "1f1b", cp=cp,
                    ep=par.get("expert_parallel_degree", 1),
                    # torchtitan's default expert_tensor_parallel_degree is 1 (JobConfig), not tp
                    etp=par.get("expert_tensor_parallel_degree", 1) if par.get("expert_parallel_degree", 1) > 1 else 0,
                    mbs=par.get("pipeline_parallel_microbatch_size", 1) if pp > 1 else local,
                    recompute=recompute)
    converters = job.get("model", {}).get("converters", [])
    precision = next((p for p, c in CONVERTERS.items() if c in converters),
                     "bf16-pure" if training.get("dtype") == "bfloat16" else
                     "fp32" if training.get("mixed_precision_param") == "float32" else "bf16")
    batch = training.get("global_batch_size", -1)
    model = {v: k for k, v in FLAVORS.items()}.get((job.get("model", {}).get("name", "llama3"),
                                                    job.get("model", {}).get("flavor", "")))
    return Shape(layout, batch if batch > 0 else local * dp, precision, training.get("seq_len", 2048),
                 load_model(model) if model else None)
