"""MaxText's YAML (keys of its configs/base.yml, which the file names as its base_config).

MaxText's mesh has an ICI and a DCN degree per axis: the ICI degrees multiply to the devices of one slice (a
TPU slice, or a GPU node), the DCN ones to the slices. Our mesh places pp outermost, then the replicas and
the shard groups of dp, cp, tp innermost, so the factors crossing slices are taken from the outside in.
MaxText shards parameters over its fsdp, context and expert axes alike, shards only optimizer states over
data with `shard_optimizer_over_data` (ZeRO-1), and pipelines circularly (GPipe order, `num_pipeline_repeats`
chunks a rank), so it keeps every micro-batch's activations as GPipe does.
"""

import math

from meshscale.errors import UserError
from meshscale.export import Job, change
from meshscale.specs.cluster import is_fp8
from meshscale.specs.layout import EVEN_CUT, Layout
from meshscale.specs.model import ModelSpec
from meshscale.specs.placement import layout_ends

GPU_ONLY = None  # MaxText runs on TPU slices and GPUs alike
PRECISIONS: dict = {}  # each precision runs as asked
# MaxText's own model configs of our presets (src/maxtext/configs/models/*.yml at e591f30, base.yml's commit)
MODEL_NAMES = {"llama2-7b": "llama2-7b", "llama2-13b": "llama2-13b", "llama2-70b": "llama2-70b",
               "llama3-8b": "llama3-8b", "llama3-70b": "llama3-70b", "llama3-405b": "llama3-405b",
               "mixtral-8x7b": "mixtral-8x7b", "deepseek-v3": "deepseek3-671b", "gpt3-175b": "gpt3-175b",
               "qwen3-235b-a22b": "qwen3-235b-a22b", "gpt-oss-120b": "gpt-oss-120b"}
# remat_policy: MaxText's policies from fastest (saves most) to slowest; 'minimal_with_context' keeps every
# matmul output and the attention context, the nearest to recompute=none; 'minimal' (checkpoint_dots_with_no_
# batch_dims) keeps the matmul outputs backward reads and reruns the attention, recompute=minimal;
# 'save_dot_except_mlpwi' keeps them but the MLP's first, recompute=minimal_mlp
REMAT = {"none": "minimal_with_context", "minimal": "minimal", "minimal_mlp": "save_dot_except_mlpwi", "full": "full"}


def adapt(layout: Layout, model: ModelSpec) -> tuple[Layout, list[str]]:
    changes: list[str] = []
    if layout_ends(layout):
        layout = change(layout, changes, "MaxText cuts its pipeline evenly", **EVEN_CUT)
    if layout.pp > 1 and model.layers % layout.stages:
        layout = change(layout, changes, f"MaxText's pipeline needs pp*vpp ({layout.stages}) to divide the "
                                         f"{model.layers} layers", pp=1, vpp=1, schedule="1f1b",
                                 dp=layout.dp * layout.pp)
    if layout.pp > 1 and layout.schedule != "gpipe" and not (layout.schedule == "interleaved"):
        layout = change(layout, changes, "MaxText pipelines circularly in GPipe order (every micro-batch's "
                                         f"activations held), not {layout.schedule}", schedule="gpipe", vpp=1)
    if layout.ep > 1 and layout.dp % layout.ep:
        layout = change(layout, changes, f"MaxText's expert axis takes its ranks from dp={layout.dp}", ep=1,
                        **({"etp": layout.tp} if layout.etp else {}))
    if layout.etp:
        layout = change(layout, changes, f"MaxText splits its experts over the tensor axis (tp={layout.tp}) as "
                                         "everything else: no separate expert tensor parallelism", etp=layout.tp)
    if layout.zero in (0, 1) and (layout.cp > 1 or layout.ep > 1):
        layout = change(layout, changes, "MaxText shards parameters over its context and expert axes", zero=3)
    if layout.zero == 2:
        layout = change(layout, changes, "MaxText shards optimizer states over data (ZeRO-1) or everything over "
                                         "fsdp (ZeRO-3), nothing in between", zero=3)
    if layout.shard and (layout.shard % layout.cp or layout.ep > 1):
        layout = change(layout, changes, "MaxText's fsdp groups span the context and expert axes whole", shard=0)
    if layout.tp > 1 and layout.sp:
        layout = change(layout, changes, "MaxText's tensor axis has no sequence-parallel switch for norms and "
                                         "residuals", sp=False)
    if layout.offload:
        layout = change(layout, changes, "MaxText offloads by remat policy, not whole layers", offload=0)
    if layout.recompute not in REMAT:
        layout = change(layout, changes, "MaxText's remat policies name tensors to save, not the attention core "
                                         "or every other matmul", recompute="full")
    return layout, changes


def axes(layout: Layout) -> dict[str, int]:
    """MaxText axis degrees, outermost first as our mesh nests them."""
    if layout.zero == 3:
        replicas = layout.replicas
        fsdp = layout.dp // replicas // layout.ep
        data = replicas
    else:
        fsdp, data = 1, layout.dp // layout.ep
    return {"pipeline": layout.pp, "data": data, "fsdp": fsdp, "expert": layout.ep, "context": layout.cp,
            "tensor": layout.tp}


