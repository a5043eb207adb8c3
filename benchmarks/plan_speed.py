"""Planner speed and memory: exhaustive search for llama3-405b on 16,384 H100 with a 16M-token batch.

Target (issue 3): under 2 s and under 500 MB on the 2-core development machine.
Run: PYTHONPATH=src python benchmarks/plan_speed.py
"""

import resource
import time

start = time.perf_counter()
from meshscale.plan import search  # noqa: E402  (imports are part of the measured time)
from meshscale.specs.cluster import load_cluster  # noqa: E402
from meshscale.specs.model import load_model  # noqa: E402

model, cluster = load_model("llama3-405b"), load_cluster("h100-80gb")
batch = 16 * 1024 * 1024 // model.seq  # 16M tokens at 8192 = 2048 sequences
plan = search(model, cluster, 16384, batch)
wall = time.perf_counter() - start
rss_mb = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
print(f"enumerated {plan.enumerated:,} layouts, {plan.fitting:,} fit, costed {plan.evaluated:,} in full")
print(f"search {plan.seconds:.2f} s, wall with imports {wall:.2f} s, peak RSS {rss_mb:.0f} MB")
best = plan.ranked[0]
print(f"winner {best.layout}: {best.step_time_s:.2f} s/step, MFU {best.mfu:.1%}")
raise SystemExit(0 if wall < 2 and rss_mb < 500 else 1)
