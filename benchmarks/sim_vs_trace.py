"""The simulator against measured pipelines: train each schedule at pp=2 and pp=4 on this machine with
--trace, replay the measured F/B/W durations through the simulator's schedule orders, and compare the
bubbles (target, issue 11: within 5 percentage points on every pipeline rank).
Run: PYTHONPATH=src python benchmarks/sim_vs_trace.py   (7-15 minutes on 2 cores)
"""

import os
import subprocess
import sys
import tempfile

from meshscale.sim.measured import replay
from meshscale.specs.layout import Layout

BATCH = 8  # sequences: 8 micro-batches of 1, enough for dualpipev at pp=4 (m >= 2pp)
CASES = [(pp, schedule, vpp) for pp in (2, 4)
         for schedule, vpp in (("gpipe", 1), ("1f1b", 1), ("interleaved", 2), ("zb", 1), ("zbv", 2), ("dualpipev", 2))]

worst = 0.0
with tempfile.TemporaryDirectory() as tmp:
    for pp, schedule, vpp in CASES:
        text = f"pp={pp},schedule={schedule}" + (",vpp=2" if schedule == "interleaved" else "")
        trace = os.path.join(tmp, f"{pp}_{schedule}.json")
        subprocess.run([sys.executable, "-m", "meshscale", "train", "--model", "small", "--nproc", str(pp),
                        "--layout", text, "--global-batch", str(BATCH), "--steps", "2", "--trace", trace],
                       check=True, capture_output=True)
        layout = Layout.parse(text, pp).resolve_mbs(BATCH)
        r = replay(trace, layout, layout.microbatches(BATCH))
        gap = max(abs(a - b) for a, b in zip(r.measured, r.simulated))
        worst = max(worst, gap)
        print(f"pp={pp} {schedule:12s} measured {' '.join(f'{x:5.1%}' for x in r.measured)}  "
              f"simulated {' '.join(f'{x:5.1%}' for x in r.simulated)}  largest gap {gap * 100:.1f} pp", flush=True)
print(f"largest gap over all cases: {worst * 100:.1f} percentage points (target < 5)")
