"""Hugging Face models in meshscale's runtime model: logits equal transformers' in fp32."""

import pytest
import torch

from hf_cases import NAMES, config, save, tokens
from meshscale.models.hf_weights import load
from meshscale.models.transformer import Transformer, full_shapes
from meshscale.specs.model import load_model



@pytest.fixture(scope="module")
def saved(tmp_path_factory):
    """Each case saved once (in several safetensors files with an index), with transformers' logits."""
    root = tmp_path_factory.mktemp("hf")
    out = {}
    for case in NAMES:
        hf = save(config(case), root / case, shard="30KB")
        with torch.no_grad():
            out[case] = (root / case, hf(tokens()).logits, sum(p.numel() for p in hf.parameters()))
    return out


@pytest.mark.parametrize("case", NAMES)
def test_logits_equal_transformers(saved, case):
    path, want, count = saved[case]
    assert (path / "model.safetensors.index.json").is_file()
    spec = load_model(str(path))
    assert spec.param_count() == count
    model = Transformer(spec).eval()
    load(model, path, spec, full_shapes(spec))
    with torch.no_grad():
        got = model(tokens())
    assert (got - want).abs().max().item() < 1e-5, (got - want).abs().max().item()


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


def test_logits_equal_transformers_under_layouts(saved):
    from multirank import run_ranks

    jobs = []
    for case, (path, want, _) in saved.items():  # several files: each rank opens those it needs
        moe = "moe" in case or case == "mixtral"
        jobs.append((case, str(path), MOE_LAYOUTS if moe else DENSE, want))
    per_rank = run_ranks(2, _logits_under_layouts, jobs)
    assert len(per_rank[0]) == sum(len(j[2]) for j in jobs)
    for diffs in per_rank:
        bad = {k: v for k, v in diffs.items() if not v < 1e-5}
        assert not bad, bad


# ---- train from a transformers checkpoint, export, reload ---------------------------------------------
def _train(rank, world, runs):
    from meshscale.runtime.loop.config import TrainConfig, resolve
    from meshscale.runtime.loop.data import load_tokens
    from meshscale.runtime.loop.trainer import train

    text = load_tokens(None)[: 1 << 18]  # bytes: the models below have a vocabulary of 256
    for options in runs:
        train(resolve(TrainConfig(global_batch=4, warmup=0, val_batches=1, **options), world),
              torch.device("cpu"), text, log=False)


def _export(checkpoint, out):
    from test_cli_predict_plan import cli

    r = cli("export", str(checkpoint), "--to", "hf", str(out), "--max-shard-gb", "0.00003")
    assert r.returncode == 0, r.stderr
    assert "as a Hugging Face" in r.stdout
    return r


def _tensors(root):
    from meshscale.models.hf_weights import Safetensors

    files = Safetensors(root)
    return {key: files.slice(key)[:] for key in files.files}


def test_train_from_transformers_checkpoints_then_export(tmp_path):
    """Start from transformers-made checkpoints under tp=2 (learning rate 0: the export must give back the
    very same tensors), ep=2 and pp=2 with a tied GPT-2 table (trained: transformers reloads the export and
    its logits equal meshscale's own from the checkpoint)."""
    import transformers

    from meshscale.commands.export import _weights
    from multirank import run_ranks

    models = {"qwen3": config("qwen3"), "qwen2_moe": config("qwen2_moe"), "gpt2": config("gpt2")}
    for name, cfg in models.items():
        cfg.vocab_size = 256
        save(cfg, tmp_path / name, shard="40KB")
    runs = [dict(init_from=str(tmp_path / "qwen3"), layout="tp=2", steps=1, lr=0.0, min_lr=0.0, seq=32,
                 checkpoint_dir=str(tmp_path / "ck-qwen3")),
            dict(init_from=str(tmp_path / "qwen2_moe"), layout="ep=2", steps=2, lr=1e-3, seq=32,
                 checkpoint_dir=str(tmp_path / "ck-qwen2_moe")),
            dict(init_from=str(tmp_path / "gpt2"), layout="pp=2", steps=2, lr=1e-3, seq=64,
                 checkpoint_dir=str(tmp_path / "ck-gpt2"))]
    run_ranks(2, _train, runs)

    _export(tmp_path / "ck-qwen3", tmp_path / "out-qwen3")
    original, exported = _tensors(tmp_path / "qwen3"), _tensors(tmp_path / "out-qwen3")
    assert sorted(original) == sorted(exported)
    assert all(torch.equal(original[k], exported[k]) for k in original)

    for name in ("qwen2_moe", "gpt2"):
        _export(tmp_path / f"ck-{name}", tmp_path / f"out-{name}")
        spec = load_model(str(tmp_path / f"out-{name}"))
        step = sorted((tmp_path / f"ck-{name}").glob("step-*"))[-1]
        ours = Transformer(spec).eval()
        weights = _weights(step, spec)
        if spec.tied_embeddings:
            weights["output.weight"] = weights["tok_embeddings.weight"]
        ours.load_state_dict(weights)
        before = _tensors(tmp_path / name)
        changed = _tensors(tmp_path / f"out-{name}")
        assert any(not torch.equal(before[k], changed[k]) for k in before)  # it trained
        theirs = transformers.AutoModelForCausalLM.from_pretrained(tmp_path / f"out-{name}").eval()
        x = tokens(vocab=256)
        with torch.no_grad():
            assert (ours(x) - theirs(x).logits).abs().max().item() < 1e-5


def test_init_from_refusals_are_one_line(tmp_path):
    import json

    from meshscale.errors import UserError
    from meshscale.runtime.loop.config import TrainConfig, resolve

    def refused(match, **options):
        with pytest.raises(UserError, match=match):
            resolve(TrainConfig(global_batch=2, **options), 1)

    refused("not a directory", init_from=str(tmp_path / "nowhere"))
    config(case := "qwen3").save_pretrained(tmp_path / case)  # a config, no weights
    refused("no model.safetensors or model.safetensors.index.json", init_from=str(tmp_path / case))
    weights = config(case)
    weights.vocab_size = 256  # the default text's bytes
    save(weights, tmp_path / case)
    refused("--model tiny-gpt is not the model in --init-from", init_from=str(tmp_path / case), model="tiny-gpt")
    assert resolve(TrainConfig(global_batch=2, init_from=str(tmp_path / case), seq=32), 1).spec.qk_norm
    quantized = json.loads((tmp_path / case / "config.json").read_text())
    quantized["quantization_config"] = {"quant_method": "fp8"}
    (tmp_path / case / "config.json").write_text(json.dumps(quantized))
    refused("quantized weights \\(fp8\\) are not read", init_from=str(tmp_path / case))



def test_nemotron_norms_read_and_write_back_as_stored(saved):
    """Nemotron's LayerNorm1P stores a gain g as g - 1: loaded, our LayerNorm holds g; assembled for export, every
    tensor is the checkpoint's own again, and the config written reads back as the same model."""
    from meshscale.models.hf_weights import assemble
    from meshscale.specs.hf import to_hf_config

    path, _, _ = saved["nemotron"]
    spec = load_model(str(path))
    model = Transformer(spec)
    load(model, path, spec, full_shapes(spec))
    original = _tensors(path)
    assert torch.equal(model.norm.weight, original["model.norm.weight"] + 1)
    back = assemble("nemotron", spec, dict(model.state_dict()))
    assert sorted(back) == sorted(original)
    assert all(torch.allclose(back[k], original[k], atol=1e-6) for k in original)
    config = to_hf_config(spec)
    assert (config["model_type"], config["hidden_act"], config["partial_rotary_factor"]) == ("nemotron", "relu2", 0.5)
