"""`meshscale collectives`: the model's time and bus bandwidth of one collective over N devices, per message
size, laid out as nccl-tests prints them; with `--measured`, beside your own nccl-tests run and its error."""

import argparse
import json
from pathlib import Path
from statistics import median

from meshscale import SCHEMA_VERSION
from meshscale.commands.counts import binary_count
from meshscale.outputs import check_outputs

KINDS = ("all_reduce", "all_gather", "reduce_scatter", "all_to_all")
DEFAULT_SIZES = ",".join(f"{2**i}M" for i in range(14))  # 1 MiB .. 8 GiB, doubling


def add_arguments(p):
    p.add_argument("--cluster", required=True, help="preset name or JSON/TOML ClusterSpec")
    p.add_argument("--devices", type=int, help="ranks in the collective (one per device); with --measured, "
                   "the ranks its log names by default")
    p.add_argument("--collective", help=f"one of {', '.join(KINDS)} (default: --measured's, else all_reduce)")
    p.add_argument("--sizes", help="message sizes, e.g. 1M,64M,1G (K/M/G are binary; the buffer each rank passes, "
                   "as nccl-tests' size column); default 1M..8G, or --measured's")
    p.add_argument("--measured", metavar="LOG", help="the saved output of one nccl-tests (or rccl-tests) run: "
                   "each of its sizes printed beside its out-of-place bus bandwidth and the model's error")
    p.add_argument("--json", action="store_true", help="print one JSON object: cluster, devices, collective, nccl "
                   "(the release modelled; null where NCCL is not) and "
                   "rows of {collective, bytes, seconds, busbw_GBps, algorithm} (with --measured also "
                   "measured_busbw_GBps and error, predicted / measured - 1, and the log's "
                   "measured_gpus_per_process and measured_nccl, the release it ran, which the model then takes)")
    p.add_argument("--plot", metavar="FILE.png", help="draw bus bandwidth against message size (and --measured's)")
    p.add_argument("--overwrite", action="store_true", help="allow replacing an existing --plot file")


def parse_sizes(text: str) -> list[int]:
    from meshscale.errors import UserError

    try:  # nccl-tests' -b/-e sizes: bytes, K/M/G binary, a trailing B allowed
        return [binary_count(item.strip().upper().removesuffix("B")) for item in text.split(",")]
    except argparse.ArgumentTypeError as e:
        raise UserError(f"--sizes: {e}") from None


def curve(cluster, devices: int, collective: str, sizes: list[int]) -> list[dict]:
    """[{collective, bytes, seconds, busbw_GBps, algorithm}] of one call per size over all `devices` ranks."""
    from meshscale.cost import collectives, comm

    link = comm.group_link(cluster, devices, devices, 1)
    rows = []
    for size in sizes:
        t = comm.collective_time(collective, size, 1, devices, link)
        rows.append({"collective": collective, "bytes": size, "seconds": t,
                     "busbw_GBps": collectives.wire_factor(collective, devices) * size / t / 1e9 if t else 0.0,
                     "algorithm": _algorithm(collective, size, devices, link)})
    return rows


def _algorithm(collective: str, size: int, devices: int, link) -> str:
    """What runs one call: NCCL's pick as NCCL_DEBUG=INFO names it (algorithm/protocol; all-to-all is grouped
    send/recv), or the alpha-beta model where comm.collective_time takes it (comm.nccl_fabric: 12 H100 fill no
    whole node)."""
    from meshscale.cost import collectives, comm

    fabric = comm.nccl_fabric(link, devices)
    if fabric is None:
        return "alpha-beta"
    if collective == "all_to_all":
        return "p2p"
    algorithm, protocol = collectives.best(collective, fabric, size)[1][:2]
    return f"{algorithm}/{protocol}"


