"""ClusterSpec presets and loading."""

import json
import pickle

import pytest

from meshscale.errors import UserError
from meshscale.specs.cluster import PRESETS, ClusterSpec, Tier, load_cluster
from meshscale.specs.layout import Layout
from meshscale.specs.model import load_model


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
    path.write_text(json.dumps({"extends": "h100-80gb"}))  # the key a preset is based on is listed too
    with pytest.raises(UserError, match=r"unknown field\(s\) extends; known: .*, base, "):
        load_cluster(str(path))
    with pytest.raises(UserError, match="matmul_efficiency"):
        ClusterSpec(name="x", accelerator="x", peak_flops_bf16=1, peak_flops_fp8=0, peak_flops_fp32=0,
                    hbm_bytes=1, hbm_bandwidth=1, matmul_efficiency=1.5, tiers=(Tier("a", 0, 1, 0, 1),))


def test_a_cluster_file_missing_fields_names_them_and_the_base_key(tmp_path):
    path = tmp_path / "c.toml"
    path.write_text('accelerator = "x"\n[software]\nframework = "torch"\n')
    with pytest.raises(UserError, match=r"missing field\(s\) peak_flops_bf16, .*matmul_efficiency; .*base = "):
        load_cluster(str(path))


@pytest.mark.parametrize("text, match", [
    ('matmul_efficiency = "0.5"', "matmul_efficiency must be a number, got '0.5'"),
    ("compute_units = 1.5", "compute_units must be an integer"),
    ("compute_units = true", "compute_units must be an integer"),
    ('fp8_gemm_speedup = 0.5', "fp8_gemm_speedup must be >= 1"),
    ('[software]\nparam_gather_fp32 = "yes"', "param_gather_fp32 must be true or false"),
    ("bogus = 3", "unknown field"),
    ('tiers = "nvlink"', "tiers must be a list or a table, got 'nvlink'"),
    ("tiers = [1, 2]", "each entry of tiers must be a table of Tier fields, got 1"),
    ("gemm_rates = [1]", "each entry of gemm_rates must be a row"),
    ("software = 3", "software must be a table of Software fields, got 3"),
])
def test_mistyped_fields_of_a_based_file_are_one_line(tmp_path, text, match):
    path = tmp_path / "c.toml"
    path.write_text(f'base = "h100-80gb"\n{text}\n')
    with pytest.raises(UserError, match=match):
        load_cluster(str(path))


@pytest.mark.parametrize("value", ["0", "1.2", "-0.5"])
def test_hbm_efficiency_outside_0_1_is_one_line(tmp_path, value):
    path = tmp_path / "c.toml"
    path.write_text(f'base = "h200"\nhbm_efficiency = {value}\n')
    with pytest.raises(UserError) as e:
        load_cluster(str(path))
    assert str(e.value) == f"cluster {path}: hbm_efficiency must be in (0, 1] (the achieved fraction of " \
                           f"hbm_bandwidth), got {value}"
    path.write_text('base = "h200"\ngemm_kernel_overhead_s = -1e-6\n')
    with pytest.raises(UserError, match="gemm_kernel_overhead_s must be >= 0 seconds, got -1e-06$"):
        load_cluster(str(path))


def test_an_integer_stands_for_a_float_but_not_for_a_bool(tmp_path):
    path = tmp_path / "c.toml"
    path.write_text('base = "h100-80gb"\nmatmul_efficiency = 1\nfp8_gemm_speedup = 2\n')
    assert load_cluster(str(path)).matmul_efficiency == 1
    path.write_text('base = "h100-80gb"\n[software]\ntp_comm_overlap = 1\n')
    with pytest.raises(UserError, match="tp_comm_overlap must be true or false"):
        load_cluster(str(path))


def test_a_hashed_spec_still_copies_from_its_fields():
    """Specs hash once (they key the cost model's caches), but the cached hash is no attribute: a spec rebuilt
    from its __dict__ is equal with the same hash, and a pickle carries only the fields."""
    for spec in (load_model("llama3-8b"), load_cluster("h100-80gb")):
        hash(spec)
        copy = type(spec)(**spec.__dict__)
        assert copy == spec and hash(copy) == hash(spec) and {copy: 1}[spec] == 1
        assert set(pickle.loads(pickle.dumps(spec)).__dict__) == set(spec.__dataclass_fields__)


