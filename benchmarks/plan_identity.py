"""Before/after check for refactorings of the cost model and the planner: plans, predictions and simulations
must stay byte-identical.

    PYTHONPATH=src python benchmarks/plan_identity.py run OUT.json      # every number, repr'd exactly
    PYTHONPATH=src python benchmarks/plan_identity.py compare A.json B.json

`run` searches 16 cases (10 models, 8 clusters, several --fix, precisions, cross-TP, 65,536 devices) and dumps
each plan (counts, smallest, ranked and rejected predictions in full, the explanation's lines), then 17
predictions and 8 simulations of fixed layouts. `compare` exits 0 when the two files are byte-identical, or
differ only in how many layouts each search costed in full (a tighter bound prunes more: it reports the counts),
else prints the first differing entries and exits 1.
"""

import json
import sys

from meshscale.cost import predict
from meshscale.errors import UserError
from meshscale.plan.explain import explain, rejected
from meshscale.plan.search import parse_fix, search
from meshscale.sim.step import simulate
from meshscale.specs.cluster import load_cluster
from meshscale.specs.layout import Layout
from meshscale.specs.model import load_model

# (model, cluster, devices, global batch in sequences, --fix or None, options)
SEARCHES = [
    ("llama3-405b", "h100-80gb", 16384, 2048, None, {}),
    ("llama3-405b", "h100-80gb", 16384, 2048, "pp=16", {}),
    ("llama3-405b", "h100-80gb", 65536, 2048, None, {}),
    ("llama3-70b", "h100-80gb", 1024, 512, None, {}),
    ("llama3-70b", "b200", 512, 512, "tp=8,pp=1", {}),
    ("llama2-70b", "gb200-nvl72", 512, 512, "schedule=zbv", {}),
    ("llama2-7b", "a100-80gb", 64, 256, None, {}),
    ("llama2-13b", "tpu-v5e", 256, 256, None, {}),
    ("llama3-8b", "tpu-v5p", 256, 512, None, {}),
    ("llama3-8b", "h100-80gb", 64, 256, "recompute=full,mbs=1", {"precision": "fp8"}),
    ("gpt3-175b", "a100-80gb", 1024, 1536, None, {}),
    ("gpt3-175b", "a100-80gb", 1024, 1536, "fsdp=128", {"cross_tp": True}),
    ("mixtral-8x7b", "h100-80gb", 256, 512, None, {}),
    ("mixtral-8x7b", "h100-80gb", 256, 512, "ep=8,zero=1", {}),
    ("deepseek-v3", "h200", 2048, 4096, None, {}),
    ("small-moe", "local-cpu", 8, 32, None, {"precision": "fp32"}),
]

# (model, cluster, layout, global batch, simulate too)
PREDICTIONS = [
    ("llama3-405b", "h100-80gb", "tp=8,pp=16,dp=128,zero=1,schedule=1f1b,mbs=1,recompute=selective,sp=true", 2048,
     True),
    ("llama3-405b", "h100-80gb", "tp=8,pp=16,dp=64,cp=2,zero=1,schedule=interleaved,vpp=2,mbs=1,sp=true", 2048, True),
    ("llama3-70b", "h100-80gb", "tp=8,pp=4,dp=32,zero=1,schedule=zbv,mbs=1,sp=true", 512, True),
    ("llama3-70b", "h100-80gb", "tp=8,pp=4,dp=32,zero=1,schedule=dualpipev,mbs=1,sp=true", 512, True),
    ("llama3-70b", "h100-80gb", "tp=8,pp=4,dp=32,zero=1,schedule=zb,mbs=1", 512, False),
    ("llama3-70b", "h100-80gb", "tp=4,pp=8,dp=32,zero=1,schedule=gpipe,mbs=2,recompute=full", 512, True),
    ("llama2-7b", "a100-80gb", "fsdp=64,mbs=2", 256, False),
    ("llama2-7b", "a100-80gb", "dp=64,zero=3,shard=8,mbs=1", 256, False),
    ("llama2-7b", "a100-80gb", "dp=64,zero=2,mbs=4", 256, False),
    ("gpt3-175b", "a100-80gb", "tp=8,pp=8,dp=16,zero=1,schedule=interleaved,vpp=3,mbs=1", 1536, True),
    ("mixtral-8x7b", "h100-80gb", "tp=2,pp=2,dp=64,ep=8,zero=1,schedule=1f1b,mbs=1,sp=true", 512, False),
    ("mixtral-8x7b", "h100-80gb", "tp=1,pp=4,dp=64,ep=8,zero=3,schedule=1f1b,mbs=1", 512, False),
    ("deepseek-v3", "h200", "tp=1,pp=16,dp=128,ep=64,zero=1,schedule=dualpipev,mbs=1", 4096, False),
    ("llama3-8b", "tpu-v5p", "tp=4,dp=64,zero=3,mbs=2", 512, False),
    ("llama3-8b", "h100-80gb", "dp=64,zero=1,mbs=1,recompute=op", 256, False),
    ("llama3-8b", "h100-80gb", "tp=2,cp=4,dp=8,zero=2,mbs=1,sp=true", 256, True),
    ("tiny", "local-cpu", "tp=2,pp=2,dp=2,zero=1,schedule=zbv,mbs=1", 16, True),
]


