"""The cost model's kernel terms against this workplace's recorded GPU scans (benchmarks/kernel_scan.py on two
H200s and an H100, benchmarks/data/): GEMM, HBM, grouped weight-gradient, MoE permute, interference and
attention rows (FlashAttention-2's at 128, both kernels' at other head dims) predicted again by today's model,
pred/meas."""

import importlib.util
import json
import statistics
from pathlib import Path

import pytest

from meshscale.specs.cluster import load_cluster

ROOT = Path(__file__).resolve().parents[1]
SPEC = importlib.util.spec_from_file_location("kernel_scan", ROOT / "benchmarks" / "kernel_scan.py")
kernel_scan = importlib.util.module_from_spec(SPEC)
SPEC.loader.exec_module(kernel_scan)
SCANS = sorted((ROOT / "benchmarks" / "data").glob("kernel_scan_*.json"))


def ratios(path: Path, kind: str) -> list[tuple[float, float]]:
    """(measured seconds, predicted / measured) of the scan's rows whose kind starts with `kind`, on the scan's
    own preset."""
    scan = json.loads(path.read_text())
    cluster = load_cluster(scan["preset"])
    return [(r["measured_s"], kernel_scan.predicted_seconds(r, cluster) / r["measured_s"]) for r in scan["rows"]
            if r["kind"].startswith(kind)]


@pytest.mark.parametrize("path", SCANS, ids=lambda p: p.stem)
def test_memory_traffic_is_charged_at_what_a_copy_reaches(path):
    """hbm_efficiency: a 4 GiB copy and add within 5% (the datasheet bandwidth had them 8-11% fast)."""
    assert all(0.95 < r < 1.05 for _, r in ratios(path, "hbm"))


@pytest.mark.parametrize("path", SCANS, ids=lambda p: p.stem)
def test_small_gemms_pay_a_fixed_time_per_kernel_and_large_ones_barely_notice(path):
    """gemm_kernel_overhead_s: the one-wave GEMMs (under 100 us) were 0.54-0.88 of their time without it; with
    it each is within 0.8-1.2 (two H200 scans put the 20 us FP8 512 x 4096 x 4096 at 1.08 and 1.16) and their
    median within 5%. The large ones stay where tiles and waves put them (0.81-1.24, the 8192 x 6144 x 4096
    ones' wave quantization the most pessimistic; the H100's 3.6 ms FP8 8192 x 8192 x 28672 ran at 1,082 TFLOP/s
    where its 8192^3 ran at 1,322 and Azure's soaked scan at 1,377: 0.82, a long kernel below the clock of the
    shorter ones); FP8's median 1.00 on H100 and 0.97 on H200 at the soaked FP8 rate (1.11 and 1.02 at the
    burst ratios)."""
    rows = ratios(path, "gemm")
    small = [r for t, r in rows if t < 1e-4]
    large = [r for t, r in rows if t >= 1e-4]
    assert len(small) == 6 and all(0.8 < r < 1.2 for r in small)
    assert 0.95 < statistics.median(small) < 1.05
    assert all(0.8 < r < 1.3 for r in large) and 0.97 < statistics.median(large) < 1.1


H200_SCANS = [p for p in SCANS if p.stem.startswith("kernel_scan_h200")]


def scan_rows(path: Path, kind: str) -> list[tuple[dict, float]]:
    """(row, predicted / measured) of the scan's rows of exactly `kind`."""
    scan = json.loads(path.read_text())
    cluster = load_cluster(scan["preset"])
    return [(r, kernel_scan.predicted_seconds(r, cluster) / r["measured_s"]) for r in scan["rows"] if r["kind"] == kind]


@pytest.mark.parametrize("path", H200_SCANS, ids=lambda p: p.stem)
def test_a_gemm_beside_a_collective_loses_the_sms_its_blocks_hold(path):
    """comm.sm_share's mechanism on the H200: a GEMM beside a copy on 8 or 24 thread blocks (NCCL's channels)
    slowed as the SMs those blocks hold predict, within 5%; 66 blocks (half the SMs) slowed it less (1.14-1.15)."""
    rows = {r["shape"]["blocks"]: ratio for r, ratio in scan_rows(path, "interference")}
    assert rows and all(0.95 < rows[b] < 1.05 for b in (8, 24)) and 1.0 < rows[66] < 1.25


@pytest.mark.parametrize("path", H200_SCANS, ids=lambda p: p.stem)
def test_permute_kernels_cost_their_measured_share_of_the_memory_rate(path):
    """PERMUTE_EFFICIENCY: each path's rows whose kernels outlast their launches (all but Mixtral at 4,096
    tokens, which the host paces) within 10%, Megatron-Core's torch ops and Transformer Engine's fused kernels
    (the second scan had no Transformer Engine to import); Qwen3-235B at 4,096 tokens, 2 ms of kernels, at 0.87
    (0.91 in an earlier run of the same scan that day)."""
    paths = 0
    for kind in ("moe permute megatron", "moe permute te"):
        timed = [ratio for r, ratio in scan_rows(path, kind) if (r["shape"]["model"], r["shape"]["tokens"]) !=
                 ("mixtral-8x7b", 4096)]
        paths += bool(timed)
        assert len(timed) in (0, 3, 5) and all(0.85 < ratio < 1.1 for ratio in timed)
    assert paths


