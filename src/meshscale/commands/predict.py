"""`meshscale predict`: one layout's step, broken down into compute, each collective, bubble and memory."""

import json

from meshscale.errors import UserError


def add_arguments(p):
    p.add_argument("--model", required=True, help="preset name, meshscale JSON/TOML, or HF config.json")
    p.add_argument("--cluster", required=True, help="preset name or JSON/TOML ClusterSpec")
    p.add_argument("--devices", type=int, help="device count (default: the cluster preset's)")
    p.add_argument("--layout", required=True, help="e.g. tp=8,pp=4,dp=16,zero=1 (dp fills the rest)")
    add_batch_arguments(p)
    p.add_argument("--precision", default="bf16", help="bf16 (16 B/param), bf16-pure (10 B/param), fp8, fp32")
    p.add_argument("--json", action="store_true", help="print one JSON object")


def add_batch_arguments(p):
    batch = p.add_mutually_exclusive_group(required=True)
    batch.add_argument("--global-batch", type=int, help="global batch in sequences")
    batch.add_argument("--global-batch-tokens", type=int, help="global batch in tokens (a multiple of --seq)")
    p.add_argument("--seq", type=int, help="sequence length (default: the model's)")


def resolve_inputs(args):
    """Model (with --seq), cluster, device count and batch in sequences, checked."""
    from meshscale.specs.cluster import load_cluster
    from meshscale.specs.model import load_model

    model = load_model(args.model)
    if args.seq is not None:
        if args.seq <= 0:
            raise UserError(f"--seq must be positive, got {args.seq}")
        model = model.with_seq(args.seq)
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
    from meshscale.cost import predict
    from meshscale.specs.layout import Layout

    model, cluster, devices, batch = resolve_inputs(args)
    layout = Layout.parse(args.layout, devices)
    pred = predict(model, cluster, layout, batch, args.precision)
    if args.json:
        print(json.dumps(pred.to_dict()))
    else:
        from meshscale.commands.report import print_prediction
        print_prediction(pred)
    return 0