def _plan(model_name, cluster_name, devices, batch, fix_text, options) -> dict:
    model, cluster = load_model(model_name), load_cluster(cluster_name)
    fix = parse_fix(fix_text) if fix_text else {}
    precision = options.get("precision", "bf16")
    plan = search(model, cluster, devices, batch, precision, cross_tp=options.get("cross_tp", False), fix=fix)
    out = {"case": [model_name, cluster_name, devices, batch, fix_text, options], "fixed": plan.fixed,
           "enumerated": plan.enumerated, "fitting": plan.fitting, "evaluated": plan.evaluated,
           "smallest": list(plan.smallest), "ranked": [p.to_dict() for p in plan.ranked],
           "rejected": [p.to_dict() for p in plan.rejected]}
    if plan.ranked:
        out["explain"] = explain(plan, model, cluster, plan.ranked[0].devices, batch, precision)
        out["alternatives"] = rejected(plan)
    return out


def _prediction(model_name, cluster_name, text, batch, sim) -> dict:
    model, cluster = load_model(model_name), load_cluster(cluster_name)
    layout = Layout.parse(text)
    out = {"case": [model_name, cluster_name, text, batch]}
    try:
        out["predict"] = predict(model, cluster, layout, batch).to_dict()
        if sim:
            s = simulate(model, cluster, layout, batch)
            out["simulate"] = {**s.to_dict(), "events": [list(e.__dict__.values()) for e in s.events]}
    except UserError as e:
        out["error"] = str(e)
    return out


def run(path: str) -> None:
    results = {"searches": [], "predictions": []}
    for case in SEARCHES:
        results["searches"].append(_plan(*case))
        print(f"searched {case[:5]}", flush=True)
    for case in PREDICTIONS:
        results["predictions"].append(_prediction(*case))
    with open(path, "w") as f:
        json.dump(results, f, indent=1, sort_keys=True)  # floats as repr: exact
    print(f"wrote {path}")


def _diff(a, b, where="") -> list[str]:
    if type(a) is not type(b):
        return [f"{where}: {a!r} != {b!r}"]
    if isinstance(a, dict):
        return [d for k in sorted(set(a) | set(b)) for d in _diff(a.get(k), b.get(k), f"{where}.{k}")]
    if isinstance(a, list):
        if len(a) != len(b):
            return [f"{where}: {len(a)} items != {len(b)}"]
        return [d for i, (x, y) in enumerate(zip(a, b)) for d in _diff(x, y, f"{where}[{i}]")]
    return [] if a == b and repr(a) == repr(b) else [f"{where}: {a!r} != {b!r}"]


def compare(path_a: str, path_b: str) -> int:
    with open(path_a, "rb") as f, open(path_b, "rb") as g:
        raw_a, raw_b = f.read(), g.read()
    if raw_a == raw_b:
        data = json.loads(raw_a)
        print(f"identical: {len(data['searches'])} searches, {len(data['predictions'])} predictions "
              f"({sum('simulate' in p for p in data['predictions'])} simulated), {len(raw_a):,} bytes")
        return 0
    a, b = json.loads(raw_a), json.loads(raw_b)
    counts = [(x["evaluated"], y["evaluated"]) for x, y in zip(a["searches"], b["searches"])]
    for x, y in zip(a["searches"], b["searches"]):  # how many the bound let through is not a result
        x["evaluated"] = y["evaluated"] = 0
    diffs = _diff(a, b)
    if not diffs:
        print(f"identical but for how many layouts were costed in full: {len(a['searches'])} searches, "
              f"{len(a['predictions'])} predictions; costed {sum(x for x, _ in counts):,} -> "
              f"{sum(y for _, y in counts):,} ({', '.join(f'{x}->{y}' for x, y in counts if x != y)})")
        return 0
    print(f"DIFFERENT: {len(diffs)} values")
    for d in diffs[:20]:
        print(" ", d[:300])
    return 1


if __name__ == "__main__":
    if len(sys.argv) == 3 and sys.argv[1] == "run":
        run(sys.argv[2])
    elif len(sys.argv) == 4 and sys.argv[1] == "compare":
        raise SystemExit(compare(sys.argv[2], sys.argv[3]))
    else:
        raise SystemExit(__doc__)
