"""Goodput under failures, measured against its prediction: a long `meshscale train` run with --async-save
checkpoints and --max-restarts, whose workers this script SIGKILLs at the times of a Poisson process (mean
time between failures --mtbf seconds: exponential gaps, one random worker each time), then stopped with
SIGTERM after --duration seconds (it saves and exits 75).

Recorded (--events FILE keeps them; --analyse FILE reads them back without running anything): when each
metrics row appeared (the file is polled), each kill, when the launcher's new workers appeared, and when rank 0
printed "resuming from". From them the wall time, from the start of the first step to the end of the last one
logged, is split into what it went to:
- useful: (steps that count, each once) x w, w the mean wall between consecutive rows of steady steps (not
  a save, a write or a warm-up): what a run without failures or checkpoints would take per step on this
  machine, its load included (a median would count the steps the load slowed as time lost to failures);
- checkpoints: per save, the saving step's excess over w (DCP's staging) plus the excess of the steps the
  background write overlaps (the save's row up to the one that reports `checkpoint_write_s`);
- per failure: the restart (kill -> start of the first step of the new group), cut into detection and
  relaunch (kill -> the new workers exist), start-up and load (-> "resuming from"), and to the first step;
  the warm-up (the excess of the first WARMUP steps after it); the lost work (the steps run again after the
  restart and the step the kill cut short), with the kills that landed while an async write was in flight;
- other: the excess of every other step over w (load from the rest of the machine).
Predicted: cost/goodput.py's ettr(tau, delta, R + warm-up, M, write) with tau = --every x w, delta the mean
checkpoint cost per interval, R and the warm-up the means measured here, write the median write time, and M =
--mtbf or the realised mean wall time between kills; and the lost work it expects per failure beside the
measured one. The same comparison with w the median steady step is printed beside it: on a loaded machine
the two differ, and the soak says something about the model only where they agree.

    PYTHONPATH=src nice python benchmarks/goodput_soak.py [--duration 1500] [--mtbf 300] [--every 40]
        [--nproc 2] [--model tiny] [--seed 0] [--events soak.json]
    python benchmarks/goodput_soak.py --analyse soak.json
"""

import argparse
import json
import os
import random
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
WARMUP = 10  # steps after a restart counted as its warm-up (the profile printed shows where they settle)
KEPT = ("step", "step_time_s", "checkpoint_save_s", "checkpoint_write_s")


def _workers(launcher: int) -> list[int]:
    """The launcher's worker processes (its children running the worker module): read from the kernel's list
    of its children, not a scan of /proc, which would take a share of the cores the restart needs."""
    found = []
    for task in Path(f"/proc/{launcher}/task").glob("*/children"):
        for pid in task.read_text().split():
            try:
                if b"meshscale.runtime.loop.launch" in Path(f"/proc/{pid}/cmdline").read_bytes():
                    found.append(int(pid))
            except OSError:
                continue
    return found


class Rows:
    """New complete lines of a metrics file that a restart rewrites (os.replace, keeping the rows before its
    checkpoint) and then appends to: read from the last offset, from the start when the file was replaced."""

    def __init__(self, path: Path):
        self.path, self.inode, self.offset, self.seen = path, None, 0, set()

    def new(self) -> list[dict]:
        try:
            st = self.path.stat()
        except OSError:
            return []
        if st.st_ino != self.inode or st.st_size < self.offset:
            self.inode, self.offset = st.st_ino, 0
        if st.st_size == self.offset:
            return []
        with open(self.path, "rb") as f:
            f.seek(self.offset)
            chunk = f.read()
        end = chunk.rfind(b"\n") + 1
        self.offset += end
        out = []
        for line in chunk[:end].decode().splitlines():
            if line and line not in self.seen:  # kept rows come back after a replace; timings make new ones unique
                self.seen.add(line)
                row = json.loads(line)
                out.append({k: row[k] for k in KEPT if k in row})
        return out


