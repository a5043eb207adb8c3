"""`--emit torchtitan|megatron|deepspeed|maxtext`: every emitted config is read by its framework's own loader
(torchtitan's ConfigManager, Megatron-Core's config dataclasses with Megatron-LM's recorded flags, DeepSpeed's
DeepSpeedConfig, MaxText's recorded base.yml keys), so a renamed option fails here, and the values it loads
are the layout's."""

import dataclasses
import importlib.util
import json
import shlex
import subprocess
import sys
import types
from pathlib import Path

import pytest

from meshscale.errors import UserError
from meshscale.export import FRAMEWORKS, adapted, emit, read
from meshscale.specs.cluster import load_cluster
from meshscale.specs.layout import Layout, split_layers
from meshscale.specs.model import load_model
from meshscale.specs.placement import chunk_ranges, layout_ends

DATA = Path(__file__).parent / "data"
ROOT = Path(__file__).parent.parent

# (model, cluster, layout, global batch, precision): dense, pipelined, hybrid-sharded, context-parallel, MoE
# with EP, MLA, GPT-style, FP8, each recompute mode
CASES = [
    ("llama3-8b", "h100-80gb", "dp=2,zero=1,tp=8,sp=true,mbs=2,recompute=selective", 64, "bf16"),
    # (llama3-8b: FSDP inside a pipeline stage holds the stage whole, so 70B does not fit this layout)
    ("llama3-8b", "h100-80gb", "dp=8,zero=3,pp=2,vpp=8,schedule=interleaved,cp=4,mbs=1", 256, "bf16"),
    ("llama3-70b", "h100-80gb", "dp=16,zero=3,shard=8,tp=4,sp=true,mbs=2,recompute=full", 128, "fp8"),
    ("llama2-7b", "a100-80gb", "dp=4,pp=4,schedule=zbv,mbs=1", 64, "bf16-pure"),
    # EP folded over tp x dp (ep=8 > dp=4) with whole experts: etp=1
    ("mixtral-8x7b", "h100-80gb", "dp=4,zero=1,tp=2,sp=true,pp=8,ep=8,etp=1,mbs=1", 256, "bf16"),
    ("deepseek-v3", "h100-80gb", "dp=64,zero=1,pp=16,ep=64,mbs=1,recompute=full", 1024, "bf16"),
    ("gpt3-175b", "a100-80gb", "dp=8,zero=1,tp=8,sp=true,pp=12,vpp=2,schedule=interleaved,mbs=1", 1536, "bf16"),
    ("llama3-8b", "h100-80gb", "dp=8,zero=3,mbs=1,recompute=op", 64, "fp32"),
    ("llama2-13b", "tpu-v5p", "dp=32,zero=3,tp=4,cp=32,recompute=full", 96, "bf16"),
    ("llama2-13b", "tpu-v5p", "dp=16,zero=3,tp=4,mbs=8,recompute=minimal", 128, "bf16"),
    ("llama3-8b", "h100-80gb", "dp=8,zero=3,mbs=1,recompute=minimal", 64, "bf16"),
    # uneven first and last pipeline ranks, Megatron-Core's recompute modules, and activation offload
    ("llama3-8b", "h100-80gb", "dp=2,zero=1,tp=2,sp=true,pp=4,first=5,last=11,mbs=1", 64, "bf16"),
    # the embedding counted as a layer of the cut (Megatron-Core --account-for-embedding-in-pipeline-split)
    ("llama3-8b", "h100-80gb", "dp=2,zero=1,tp=4,sp=true,pp=3,embedding_layer=true,mbs=1", 48, "bf16"),
    ("llama3-8b", "h100-80gb", "dp=8,zero=1,mbs=1,offload=8", 64, "bf16"),
    ("llama3-8b", "h100-80gb", "dp=8,zero=1,mbs=1,recompute=full,offload=32", 64, "bf16"),
    ("llama3-8b", "h100-80gb", "dp=4,zero=1,tp=2,sp=true,mbs=1,recompute=layernorm+mlp", 64, "bf16"),
    ("mixtral-8x7b", "h100-80gb", "dp=4,zero=1,tp=2,sp=true,pp=8,ep=8,etp=1,mbs=1,recompute=core_attn+moe_act", 256,
     "bf16"),
    ("deepseek-v3", "h100-80gb", "dp=64,zero=1,pp=16,ep=64,mbs=1,recompute=layernorm+mla_up_proj+moe_act", 1024,
     "bf16"),
    ("llama3-8b", "b200", "dp=4,zero=1,tp=2,sp=true,mbs=1", 64, "mxfp8"),  # Blackwell's block-scaled FP8
]


def emitted(framework, case):
    model, cluster, layout, batch, precision = case
    m, c = load_model(model), load_cluster(cluster)
    shape = Layout.parse(layout)
    if framework != "maxtext" and c.torus:
        pytest.skip(f"{framework} runs on GPUs")
    return emit(framework, m, c, shape, batch, precision, steps=100), m, shape


def installed(name: str) -> bool:
    return importlib.util.find_spec(name) is not None


# ---- torchtitan ----------------------------------------------------------------------------------------

def torchtitan_config_manager():
    """torchtitan.config without torchtitan/__init__.py, which imports its Triton kernels (absent from
    torch's CPU wheel): the config package itself is plain dataclasses and tyro."""
    if "torchtitan.config" not in sys.modules:
        spec = importlib.util.find_spec("torchtitan")
        package = types.ModuleType("torchtitan")
        package.__path__ = list(spec.submodule_search_locations)
        sys.modules.setdefault("torchtitan", package)
    from torchtitan.config import ConfigManager
    return ConfigManager


