"""ClusterSpec presets and loading."""

import json

import pytest

from meshscale.errors import UserError
from meshscale.specs.cluster import PRESETS, ClusterSpec, Tier, load_cluster


def test_presets_cover_the_issue_and_are_valid():
    for name in ("a100-80gb", "h100-80gb", "h200", "b200", "gb200-nvl72", "tpu-v5p", "tpu-v5e", "tpu-v4",
                 "local-cpu"):
        c = load_cluster(name)
        assert c.peak_flops_bf16 > 0 and c.hbm_bytes > 0 and c.tiers
        assert 0 < c.matmul_efficiency <= 1
    assert PRESETS["h100-80gb"].fast_domain == 8
    assert PRESETS["gb200-nvl72"].fast_domain == 72
    assert PRESETS["tpu-v5p"].fast_domain == 4096


def test_load_json_toml_and_base_override(tmp_path):
    spec = {"name": "mine", "accelerator": "x", "peak_flops_bf16": 1e15, "peak_flops_fp8": 2e15,
            "peak_flops_fp32": 5e13, "hbm_bytes": 1e11, "hbm_bandwidth": 3e12, "matmul_efficiency": 0.5,
            "tiers": [{"name": "nvlink", "size": 4, "bandwidth": 1e11, "latency": 1e-6, "efficiency": 0.8},
                      {"name": "eth", "size": 0, "bandwidth": 1e10, "latency": 1e-5, "efficiency": 0.7}]}
    path = tmp_path / "c.json"
    path.write_text(json.dumps(spec))
    c = load_cluster(str(path))
    assert isinstance(c.tiers[0], Tier) and c.fast_domain == 4
    toml = tmp_path / "c.toml"
    toml.write_text('base = "h100-80gb"\nmatmul_efficiency = 0.5\n')
    assert load_cluster(str(toml)).matmul_efficiency == 0.5
    assert load_cluster(str(toml)).hbm_bytes == PRESETS["h100-80gb"].hbm_bytes


@pytest.mark.parametrize("bad, match", [
    ("nope", "unknown cluster preset"),
    ("missing.json", "file not found"),
])
def test_bad_cluster_names(bad, match):
    with pytest.raises(UserError, match=match):
        load_cluster(bad)


def test_bad_fields(tmp_path):
    path = tmp_path / "c.json"
    path.write_text(json.dumps({"name": "x", "peak_flops_bf16": 1, "bogus": 3}))
    with pytest.raises(UserError, match="unknown field"):
        load_cluster(str(path))
    with pytest.raises(UserError, match="matmul_efficiency"):
        ClusterSpec(name="x", accelerator="x", peak_flops_bf16=1, peak_flops_fp8=0, peak_flops_fp32=0,
                    hbm_bytes=1, hbm_bandwidth=1, matmul_efficiency=1.5, tiers=(Tier("a", 0, 1, 0, 1),))


def test_tp_splits_or_replicates_kv_heads_and_nothing_else():
    from dataclasses import replace

    from meshscale.specs.layout import Layout, check_against
    from meshscale.specs.model import PRESETS

    model = replace(PRESETS["tiny"], heads=12, kv_heads=3, head_dim=8, hidden=96, ffn=192)
    check_against(Layout(tp=3), model)  # divides kv_heads
    check_against(Layout(tp=6), model)  # a multiple of kv_heads: each rank a copy of its KV head
    with pytest.raises(UserError, match="either divide kv_heads \\(3\\) or be a multiple of it"):
        check_against(Layout(tp=2), model)