def test_tp_splits_or_replicates_kv_heads_and_nothing_else():
    from dataclasses import replace

    from meshscale.specs.layout import Layout, check_against
    from meshscale.specs.model import PRESETS

    model = replace(PRESETS["tiny"], heads=12, kv_heads=3, head_dim=8, hidden=96, ffn=192)
    check_against(Layout(tp=3), model)  # divides kv_heads
    check_against(Layout(tp=6), model)  # a multiple of kv_heads: each rank a copy of its KV head
    with pytest.raises(UserError, match="either divide kv_heads \\(3\\) or be a multiple of it"):
        check_against(Layout(tp=2), model)


def test_mistyped_model_and_train_files_are_one_line(tmp_path):
    from meshscale.runtime.loop.config import load_config
    from meshscale.specs.model import load_model

    model = tmp_path / "m.json"
    model.write_text(json.dumps({"name": "m", "layers": "2", "hidden": 64, "heads": 8, "ffn": 128, "vocab": 256}))
    with pytest.raises(UserError, match="layers must be an integer, got '2'"):
        load_model(str(model))
    model.write_text(json.dumps({"name": "m", "layers": 2, "hidden": 64, "heads": 3, "ffn": 128, "vocab": 256}))
    with pytest.raises(UserError, match=r"hidden \(64\) must be a multiple of heads \(3\), or give head_dim"):
        load_model(str(model))
    shape = {"name": "m", "layers": 2, "hidden": 64, "heads": 8, "ffn": 128, "vocab": 256}
    for extra, match in (({"norm": "ln"}, "norm must be layernorm or rmsnorm .*got 'ln'"),
                         ({"mlp": "relu"}, "mlp must be one of swiglu, geglu, gelu, gelu-erf, relu2, got 'relu'"),
                         ({"chunked_attention": True}, "chunked_attention needs sliding_window"),
                         ({"causal": False, "sliding_window": 16}, "sliding_window looks back only")):
        model.write_text(json.dumps({**shape, **extra}))
        with pytest.raises(UserError, match=match):
            load_model(str(model))
    train = tmp_path / "t.toml"
    train.write_text('[train]\nsteps = "5"\n')
    with pytest.raises(UserError, match="steps must be an integer"):
        load_config(str(train), {})
    train.write_text('[train]\nlr = 1\nsteps = 5\n')  # an integer learning rate is a number
    assert load_config(str(train), {}).lr == 1


def test_fp8_asked_of_a_cluster_without_fp8_data_is_one_line():
    from meshscale.cost import predict
    from meshscale.plan.search import search
    from meshscale.specs.model import load_model

    model, a100 = load_model("llama3-8b"), load_cluster("a100-80gb")
    for ask in (lambda: predict(model, a100, Layout.parse("dp=8", 8), 8, "fp8"),
                lambda: search(model, a100, 8, 8, "fp8")):
        with pytest.raises(UserError, match="a100-80gb: no FP8 data") as e:
            ask()
        assert "\n" not in str(e.value)
    # TPUs up to v6e list a bf16 and an Int8 peak, no FP8 one: their integer rate is not FP8's
    for tpu in ("tpu-v4", "tpu-v5e", "tpu-v5p", "tpu-v6e"):
        with pytest.raises(UserError, match=f"{tpu}: no FP8 data"):
            predict(model, load_cluster(tpu), Layout.parse("dp=8", 8), 8, "fp8")
    assert predict(model, load_cluster("h100-80gb"), Layout.parse("dp=8", 8), 8, "fp8").precision == "fp8"
    # MXFP8's block-scaled tensor cores came with Blackwell: Hopper has FP8 data but none for MXFP8
    with pytest.raises(UserError, match="h100-80gb: no MXFP8 data") as e:
        predict(model, load_cluster("h100-80gb"), Layout.parse("dp=8", 8), 8, "mxfp8")
    assert "\n" not in str(e.value) and "--precision fp8" in str(e.value)
    assert predict(model, load_cluster("b200"), Layout.parse("dp=8", 8), 8, "mxfp8").precision == "mxfp8"


