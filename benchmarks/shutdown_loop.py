"""Clean shutdown (issue 8, item 8): N consecutive runs of each layout below must all exit 0.

Run: PYTHONPATH=src python benchmarks/shutdown_loop.py [N]   (default 30; about 10 s a run on 2 cores)
Prints one line per failing run (exit code and the last line of its stderr) and a count per layout.
"""

import subprocess
import sys
import tempfile

LAYOUTS = [("dp=2,zero=1", 2), ("dp=2,zero=2,recompute=full", 2), ("tp=2,pp=2", 4)]


def one_run(layout: str, nproc: int, workdir: str, i: int) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "meshscale", "train", "--model", "tiny", "--layout", layout,
                           "--nproc", str(nproc), "--steps", "5", "--precision", "fp32",
                           "--metrics-out", f"{workdir}/m{i}.jsonl"], capture_output=True, text=True)


def main() -> int:
    n = int(sys.argv[1]) if len(sys.argv) > 1 else 30
    failed_total = 0
    for layout, nproc in LAYOUTS:
        failed = 0
        with tempfile.TemporaryDirectory() as workdir:
            for i in range(n):
                done = one_run(layout, nproc, workdir, i)
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