def mesh(layout: Layout, slice_size: int) -> dict[str, int]:
    """ici_*/dcn_* degrees: the slices take their factors from the outermost axes."""
    devices = layout.devices
    if devices > slice_size and devices % slice_size:
        raise UserError(f"--emit maxtext: {devices} devices are not whole slices of {slice_size}; pick a "
                        f"multiple of {slice_size}")
    left = max(1, devices // slice_size)
    out = {}
    for axis, degree in axes(layout).items():
        dcn = math.gcd(degree, left)
        left //= dcn
        out[f"dcn_{axis}_parallelism"], out[f"ici_{axis}_parallelism"] = dcn, degree // dcn
    if left != 1:
        raise UserError(f"--emit maxtext: the layout's axes do not split into {devices // slice_size} slices; "
                        "pick degrees whose outer factors make whole slices")
    return out


def render(job: Job) -> str:
    lay, model = job.layout, job.model
    accumulate = job.microbatches if lay.pp == 1 else 1
    values: dict[str, object] = {"base_config": "base.yml", "run_name": f"meshscale-{model.name}",
              "hardware": "tpu" if job.cluster.torus else "gpu", "steps": job.steps}
    values |= {"model_name": MODEL_NAMES[model.name]} if model.name in MODEL_NAMES else _shape(model)
    values |= {"max_target_length": model.seq,
               "per_device_batch_size": job.global_batch / lay.devices / accumulate,
               "gradient_accumulation_steps": accumulate,
               "num_slices": max(1, lay.devices // job.devices_per_node)}
    values |= mesh(lay, job.devices_per_node)
    if lay.zero == 1:
        values["shard_optimizer_over_data"] = True
    if lay.pp > 1:
        values |= {"num_layers_per_pipeline_stage": model.layers // lay.stages,
                   "num_pipeline_repeats": lay.vpp, "num_pipeline_microbatches": job.microbatches}
    if model.is_moe:  # GShard's einsum dispatch is MaxText's dense path, megablox its dropless one
        values["megablox"] = job.cluster.software.moe_dispatcher != "einsum"
        if model.capacity_factor:
            values["capacity_factor"] = model.capacity_factor
    values |= {"remat_policy": REMAT[lay.recompute],
               "dtype": "float32" if job.precision == "fp32" else "bfloat16",
               "weight_dtype": "bfloat16" if job.precision == "bf16-pure" else "float32"}
    if is_fp8(job.precision):  # MXFP8 (Blackwell only) through Transformer Engine's recipe
        values["quantization"] = "fp8" if job.precision == "fp8" else "te_mxfp8"
    elif job.precision == "int8":  # AQT: the linear layers' GEMMs in int8
        values["quantization"] = "int8"
    values |= {"dataset_type": "synthetic"} if not job.data else {"dataset_type": "hf", "hf_path": job.data}
    header = (f"# meshscale: {model.name}, {job.global_batch} x {model.seq} tokens a step on {lay.devices} x "
              f"{job.cluster.name}, layout {lay}\n")
    return header + "".join(f"{key}: {_yaml(v)}\n" for key, v in values.items())


def _shape(model: ModelSpec) -> dict:
    out = {"model_name": "default", "decoder_block": "mixtral" if model.is_moe else "llama2",
           "base_emb_dim": model.hidden, "base_num_query_heads": model.heads,
           "base_num_kv_heads": model.kv_heads, "base_mlp_dim": model.ffn, "base_num_decoder_layers": model.layers,
           "head_dim": model.head_dim, "vocab_size": model.vocab,
           "mlp_activations": ["silu", "linear"] if model.mlp == "swiglu" else ["gelu"],
           "logits_via_embedding": model.tied_embeddings}
    if model.is_moe:
        out |= {"num_experts": model.experts, "num_experts_per_tok": model.top_k,
                "base_moe_mlp_dim": model.expert_ffn, "shared_experts": model.shared_experts,
                "first_num_dense_layers": model.first_dense_layers}
    return out


def _yaml(v) -> str:
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, str):
        return f'"{v}"'
    if isinstance(v, list):
        return "[" + ", ".join(_yaml(x) for x in v) + "]"
    return str(v)


def notes(job: Job) -> list[str]:
    out = []
    if job.model.name not in MODEL_NAMES and (job.model.biases or job.model.learned_positions or job.model.uses_mla):
        out.append(f"MaxText: {job.model.name}'s biases, learned positions or MLA need a decoder_block of their "
                   "own; the config gives its shapes only")
    if job.model.mlp == "relu2" or job.model.norm == "layernorm":
        out.append(f"MaxText: {job.model.name}'s squared ReLU or LayerNorm (Nemotron-4's) is no flax.linen "
                   "activation and no decoder_block of MaxText's; the config gives its shapes only")
    if job.model.chunked_attention:
        out.append(f"MaxText: {job.model.name}'s chunked attention (Llama 4's) needs a decoder_block of its own; "
                   "the config gives its shapes only")
    if job.precision == "int8" and job.cluster.software.int8_forward_only:
        out.append(f"MaxText: quantization=int8 quantizes every part's gradients too; the prediction took "
                   f"{job.cluster.software.int8_forward_only} in the forward only (enable_tff_quant of its MLPerf 4.1 "
                   "branch), which main has no switch for")
    return out