@pytest.mark.parametrize("path", H200_SCANS, ids=lambda p: p.stem)
def test_grouped_weight_gradients_cost_what_the_scan_measured_by_tokens_per_expert(path):
    """GROUPED_WGRAD_EFFICIENCY: at every tokens-per-expert point the matrices' median within 10%, and none off
    by more than 25%; without it the model was 0.62-0.84 of the measured time at 128 tokens. The second scan adds
    DeepSeek-V2's experts at ep=8."""
    by_tokens: dict = {}
    for r, ratio in scan_rows(path, "grouped wgrad bf16"):
        by_tokens.setdefault(r["shape"]["m"], []).append(ratio)
    assert len(by_tokens) == 6
    for ratios_ in by_tokens.values():
        assert 0.9 < statistics.median(ratios_) < 1.1 and all(0.75 < x < 1.25 for x in ratios_)


@pytest.mark.parametrize("path", SCANS, ids=lambda p: p.stem)
def test_grouped_forward_gemms_cost_what_the_scans_measured_by_tokens_per_expert(path):
    """GROUPED_BF16_EFFICIENCY: none off by more than 25%, and on the H200s (six and eight matrices) the median
    at every tokens-per-expert point within 10% (the H100's one matrix reads 1.17 at 128 tokens). DeepGEMM's FP8
    table, which every grouped GEMM took before, had the H200s' medians at 1.19-1.20 at 256 tokens."""
    by_tokens: dict = {}
    for r, ratio in scan_rows(path, "grouped gemm bf16"):
        by_tokens.setdefault(r["shape"]["m"], []).append(ratio)
    assert len(by_tokens) == 6
    for ratios_ in by_tokens.values():
        assert all(0.75 < x < 1.25 for x in ratios_)
        assert len(ratios_) == 1 or 0.9 < statistics.median(ratios_) < 1.1


@pytest.mark.parametrize("path", H200_SCANS, ids=lambda p: p.stem)
def test_the_trainers_fused_adamw_costs_the_one_pass_the_model_charges(path):
    """cost/step.py charges the update one read and write of fp32 parameters, gradients and moments: torch's
    fused AdamW (the trainer's on GPUs) within 10% of it; its default foreach kernels took about 3x."""
    (_, fused), = scan_rows(path, "optimizer fused")
    (_, foreach), = scan_rows(path, "optimizer foreach")
    assert 0.9 < fused < 1.1 and foreach < 0.4


def head_128(path: Path, kind: str) -> list[float]:
    return [ratio for r, ratio in scan_rows(path, kind) if r["shape"]["head_dim"] == 128]


def test_flash_attention_runs_at_the_rate_the_hopper_scans_sustained():
    """FA2_H100 is the H100 scan's FlashAttention-2 rows (torch's flash back end): they replay at 1; the H200's,
    the same silicon measured apart, within 0.95-1.12 of them at every length, causal or not."""
    for path in SCANS:
        low, high = (0.99, 1.01) if path.stem == "kernel_scan_h100" else (0.95, 1.12)
        flash = head_128(path, "attention flash")
        assert len(flash) == 12 and all(low < ratio < high for ratio in flash), (path.name, flash)


def test_each_head_dim_runs_at_its_measured_share_of_128s_rate():
    """head_dim_speed against the second H200 scan's rows at other head dims, each row's pred/meas over the
    128 row's at the same length: 1 where the tables are this scan's (192, 256, MLA's 192/128); at 64, where
    they are the published panels' (Shah et al. for cuDNN, Dao fig. 7 for FlashAttention-2), within 8% (cuDNN
    0.92-1.03; FlashAttention-2 1.01-1.08, the panel's burst a little slower at 64 than the scan)."""
    path = ROOT / "benchmarks/data/kernel_scan_h200_2026-11-29.json"
    for kind in ("attention cudnn", "attention flash"):
        rows = scan_rows(path, kind)
        base = {(r["shape"]["seq"], r["shape"]["causal"]): ratio for r, ratio in rows if r["shape"]["head_dim"] == 128}
        seen = set()
        for r, ratio in rows:
            s = r["shape"]
            dims, relative = (s["head_dim"], s["v_head_dim"]), ratio / base[s["seq"], s["causal"]]
            seen.add(dims)
            assert 0.92 < relative < 1.08 if dims == (64, 64) else relative == pytest.approx(1, abs=2e-3), (kind, s)
        assert seen >= {(128, 128), (64, 64), (192, 192), (256, 256)}
