"""`meshscale calibrate`: measure this machine and write a ClusterSpec file that `predict`, `plan` and
`train --predict` take with --cluster."""

from pathlib import Path

from meshscale.errors import UserError
from meshscale.outputs import check_new_file
from meshscale.specs.cluster import load_cluster


def add_arguments(p):
    p.add_argument("--nproc", type=int, default=2, help="local processes (ranks) to measure with (default 2)")
    p.add_argument("--out", default="local.toml", help="ClusterSpec TOML file to write (default local.toml)")
    p.add_argument("--quick", action="store_true", help="fewer repeats and message sizes (seconds, for tests)")
    p.add_argument("--overwrite", action="store_true", help="allow replacing an existing --out file")


def run(args) -> int:
    out = Path(args.out)
    if args.nproc < 1:
        raise UserError(f"--nproc must be at least 1, got {args.nproc}")
    if out.suffix != ".toml":
        raise UserError(f"--out {out}: the ClusterSpec is written as TOML; use a name ending in .toml")
    check_new_file("--out", out, args.overwrite)
    from meshscale.runtime.measure.calibrate import launch  # imports torch

    launch(args.nproc, str(out), args.quick)
    print(summary(str(out)))
    return 0


def summary(path: str) -> str:
    """What was measured, in one paragraph, read back through the loader that `predict` uses."""
    c = load_cluster(path)
    kinds = ", ".join(f"{k} {bw / 1e9:.2f} GB/s {lat * 1e6:.0f} us" for k, lat, bw in c.collectives)
    rates = ", ".join(f"{m}x{n}x{k} {r / 1e9:.1f}" for m, n, k, r in c.gemm_rates)
    attn = ", ".join(f"s={s} d={d} {r / 1e9:.2f}" for s, d, r in c.attention_rates)
    return (f"wrote {path} ({c.name}, base {dict(c.calibration).get('device', '')})\n"
            f"GEMM GFLOP/s ({c.rates_precision}): {rates}\n"
            f"attention GFLOP/s ({c.rates_precision}): {attn}\nmemory bandwidth {c.hbm_bandwidth / 1e9:.1f} GB/s; "
            f"{c.op_overhead_s * 1e6:.1f} us per operator; FSDP2 {c.fsdp_unit_overhead_s * 1e6:.0f} us per unit, "
            f"{c.fsdp_tensor_overhead_s * 1e6:.0f} us per sharded tensor update; compute hides "
            f"{c.software.overlap_efficiency:.0%} of an overlapped collective\n"
            + (f"collectives (bus bandwidth, latency per step): {kinds}" if kinds
               else "collectives: one process, none measured"))
