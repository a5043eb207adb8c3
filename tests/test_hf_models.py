"""Hugging Face models in meshscale's runtime model: logits equal transformers' in fp32."""

import pytest
import torch

from hf_cases import NAMES, config, save, tokens
from meshscale.models.hf_weights import load
from meshscale.models.transformer import Transformer, full_shapes
from meshscale.specs.model import load_model



@pytest.mark.parametrize("case", NAMES)
def test_logits_equal_transformers(tmp_path, case):
    hf = save(config(case), tmp_path, shard="20KB" if case == "mixtral" else None)
    if case == "mixtral":
        assert (tmp_path / "model.safetensors.index.json").is_file()
    spec = load_model(str(tmp_path))
    assert spec.param_count() == sum(p.numel() for p in hf.parameters())
    model = Transformer(spec).eval()
    load(model, tmp_path, spec, full_shapes(spec))
    x = tokens()
    with torch.no_grad():
        ours, theirs = model(x), hf(x).logits
    assert (ours - theirs).abs().max().item() < 1e-5, (ours - theirs).abs().max().item()


# ---- under layouts: each rank loads only its pieces ----------------------------------------------------
DENSE = ["tp=2", "pp=2", "dp=2,zero=3", "dp=2,zero=1"]
MOE_LAYOUTS = ["tp=2", "pp=2", "dp=2,zero=3", "ep=2"]


def _full_logits(par, layout, mesh, x):
    """The whole (batch, seq, vocab) logits on every rank: the pipeline's stages run by hand (a send per
    boundary), the vocabulary shards gathered over TP."""
    import torch.distributed as dist

    if layout.pp > 1:
        rank, last = mesh["pp"].get_local_rank(), layout.pp - 1
        (_, chunk), = par.chunks
        h = x if rank == 0 else torch.empty(*x.shape, chunk.spec.hidden)
        if rank:
            dist.recv(h, group=mesh["pp"].get_group(), group_src=rank - 1)
        h = chunk(h)
        if rank < last:
            dist.send(h.contiguous(), group=mesh["pp"].get_group(), group_dst=rank + 1)
            h = torch.empty(*x.shape, chunk.spec.vocab)
        dist.broadcast(h, group=mesh["pp"].get_group(), group_src=last)
        return h
    logits = par.model(x)
    if layout.tp > 1:
        pieces = [torch.empty_like(logits) for _ in range(layout.tp)]
        dist.all_gather(pieces, logits.contiguous(), group=mesh["tp"].get_group())
        logits = torch.cat(pieces, dim=-1)
    return logits


def _logits_under_layouts(rank, world, jobs):
    from meshscale.models.hf_weights import load
    from meshscale.parallel.apply import apply_layout
    from meshscale.parallel.ledger import CommLedger
    from meshscale.parallel.mesh import build_mesh
    from meshscale.specs.layout import Layout

    out = {}
    for case, path, layouts, want in jobs:
        spec = load_model(path)
        shapes = full_shapes(spec)
        for text in layouts:
            layout = Layout.parse(text, world)
            mesh = build_mesh(layout, "cpu")
            par = apply_layout(Transformer(spec), layout, mesh, CommLedger(),
                               load=lambda module, tp_rank, tp: load(module, path, spec, shapes, tp_rank, tp))
            for _, chunk in par.chunks:
                chunk.eval()
            with torch.no_grad():
                got = _full_logits(par, layout, mesh, tokens())
            out[f"{case} {text}"] = (got - want).abs().max().item()
    return out


def test_logits_equal_transformers_under_layouts(tmp_path):
    from multirank import run_ranks

    jobs = []
    for case in NAMES:
        hf = save(config(case), tmp_path / case, shard="30KB")  # several files: each rank opens those it needs
        with torch.no_grad():
            want = hf(tokens()).logits
        moe = "moe" in case or case == "mixtral"
        jobs.append((case, str(tmp_path / case), MOE_LAYOUTS if moe else DENSE, want))
    per_rank = run_ranks(2, _logits_under_layouts, jobs)
    assert len(per_rank[0]) == sum(len(j[2]) for j in jobs)
    for diffs in per_rank:
        bad = {k: v for k, v in diffs.items() if not v < 1e-5}
        assert not bad, bad
