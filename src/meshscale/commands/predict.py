"""`meshscale predict`: one layout's step, broken down into compute, each collective, bubble and memory."""

import json
import sys
from dataclasses import replace

from meshscale import SCHEMA_VERSION
from meshscale.commands.counts import binary_count, positive_number, seconds, whole_number
from meshscale.commands.report import print_prediction
from meshscale.cost import predict
from meshscale.cost.goodput import DEFAULT_CHECKPOINT_BANDWIDTH, LLAMA3_MTBF_HOURS, of_prediction
from meshscale.errors import UserError
from meshscale.export import FRAMEWORKS, emit, summary
from meshscale.outputs import check_outputs
from meshscale.specs.cluster import load_cluster
from meshscale.specs.layout import Layout
from meshscale.specs.model import is_hf_model, load_model


def add_arguments(p):
    add_step_arguments(p)
    p.add_argument("--json", action="store_true", help="print one JSON object")
    p.add_argument("--plot", metavar="FILE.png", help="draw the memory per device as a PNG")
    p.add_argument("--overwrite", action="store_true", help="allow replacing an existing --plot file")
    add_emit_arguments(p)
    add_goodput_arguments(p)


def add_model_arguments(p):
    """--model, what is trained of it (--lora) and on what (--packed-samples)."""
    p.add_argument("--model", required=True, help="preset name, meshscale JSON/TOML, or HF config.json")
    p.add_argument("--lora", metavar="RANK[:MODULES[:DROPOUT]]",
                   help="LoRA fine-tuning: the model frozen, rank-RANK adapters trained beside its attention "
                        "(QKV and output projection; the default), qkv, mlp or all matrices, e.g. 16 or 16:all:0.1")
    p.add_argument("--packed-samples", type=int, metavar="TOKENS",
                   help="sequences packed from samples of about TOKENS tokens, each attending within itself "
                        "(fine-tuning with sequence packing)")


def add_step_arguments(p):
    """What names one step: model, cluster, devices, layout, batch, precision (predict and simulate)."""
    add_model_arguments(p)
    p.add_argument("--cluster", required=True, help="preset name or JSON/TOML ClusterSpec")
    p.add_argument("--devices", type=int, help="device count (default: the cluster preset's)")
    p.add_argument("--layout", required=True, help="e.g. tp=8,pp=4,dp=16,zero=1 (dp fills the rest)")
    add_batch_arguments(p)
    p.add_argument("--precision", default="bf16",
                   help="bf16 (16 B/param), bf16-pure (8 B/param), fp8, mxfp8 (Blackwell), fp32")


def add_emit_arguments(p):
    p.add_argument("--emit", choices=("torchrun",) + FRAMEWORKS,
                   help="print the layout as a command (torchrun: meshscale train) or as that framework's config "
                        "(torchtitan TOML, Megatron-LM arguments, DeepSpeed JSON, MaxText YAML)")
    p.add_argument("--steps", type=whole_number, default=1000,
                   help="optimizer steps the emitted job runs (default 1000)")
    p.add_argument("--data", help="training data path the emitted job reads (default: the framework's own "
                                  "synthetic or test data)")


def print_emitted(args, emitted, extra: dict) -> None:
    """A framework config on stdout and what was changed on stderr; or, with --json, one object."""
    if args.json:
        print(json_line({**extra, "emit": emitted.to_dict()}))
        return
    print(emitted.config, end="")
    for line in summary(emitted):
        print(f"meshscale: {line}", file=sys.stderr)


def json_line(obj: dict) -> str:
    """One --json object, stamped with the schema version its keys follow."""
    return json.dumps({"schema_version": SCHEMA_VERSION, **obj})


def add_goodput_arguments(p):
    p.add_argument("--mtbf-hours", type=positive_number, help="mean time between failures per device, hours, for "
                   f"goodput (Llama 3's 16K-GPU run: {LLAMA3_MTBF_HOURS:,.0f})")
    p.add_argument("--checkpoint-bandwidth", type=positive_number, default=DEFAULT_CHECKPOINT_BANDWIDTH,
                   help="bytes/s per device to storage (default: Llama 3's 2 TB/s over 16,384 GPUs)")
    add_restart_argument(p)


def add_restart_argument(p):
    p.add_argument("--restart-seconds", type=seconds, help="seconds from a failure to training again, the load "
                   "included, e.g. what a soak measured (default: 5 minutes to relaunch plus the load)")


def goodput_of(args, pred):
    """The Goodput of a Prediction when --mtbf-hours is given, else None."""
    if args.mtbf_hours is None:
        return None
    return of_prediction(pred, args.mtbf_hours, args.checkpoint_bandwidth, args.restart_seconds)


