"""Clean shutdown (issue 8, item 8): N consecutive runs of each layout below must all exit 0.

Run: PYTHONPATH=src python benchmarks/shutdown_loop.py [N] [--only WORD]   (default 30; about 10 s a run on 2
cores)
Prints one line per failing run (exit code and the last line of its stderr) and a count per layout.
"""

import argparse
import subprocess
import sys
import tempfile

# (model, layout, processes)
LAYOUTS = [("tiny", "dp=2,zero=1", 2), ("tiny", "dp=2,zero=2,recompute=full", 2), ("tiny", "tp=2,pp=2", 4),
           ("tiny", "dp=4,zero=3,shard=2", 4), ("tiny", "cp=2,dp=2,zero=3", 4), ("tiny-moe", "dp=2,ep=2", 2)]


def one_run(model: str, layout: str, nproc: int, workdir: str, i: int) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "meshscale", "train", "--model", model, "--layout", layout,
                           "--nproc", str(nproc), "--steps", "5", "--precision", "fp32",
                           "--metrics-out", f"{workdir}/m{i}.jsonl"], capture_output=True, text=True)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("n", nargs="?", type=int, default=30, help="runs per layout")
    parser.add_argument("--only", default="", help="only the layouts containing this text")
    args = parser.parse_args()
    n, failed_total = args.n, 0
    for model, layout, nproc in LAYOUTS:
        if args.only not in layout:
            continue
        failed = 0
        with tempfile.TemporaryDirectory() as workdir:
            for i in range(n):
                done = one_run(model, layout, nproc, workdir, i)
                if done.returncode != 0:
                    failed += 1
                    tail = (done.stderr.strip().splitlines() or ["(no stderr)"])[-1]
                    print(f"  {layout} run {i}: exit {done.returncode}: {tail}", flush=True)
                if (i + 1) % 10 == 0:
                    print(f"  {layout}: {i + 1 - failed}/{i + 1} so far", flush=True)
        print(f"{layout} ({nproc} processes): {n - failed}/{n} runs exited 0", flush=True)
        failed_total += failed
    return 1 if failed_total else 0


if __name__ == "__main__":
    raise SystemExit(main())
