"""Planner speed and memory: exhaustive search for llama3-405b on H100 with a 16M-token batch, and the
explanation `meshscale plan` prints with it.

Targets: issue 3, the search under 2 s and 500 MB on the 2-core development machine; issue 23, the whole
`meshscale plan` command (imports, search, explanation) under 0.5 s of CPU at 16,384 devices and under 1 s at
65,536 (measure the command itself with `time`, user + sys, interleaved with a baseline: the machine is shared).
Run: PYTHONPATH=src python benchmarks/plan_speed.py [DEVICES]
"""

import resource
import sys
import time

start, cpu = time.perf_counter(), time.process_time()
from meshscale.plan.search import search  # noqa: E402  (imports are part of the measured time)
from meshscale.plan.explain import explain  # noqa: E402
from meshscale.specs.cluster import load_cluster  # noqa: E402
from meshscale.specs.model import load_model  # noqa: E402

devices = int(sys.argv[1]) if len(sys.argv) > 1 else 16384
imported = time.process_time()
model, cluster = load_model("llama3-405b"), load_cluster("h100-80gb")
batch = 16 * 1024 * 1024 // model.seq  # 16M tokens at 8192 = 2048 sequences
plan = search(model, cluster, devices, batch)
searched = time.process_time()
explain(plan, model, cluster, devices, batch)
explained = time.process_time()
wall = time.perf_counter() - start
rss_mb = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
print(f"enumerated {plan.enumerated:,} layouts, {plan.fitting:,} fit, costed {plan.evaluated:,} in full")
print(f"CPU: imports {imported - cpu:.2f} s, search {searched - imported:.2f} s, explanation "
      f"{explained - searched:.2f} s; wall with imports {wall:.2f} s, peak RSS {rss_mb:.0f} MB")
best = plan.ranked[0]
print(f"winner {best.layout}: {best.step_time_s:.2f} s/step, MFU {best.mfu:.1%}")
raise SystemExit(0 if wall < 2 and rss_mb < 500 else 1)