def goodput_line(good) -> str:
    return (f"goodput: checkpoint {good.checkpoint_bytes_per_device / 1e9:,.2f} GB per device "
            f"({good.checkpoint_bytes_total / 1e12:,.2f} TB in all), saved in {good.save_s:,.1f} s every "
            f"{good.interval_s / 60:,.1f} min (Young/Daly); a restart costs {good.restart_s:,.0f} s plus the lost "
            f"work; ETTR {good.ettr:.1%} of wall time trains")


def add_batch_arguments(p):
    batch = p.add_mutually_exclusive_group(required=True)
    batch.add_argument("--global-batch", type=int, help="global batch in sequences")
    batch.add_argument("--global-batch-tokens", type=binary_count,
                       help="global batch in tokens, a multiple of --seq (4M: 4 x 2^20)")
    p.add_argument("--seq", type=int, help="sequence length (default: the model's)")


def with_lora(model, text: str | None):
    """`model` under --lora RANK[:MODULES[:DROPOUT]] (ModelSpec's lora_rank, lora_modules, lora_dropout)."""
    if text is None:
        return model
    rank, modules, dropout, *extra = text.split(":") + ["", ""]
    try:
        rank, dropout = int(rank), float(dropout) if dropout else model.lora_dropout
    except ValueError:
        rank = 0
    if rank <= 0 or any(extra):
        raise UserError(f"--lora {text!r}: give RANK[:MODULES[:DROPOUT]], a positive rank, then attention, qkv, "
                        "mlp or all, then a dropout in [0, 1), e.g. 16 or 16:all:0.1")
    return replace(model, lora_rank=rank, lora_modules=modules or model.lora_modules, lora_dropout=dropout)


def model_at_seq(args):
    """--model (under --lora), at --seq when given, packed from --packed-samples; a Hugging Face config's own
    length is its max_position_embeddings, which can be far longer than anyone trains at (131,072 for Llama 3.1),
    so using it is said on stderr."""
    model = with_lora(load_model(args.model), args.lora)
    if args.seq is None:
        if is_hf_model(args.model):
            print(f"meshscale: note: sequence length {model.seq:,} tokens, the config's max_position_embeddings; "
                  "pass --seq to plan another", file=sys.stderr)
    elif args.seq <= 0:
        raise UserError(f"--seq must be positive, got {args.seq}")
    else:
        model = model.with_seq(args.seq)
    if args.packed_samples is not None:  # ModelSpec says what it accepts
        model = replace(model, packed_samples=args.packed_samples)
    return model


def resolve_inputs(args):
    """Model (with --seq), cluster, device count and batch in sequences, checked."""
    model = model_at_seq(args)
    cluster = load_cluster(args.cluster)
    devices = args.devices if args.devices is not None else cluster.default_devices
    if devices <= 0:
        raise UserError(f"--devices must be positive, got {devices}")
    if args.global_batch_tokens is not None:
        if args.global_batch_tokens <= 0 or args.global_batch_tokens % model.seq:
            raise UserError(f"--global-batch-tokens {args.global_batch_tokens} must be a positive multiple of "
                            f"the sequence length {model.seq}; adjust it or --seq")
        batch = args.global_batch_tokens // model.seq
    else:
        batch = args.global_batch
        if batch <= 0:
            raise UserError(f"--global-batch must be a positive number of sequences, got {batch}")
    return model, cluster, devices, batch


def run(args) -> int:
    check_outputs(args, "plot")  # before any work
    model, cluster, devices, batch = resolve_inputs(args)
    layout = Layout.parse(args.layout, devices)
    pred = predict(model, cluster, layout, batch, args.precision)
    good = goodput_of(args, pred)
    if args.plot:
        from meshscale.plots import memory_plot  # matplotlib's helpers, for --plot alone
        memory_plot(pred, args.plot)
    extra = {**pred.to_dict(), **({"goodput": good.to_dict()} if good else {})}
    if args.emit == "torchrun":
        from meshscale.commands.plan import emit_torchrun  # commands.plan imports this module
        command = emit_torchrun(args, model, cluster, pred, batch, {})
        print(json_line({**extra, "emit": {"framework": "torchrun", "command": command}}) if args.json else command)
    elif args.emit:
        print_emitted(args, emit(args.emit, model, cluster, layout, batch, args.precision, args.steps, args.data),
                      extra)
    elif args.json:
        print(json_line(extra))
    else:
        print_prediction(pred)
        if good:
            print(goodput_line(good))
    return 0