def record(args) -> dict:
    """Run the soak; every event with its wall-clock time."""
    rng = random.Random(args.seed)
    ev: dict = {"args": vars(args), "rows": [], "kills": [], "spawns": [], "resumes": [], "load": []}
    with tempfile.TemporaryDirectory() as tmp:
        metrics = Path(tmp) / "soak.jsonl"
        cmd = [sys.executable, "-m", "meshscale", "train", "--model", args.model, "--nproc", str(args.nproc),
               "--steps", "1000000", "--val-batches", "1", "--log-every", "100000", "--metrics-out", str(metrics),
               "--checkpoint-dir", str(Path(tmp) / "ck"), "--checkpoint-every", str(args.every), "--async-save",
               "--max-restarts", "1000", "--max-no-progress-restarts", "1000", "--sdc-check-every", "0"]
        launcher = subprocess.Popen(cmd, env={**os.environ, "PYTHONPATH": str(ROOT / "src")}, cwd=ROOT,
                                    stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)

        err: list[str] = []

        def stdout() -> None:
            for line in launcher.stdout:  # type: ignore[union-attr]
                if line.startswith("resuming from"):
                    ev["resumes"].append(time.time())

        def stderr() -> None:  # drained as it comes: a full pipe would stop the workers
            for line in launcher.stderr:  # type: ignore[union-attr]
                err[:] = (err + [line])[-40:]
        readers = [threading.Thread(target=f, daemon=True) for f in (stdout, stderr)]
        for r in readers:
            r.start()
        rows, known = Rows(metrics), set()
        waiting = True  # for the (re)started group's first row: watch for its workers meanwhile
        started = next_kill = None
        while launcher.poll() is None:
            now = time.time()
            if waiting:
                pids = set(_workers(launcher.pid))
                if pids - known:
                    ev["spawns"].append(now)
                    known |= pids
            for row in rows.new():
                ev["rows"].append([now, row])
                waiting = False
                started = started or now - row["step_time_s"]
            if started is not None and next_kill is None:
                next_kill = now + rng.expovariate(1 / args.mtbf)
            if next_kill is not None and now >= next_kill:
                victims = _workers(launcher.pid)
                if victims:
                    os.kill(rng.choice(victims), signal.SIGKILL)
                    ev["kills"].append(now)
                    known |= set(victims)
                    waiting = True
                next_kill = now + rng.expovariate(1 / args.mtbf)
            if started is not None and now - started > args.duration and "end" not in ev:
                ev["end"] = max(t for t, _ in ev["rows"])
                launcher.send_signal(signal.SIGTERM)
            if not ev["load"] or now - ev["load"][-1][0] > 15:
                ev["load"].append([now, os.getloadavg()[0]])
            time.sleep(0.05)
        for r in readers:
            r.join(timeout=10)
        ev["exit"], ev["stderr"] = launcher.returncode, "".join(err)
        if launcher.returncode not in (75, 128 + signal.SIGTERM):  # SIGTERM mid-restart: out at once
            sys.exit(f"soak run ended with exit {launcher.returncode}: {ev['stderr']}")
    ev["started"] = started
    return ev


