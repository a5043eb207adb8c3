"""`meshscale simulate` against `meshscale predict` on H100 pipelines with uneven ranks (the output head, and
the embedding, make one rank slower): llama2-7b, llama3-8b and llama2-70b at tp=8, pp 2, 4 and 8, every
schedule, m = p..8p micro-batches (DualPipeV from 2p). Prints the median and worst relative difference of
the step per schedule and the cases beyond 2% (the issue's target). The closed forms these test are in
cost/pipeline.py. Run: PYTHONPATH=src python benchmarks/sim_vs_predict.py   (a few seconds)
"""

import statistics

from meshscale.cost import predict
from meshscale.sim.step import simulate
from meshscale.specs.cluster import load_cluster
from meshscale.specs.layout import SCHEDULES, Layout
from meshscale.specs.model import load_model

H100 = load_cluster("h100-80gb")
gaps: dict = {}
for name in ("llama2-7b", "llama3-8b", "llama2-70b"):
    model = load_model(name)
    for pp in (2, 4, 8):
        for schedule in SCHEDULES:
            layout = Layout.parse(f"tp=8,pp={pp},schedule={schedule}" + (",vpp=2" if schedule == "interleaved" else ""),
                                  8 * pp)
            for m in range(2 * pp if schedule == "dualpipev" else pp, 8 * pp + 1, pp):
                gap = simulate(model, H100, layout, m).step_time_s / predict(model, H100, layout, m).step_time_s - 1
                gaps.setdefault(schedule, []).append((abs(gap), gap, name, pp, m))
for schedule, rows in gaps.items():
    rows.sort()
    beyond = ", ".join(f"{n} pp={pp} m={m} {g:+.1%}" for _, g, n, pp, m in rows if abs(g) > 0.02)
    print(f"{schedule:12s} {len(rows):3d} cases  median {statistics.median(r[0] for r in rows):.2%}  "
          f"worst {rows[-1][0]:.2%}" + (f"  beyond 2%: {beyond}" if beyond else ""))