@pytest.mark.skipif(not installed("torchtitan"), reason="torchtitan is not installed (pip install '.[test]')")
@pytest.mark.parametrize("case", CASES, ids=[c[2] for c in CASES])
def test_torchtitan_config_manager_loads_it(case, tmp_path):
    out, model, asked = emitted("torchtitan", case)
    path = tmp_path / "job.toml"
    path.write_text(out.config)
    job = torchtitan_config_manager()().parse_args(["--job.config_file", str(path)])
    lay = Layout.parse(out.layout)
    par = job.parallelism
    assert (par.data_parallel_replicate_degree * par.data_parallel_shard_degree * par.context_parallel_degree
            * par.tensor_parallel_degree * par.pipeline_parallel_degree) == lay.devices == asked.devices
    assert (par.tensor_parallel_degree, par.pipeline_parallel_degree, par.context_parallel_degree,
            par.expert_parallel_degree) == (lay.tp, lay.pp, lay.cp, lay.ep)
    assert par.expert_tensor_parallel_degree == (lay.expert_tp if lay.ep > 1 else 1)
    assert par.data_parallel_shard_degree * lay.cp == (lay.shard_size if lay.zero >= 2 else lay.cp)
    assert job.training.global_batch_size == case[3] and job.training.seq_len == model.seq
    if lay.pp > 1:
        chunks = par.module_fqns_per_model_part
        assert len(chunks) == lay.pp * lay.vpp and sum(len(c) for c in chunks) == model.layers + 3
        assert job.training.local_batch_size // par.pipeline_parallel_microbatch_size == out.prediction.microbatches
    assert job.activation_checkpoint.mode == {"none": "none", "full": "full", "op": "selective"}[lay.recompute]
    assert ("quantize.linear.float8" in job.model.converters) == (case[4] == "fp8")
    assert ("quantize.linear.mx" in job.model.converters) == (case[4] == "mxfp8")


# ---- Megatron-LM / Megatron-Core -----------------------------------------------------------------------

def megatron_flags() -> dict:
    rows = [line.rstrip("\n").split("\t") for line in (DATA / "megatron_lm_flags.tsv").read_text().splitlines()
            if line and not line.startswith("#")]
    return {flag: (dest, takes, set(choices.split(",")) if choices else None) for flag, dest, takes, choices in rows}


def parse_megatron(text: str) -> dict:
    """Megatron-LM's parse of the emitted arguments, by its recorded flags: each flag known, each value count
    and choice its own; returns dest -> value as argparse would set it."""
    flags = megatron_flags()
    # as bash reads it: an operator (a pipe, a redirect) outside quotes would end the command
    lexer = shlex.shlex(text.replace("\\\n", " "), posix=True, punctuation_chars=True)
    lexer.whitespace_split, lexer.commenters = True, "#"
    tokens = list(lexer)
    assert not any(set(t) <= set("|&;<>()") for t in tokens), f"a shell operator in {tokens}"
    tokens = tokens[tokens.index("pretrain_gpt.py") + 1:]
    out, i = {}, 0
    while i < len(tokens):
        flag = tokens[i]
        assert flag in flags, f"Megatron-LM has no flag {flag}"
        dest, takes, choices = flags[flag]
        values = []
        while i + 1 < len(tokens) and not tokens[i + 1].startswith("--"):
            values.append(tokens[i + 1])
            i += 1
        i += 1
        if takes == "0":
            assert not values, f"{flag} is a switch, given {values}"
            out[dest] = not flag.startswith(("--disable-", "--no-"))  # Megatron-LM's store_false switches
            continue
        assert values and (takes in "*+" or len(values) == int(takes)), f"{flag} takes {takes} values: {values}"
        assert choices is None or set(values) <= choices, f"{flag} {values} not in {sorted(choices)}"
        out[dest] = [_number(v) for v in values] if takes in "*+" else _number(values[0])
    return out


def _number(text: str):
    for kind in (int, float):
        try:
            return kind(text)
        except ValueError:
            pass
    return text