def analyse(ev: dict, center=statistics.mean) -> dict:
    """Split the wall time of a recorded soak into what it went to (module docstring). `center`: how a steady
    step's wall time w is taken from the steady steps."""
    end, kills = ev["end"], ev["kills"]
    rows = [(t, r) for t, r in ev["rows"] if t <= end]
    kills = [k for k in kills if k <= end]

    def attempt(t: float, r: dict) -> int:  # the group a row's step ran in: kills before the step began
        return sum(k < t - r["step_time_s"] for k in kills)
    last = {r["step"]: i for i, (_, r) in enumerate(rows)}  # the run of each step that counts
    by_attempt: dict[int, list[int]] = {}
    for i, (t, r) in enumerate(rows):
        by_attempt.setdefault(attempt(t, r), []).append(i)
    gap, first_of = {}, set()
    for idx in by_attempt.values():
        first_of.add(idx[0])
        gap[idx[0]] = rows[idx[0]][1]["step_time_s"]
        for a, b in zip(idx, idx[1:]):
            gap[b] = rows[b][0] - rows[a][0]

    # steady steps: counted, not the first after a (re)start, no save or write near them
    saves = [i for i, (_, r) in enumerate(rows) if "checkpoint_save_s" in r]
    in_write: dict[int, int] = {}  # row -> the save whose background write it overlaps
    for s in saves:
        same = by_attempt[attempt(*rows[s])]
        for i in same[same.index(s) + 1:]:
            in_write[i] = s
            if "checkpoint_write_s" in rows[i][1]:
                break
    warm: dict[int, int] = {}  # row -> its position after a restart's first step (1-based)
    for a, idx in by_attempt.items():
        for k, i in enumerate(idx[:WARMUP]):
            warm[i] = k + 1
    steady = [gap[i] for i in gap if last[rows[i][1]["step"]] == i and i not in warm and i not in in_write
              and i not in saves]
    w = center(steady)

    # per failure: restart, its parts, lost work
    failures = []
    for n, k in enumerate(kills):
        nxt = kills[n + 1] if n + 1 < len(kills) else float("inf")
        before = by_attempt.get(n, [])  # the attempt the kill ended (attempt n ran between kill n-1 and n)
        after = by_attempt.get(n + 1, [])
        f: dict = {"kill": k}
        if after:
            f["restart_s"] = rows[after[0]][0] - rows[after[0]][1]["step_time_s"] - k
            resumed = rows[after[0]][1]["step"]
            f["resumed"] = resumed
            spawn = [s for s in ev["spawns"] if k < s < nxt]
            resume = [s for s in ev["resumes"] if k < s < nxt]
            if spawn:
                f["relaunch_s"] = spawn[0] - k
            if spawn and resume:
                f["startup_load_s"] = resume[0] - spawn[0]
                f["to_first_step_s"] = rows[after[0]][0] - rows[after[0]][1]["step_time_s"] - resume[0]
        else:
            f["cut_short_by_next_kill_s"] = nxt - k
        if before:
            redone = [i for i in before if last[rows[i][1]["step"]] != i]
            f["lost_s"] = sum(gap[i] for i in redone) + (k - rows[before[-1]][0])
            logged_saves = [rows[i][1]["step"] + 1 for i in before if "checkpoint_save_s" in rows[i][1]]
            # the newest save begun before the kill is not the one resumed from: its write was in flight
            f["write_in_flight"] = bool(after and logged_saves and f["resumed"] < logged_saves[-1])
        elif n > 0:
            f["lost_s"] = 0.0  # killed during the restart: that restart's time is the loss
        failures.append(f)
    restarts = [f["restart_s"] for f in failures if "restart_s" in f]
    warm_excess = [sum(gap[i] - w for i in idx[:WARMUP] if last[rows[i][1]["step"]] == i and i not in saves
                       and i not in in_write)
                   for a, idx in by_attempt.items() if a > 0 and idx]
    profile = [statistics.mean(gap[idx[k]] for a, idx in by_attempt.items() if a > 0 and len(idx) > k)
               for k in range(min(20, min((len(idx) for a, idx in by_attempt.items() if a > 0), default=0)))]

    # checkpoint cost per interval: the save's own step plus the steps its write overlaps (counted runs only)
    counted = [i for i in saves if last[rows[i][1]["step"]] == i]
    blocked = [gap[i] - w for i in counted]
    overlap = [sum(gap[j] - w for j, s in in_write.items() if s == i and last[rows[j][1]["step"]] == j)
               for i in counted]
    writes = [r["checkpoint_write_s"] for _, r in rows if "checkpoint_write_s" in r]
    wall = end - ev["started"]
    steps = len(last)
    useful = steps * w
    restart_total = sum(restarts) + sum(f.get("cut_short_by_next_kill_s", 0) for f in failures)
    lost_total = sum(f.get("lost_s", 0) for f in failures)
    other = sum(gap[i] - w for i in gap if last[rows[i][1]["step"]] == i and i not in in_write and i not in saves
                and not (i in warm and attempt(*rows[i]) > 0))
    return {"w": w, "wall": wall, "steps": steps, "useful": useful, "kills": len(kills), "failures": failures,
            "restart_mean": statistics.mean(restarts) if restarts else 0.0, "restarts": sorted(restarts),
            "warm_mean": statistics.mean(warm_excess) if warm_excess else 0.0, "profile": profile,
            "saves": len(counted), "blocked_mean": statistics.mean(blocked), "overlap_mean": statistics.mean(overlap),
            "write_median": statistics.median(writes) if writes else 0.0,
            "budget": {"useful": useful, "checkpoints": sum(blocked) + sum(overlap), "restarts": restart_total,
                       "warm-up": sum(warm_excess), "lost work": lost_total, "other": other},
            "load": [x for _, x in ev.get("load", [])]}


def compared(ev: dict, a: dict) -> list[tuple[str, float, float, float]]:
    """(which M, M, ETTR measured, ETTR predicted by cost/goodput.ettr from the run's own inputs)."""
    from meshscale.cost.goodput import ettr

    tau, delta = ev["args"]["every"] * a["w"], a["blocked_mean"] + a["overlap_mean"]
    realised = a["wall"] / a["kills"] if a["kills"] else float("inf")
    return [(name, m, a["useful"] / a["wall"], ettr(tau, delta, a["restart_mean"] + a["warm_mean"], m,
                                                    a["write_median"]))
            for name, m in (("--mtbf", ev["args"]["mtbf"]), ("realised", realised))]


