"""Hugging Face models in meshscale's runtime model: logits equal transformers' in fp32."""

import pytest
import torch

from hf_cases import configs, save, tokens
from meshscale.models.hf_weights import load
from meshscale.models.transformer import Transformer, full_shapes
from meshscale.specs.model import load_model

CASES = configs()


@pytest.mark.parametrize("case", list(CASES))
def test_logits_equal_transformers(tmp_path, case):
    hf = save(CASES[case], tmp_path, shard="20KB" if case == "mixtral" else None)
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
