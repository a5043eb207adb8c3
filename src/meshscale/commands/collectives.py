"""`meshscale collectives`: the model's time and bus bandwidth of one collective over N devices, per message
size, laid out as nccl-tests prints them, to hold against your own nccl-tests run."""

import argparse
import json

from meshscale import SCHEMA_VERSION
from meshscale.commands.counts import binary_count
from meshscale.outputs import check_outputs

KINDS = ("all_reduce", "all_gather", "reduce_scatter", "all_to_all")
DEFAULT_SIZES = ",".join(f"{2**i}M" for i in range(14))  # 1 MiB .. 8 GiB, doubling


def add_arguments(p):
    p.add_argument("--cluster", required=True, help="preset name or JSON/TOML ClusterSpec")
    p.add_argument("--devices", required=True, type=int, help="ranks in the collective (one per device)")
    p.add_argument("--collective", default="all_reduce", help=f"one of {', '.join(KINDS)} (default all_reduce)")
    p.add_argument("--sizes", default=DEFAULT_SIZES, help="message sizes, e.g. 1M,64M,1G (K/M/G are binary; "
                   "the buffer each rank passes, as nccl-tests' size column); default 1M..8G")
    p.add_argument("--json", action="store_true", help="print one JSON object: cluster, devices, collective and "
                   "rows of {collective, bytes, seconds, busbw_GBps}")
    p.add_argument("--plot", metavar="FILE.png", help="draw bus bandwidth against message size")
    p.add_argument("--overwrite", action="store_true", help="allow replacing an existing --plot file")


def parse_sizes(text: str) -> list[int]:
    from meshscale.errors import UserError

    try:  # nccl-tests' -b/-e sizes: bytes, K/M/G binary, a trailing B allowed
        return [binary_count(item.strip().upper().removesuffix("B")) for item in text.split(",")]
    except argparse.ArgumentTypeError as e:
        raise UserError(f"--sizes: {e}") from None


def curve(cluster, devices: int, collective: str, sizes: list[int]) -> list[dict]:
    """[{collective, bytes, seconds, busbw_GBps}] of one call per size over all `devices` ranks."""
    from meshscale.cost import collectives, comm

    link = comm.group_link(cluster, devices, devices, 1)
    rows = []
    for size in sizes:
        t = comm.collective_time(collective, size, 1, devices, link)
        rows.append({"collective": collective, "bytes": size, "seconds": t,
                     "busbw_GBps": collectives.wire_factor(collective, devices) * size / t / 1e9 if t else 0.0})
    return rows


def run(args) -> int:
    check_outputs(args, "plot")  # before any work
    from meshscale.errors import UserError
    from meshscale.specs.cluster import load_cluster

    if args.collective not in KINDS:
        raise UserError(f"--collective {args.collective!r}: choose one of {', '.join(KINDS)}")
    if args.devices < 2:
        raise UserError(f"--devices {args.devices}: a collective needs at least 2 devices")
    sizes = parse_sizes(args.sizes)
    cluster = load_cluster(args.cluster)
    rows = curve(cluster, args.devices, args.collective, sizes)
    if args.plot:
        from meshscale.plots import collective_plot
        collective_plot(rows, f"{args.collective} on {args.devices} x {cluster.name} (model)", args.plot)
    if args.json:
        print(json.dumps({"schema_version": SCHEMA_VERSION, "cluster": cluster.name, "devices": args.devices,
                          "collective": args.collective, "rows": rows}))
        return 0
    print(f"# {args.collective} over {args.devices} devices of {cluster.name} (predicted, nccl-tests columns)")
    print(f"# {'size (B)':>14s} {'time (us)':>12s} {'algbw (GB/s)':>13s} {'busbw (GB/s)':>13s}")
    for r in rows:
        algbw = r["bytes"] / r["seconds"] / 1e9 if r["seconds"] else 0.0
        print(f"  {r['bytes']:14d} {r['seconds'] * 1e6:12.1f} {algbw:13.2f} {r['busbw_GBps']:13.2f}")
    return 0