def report(ev: dict, a: dict, median: dict) -> None:
    from meshscale.cost.goodput import expected_lost_work

    args = ev["args"]
    w, every = a["w"], args["every"]
    tau, delta = every * w, a["blocked_mean"] + a["overlap_mean"]
    load = a["load"]
    print(f"{args['model']} on {args['nproc']} gloo ranks, --async-save every {every} steps, kills at MTBF "
          f"{args['mtbf']:g} s for {a['wall']:.0f} s: {a['kills']} kills, {len(a['restarts'])} restarts, "
          f"{a['steps']} steps" + (f"; load {min(load):.1f}-{max(load):.1f} (median {statistics.median(load):.1f})"
                                   if load else ""))
    print(f"  w {w:.3f} s per steady step (mean; median {median['w']:.3f} s): tau {tau:.2f} s; "
          f"checkpoint cost per interval delta {delta:.3f} s "
          f"(staging step {a['blocked_mean']:.3f} s + steps the write overlaps {a['overlap_mean']:.3f} s; write to "
          f"commit {a['write_median']:.2f} s, median of {a['saves']})")
    parts = {name: [f[key] for f in a["failures"] if key in f] for key, name in
             (("relaunch_s", "detection & relaunch"), ("startup_load_s", "start-up & load"),
              ("to_first_step_s", "to the first step"))}
    print(f"  restart R {a['restart_mean']:.1f} s mean (each: {', '.join(f'{r:.1f}' for r in a['restarts'])}) = "
          + " + ".join(f"{name} {statistics.mean(v):.1f}" for name, v in parts.items() if v)
          + f"; warm-up {a['warm_mean']:.2f} s over the first {WARMUP} steps (first steps' mean wall: "
          + ", ".join(f"{g:.2f}" for g in a["profile"][:WARMUP]) + ")")
    lost = [f["lost_s"] for f in a["failures"] if "lost_s" in f]
    hit = sum(f.get("write_in_flight", False) for f in a["failures"])
    cut = sum("cut_short_by_next_kill_s" in f for f in a["failures"])
    print(f"  lost work {statistics.mean(lost) if lost else 0:.1f} s per failure measured ({hit} of {len(lost)} "
          f"kills during a write), {expected_lost_work(tau, delta, a['write_median']):.1f} s expected; {cut} "
          "kill(s) landed in a restart")
    print("  wall " + ", ".join(f"{k} {v:.0f} s" for k, v in a["budget"].items())
          + f" (sum {sum(a['budget'].values()):.0f} s of {a['wall']:.0f} s)")
    for (name, mtbf, measured, predicted), (_, _, measured_md, predicted_md) in zip(compared(ev, a),
                                                                                 compared(ev, median)):
        off = f"{100 * (measured - predicted) / predicted:+.1f}%" if predicted > 0 else "no useful time predicted"
        print(f"  ETTR measured {measured:.3f}; predicted (cost/goodput.ettr, M = {name} {mtbf:.0f} s) "
              f"{predicted:.3f}: {off} (w the median step: {measured_md:.3f} vs {predicted_md:.3f}, "
              f"{100 * (measured_md - predicted_md) / predicted_md:+.1f}%)")


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--duration", type=float, default=1500.0)
    p.add_argument("--mtbf", type=float, default=300.0, help="mean seconds between injected kills")
    p.add_argument("--every", type=int, default=40, help="--checkpoint-every (an async write should fit in it)")
    p.add_argument("--nproc", type=int, default=2)
    p.add_argument("--model", default="tiny")
    p.add_argument("--seed", type=int, default=0, help="of the kill times")
    p.add_argument("--events", help="save the recorded events to this JSON file")
    p.add_argument("--analyse", help="report on a saved events file instead of running")
    args = p.parse_args()
    sys.path.insert(0, str(ROOT / "src"))
    if args.analyse:
        ev = json.loads(Path(args.analyse).read_text())
    else:
        ev = record(args)
        if args.events:
            Path(args.events).write_text(json.dumps(ev))
    report(ev, analyse(ev), analyse(ev, statistics.median))


if __name__ == "__main__":
    main()