def run(args) -> int:
    check_outputs(args, "plot")  # before any work
    from meshscale.errors import UserError
    from meshscale.specs.cluster import load_cluster

    measured = _measured(args)
    collective = args.collective or (measured.collective if measured else "all_reduce")
    if collective is None:
        raise UserError(f"--collective: {args.measured} does not name its test; give the collective it ran")
    if collective not in KINDS:
        raise UserError(f"--collective {collective!r}: choose one of {', '.join(KINDS)}")
    devices = args.devices if args.devices is not None else measured.ranks if measured else None
    if devices is None:
        raise UserError("--devices: give the ranks in the collective" +
                        (f" ({args.measured} names none)" if measured else ""))
    if devices < 2:
        raise UserError(f"--devices {devices}: a collective needs at least 2 devices")
    sizes = [b for b, _ in measured.points] if measured else parse_sizes(args.sizes or DEFAULT_SIZES)
    cluster = load_cluster(args.cluster)
    if measured and measured.nccl:  # model the release the run used (Blackwell's tuner rows moved in 2.28)
        cluster = cluster.with_software(nccl=measured.nccl)
    rows = curve(cluster, devices, collective, sizes)
    if measured:
        for row, (_, busbw) in zip(rows, measured.points):
            row.update(measured_busbw_GBps=busbw, error=row["busbw_GBps"] / busbw - 1)
    if args.plot:
        from meshscale.plots import collective_plot
        collective_plot(rows, f"{collective} on {devices} x {cluster.name}", args.plot,
                        measured.points if measured else ())
    nccl = cluster.software.nccl if cluster.gpu_arch else None  # TPUs and RCCL's GPUs: the alpha-beta model
    if args.json:
        out = {"schema_version": SCHEMA_VERSION, "cluster": cluster.name, "devices": devices,
               "collective": collective, "nccl": nccl, "rows": rows}
        if measured:
            out.update(measured_gpus_per_process=measured.gpus_per_process, measured_nccl=measured.nccl)
        print(json.dumps(out))
        return 0
    _print(rows, collective, devices, f"{cluster.name}, " + (f"NCCL {nccl}" if nccl else "alpha-beta model"),
           args.measured)
    if measured and measured.gpus_per_process > 1:
        print(_ONE_PROCESS.format(n=measured.gpus_per_process))
    return 0


# One A100 server both ways (benchmarks/nccl_curves.py, "HGX A100 x8, a process per GPU"): -g 8 read 7-28% below a
# process per GPU from 1 to 512 MiB, the same from 1 GiB.
_ONE_PROCESS = ("# one process drove {n} GPUs (nccl-tests -t/-g): it launches each GPU's kernel in turn, which a "
                "process per GPU, as training runs, does not pay; on one A100 server this read 7-28% below a process "
                "per GPU from 1 to 512 MiB (rerun with mpirun or srun, -g 1, to compare like with like)")


def _measured(args):
    """The nccl-tests run --measured names, checked against what the other options say; None without it."""
    from meshscale.check import nccl_tests
    from meshscale.errors import UserError

    if not args.measured:
        return None
    if args.sizes:
        raise UserError("--sizes: the sizes come from --measured; give one or the other")
    try:
        text = Path(args.measured).read_text(encoding="utf-8", errors="replace")
    except OSError as e:
        raise UserError(f"--measured {args.measured}: {e.strerror}") from None
    run = nccl_tests.parse(text, args.measured)
    if args.collective and run.collective and args.collective != run.collective:
        raise UserError(f"--collective {args.collective}: {args.measured} ran {run.collective}")
    if args.devices is not None and run.ranks and args.devices != run.ranks:
        raise UserError(f"--devices {args.devices}: {args.measured} names {run.ranks} ranks")
    return run


def _print(rows: list[dict], collective: str, devices: int, cluster: str, log: str | None) -> None:
    """nccl-tests' columns, and with a measured run (`log`) its bus bandwidth, the error and a summary from
    1 MiB up."""
    print(f"# {collective} over {devices} devices of {cluster} (predicted, nccl-tests columns"
          + (f"; measured: {log}, out-of-place)" if log else ")"))
    extra = f" {'measured':>13s} {'error':>8s}" if log else ""
    print(f"# {'size (B)':>14s} {'time (us)':>12s} {'algbw (GB/s)':>13s} {'busbw (GB/s)':>13s}{extra}  algorithm")
    for r in rows:
        algbw = r["bytes"] / r["seconds"] / 1e9 if r["seconds"] else 0.0
        extra = f" {r['measured_busbw_GBps']:13.2f} {r['error']:+8.1%}" if log else ""
        print(f"  {r['bytes']:14d} {r['seconds'] * 1e6:12.1f} {algbw:13.2f} {r['busbw_GBps']:13.2f}{extra}  "
              f"{r['algorithm']}")
    if log:
        big = [r for r in rows if r["bytes"] >= 2**20] or rows
        worst = max(big, key=lambda r: abs(r["error"]))
        print(f"# {'from 1 MiB up' if big is not rows else 'all sizes'}: median |error| "
              f"{median(abs(r['error']) for r in big):.1%}, worst {worst['error']:+.1%} at {worst['bytes']:,} B "
              "(predicted / measured - 1)")