def test_int8_asked_of_a_cluster_without_int8_data_is_one_line(tmp_path):
    """Int8 training (AQT) is planned where a datasheet gives an int8 peak (the TPUs); [software]
    int8_forward_only names layer parts and needs --precision int8."""
    from meshscale.cost import predict
    from meshscale.specs.model import load_model

    model, layout = load_model("llama3-8b"), Layout.parse("dp=8", 8)
    with pytest.raises(UserError, match="h100-80gb: no int8 data") as e:
        predict(model, load_cluster("h100-80gb"), layout, 8, "int8")
    assert "\n" not in str(e.value) and "--precision bf16" in str(e.value)
    v5p = load_cluster("tpu-v5p")
    assert predict(model, v5p, layout, 8, "int8").precision == "int8"
    with pytest.raises(UserError, match="int8_forward_only must name layer parts joined by \\+"):
        v5p.with_software(int8_forward_only="mlp+attn")
    with pytest.raises(UserError, match="int8_forward_only says which parts AQT quantizes; it needs --precision int8"):
        predict(model, v5p.with_software(int8_forward_only="mlp"), layout, 8, "bf16")
    bad = tmp_path / "c.toml"
    bad.write_text('base = "tpu-v5e"\nint8_gemm_speedup = -1\n')
    with pytest.raises(UserError, match="int8_gemm_speedup .* must be >= 0"):
        load_cluster(str(bad))


def test_new_generations_from_their_datasheets():
    b300, gb300, mi300x, mi325x, v6e = (load_cluster(n) for n in ("b300", "gb300-nvl72", "mi300x", "mi325x", "tpu-v6e"))
    assert b300.peak_flops_fp8 == 2 * b300.peak_flops_bf16 and b300.hbm_bytes == 288e9
    assert gb300.fast_domain == 72 and gb300.nvls_bandwidth > 0
    assert mi300x.gpu_arch == "" and mi300x.tiers[0].name == "xgmi"  # RCCL: the alpha-beta model, not NCCL's tuner
    assert mi325x.peak_flops_bf16 == mi300x.peak_flops_bf16 and mi325x.hbm_bytes > mi300x.hbm_bytes
    assert v6e.torus == (16, 16) and v6e.peak_flops_bf16 == 918e12
    assert v6e.gemm_tile == (256, 256) and load_cluster("tpu-v5p").gemm_tile == (128, 128)  # MXU widths
    # its measured GEMM ceiling (727.7 TFLOP/s of device time at 8192^3), not v5e's near-peak one
    assert v6e.matmul_efficiency == pytest.approx(727.7 / 918, abs=0.005)
    assert v6e.matmul_efficiency < load_cluster("tpu-v5e").matmul_efficiency
    assert v6e.tiers[1].bandwidth == 4 * load_cluster("tpu-v5e").tiers[1].bandwidth  # DCN a chip: 12.5e9 B/s
    h800, h100 = load_cluster("h800"), load_cluster("h100-80gb")  # H100 with NVLink at 200 GB/s one way
    assert h800.peak_flops_bf16 == h100.peak_flops_bf16 and h800.tiers[0].bandwidth == h100.tiers[0].bandwidth * 4 / 9


def test_the_40gb_a100_differs_from_the_80gb_in_its_hbm_alone():
    from meshscale.cost import predict
    small, large = load_cluster("a100-40gb"), load_cluster("a100-80gb")
    assert small.hbm_bytes == large.hbm_bytes / 2 and small.hbm_bandwidth < large.hbm_bandwidth
    assert (small.peak_flops_bf16, small.tiers, small.software) == (large.peak_flops_bf16, large.tiers, large.software)
    model, layout = load_model("llama2-7b"), Layout.parse("dp=8,zero=1,mbs=1", 8)
    on_small, on_large = predict(model, small, layout, 64), predict(model, large, layout, 64)
    need = on_small.memory_per_device_bytes["total"]
    assert need == on_large.memory_per_device_bytes["total"] and small.hbm_bytes < need < large.hbm_bytes
    assert on_small.step_time_s > on_large.step_time_s  # its memory-bound kernels take longer