def megatron_cut(config) -> list[int]:
    """The transformer layers Megatron-Core builds on each pipeline chunk (chunk c: pipeline rank c % pp,
    virtual stage c // pp), from its own functions: the layout it was given, or its cut rules."""
    from megatron.core.transformer.enums import LayerType
    from megatron.core.transformer.transformer_block import get_num_layers_to_build

    pp, vpp = config.pipeline_model_parallel_size, config.virtual_pipeline_model_parallel_size or 1
    spelled = config.pipeline_model_parallel_layout
    return [spelled.layout[c % pp][c // pp].count(LayerType.decoder) if spelled else
            get_num_layers_to_build(config, c // pp if vpp > 1 else None, c % pp) for c in range(pp * vpp)]


@pytest.mark.skipif(not installed("megatron.core"), reason="megatron-core is not installed (pip install '.[test]')")
def test_the_cut_is_megatron_cores():
    """split_layers against Megatron-Core's get_num_layers_to_build: the even cut, the first and last ranks'
    layers given, the embedding and the loss counted as layers. Where the layers and both counted make whole
    chunks, the even cut with its leftovers inside is that cut: the layouts that leave the flags out charge it."""
    import torch
    from megatron.core.transformer.transformer_config import TransformerConfig

    for layers, pp, vpp, first, last, embedding, loss in [
            (32, 4, 1, 0, 0, False, False), (32, 2, 4, 0, 0, False, False), (32, 4, 1, 5, 11, False, False),
            (32, 2, 2, 14, 18, False, False), (31, 4, 1, 0, 0, True, False), (31, 4, 1, 0, 0, False, True),
            (126, 16, 4, 0, 0, True, True), (30, 4, 1, 0, 0, True, True), (62, 8, 2, 0, 0, True, True)]:
        config = TransformerConfig(
            num_layers=layers, hidden_size=64, num_attention_heads=4, pipeline_model_parallel_size=pp,
            virtual_pipeline_model_parallel_size=vpp if vpp > 1 else None, pipeline_dtype=torch.bfloat16,
            num_layers_in_first_pipeline_stage=first or None, num_layers_in_last_pipeline_stage=last or None,
            account_for_embedding_in_pipeline_split=embedding, account_for_loss_in_pipeline_split=loss)
        cut = [len(r) for r in split_layers(layers, pp * vpp, 0, pp, first, last, embedding, loss)]
        assert cut == megatron_cut(config), (layers, pp, vpp, first, last, embedding, loss)
        if embedding and loss:
            assert cut == [len(r) for r in split_layers(layers, pp * vpp)]


@pytest.mark.skipif(not installed("megatron.core"), reason="megatron-core is not installed (pip install '.[test]')")
@pytest.mark.parametrize("case", [c for c in CASES if not c[1].startswith("tpu")], ids=lambda c: c[2])
def test_megatron_core_configs_take_it(case):
    import torch
    import torch.nn.functional as F
    from megatron.core.distributed import DistributedDataParallelConfig
    from megatron.core.transformer.transformer_config import MLATransformerConfig, TransformerConfig

    out, model, asked = emitted("megatron", case)
    args = parse_megatron(out.config)
    lay = Layout.parse(out.layout)
    # Megatron-LM's core_transformer_config_from_args: every argument named as a field, plus its renames
    kind = MLATransformerConfig if args.get("multi_latent_attention") else TransformerConfig
    names = {f.name for f in dataclasses.fields(kind)}
    kw = {k: v for k, v in args.items() if k in names}
    if len(kw.get("cp_comm_type", ())) == 1:  # validate_args: one type for every layer
        kw["cp_comm_type"] = kw["cp_comm_type"][0]
    kw.update(num_moe_experts=args.get("num_experts"), gated_linear_unit=bool(args.get("swiglu")),
              activation_func=F.silu if args.get("swiglu") else F.gelu,
              num_query_groups=args.get("num_query_groups"), fp8=args.get("fp8"),
              pipeline_dtype=torch.bfloat16 if args.get("bf16") else torch.float32)
    if lay.vpp > 1 and "num_layers_per_virtual_pipeline_stage" in args:
        kw["virtual_pipeline_model_parallel_size"] = (
            model.layers // lay.pp // args["num_layers_per_virtual_pipeline_stage"])
    if "num_virtual_stages_per_pipeline_rank" in args:
        kw["virtual_pipeline_model_parallel_size"] = args["num_virtual_stages_per_pipeline_rank"]
    if kind is MLATransformerConfig:
        kw.pop("kv_channels", None)
    config = kind(**kw)
    assert (config.tensor_model_parallel_size, config.pipeline_model_parallel_size, config.context_parallel_size,
            config.expert_model_parallel_size) == (lay.tp, lay.pp, lay.cp, lay.ep)
    assert config.expert_tensor_parallel_size == lay.expert_tp
    assert config.sequence_parallel == lay.sp and config.num_layers == model.layers
    assert config.recompute_granularity == {"none": None, "full": "full"}.get(lay.recompute, "selective")
    assert config.cpu_offloading_num_layers == lay.offload
    if config.recompute_granularity == "selective":
        assert set(config.recompute_modules) == lay.recompute_modules
    if lay.pp > 1:  # Megatron-Core builds on each chunk the layers the cost model charged it
        assert megatron_cut(config) == [len(r) for r in chunk_ranges(model.layers, lay.stages, model.mtp_layers,
                                                                      lay.pp, layout_ends(lay))]
        back = read("megatron", out.config, asked.devices).layout  # as `check` reads a job's arguments
        assert (back.embedding_layer, back.loss_layer) == (lay.embedding_layer, lay.loss_layer)
    ddp_names = {f.name for f in dataclasses.fields(DistributedDataParallelConfig)}
    ddp = DistributedDataParallelConfig(**{k: v for k, v in args.items() if k in ddp_names},
                                        grad_reduce_in_fp32=bool(args.get("accumulate_allreduce_grads_in_fp32")),
                                        bucket_size=args.get("ddp_bucket_size"))
    assert ddp.use_distributed_optimizer == (lay.zero >= 1 and lay.dp * lay.cp > 1)
    assert ddp.use_megatron_fsdp == (lay.zero >= 2 and lay.dp * lay.cp > 1)
    # Megatron-LM's batch rule (validate_args): the global batch splits into micro-batches of every DP rank
    dp = asked.devices // (lay.tp * lay.pp * lay.cp)
    assert args["global_batch_size"] % (args["micro_batch_size"] * dp) == 0
    assert args["global_batch_size"] // (args["micro_batch_size"] * dp) == out.prediction.microbatches


def test_megatron_fp8_with_layernorm_recompute_takes_a_recipe_that_allows_it():
    """TransformerConfig refuses layernorm and moe_act recompute under FP8's delayed scaling."""
    out = emit("megatron", load_model("llama3-8b"), load_cluster("h100-80gb"),
               Layout.parse("dp=8,zero=1,mbs=1,recompute=layernorm"), 64, "fp8", steps=10)
    args = parse_megatron(out.config)
    assert args["fp8_recipe"] == "tensorwise" and args["recompute_modules"] == ["layernorm"]


def test_each_fp8_recipe_reaches_each_framework_as_the_cost_model_charged_it():
    """MXFP8 is Megatron-Core's mxfp8 recipe (e4m3 throughout), torchtitan's mx converter and MaxText's te_mxfp8,
    and reads back as mxfp8; DeepSpeed's JSON has none (nearest bf16). Tensor-wise FP8 with current scaling is
    Megatron-Core's tensorwise recipe, delayed scaling its default."""

    model, b200, layout = load_model("llama3-8b"), load_cluster("b200"), Layout.parse("dp=8,zero=1,mbs=1")
    out = {f: emit(f, model, b200, layout, 64, "mxfp8", steps=10) for f in ("megatron", "torchtitan", "maxtext",
                                                                           "deepspeed")}
    args = parse_megatron(out["megatron"].config)
    assert (args["fp8"], args["fp8_recipe"], args["bf16"]) == ("e4m3", "mxfp8", True)
    for framework in ("megatron", "torchtitan"):
        assert read(framework, out[framework].config, 8).precision == "mxfp8"
    assert 'converters = ["quantize.linear.mx"]' in out["torchtitan"].config
    assert 'quantization: "te_mxfp8"' in out["maxtext"].config
    assert any("no FP8 switch" in c for c in out["deepspeed"].changes)
    current = b200.with_software(fp8_scaling="current")
    assert parse_megatron(emit("megatron", model, current, layout, 64, "fp8", steps=10).config)["fp8_recipe"] == \
        "tensorwise"
    assert "fp8_recipe" not in parse_megatron(emit("megatron", model, b200, layout, 64, "fp8", steps=10).config)


def test_blockwise_fp8_reaches_megatron_as_its_blockwise_recipe():
    """Block-scaled FP8 is Megatron-Core's blockwise recipe in e4m3 throughout (DeepSeek-V3's format), and reads
    back as FP8; torchtitan's float8 converter has no such recipe, which its notes say."""
    model, layout = load_model("llama3-8b"), Layout.parse("dp=8,zero=1,mbs=1")
    h100 = load_cluster("h100-80gb").with_software(fp8_scaling="blockwise")
    out = emit("megatron", model, h100, layout, 64, "fp8", steps=10)
    args = parse_megatron(out.config)
    assert (args["fp8"], args["fp8_recipe"]) == ("e4m3", "blockwise")
    assert read("megatron", out.config, 8).precision == "fp8"
    assert any("blockwise" in n for n in emit("torchtitan", model, h100, layout, 64, "fp8", steps=10).notes)
    assert not any("blockwise" in n for n in emit("torchtitan", model, load_cluster("h100-80gb"), layout, 64, "fp8",
                                                  steps=10).notes)


def test_int8_reaches_maxtext_as_aqt_and_the_gpu_frameworks_as_bf16():
    """--precision int8 is MaxText's quantization=int8 on a TPU slice; on a GPU cluster given int8 data, the GPU
    frameworks have no int8 training and write the nearest, bf16."""
    model, layout = load_model("llama3-8b"), Layout.parse("dp=64,zero=3,mbs=1,recompute=full")
    out = emit("maxtext", model, load_cluster("tpu-v5p"), layout, 64, "int8", steps=10)
    assert 'quantization: "int8"' in out.config and not out.changes
    tff = load_cluster("tpu-v5p").with_software(int8_forward_only="attention_out+mlp", tp_comm_overlap=True,
                                                tp_overlap_scatters=False)
    notes = emit("maxtext", model, tff, layout, 64, "int8", steps=10).notes
    assert any("attention_out+mlp in the forward only" in n for n in notes)
    assert any("TP's all-gathers alone" in n for n in notes)
    h100 = dataclasses.replace(load_cluster("h100-80gb"), peak_flops_int8=1979e12)
    for framework in ("megatron", "torchtitan", "deepspeed"):
        got = emit(framework, model, h100, Layout.parse("dp=8,zero=1,mbs=1"), 64, "int8", steps=10)
        assert any("no int8 training" in c and "precision=bf16" in c for c in got.changes), framework


@pytest.mark.skipif(not installed("megatron.core"), reason="megatron-core is not installed (pip install '.[test]')")
def test_megatron_gathers_fp8_parameters_where_the_cost_model_charged_one_byte():
    from megatron.core.distributed import DistributedDataParallelConfig
    from megatron.core.transformer.transformer_config import TransformerConfig

    h100 = load_cluster("h100-80gb")
    fp8_params = h100.with_software(fp8_param_gather=True)
    model, layout = load_model("llama3-8b"), Layout.parse("dp=8,zero=1,mbs=1")
    args = parse_megatron(emit("megatron", model, fp8_params, layout, 64, "fp8", steps=10).config)
    assert args["fp8_param_gather"] and args["fp8"] == "hybrid"
    assert DistributedDataParallelConfig(fp8_param_gather=args["fp8_param_gather"]).fp8_param_gather
    TransformerConfig(num_layers=2, hidden_size=64, num_attention_heads=4, fp8=args["fp8"],
                      fp8_param=args["fp8_param_gather"])
    assert "fp8_param_gather" not in parse_megatron(emit("megatron", model, h100, layout, 64, "fp8", steps=10).config)


def test_megatron_keeps_the_optimizer_state_the_cost_model_counted():
    """The precision-aware optimizer and its bf16 moments reach Megatron-LM's flags (checked against its parser's
    choices) with the distributed optimizer, which it needs; a replicated layout gets neither."""
    sw = load_cluster("h100-80gb").with_software(precision_aware_optimizer=True, adam_moments="bf16")
    model = dataclasses.replace(load_model("llama3-8b").with_seq(1024), layers=4)  # small enough to replicate
    args = parse_megatron(emit("megatron", model, sw, Layout.parse("dp=8,zero=1,mbs=1"), 64, "bf16", steps=10).config)
    assert args["use_precision_aware_optimizer"] and args["exp_avg_dtype"] == args["exp_avg_sq_dtype"] == "bf16"
    replicated = parse_megatron(emit("megatron", model, sw, Layout.parse("dp=8,mbs=1"), 64, "bf16", steps=10).config)
    assert "use_precision_aware_optimizer" not in replicated and "exp_avg_dtype" not in replicated


def test_offload_reaches_each_framework_in_the_form_it_has():
    """Megatron-Core offloads fewer than all layers without recompute; DeepSpeed every layer's checkpoint under
    full recompute (cpu_checkpointing); each export keeps the form its framework has and drops the other."""
    model, h100 = load_model("llama3-8b"), load_cluster("h100-80gb")

    def emitted_layout(framework, text):
        return emit(framework, model, h100, Layout.parse(text), 64, "bf16", steps=10)

    checkpoints = emitted_layout("deepspeed", "dp=8,zero=1,mbs=1,recompute=full,offload=32")
    assert json.loads(checkpoints.config)["activation_checkpointing"]["cpu_checkpointing"] is True
    assert Layout.parse(emitted_layout("megatron", "dp=8,zero=1,mbs=1,recompute=full,offload=32").layout).offload == 0
    layers = emitted_layout("megatron", "dp=8,zero=1,mbs=1,offload=8")
    assert parse_megatron(layers.config)["cpu_offloading_num_layers"] == 8
    assert Layout.parse(emitted_layout("deepspeed", "dp=8,zero=1,mbs=1,offload=8").layout).offload == 0


# ---- DeepSpeed -----------------------------------------------------------------------------------------

@pytest.mark.skipif(not installed("deepspeed"), reason="deepspeed is not installed (pip install '.[test]')")
def test_deepspeed_config_class_takes_every_case(tmp_path):
    """One process reads them all (DeepSpeed's import costs seconds); a world of one: DeepSpeed checks
    train_batch_size against the data-parallel world of a running job, so that rule is checked here."""
    configs = []
    for case in CASES:
        if case[1].startswith("tpu"):
            continue
        if case[0] == "deepseek-v3":  # its EP lives in DeepSpeed's model code; without it FSDP gathers whole MoE layers
            with pytest.raises(UserError, match="no layout it can express fits"):
                emitted("deepspeed", case)
            continue
        out, _, asked = emitted("deepspeed", case)
        lay = Layout.parse(out.layout)
        cfg = json.loads(out.config)
        assert (lay.pp, lay.cp, lay.ep, lay.shard) == (1, 1, 1, 0)
        assert cfg["train_batch_size"] == cfg["train_micro_batch_size_per_gpu"] * \
            cfg["gradient_accumulation_steps"] * lay.dp
        assert cfg.get("tensor_parallel", {}).get("autotp_size", 1) == lay.tp and lay.devices == asked.devices
        configs.append({k: v for k, v in cfg.items() if k != "train_batch_size"})
    script = ("import json, sys\nfrom deepspeed.runtime.config import DeepSpeedConfig\n"
              "for cfg in json.load(open(sys.argv[1])):\n"
              "    c = DeepSpeedConfig(cfg)\n"
              "    print('loaded', json.dumps([c.zero_optimization_stage, c.zero_config.overlap_comm,\n"
              "                      c.zero_config.reduce_bucket_size, c.bfloat16_config.enabled,\n"
              "                      c.gradient_accumulation_steps, c.tensor_parallel_config.autotp_size]))\n")
    path = tmp_path / "configs.json"
    path.write_text(json.dumps(configs))
    r = subprocess.run([sys.executable, "-c", script, str(path)], capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr[-2000:]
    loaded = [json.loads(line[len("loaded "):]) for line in r.stdout.splitlines() if line.startswith("loaded ")]
    assert len(loaded) == len(configs)
    for cfg, (stage, overlap, bucket, bf16, accumulate, autotp) in zip(configs, loaded):
        zero = cfg["zero_optimization"]
        assert (stage, overlap, bucket) == (zero["stage"], zero["overlap_comm"], zero["reduce_bucket_size"])
        assert bf16 == ("bf16" in cfg) and accumulate == cfg["gradient_accumulation_steps"]
        assert autotp == cfg.get("tensor_parallel", {}).get("autotp_size", 0)


# ---- MaxText -------------------------------------------------------------------------------------------

def maxtext_keys() -> dict:
    rows = [line.split("\t") for line in (DATA / "maxtext_base_keys.tsv").read_text().splitlines()
            if line and not line.startswith("#")]
    return dict(rows)


@pytest.mark.parametrize("case", CASES, ids=[c[2] for c in CASES])
def test_maxtext_keys_are_base_yml_keys(case):
    yaml = pytest.importorskip("yaml", reason="pyyaml is not installed (pip install '.[test]')")
    out, model, asked = emitted("maxtext", case)
    values = yaml.safe_load(out.config)
    keys = maxtext_keys()
    assert values.pop("base_config") == "base.yml"
    kinds = {bool: "bool", int: "int", float: "float", str: "str", list: "list"}
    for key, value in values.items():
        assert key in keys, f"MaxText's base.yml has no key {key}"
        assert kinds[type(value)] == keys[key] or (keys[key], kinds[type(value)]) == ("float", "int"), key
    lay = Layout.parse(out.layout)
    ici = [v for k, v in values.items() if k.startswith("ici_")]
    dcn = [v for k, v in values.items() if k.startswith("dcn_")]
    slices = values["num_slices"]
    assert _product(ici) * slices == lay.devices == asked.devices and _product(dcn) == slices
    assert values["per_device_batch_size"] * lay.devices * values["gradient_accumulation_steps"] == case[3]
    if lay.pp > 1:
        assert values["num_layers_per_pipeline_stage"] * lay.pp * values["num_pipeline_repeats"] == model.layers


def test_gshard_einsum_dispatch_reaches_maxtext_and_megatron_in_the_form_each_has():
    """MaxText runs GShard's einsum dispatch without megablox, into buffers of its capacity_factor; Megatron-Core
    has no such dispatcher: its arguments pad the all-to-all's buffers to capacity, and a note says what differs."""
    yaml = pytest.importorskip("yaml", reason="pyyaml is not installed (pip install '.[test]')")
    model = dataclasses.replace(load_model("mixtral-8x7b"), capacity_factor=1.25)
    v6e = load_cluster("tpu-v6e").with_software(moe_dispatcher="einsum")
    values = yaml.safe_load(emit("maxtext", model, v6e, Layout.parse("dp=256,zero=3,mbs=8,recompute=full"), 2048,
                                 "bf16", steps=10).config)
    keys = maxtext_keys()
    assert values["megablox"] is False and values["capacity_factor"] == 1.25
    assert keys["megablox"] == "bool" and keys["capacity_factor"] == "float"
    dropless = load_cluster("tpu-v6e")
    assert yaml.safe_load(emit("maxtext", load_model("mixtral-8x7b"), dropless,
                               Layout.parse("dp=256,zero=3,mbs=8,recompute=full"), 2048, "bf16",
                               steps=10).config)["megablox"] is True
    h100 = load_cluster("h100-80gb").with_software(moe_dispatcher="einsum")
    got = emit("megatron", model, h100, Layout.parse("dp=8,zero=1,pp=4,ep=8,mbs=1"), 64, "bf16", steps=10)
    args = parse_megatron(got.config)
    assert args["moe_pad_expert_input_to_capacity"] and args["moe_expert_capacity_factor"] == 1.25
    assert args["moe_token_dispatcher_type"] == "alltoall"
    assert any("no GShard einsum dispatch" in n for n in got.notes)


def _product(xs) -> int:
    out = 1
    for x in xs:
        out *= x
    return out


def test_minimal_recompute_is_maxtexts_policy_and_the_nearest_elsewhere():
    yaml = pytest.importorskip("yaml", reason="pyyaml is not installed (pip install '.[test]')")
    out, _, _ = emitted("maxtext", CASES[9])
    assert yaml.safe_load(out.config)["remat_policy"] == "minimal" and not out.changes
    model, cluster, layout, batch, precision = CASES[9]
    kept_but_mlp = emit("maxtext", load_model(model), load_cluster(cluster),
                        Layout.parse(layout.replace("minimal", "minimal_mlp")), batch, precision, steps=10)
    assert yaml.safe_load(kept_but_mlp.config)["remat_policy"] == "save_dot_except_mlpwi"
    nearest = {"megatron": "selective", "torchtitan": "op", "deepspeed": "full"}
    for framework, recompute in nearest.items():
        out, _, _ = emitted(framework, CASES[10])
        assert Layout.parse(out.layout).recompute == recompute and any("recompute" in c for c in out.changes)


# ---- what a framework cannot express -------------------------------------------------------------------

def test_what_a_framework_cannot_express_is_said_and_the_nearest_emitted_with_its_prediction():
    model, cluster = load_model("llama3-8b"), load_cluster("h100-80gb")
    asked = Layout.parse("dp=8,zero=3,pp=2,vpp=8,schedule=interleaved,cp=4,mbs=1")
    out = emit("deepspeed", model, cluster, asked, 256, "bf16", steps=10)
    assert out.changes and any("pp=2" in c for c in out.changes) and any("cp=4" in c for c in out.changes)
    lay = Layout.parse(out.layout)
    assert (lay.pp, lay.cp) == (1, 1) and lay.devices == 64 and out.prediction.fits
    # the asked layout's own prediction is said beside the nearest's
    assert out.asked_step_s and out.asked_step_s != out.prediction.step_time_s
    # Megatron-LM has no zero-bubble schedules: the nearest is 1F1B, predicted on its own
    out = emit("megatron", load_model("llama2-7b"), load_cluster("a100-80gb"),
               Layout.parse("dp=4,zero=1,pp=4,schedule=zb,mbs=1"), 64, "bf16", steps=10)
    assert Layout.parse(out.layout).schedule == "1f1b" and "zb" in out.changes[0]
    assert out.prediction.layout == out.layout
    # what each expresses exactly comes back unchanged
    for framework in FRAMEWORKS:
        same = Layout.parse({"deepspeed": "dp=8,zero=2,tp=8,recompute=full",
                             "maxtext": "dp=8,zero=3,tp=8,recompute=full"}.get(
            framework, "dp=8,zero=3,tp=8,sp=true,recompute=full"))
        assert adapted(framework, same, model) == (same, [])


from clirun import run_cli as cli  # noqa: E402


def test_cli_emit_prints_the_config_and_json_carries_it():
    args = ["plan", "--model", "llama3-8b", "--cluster", "h100-80gb", "--devices", "16", "--global-batch", "64"]
    r = cli(*args, "--emit", "deepspeed", "--steps", "50")
    assert r.returncode == 0, r.stderr
    cfg = json.loads(r.stdout)  # stdout is the config alone; what was changed goes to stderr
    assert cfg["train_batch_size"] == 64 and "predicted step" in r.stderr
    r = cli(*args, "--emit", "maxtext", "--json")
    d = json.loads(r.stdout)
    assert d["schema_version"] == 1 and d["emit"]["framework"] == "maxtext" and d["ranked"]
    assert "ici_tensor_parallelism" in d["emit"]["config"] and d["emit"]["prediction"]["fits"]
    r = cli("predict", "--model", "llama3-8b", "--cluster", "h100-80gb", "--devices", "16", "--global-batch", "64",
            "--layout", "dp=2,tp=8,sp=true,zero=1,mbs=2", "--emit", "torchtitan")
    assert r.returncode == 0 and "tensor_parallel_degree = 8" in r.stdout
    assert "ZeRO-1" in r.stderr  # torchtitan has none: the nearest (ZeRO-2) is emitted and said
    r = cli("plan", "--model", "llama2-13b", "--cluster", "tpu-v5p", "--devices", "256", "--global-batch", "256",
            "--emit", "megatron")
    assert r.returncode == 2 and len(r.stderr.strip().splitlines()) == 1 and "maxtext" in r.stderr


@pytest.mark.skipif(not installed("megatron.core"), reason="megatron-core is not installed (pip install '.[test]')")
def test_megatron_takes_cuda_graphs_where_the_cost_model_charges_them():
    """[software] cuda_graphs: a dropless MoE layer's attention and router captured (its dense layers' MLPs too),
    which Megatron-Core's TransformerConfig accepts; a layout it refuses them with gets none, and a note."""
    from megatron.core.transformer.transformer_config import TransformerConfig

    h100 = load_cluster("h100-80gb")
    graphs = h100.with_software(cuda_graphs=True)
    mixtral = "dp=4,zero=1,tp=2,sp=true,pp=8,ep=8,etp=1,mbs=1"
    deepseek = "dp=64,zero=1,pp=16,ep=64,mbs=1,recompute=layernorm+mla_up_proj+moe_act"
    for name, layout, scopes in (("mixtral-8x7b", mixtral, {"attn", "moe_router"}),
                                 ("deepseek-v3", deepseek, {"attn", "moe_router", "mlp"})):
        model = load_model(name)
        out = emit("megatron", model, graphs, Layout.parse(layout), 1024, "bf16", steps=10)
        args = parse_megatron(out.config)
        assert args["cuda_graph_impl"] == "transformer_engine" and set(args["cuda_graph_scope"]) == scopes
        pattern = [int(model.is_moe_layer(i)) for i in range(model.layers)]
        config = TransformerConfig(num_layers=model.layers, hidden_size=model.hidden, num_attention_heads=model.heads,
                                   num_moe_experts=model.experts, moe_layer_freq=pattern,
                                   cuda_graph_impl=args["cuda_graph_impl"], cuda_graph_scope=args["cuda_graph_scope"])
        assert {s.name for s in config.cuda_graph_scope} == scopes
        assert not out.notes
    refused = emit("megatron", load_model("mixtral-8x7b"), graphs, Layout.parse(mixtral + ",recompute=full"), 256,
                   "bf16", steps=10)
    assert "cuda_graph_impl" not in parse_megatron(refused.config)
    assert any("cuda_graphs is left out" in n and "full recompute" in n for n in refused.notes)
    assert "cuda_graph_impl" not in parse_megatron(emit("megatron", load_model("llama3-8b"), h100,
                                                        Layout.parse("dp=8,zero=1,mbs=1"), 64, "bf16", steps=10).config)


def test_kernels_the_prediction_assumed_are_named_beside_the_config():
    """The emitted configs do not pick attention, norm or loss kernels: a [software] choice of them is a note."""
    h100, model, layout = load_cluster("h100-80gb"), load_model("llama3-8b"), Layout.parse("dp=8,zero=3,mbs=1")
    assert not emit("torchtitan", model, h100, layout, 64, "bf16", steps=10).notes
    stack = h100.with_software(attention_kernel="fa2", attention_unpad=True, metric_cross_entropies=2)
    notes = emit("torchtitan", model, stack, layout, 64, "bf16", steps=10).notes
    assert len(notes) == 1
    assert "attention_kernel = 'fa2', attention_unpad = True, metric_cross_entropies = 2" in notes[0]


def test_a_qkv_gather_run_alone_is_a_note_beside_the_megatron_arguments():
    """tp_overlap_disable_qkv is a field of Megatron-Core's config with no command-line switch: the emitted
    arguments overlap every TP all-gather, and a note says the prediction ran the QKV one alone."""
    h100, model, layout = load_cluster("h100-80gb"), load_model("llama3-8b"), Layout.parse("tp=8,sp=true,mbs=1")
    overlapped = h100.with_software(tp_comm_overlap=True)
    assert not emit("megatron", model, overlapped, layout, 64, "bf16", steps=10).notes
    alone = emit("megatron", model, overlapped.with_software(tp_overlap_disable_qkv=True), layout, 64, "bf16",
                 steps=10)
    assert "--tp-comm-overlap" in alone.config
    assert len(alone.notes) == 1 and "QKV projection's all-gather alone" in alone.notes[0]


def test_rs_dgrad_overlap_is_a_megatron_switch_and_fp8_attention_a_note():
    """--tp-comm-overlap-rs-dgrad pipelines the input-gradient reduce-scatters as the prediction ran them (a switch
    of the recorded Megatron-LM); FP8 attention is a TransformerConfig field with no command-line switch there, so
    the arguments leave it out and a note says the prediction assumed it."""
    h100, model, layout = load_cluster("h100-80gb"), load_model("llama3-8b"), Layout.parse("tp=8,sp=true,mbs=1")
    overlapped = h100.with_software(tp_comm_overlap=True)
    assert "tp_comm_overlap_rs_dgrad" not in parse_megatron(emit("megatron", model, overlapped, layout, 64, "fp8",
                                                                 steps=10).config)
    both = overlapped.with_software(tp_overlap_rs_dgrad=True, fp8_attention=True)
    got = emit("megatron", model, both, layout, 64, "fp8", steps=10)
    args = parse_megatron(got.config)
    assert args["tp_comm_overlap"] and args["tp_comm_overlap_rs_dgrad"]
    assert any("fp8_attention = True" in n for n in got.notes)


def test_attention_without_a_causal_mask_is_a_note_in_every_framework():
    """Every framework's decoder masks causally: a model with causal = false gets its config and a note saying the
    run does about half the attention work predicted."""
    h100, layout = load_cluster("h100-80gb"), Layout.parse("dp=8,zero=3,mbs=1")
    model = dataclasses.replace(load_model("llama3-8b"), causal=False)
    for framework in ("torchtitan", "megatron"):
        notes = emit(framework, model, h100, layout, 64, "bf16", steps=10).notes
        assert any(n.startswith(f"{framework}'s decoder masks") and "causal = false" in n for n in notes)
    assert not any("causal" in n for n in emit("megatron", load_model("llama3-8b"), h100, layout, 64, "bf16",
                                              steps=10).notes)
    packed = dataclasses.replace(load_model("llama3-8b"), packed_samples=512)
    notes = emit("torchtitan", packed, h100, layout, 64, "bf16", steps=10).notes
    assert len(notes) == 1 and "packed samples of 512 tokens" in notes[0]


@pytest.mark.skipif(not installed("megatron.core"), reason="megatron-core is not installed (pip install '.[test]')")
def test_megatron_dispatches_tokens_as_the_cost_model_charged():
    """[software] moe_dispatcher = "deepep" or "hybridep" is Megatron-Core's flex dispatcher with that backend
    behind it, which its TransformerConfig takes; alltoall stays NCCL's all-to-all. moe_permute_fusion is
    --moe-permute-fusion (which TransformerConfig takes only beside Transformer Engine: its parser is the check
    here)."""
    from megatron.core.transformer.transformer_config import TransformerConfig

    h100, model = load_cluster("h100-80gb"), load_model("mixtral-8x7b")
    layout = Layout.parse("dp=4,zero=1,tp=2,sp=true,pp=8,ep=8,etp=1,mbs=1")
    for dispatcher, kind, backend in (("alltoall", "alltoall", None), ("deepep", "flex", "deepep"),
                                      ("hybridep", "flex", "hybridep")):
        fused = dispatcher != "alltoall"
        cluster = h100.with_software(moe_dispatcher=dispatcher, moe_permute_fusion=fused)
        args = parse_megatron(emit("megatron", model, cluster, layout, 256, "bf16", steps=10).config)
        assert (args["moe_token_dispatcher_type"], args.get("moe_flex_dispatcher_backend")) == (kind, backend)
        assert args.get("moe_permute_fusion", False) is fused
        config = TransformerConfig(num_layers=model.layers, hidden_size=model.hidden, num_attention_heads=model.heads,
                                   num_moe_experts=model.experts, moe_token_dispatcher_type=kind,
                                   **({"moe_flex_dispatcher_backend": backend} if backend else {}))
        assert config.moe_token_dispatcher_type == kind


def test_megatron_overlaps_pipeline_sends_as_the_cost_model_charged():
    """[software] pp_comm_overlap = false is Megatron-LM's --no-overlap-p2p-communication, which only the
    interleaved schedule has (its validate_args turns the overlap off for the others)."""
    h100, model = load_cluster("h100-80gb"), load_model("llama3-8b")
    for schedule, vpp in (("interleaved", ",vpp=2"), ("1f1b", "")):
        layout = Layout.parse(f"dp=4,zero=1,tp=2,pp=4{vpp},schedule={schedule},mbs=1")
        for overlap in (True, False):
            cluster = h100.with_software(pp_comm_overlap=overlap)
            args = parse_megatron(emit("megatron", model, cluster, layout, 256, "bf16", steps=10).config)
            assert args.get("overlap_p2p_comm", True) is (overlap or schedule != "interleaved")


@pytest.mark.skipif(not installed("megatron.core"), reason="megatron-core is not installed (pip install '.[test]')")
def test_megatron_builds_the_attention_the_cost_model_charged():
    """GPT-OSS's window of 128 in every other layer and its learnable softmax sinks, q/k/v biases, Qwen3's
    QK-norm and each model's rope base reach Megatron-LM's arguments as its TransformerConfig takes them."""
    from megatron.core.transformer.transformer_config import TransformerConfig

    h100 = load_cluster("h100-80gb")
    oss = parse_megatron(emit("megatron", load_model("gpt-oss-120b"), h100, Layout.parse("dp=64,zero=1,ep=64,mbs=1"),
                              512, "bf16", steps=10).config)
    window = tuple(int(x) for x in oss["window_size"].split(","))  # Megatron-LM's tuple_type
    config = TransformerConfig(num_layers=36, hidden_size=2880, num_attention_heads=64, window_size=window,
                               window_attn_skip_freq=oss["window_attn_skip_freq"], softmax_type=oss["softmax_type"],
                               add_qkv_bias=oss["add_qkv_bias"], add_bias_linear=oss["add_bias_linear"])
    assert (config.window_size, config.window_attn_skip_freq, config.softmax_type) == ((127, 0), 2, "learnable")
    assert config.add_qkv_bias and not config.add_bias_linear and oss["rotary_base"] == 150000
    qwen = parse_megatron(emit("megatron", load_model("qwen3-235b-a22b"), h100,
                               Layout.parse("dp=8,zero=1,pp=16,cp=2,ep=8,mbs=1"), 1024, "bf16", steps=10).config)
    assert qwen["qk_layernorm"] and qwen["rotary_base"] == 1000000 and isinstance(qwen["rotary_base"], int)
    assert not {"window_size", "softmax_type", "add_qkv_bias"} & set(qwen)


def test_check_reads_megatrons_pipeline_cut():
    """`check` takes a job's uneven pipeline ends and its counted embedding and loss from its arguments, so the
    cut it predicts is the one the job ran."""
    base = ("--num-layers 30 --hidden-size 4096 --num-attention-heads 32 --seq-length 4096 --micro-batch-size 1 "
            "--global-batch-size 64 --tensor-model-parallel-size 2 --pipeline-model-parallel-size 4 ")
    uneven = read("megatron", base + "--decoder-first-pipeline-num-layers 5 --decoder-last-pipeline-num-layers 11",
                  64).layout
    assert (uneven.first, uneven.last, uneven.embedding_layer, uneven.loss_layer) == (5, 11, False, False)
    counted = read("megatron", base + "--account-for-embedding-in-pipeline-split "
                   "--account-for-loss-in-pipeline-split --num-virtual-stages-per-pipeline-rank 2", 64).layout
    assert (counted.first, counted.embedding_layer, counted.loss_layer, counted.vpp) == (0, True, True, 2)


def test_megatron_builds_nemotrons_block_and_reads_it_back():
    """Nemotron-4's squared ReLU, LayerNorm without linear biases and half-rotated heads are Megatron-LM's
    --squared-relu, --normalization LayerNorm, --disable-bias-linear and --rotary-percent; `check` reads the
    same arguments back as the model the cost model planned. GPT-NeoX's LayerNorm (RoPE, biases) stays LayerNorm."""
    from meshscale.export import megatron

    h100, layout = load_cluster("h100-80gb"), Layout.parse("dp=8,zero=1,tp=4,sp=true,pp=2,mbs=1")
    model = load_model("nemotron-4-15b")
    text = emit("megatron", model, h100, layout, 256, "bf16", steps=10).config
    args = parse_megatron(text)
    assert args["squared_relu"] and args["normalization"] == "LayerNorm" and not args["add_bias_linear"]
    assert args["rotary_percent"] == 0.5 and "swiglu" not in args
    back = megatron.read(text, 64).model
    same = ("layers", "hidden", "heads", "kv_heads", "ffn", "vocab", "mlp", "biases", "rotary_fraction",
            "tied_embeddings", "learned_positions")
    assert all(getattr(back, k) == getattr(model, k) for k in same) and back.layer_norm
    assert back.param_count() == model.param_count()
    neox = dataclasses.replace(load_model("tiny-gpt"), learned_positions=False, rotary_fraction=0.25)
    assert parse_megatron(emit("megatron", neox, h100, Layout.parse("dp=8"), 64, "bf16", steps=10).config)[
        "normalization"] == "LayerNorm"


def test_llama4s_chunked_attention_is_no_window_of_megatron_or_maxtext():
    """Megatron-LM's --window-size is a sliding window; Llama 4's chunks are not one, so the arguments leave
    the window out and say so, as the MaxText config does."""
    scout, h100 = load_model("llama4-scout-17b-16e"), load_cluster("h100-80gb")
    out = emit("megatron", scout, h100, Layout.parse("dp=16,zero=1,tp=4,sp=true,pp=2,ep=16,mbs=1"), 256, "bf16",
               steps=10)
    assert "window_size" not in parse_megatron(out.config)
    assert any("no chunked attention" in n and "8192" in n for n in out.notes)
    v5p = load_cluster("tpu-v5p")
    notes = emit("maxtext", scout, v5p, Layout.parse("dp=1024,zero=3,ep=16,mbs=1", 1024), 1024, "bf16",
                 steps=10).notes
    assert any("chunked attention" in n for n in notes)


def test_each_torchtitan_flavor_named_has_the_presets_shape():
    """FLAVORS names torchtitan's own model flavors; the installed torchtitan's flavor tables (read as source:
    importing torchtitan needs triton) give each the preset's layers, width, heads and experts."""
    import ast

    from meshscale.export.torchtitan import FLAVORS

    from importlib.metadata import distribution

    root = Path(distribution("torchtitan").locate_file("torchtitan/models"))  # other tests stub the module
    fields = {"n_layers": "layers", "dim": "hidden", "n_heads": "heads", "n_kv_heads": "kv_heads",
              "num_experts": "experts", "top_k": "top_k"}
    for preset, (name, flavor) in FLAVORS.items():
        tables = [node.value for node in ast.walk(ast.parse((root / name / "__init__.py").read_text()))
                  if isinstance(node, ast.Assign) and isinstance(node.value, ast.Dict)]
        call = next(v for t in tables for k, v in zip(t.keys, t.values) if getattr(k, "value", None) == flavor)
        given = {kw.arg: kw.value.value for c in ast.walk(call) if isinstance(c, ast.Call) for kw in c.keywords
                 if isinstance(kw.value, ast.Constant) and kw.arg in fields}
        model = load_model(preset)
        assert given and all(getattr(model, fields[k]) == v for k, v in given.items()), (preset, given)
