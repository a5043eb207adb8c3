"""Shape-aware kernel times (cost/kernels.py): GEMM efficiency against size, the ceiling, sharding, MoE."""

import itertools
from dataclasses import replace

import pytest

from meshscale.cost.flops import (attended_positions, attention_core_flops, block_matmuls,
                                  model_flops_per_step, op_recomputed_matmuls)
from meshscale.cost.kernels import (Gemm, attention_core_seconds, attention_seconds, counted_seconds, fp8_cast_bytes,
                                    fp8_cast_seconds, gemm_efficiency, gemm_pass_seconds, gemm_seconds,
                                    int8_quantize_seconds, kernel_shape, layer_gemm_parts, layer_gemms, layer_passes,
                                    linear_pass_seconds, loss_seconds, microbatch_seconds, ring_merge_seconds)
from meshscale.cost.step import pipeline_passes
from meshscale.errors import UserError
from meshscale.specs.cluster import load_cluster
from meshscale.specs.layout import Layout
from meshscale.specs.model import load_model, trainer_lacks

CLUSTERS = [load_cluster(n) for n in ("a100-80gb", "h100-80gb", "tpu-v5p", "tpu-v5e")]


@pytest.mark.parametrize("cluster", CLUSTERS, ids=lambda c: c.name)
def test_efficiency_grows_with_size_and_never_exceeds_the_ceiling(cluster):
    peak = cluster.peak_flops_bf16
    sizes = [2 ** i for i in range(6, 15)]
    square = [gemm_efficiency(cluster, s, s, s, peak) for s in sizes]
    assert square == sorted(square) and square[0] < 0.5 * square[-1]
    for m, n, k in itertools.product([1, 16, 100, 1000, 4096, 12288, 65536], repeat=3):
        assert 0 < gemm_efficiency(cluster, m, n, k, peak) <= cluster.matmul_efficiency + 1e-12
    # the largest GEMMs reach the measured ceiling within a few percent
    assert square[-1] > 0.95 * cluster.matmul_efficiency


def test_skinny_and_sharded_gemms_reach_less_of_the_peak():
    h100 = CLUSTERS[1]
    peak = h100.peak_flops_bf16
    full = gemm_efficiency(h100, 8192, 8192, 8192, peak)
    # a few tokens per expert, or a narrow TP shard of the output, is memory- or wave-bound
    assert gemm_efficiency(h100, 64, 8192, 8192, peak) < 0.3 * full
    assert gemm_efficiency(h100, 8192, 8192 // 64, 8192, peak) < full
    # the roofline: never faster than moving the operands once
    assert gemm_seconds(h100, 16, 16384, 16384, peak) >= 2 * 16384 * 16384 / h100.achieved_hbm_bandwidth


def test_wave_quantization_a_partial_last_wave_costs_a_full_wave():
    h100 = CLUSTERS[1]  # 132 SMs, 128x256 tiles: 132 tiles fill one wave, 133 start a second
    peak = h100.peak_flops_bf16
    one = gemm_seconds(h100, 128 * 132, 256, 4096, peak)
    more = gemm_seconds(h100, 128 * 133, 256, 4096, peak)
    assert more > 1.4 * one  # half-width tiles soften it: 266 of them in 3 waves of half the cost


def test_backward_is_the_two_transposed_gemms():
    a100 = CLUSTERS[0]
    peak = a100.peak_flops_bf16
    f, b, w = gemm_pass_seconds(a100, (Gemm(4096, 12288, 3072),), peak, 2)
    assert f == gemm_seconds(a100, 4096, 12288, 3072, peak)
    assert b == gemm_seconds(a100, 4096, 3072, 12288, peak) and w == gemm_seconds(a100, 3072, 12288, 4096, peak)


def test_attention_efficiency_rises_with_sequence_and_stays_under_the_ceiling():
    for cluster in CLUSTERS:
        peak = cluster.peak_flops_bf16
        eff = [3.5 * 1e12 / (attention_seconds(cluster, 1e12, s, peak) * peak) for s in (256, 512, 2048, 8192, 32768)]
        ceiling = cluster.attention_efficiency or cluster.matmul_efficiency
        assert eff == sorted(eff) and eff[-1] <= ceiling * (1 + 1e-12) and ceiling <= 1  # to the last bit
        assert eff[-1] <= cluster.matmul_efficiency


def test_attention_runs_at_the_published_kernel_scans_rate_for_its_length():
    """The fused kernel's rate at a length over its rate at 16k causal is what the scans measured: cuDNN on H100
    (Shah et al. 2024 figs. 5-6), forward + backward 222 of 486 TFLOP/s at 512, causal; FlashAttention-2 on A100
    (Dao 2023 fig. 4d), 155 of 189 at 2k, 173 at 4k."""
    a100, h100 = CLUSTERS[0], CLUSTERS[1]

    def rate(cluster, seq, causal=True, cp=1):
        peak = cluster.peak_flops_bf16
        return 3.5e12 / (attention_seconds(cluster, 1e12, seq, peak, causal, cp) * peak) / cluster.attention_efficiency

    assert rate(h100, 16384) == pytest.approx(1.0)
    assert rate(h100, 512) == pytest.approx(3.5 / (1 / 315 + 2.5 / (305 * 315 / 482)) / 485.5, rel=0.01)
    assert rate(a100, 2048) == pytest.approx(155 / 189, rel=0.01)
    assert rate(a100, 4096) == pytest.approx(173 / 189, rel=0.01)  # fig. 4d's 4k bar
    assert rate(h100, 1024, causal=False) > rate(h100, 1024)  # no masked diagonal blocks
    # below the scans the 512-1k slope continues, down to a tenth of the long causal rate and no lower
    assert rate(h100, 256) < rate(h100, 512)
    assert rate(h100, 64) == pytest.approx(0.1) and rate(a100, 64) == pytest.approx(0.1)
    # a ring of 8 over 8k: 1/8 of the work causal over 1k, the rest non-causal 1k x 512 kernels
    ring = rate(h100, 8192, cp=8)
    assert rate(h100, 512) < ring < 0.85 * rate(h100, 8192)
    assert rate(h100, 8192, cp=2) > ring


def test_smaller_heads_run_at_the_figures_rate_for_their_head_dim():
    """Head dim 64 against 128 in the same published panels, per FLOP: cuDNN on H100 (Shah et al. 2024 figs. 5a,
    5b, 6a: 8k causal forward 379 against 529, backward not causal 432 against 518), FlashAttention-2 on A100
    (Dao 2023 fig. 4c: 140 against 155 at 2k causal); the 2022 Triton kernel ran faster at 64 (79 against 68).
    Geometric in between."""
    a100, h100 = CLUSTERS[0], CLUSTERS[1]

    def seconds(cluster, head_dim, seq=2048, kernel="platform"):
        cluster = with_software(cluster, attention_kernel=kernel)
        return attention_seconds(cluster, 1e12, seq, cluster.peak_flops_bf16, head_dim=head_dim)

    def cudnn(forward_nc, forward_c, backward_nc):
        return 3.5 / (1 / forward_c + 2.5 / (backward_nc * forward_c / forward_nc))

    assert seconds(h100, 128, 8192) / seconds(h100, 64, 8192) == pytest.approx(
        cudnn(412, 379, 432) / cudnn(600, 529, 518), rel=1e-3)
    assert seconds(a100, 128) / seconds(a100, 64) == pytest.approx(140 / 155)
    assert seconds(a100, 128, kernel="fa-triton") / seconds(a100, 64, kernel="fa-triton") == pytest.approx(79 / 68)
    assert seconds(h100, 64) > seconds(h100, 96) > seconds(h100, 128)
    assert seconds(h100, 32) == seconds(h100, 64)  # no figure below 64


def test_larger_heads_run_at_our_h200_scans_rate_for_their_head_dims():
    """Above 128 on Hopper, the H200 scan's own ratio to its 128 rows (kernel_scan_h200_2026-11-29.json): cuDNN
    at 192 ran 365.4 against 500.7 TFLOP/s at 8k causal, DeepSeek's MLA (192/128) 452.3; FlashAttention-2 at 256
    257.2 against 297.2, and it pads MLA's values to 192 (useful work 320 of 384 a head at 192's rate). Ampere
    has no figure above 128 (flat, the padding aside); 160 lies between 128 and 192, 320 flat past 256."""
    a100, h100 = CLUSTERS[0], CLUSTERS[1]

    def seconds(cluster, dims, kernel="platform", seq=8192):
        cluster = with_software(cluster, attention_kernel=kernel)
        return attention_seconds(cluster, 1e12, seq, cluster.peak_flops_bf16, head_dim=dims[0], v_head_dim=dims[1])

    base = seconds(h100, (128, 128))
    assert base / seconds(h100, (192, 192)) == pytest.approx(365.4 / 500.7)
    assert base / seconds(h100, (192, 128)) == pytest.approx(452.3 / 500.7)
    fa2 = seconds(h100, (128, 128), "fa2")
    assert fa2 / seconds(h100, (256, 256), "fa2") == pytest.approx(257.2 / 297.2)
    assert fa2 / seconds(h100, (192, 128), "fa2") == pytest.approx(267.0 / 297.2 * 320 / 384)
    assert seconds(h100, (128, 128)) < seconds(h100, (160, 160)) < seconds(h100, (192, 192))
    assert seconds(h100, (320, 320)) == seconds(h100, (256, 256))
    assert seconds(a100, (256, 256)) == seconds(a100, (128, 128))
    assert seconds(a100, (128, 128)) / seconds(a100, (192, 128)) == pytest.approx(320 / 384)


def with_software(cluster, **software):
    return cluster.with_software(**software)


def test_a_framework_may_run_another_attention_kernel_at_its_measured_rate():
    """[software] attention_kernel: FlashAttention-2 runs on H100 at the rate our H100 scan sustained (forward +
    backward, 222.8 TFLOP/s at 2k causal, 321.4 at 16k not causal: benchmarks/data/kernel_scan_h100.json) and is
    the platform kernel on A100; on GB200 it runs its Ampere kernels at 1.140x H100's rate (Azure's scans of
    both); the 2022 Triton kernel runs at its A100 figure's share of FlashAttention-2's (68 of 155 at 2k causal,
    90 of 187 not causal), on H100 too."""
    a100, h100 = CLUSTERS[0], CLUSTERS[1]

    def seconds(cluster, kernel, seq=2048, causal=True):
        return attention_seconds(with_software(cluster, attention_kernel=kernel), 1e12, seq,
                                 cluster.peak_flops_bf16, causal)

    # (to the preset's attention_efficiency, rounded to 0.434, against which the scan's rates are taken)
    assert 3.5e12 / seconds(h100, "fa2") == pytest.approx(222.8e12, rel=2e-3)
    assert 3.5e12 / seconds(h100, "fa2", 16384, causal=False) == pytest.approx(321.4e12, rel=2e-3)
    assert seconds(h100, "fa2") > seconds(h100, "platform")
    assert seconds(a100, "fa2") == seconds(a100, "platform")
    gb200 = load_cluster("gb200-nvl72")
    assert seconds(h100, "fa2", 8192, False) / seconds(gb200, "fa2", 8192, False) == pytest.approx(1.140, rel=2e-3)
    assert seconds(gb200, "fa2") > 1.5 * seconds(gb200, "platform")
    assert seconds(a100, "platform") / seconds(a100, "fa-triton") == pytest.approx(68 / 155)
    assert seconds(a100, "platform", causal=False) / seconds(a100, "fa-triton", causal=False) \
        == pytest.approx(90 / 187)
    assert seconds(h100, "fa2") / seconds(h100, "fa-triton") == pytest.approx(68 / 155)
    # between the measured lengths log-linear, beyond them flat
    mid = seconds(a100, "platform", 2896) / seconds(a100, "fa-triton", 2896)
    assert 68 / 155 < mid < 74 / 173 or 74 / 173 < mid < 68 / 155
    assert seconds(a100, "platform", 65536) / seconds(a100, "fa-triton", 65536) == pytest.approx(80 / 189)
    # a model's attention core follows the kernel; a calibrated machine's measured rates still win
    model, layout = load_model("llama3-8b"), Layout(mbs=1)
    core = [attention_core_seconds(model, with_software(h100, attention_kernel=k), layout, model.seq, "bf16")
            for k in ("platform", "fa2")]
    assert core[1][0] > core[0][0] and core[1][1] > core[0][1]


def test_a_sliding_window_attends_within_it_at_the_causal_rate_of_twice_its_length():
    """GPT-OSS (like Gemma 2) attends within a window of 128 in every other layer: a query at position t sees
    min(t+1, w) keys, fused kernels skip the blocks outside the window and run at the scans' causal rate for 2w;
    unfused kernels compute every score. The model's FLOPs (MFU's numerator) count what is attended."""
    assert attended_positions(10, 4) == sum(min(t + 1, 4) for t in range(10)) / 10
    assert attended_positions(10) == attended_positions(10, 16) == sum(t + 1 for t in range(10)) / 10
    assert attended_positions(10, 4, causal_skip=False) == 10
    oss, h100 = load_model("gpt-oss-120b").with_seq(8192), CLUSTERS[1]
    full = replace(oss, sliding_window=0, full_attention_every=0)
    assert [oss.attention_window(i) for i in range(4)] == [128, 0, 128, 0]
    windowed_flops = attention_core_flops(oss, oss.seq, layer=0)
    assert windowed_flops < attention_core_flops(full, oss.seq) / 30
    mean = (windowed_flops + attention_core_flops(full, oss.seq)) / 2
    assert attention_core_flops(oss, oss.seq) == pytest.approx(mean)
    windowed, dense = (sum(attention_core_seconds(m, h100, Layout(mbs=1), oss.seq, "bf16")) for m in (oss, full))
    at_256 = attention_seconds(h100, oss.seq * windowed_flops, 256, h100.peak_flops_bf16, head_dim=oss.head_dim)
    assert windowed == pytest.approx(dense / 2 + at_256 / 2)
    unfused = replace(h100, fused_attention=False)
    assert attention_core_seconds(oss, unfused, Layout(mbs=1), oss.seq, "bf16") \
        == attention_core_seconds(full, unfused, Layout(mbs=1), oss.seq, "bf16")
    assert model_flops_per_step(oss, 1) < model_flops_per_step(full, 1)


def test_chunked_attention_attends_within_its_chunk_at_the_causal_rate_of_the_chunk():
    """Llama 4 attends within aligned chunks of 8192 in 3 layers of 4: a query at position t sees (t mod C) + 1
    keys, half a sliding window's reach, and each chunk is a causal kernel of length C; at the chunk's length or
    shorter it is full causal attention."""
    assert attended_positions(10, 4, chunked=True) == sum(t % 4 + 1 for t in range(10)) / 10
    assert attended_positions(8, 8, chunked=True) == attended_positions(8)
    scout, h100 = load_model("llama4-scout-17b-16e").with_seq(32768), CLUSTERS[1]
    assert [scout.attention_window(i) for i in range(4)] == [8192, 8192, 8192, 0]
    chunk = replace(scout, seq=8192, sliding_window=0, full_attention_every=0, chunked_attention=False)
    full = replace(scout, sliding_window=0, full_attention_every=0, chunked_attention=False)
    window = replace(scout, chunked_attention=False)
    assert attention_core_flops(scout, scout.seq, layer=0) == attention_core_flops(chunk, chunk.seq)
    assert attention_core_flops(scout, scout.seq, layer=0) < attention_core_flops(window, scout.seq, layer=0)
    layout = Layout(mbs=1)
    chunked, dense = (sum(attention_core_seconds(m, h100, layout, m.seq, "bf16")) for m in (scout, full))
    one_chunk = sum(attention_core_seconds(chunk, h100, layout, chunk.seq, "bf16"))
    assert chunked == pytest.approx(3 / 4 * 4 * one_chunk + dense / 4)
    assert load_model("llama4-scout-17b-16e").seq == 8192 and sum(attention_core_seconds(
        load_model("llama4-scout-17b-16e"), h100, layout, 8192, "bf16")) == pytest.approx(one_chunk)


def test_packed_samples_attend_within_themselves_as_causal_blocks():
    """packed_samples (fine-tuning with sequence packing, THD with cu_seqlens): every layer attends within blocks
    of the sample's length, each a causal kernel of that length, where the GEMMs still see the whole sequence;
    the trainer does not build it, and a sliding-window model or a sample no shorter than the sequence is refused
    with the field's name."""
    h100, layout = CLUSTERS[1], Layout(mbs=1)
    base = load_model("llama2-7b").with_seq(4096)
    packed, sample = replace(base, packed_samples=256), base.with_seq(256)
    assert all(packed.attention_window(i) == 256 for i in range(packed.layers))
    assert attention_core_flops(packed, 4096) == pytest.approx(attention_core_flops(sample, 256))
    one = sum(attention_core_seconds(sample, h100, layout, 256, "bf16"))
    assert sum(attention_core_seconds(packed, h100, layout, 4096, "bf16")) == pytest.approx(16 * one)
    assert sum(attention_core_seconds(packed, h100, layout, 4096, "bf16")) < \
        sum(attention_core_seconds(base, h100, layout, 4096, "bf16")) / 4
    assert "packed samples" in trainer_lacks(packed)
    for bad, needle in ((dict(packed_samples=4096), "shorter than the sequence"),
                        (dict(packed_samples=-1), "shorter than the sequence"),
                        (dict(packed_samples=256, sliding_window=1024), "without a sliding window")):
        with pytest.raises(UserError, match=needle):
            replace(base, **bad)


def test_attention_without_a_causal_mask_does_every_block():
    """causal = false (an encoder's attention; MaxText's flash kernel of October 2023): a query attends to all seq
    keys, not (seq + 1) / 2, and the kernel skips no block. On a TPU (no measured shape) the causal kernel computes
    its diagonal blocks of 512 in full, so the full one takes 2 seq / (seq + 1) x nb / (nb + 1) as long; on a GPU
    it runs at the scans' non-causal rate, which is faster per FLOP; under CP every ring step is a full block."""
    causal = load_model("llama3-8b").with_seq(2048)
    full = replace(causal, causal=False)
    assert attention_core_flops(full, 2048) == attention_core_flops(causal, 2048) * 2 * 2048 / 2049
    assert attention_core_flops(full, 2048, causal_skip=False) == attention_core_flops(causal, 2048, False)
    v5p, h100, layout = CLUSTERS[2], CLUSTERS[1], Layout(mbs=1)
    tpu = [sum(attention_core_seconds(m, v5p, layout, 2048, "bf16")) for m in (causal, full)]
    blocks = 2048 / 512
    assert tpu[1] == pytest.approx(tpu[0] * 2 * 2048 / 2049 * blocks / (blocks + 1))
    gpu = [sum(attention_core_seconds(m, h100, layout, 2048, "bf16")) for m in (causal, full)]
    assert tpu[1] / tpu[0] > gpu[1] / gpu[0] > 1.5
    ring = [sum(attention_core_seconds(m, h100, Layout(mbs=1, cp=4), 512, "bf16")) for m in (causal, full)]
    assert ring[1] > 1.3 * ring[0]
    assert "causal = false" in trainer_lacks(full) and trainer_lacks(causal) is None


def test_ring_attention_merges_each_steps_output_through_memory():
    """Transformer Engine's ring adds every step's output into an fp32 one and accumulates dq, dk, dv in fp32:
    memory traffic that grows with the ring's steps, beside the attention's FLOPs."""
    model, h100 = load_model("llama3-405b"), CLUSTERS[1]
    tokens = model.seq / 8
    with_merge = attention_core_seconds(model, h100, Layout(tp=2, cp=8), tokens, "bf16")
    core = tokens * attention_core_flops(model, model.seq) / 2
    kernel = attention_seconds(h100, core, model.seq, h100.peak_flops_bf16, cp=8)
    queries = tokens * model.heads * model.head_dim / 2
    merge_f, merge_b = ring_merge_seconds(h100, queries, tokens * 4 * model.head_dim, 8)
    assert merge_f == pytest.approx(7 * 10 * queries / h100.achieved_hbm_bandwidth)
    assert with_merge[0] == pytest.approx(kernel / 3.5 + merge_f) and with_merge[1] > kernel * 2.5 / 3.5
    assert ring_merge_seconds(h100, queries, queries, 2)[0] == pytest.approx(merge_f / 7)
    # at 512-token chunks the merging is a sizable share of the forward kernel's time
    assert 0.2 < merge_f / (kernel / 3.5) < 1.0


def test_tp_and_micro_batch_size_change_efficiency_as_on_hardware():
    model, h100 = load_model("llama3-8b"), CLUSTERS[1]
    flops_rate = {}
    for tp, mbs in ((1, 1), (8, 1), (8, 4)):
        layout = Layout(tp=tp, mbs=mbs)
        passes = pipeline_passes(model, h100, layout)[0]
        flops_rate[tp, mbs] = mbs / tp / passes.total  # work per second, in units of one micro-batch
    assert flops_rate[8, 1] < flops_rate[1, 1]  # TP8 shards shrink every GEMM
    assert flops_rate[8, 4] > flops_rate[8, 1]  # a larger micro-batch fills them again


def test_recompute_adds_forward_work_to_the_input_gradient_pass_only():
    model, h100 = load_model("llama2-13b"), CLUSTERS[1]
    layers = tuple(range(model.layers))
    args = (model, h100)
    none, sel, full = (microbatch_seconds(*args, Layout(mbs=1, recompute=r), layers, True, "bf16")
                       for r in ("none", "selective", "full"))
    assert none.forward == sel.forward == full.forward and none.weight == full.weight
    assert none.backward < sel.backward < full.backward
    # full recompute repeats every layer's forward (not the output head's)
    assert 0.9 * none.forward < full.backward - none.backward < none.forward


def test_op_recompute_reruns_every_other_matmul_but_not_the_attention():
    model, a100 = load_model("llama3-8b"), CLUSTERS[0]
    layers = tuple(range(model.layers))
    none, op = (microbatch_seconds(model, a100, Layout(mbs=1, recompute=r), layers, False, "bf16")
                for r in ("none", "op"))
    assert op.forward == none.forward and op.weight == none.weight and op.attention == none.attention
    reruns = [Gemm(model.seq, o, i) for i, o in op_recomputed_matmuls(model)]
    assert [(g.n, g.k) for g in reruns] == [(model.kv_heads * model.head_dim, model.hidden),  # k, o, up
                                            (model.hidden, model.heads * model.head_dim), (model.ffn, model.hidden)]
    extra = gemm_pass_seconds(a100, tuple(reruns), 312e12, 2)[0] * model.layers
    assert op.backward - none.backward == pytest.approx(extra)
    # about a third of the layers' matmul FLOPs, between selective (attention core) and full
    share = sum(i * o for i, o in op_recomputed_matmuls(model)) / sum(i * o for i, o in block_matmuls(model))
    assert 0.3 < share < 0.4
    full = microbatch_seconds(model, a100, Layout(mbs=1, recompute="full"), layers, False, "bf16")
    assert none.backward < op.backward < full.backward


def test_fine_grained_experts_run_below_dense_efficiency():
    """128 experts of 1536 with top-8: each expert sees a few hundred tokens, so its GEMMs are small."""
    model = load_model("deepseek-v3")
    h100 = CLUSTERS[1]
    layout = Layout(ep=8, dp=8, mbs=1)
    tokens = model.seq
    gemms = layer_gemms(model, model.first_dense_layers, layout, tokens)
    expert = next(g for g in gemms if g.batch > 1)
    assert expert.batch == model.experts // 8 and expert.m == tokens * model.top_k * 8 / model.experts
    dense = gemm_efficiency(h100, tokens, 2 * model.ffn, model.hidden, 989e12)
    per_expert = 2 * expert.m * expert.n * expert.k * expert.batch / gemm_seconds(
        h100, expert.m, expert.n, expert.k, 989e12, 2, expert.batch) / 989e12
    assert per_expert < dense


def test_fp8_runs_the_linear_layers_faster_and_keeps_attention_and_the_head_in_bf16():
    """FP8 training: the layers' GEMMs at the measured FP8 speed-up over bf16 (within the fp8 peak), their
    operands' casts as memory traffic, the attention core and the output head unchanged."""
    a100, h100 = CLUSTERS[0], CLUSTERS[1]
    assert h100.gemm_peak("fp8") == pytest.approx(h100.fp8_gemm_speedup * h100.peak_flops_bf16)
    assert h100.gemm_peak("fp8") <= h100.peak_flops_fp8
    assert a100.gemm_peak("fp8") == a100.peak_flops_bf16  # no FP8 units: nothing to gain
    model = load_model("llama2-7b")
    layout = Layout(mbs=1)
    tokens = model.seq
    gemms = layer_gemms(model, 0, layout, tokens)
    bf16_gemm = sum(gemm_pass_seconds(h100, gemms, h100.gemm_peak("bf16"), 2))
    fp8_gemm = sum(gemm_pass_seconds(h100, gemms, h100.gemm_peak("fp8"), 2, 1))  # 1-byte operands
    assert 1.5 < bf16_gemm / fp8_gemm <= h100.fp8_gemm_speedup
    cast_f, cast_b = fp8_cast_seconds(h100, gemms, "fp8")
    # forward: each GEMM's input (h, q, h, ffn wide), backward: each output gradient, 4 bytes an element
    q, bandwidth = model.heads * model.head_dim, h100.achieved_hbm_bandwidth
    assert cast_f == pytest.approx(4 * tokens * (model.hidden + q + model.hidden + model.ffn) / bandwidth)
    assert cast_b == pytest.approx(4 * tokens * (q + 2 * model.kv_heads * model.head_dim + model.hidden
                                                 + 2 * model.ffn + model.hidden) / bandwidth)
    one_layer, head = (0,), ()
    bf16, fp8 = (microbatch_seconds(model, h100, layout, one_layer, False, p) for p in ("bf16", "fp8"))
    assert fp8.attention == bf16.attention
    forward = [gemm_pass_seconds(h100, gemms, h100.gemm_peak(p), 2, b)[0] for p, b in (("bf16", 2), ("fp8", 1))]
    assert fp8.forward - bf16.forward == pytest.approx(forward[1] - forward[0] + cast_f)
    heads = [microbatch_seconds(model, h100, layout, head, True, p) for p in ("bf16", "fp8")]
    assert heads[0] == heads[1]
    # the whole step gains, but less than the GEMMs alone
    bf16_step, fp8_step = (pipeline_passes(model, h100, Layout(mbs=1, dp=8), p)[0].total for p in ("bf16", "fp8"))
    assert 1.2 < bf16_step / fp8_step < bf16_gemm / fp8_gemm


def test_int8_runs_the_linear_gemms_in_int8_with_their_operands_quantization():
    """AQT's int8 as MaxText runs it: the linear layers' forward, input-gradient and weight-gradient GEMMs on int8
    operands at the int8 rate (v6e's measured 1.80x of bf16, the others' peak), each quantizing its two operands
    (3 bytes an element), the attention core and the head in bf16; a part named in [software] int8_forward_only
    runs its gradients in bf16, without quantizing them."""
    v5e, v6e, v4 = (load_cluster(n) for n in ("tpu-v5e", "tpu-v6e", "tpu-v4"))
    assert v5e.gemm_peak("int8") == v5e.peak_flops_int8 == 2 * v5e.peak_flops_bf16
    assert v6e.gemm_peak("int8") == pytest.approx(1.80 * v6e.peak_flops_bf16)
    assert v4.gemm_peak("int8") == v4.peak_flops_bf16  # the docs give v4 no faster integer path
    model, layout = load_model("llama2-7b"), Layout(mbs=2)
    gemms = layer_gemms(model, 0, layout, 2 * model.seq)
    bf16 = gemm_pass_seconds(v5e, gemms, v5e.peak_flops_bf16, 2)
    int8 = gemm_pass_seconds(v5e, gemms, v5e.peak_flops_int8, 2, 1)
    quantize = int8_quantize_seconds(v5e, gemms)
    assert linear_pass_seconds(v5e, gemms, "int8") == pytest.approx(tuple(a + q for a, q in zip(int8, quantize)))
    assert all(1.6 < b / i <= 2 for b, i in zip(bf16, int8))
    bandwidth = v5e.achieved_hbm_bandwidth
    operands = ((lambda g: g.m * g.k + g.k * g.n), (lambda g: g.m * g.n + g.k * g.n), (lambda g: g.m * g.k + g.m * g.n))
    for got, elements in zip(quantize, operands):
        assert got == pytest.approx(3 * sum(elements(g) for g in gemms) / bandwidth)
    one, head = ({p: microbatch_seconds(model, v5e, layout, layers, last, p) for p in ("bf16", "int8")}
                 for layers, last in (((0,), False), ((), True)))
    assert one["int8"].attention == one["bf16"].attention and head["int8"] == head["bf16"]
    assert one["int8"].total < one["bf16"].total
    tff = v5e.with_software(int8_forward_only="attention_out+mlp")
    parts = layer_gemm_parts(model, 0, layout, 2 * model.seq)
    named = parts["attention_out"] + parts["mlp"]
    as_int8, as_bf16 = linear_pass_seconds(v5e, named, "int8"), gemm_pass_seconds(v5e, named, v5e.peak_flops_bf16, 2)
    mixed = microbatch_seconds(model, tff, layout, (0,), False, "int8")
    assert mixed.forward == pytest.approx(one["int8"].forward)
    assert mixed.backward - one["int8"].backward == pytest.approx(as_bf16[1] - as_int8[1])
    assert mixed.weight - one["int8"].weight == pytest.approx(as_bf16[2] - as_int8[2]) and as_bf16[2] > as_int8[2]


def test_fp8_gemms_run_at_each_gpus_own_soaked_fp8_scan():
    """Where a soaked FP8 scan exists (Azure's cuBLASLt after 10,000 warm-up launches, 16384^3; specs/cluster.py)
    a preset's best-shape FP8 GEMM runs at that rate; a large layer's GEMMs gain over BF16 less than that ratio
    (tiles, the deeper k prologue) but most of it."""
    for name, measured in (("h100-80gb", 1377.3e12), ("h200", 1366.3e12), ("gb200-nvl72", 2906.9e12)):
        c = load_cluster(name)
        assert c.gemm_peak("fp8") * c.matmul_efficiency == pytest.approx(measured, rel=0.002), name
    model, layout = load_model("llama2-7b"), Layout(mbs=1)
    gemms = layer_gemms(model, 0, layout, model.seq)
    for name in ("h100-80gb", "h800", "b200", "gb200-nvl72"):
        c = load_cluster(name)
        gain = sum(gemm_pass_seconds(c, gemms, c.gemm_peak("bf16"), 2)) / sum(
            gemm_pass_seconds(c, gemms, c.gemm_peak("fp8"), 2, 1))
        assert 1.6 < gain <= c.fp8_gemm_speedup, name


def test_each_fp8_recipe_quantizes_with_its_own_traffic():
    """Bytes a bf16 element's quantization moves: tensor-wise FP8 reads 2 and writes 1, plus the transpose where
    FP8 GEMMs take only TN operands (Hopper, not Blackwell) and an amax read under current scaling; MXFP8 writes
    both ways with a scale per 32, at its quantize kernel's share of the copy rate. torchao (framework torch)
    scales from the current amax, Megatron-Core from the delayed history."""
    h100, b200 = load_cluster("h100-80gb"), load_cluster("b200")

    def scaled(cluster, how):
        return cluster.with_software(fp8_scaling=how)

    assert h100.fp8_scaling == "delayed"
    assert h100.with_software(framework="torch").fp8_scaling == "current"
    assert fp8_cast_bytes(h100, "fp8") == 4 and fp8_cast_bytes(h100, "fp8", False) == 3
    assert fp8_cast_bytes(b200, "fp8") == 3  # Blackwell reads FP8 operands in any layout: no transpose
    assert fp8_cast_bytes(scaled(h100, "current"), "fp8") == 6 and fp8_cast_bytes(scaled(b200, "current"), "fp8") == 5
    assert fp8_cast_bytes(b200, "mxfp8") == pytest.approx((2 + 2 * 33 / 32) / 0.69)
    assert fp8_cast_bytes(b200, "mxfp8", False) < fp8_cast_bytes(b200, "mxfp8")
    with pytest.raises(UserError, match="fp8_scaling must be delayed, current or blockwise"):
        scaled(h100, "dynamic")


def test_mxfp8_gemms_run_at_their_share_of_fp8_and_quantize_dearer():
    """MXFP8 on Blackwell: the layers' GEMMs at mxfp8_gemm_share of the tensor-wise FP8 rate, their operands'
    quantization dearer than delayed scaling's; the step lands between FP8's and BF16's, and the attention core
    stays in bf16."""
    b200 = load_cluster("b200")
    assert b200.gemm_peak("mxfp8") == pytest.approx(b200.gemm_peak("fp8") * b200.mxfp8_gemm_share)
    assert 0.9 < b200.mxfp8_gemm_share < 1
    model, layout = load_model("llama3-8b"), Layout(mbs=1)
    one = {p: microbatch_seconds(model, b200, layout, (0,), False, p) for p in ("bf16", "fp8", "mxfp8")}
    assert one["fp8"].total < one["mxfp8"].total < one["bf16"].total
    assert one["mxfp8"].attention == one["bf16"].attention
    gemms = layer_gemms(model, 0, layout, model.seq)
    fp8_cast, mx_cast = (sum(fp8_cast_seconds(b200, gemms, p)) for p in ("fp8", "mxfp8"))
    assert mx_cast == pytest.approx(fp8_cast * fp8_cast_bytes(b200, "mxfp8") / 3)


def test_blockwise_fp8_runs_at_its_measured_share_on_hopper_and_as_mxfp8_on_blackwell():
    """Block-scaled FP8 (a scale per 128): on Hopper its GEMMs at fp8_block_gemm_share of the tensor-wise rate, read
    off Transformer Engine's H200 benchmark (about 0.81), its casts a read and two writes with their fp32 scales;
    the step lands between delayed scaling's and bf16's. Blackwell runs it with MXFP8's kernels. A cluster without
    the measurement, or torchao (framework torch), refuses it in one line."""
    h100 = load_cluster("h100-80gb")
    block = h100.with_software(fp8_scaling="blockwise")
    assert 0.78 < h100.fp8_block_gemm_share < 0.85
    assert block.gemm_peak("fp8") == pytest.approx(h100.gemm_peak("fp8") * h100.fp8_block_gemm_share)
    assert fp8_cast_bytes(block, "fp8") == 2 + 2 * (1 + 1 / 32) and fp8_cast_bytes(block, "fp8", False) == 2 + 33 / 32
    model, layout = load_model("llama3-8b"), Layout(mbs=1)
    step = {name: microbatch_seconds(model, c, layout, (0,), False, p).total
            for name, c, p in (("delayed", h100, "fp8"), ("block", block, "fp8"), ("bf16", h100, "bf16"))}
    assert step["delayed"] < step["block"] < step["bf16"]
    b200 = load_cluster("b200")
    b200_block = b200.with_software(fp8_scaling="blockwise")
    assert b200_block.fp8_recipe("fp8") == "mxfp8" and b200_block.gemm_peak("fp8") == b200.gemm_peak("mxfp8")
    assert fp8_cast_bytes(b200_block, "fp8") == fp8_cast_bytes(b200, "mxfp8")
    with pytest.raises(UserError, match="no FP8 block-scaling data"):
        load_cluster("mi300x").with_software(fp8_scaling="blockwise").check_precision("fp8")
    with pytest.raises(UserError, match="Float8BlockScaling, which torchao"):
        h100.with_software(framework="torch", fp8_scaling="blockwise")


def test_fp8_gemms_stage_twice_the_k_and_read_one_byte_operands():
    """CUTLASS stages k in 128-byte slices (64 bf16, 128 FP8 elements), so an FP8 tile's prologue is twice the
    k of a bf16 one: small-K FP8 GEMMs lose more of their rate. FP8 operands are 1 byte, the output bf16."""
    h100 = replace(load_cluster("h100-80gb"), gemm_kernel_overhead_s=0.0)  # the tiles alone
    peak = h100.gemm_peak("fp8")

    def rate(k, operand_bytes):
        return 2 * 4096 * 32768 * k / gemm_seconds(h100, 4096, 32768, k, peak, 2, 1, operand_bytes)

    fp8, bf16 = rate(512, 1) / rate(16384, 1), rate(512, 2) / rate(16384, 2)
    assert fp8 < bf16
    prologue = h100.gemm_k_overhead
    assert fp8 == pytest.approx((512 / (512 + 2 * prologue)) / (16384 / (16384 + 2 * prologue)), rel=0.02)
    m, nk = 16, 32768  # a skinny GEMM: memory-bound either way
    one, two = (gemm_seconds(h100, m, nk, nk, peak, 2, 1, b) for b in (1, 2))
    assert one / two == pytest.approx((m * nk + nk * nk + 2 * m * nk) / (2 * (2 * m * nk + nk * nk)), rel=1e-6)


def test_the_head_pays_the_cross_entropy_as_memory_traffic():
    """Megatron-Core's loss casts the logits to fp32 and runs max, subtract, exp, sum and normalise over them
    (38 bytes an element), then scales and casts the gradient back (14): beside the head's GEMM, the more so
    the smaller the hidden size (the GEMM's FLOPs per logit)."""
    h100 = CLUSTERS[1]
    peak = h100.peak_flops_bf16
    for name in ("llama3-8b", "llama3-405b"):
        model = load_model(name)
        head = counted_seconds(model, h100, kernel_shape(Layout(tp=2, mbs=1)), 0, 0, True, "bf16")
        logits = model.seq * model.vocab / 2
        gemm = gemm_pass_seconds(h100, (Gemm(model.seq, model.vocab / 2, model.hidden),), peak, 2)
        assert head.forward == pytest.approx(gemm[0] + 38 * logits / h100.achieved_hbm_bandwidth)
        assert head.backward == pytest.approx(gemm[1] + 14 * logits / h100.achieved_hbm_bandwidth)
        assert loss_seconds(h100, logits) == pytest.approx((head.forward - gemm[0], head.backward - gemm[1]))
    small, large = (load_model(n) for n in ("llama3-8b", "llama3-405b"))
    share = {m.name: loss_seconds(h100, m.seq * m.vocab)[0] / gemm_seconds(h100, m.seq, m.vocab, m.hidden, peak)
             for m in (small, large)}
    assert share["llama3-8b"] > 3 * share["llama3-405b"] and 0.1 < share["llama3-8b"] < 1.2  # 1.05: about its GEMM's


def test_a_fused_loss_reads_the_logits_and_metric_cross_entropies_add_to_its_forward():
    """[software] fused_cross_entropy: one kernel reads the 2-byte logits (2 bytes an element) and, backward,
    reads them and writes their gradient (4); each of metric_cross_entropies casts them to fp32 and takes their
    log-softmax (14) in forward."""
    h100, logits = CLUSTERS[1], 1e9
    hbm = h100.achieved_hbm_bandwidth
    assert loss_seconds(with_software(h100, fused_cross_entropy=True), logits) == pytest.approx(
        (2 * logits / hbm, 4 * logits / hbm))
    composer = with_software(h100, fused_cross_entropy=True, metric_cross_entropies=2)
    assert loss_seconds(composer, logits) == pytest.approx((30 * logits / hbm, 4 * logits / hbm))
    assert loss_seconds(with_software(h100, metric_cross_entropies=1), logits)[0] == pytest.approx(52 * logits / hbm)


def test_flashattention_v1_runs_at_its_figures_share_of_flashattention_2():
    """FlashAttention v1 (flash-attn 1.x, Transformer Engine 0.x) beside FlashAttention-2 in Dao 2023's figures:
    on A100 69 against 155 TFLOP/s at 2k causal (fig. 4d), on H100 108 against 265 (fig. 7d) and 128 against 320
    not causal (fig. 7b); at head dim 64 its own panels' ratio (H100 136 against 108 at 2k causal)."""
    a100, h100 = CLUSTERS[0], CLUSTERS[1]

    def seconds(cluster, kernel, seq=2048, causal=True, head_dim=128):
        return attention_seconds(with_software(cluster, attention_kernel=kernel), 1e12, seq,
                                 cluster.peak_flops_bf16, causal, head_dim=head_dim)

    assert seconds(a100, "fa2") / seconds(a100, "fa1") == pytest.approx(69 / 155)
    assert seconds(h100, "fa2") / seconds(h100, "fa1") == pytest.approx(108 / 265)
    assert seconds(h100, "fa2", causal=False) / seconds(h100, "fa1", causal=False) == pytest.approx(128 / 320)
    assert seconds(h100, "fa1", 65536) / seconds(h100, "fa2", 65536) == pytest.approx(328 / 137)
    assert seconds(h100, "fa1") / seconds(h100, "fa1", head_dim=64) == pytest.approx(136 / 108)


def test_without_a_transpose_cache_every_forward_casts_the_weights_again():
    """disable_parameter_transpose_cache (Megatron-Core's; MLPerf's LoRA configs): each micro-batch's forward moves
    every weight of the layer again, a byte read and one written for an FP8 weight's transpose on Hopper, a full
    quantization both ways for a bf16 one, nothing for FP8 weights on Blackwell; only Megatron-Core has it."""
    model, shape = load_model("llama2-70b"), Layout(tp=4, mbs=1)
    weights = sum(g.batch * g.n * g.k for g in layer_gemms(model, 0, shape, model.seq))
    for name, fp8_weights, per_weight in (("h100-80gb", True, 2), ("h100-80gb", False, 4), ("b200", True, 0)):
        cluster = load_cluster(name).with_software(fp8_param_gather=fp8_weights)
        cached, uncached = (layer_passes(model, c, shape, False, "fp8").forward for c in
                            (cluster, cluster.with_software(disable_parameter_transpose_cache=True)))
        assert uncached - cached == pytest.approx(per_weight * weights / cluster.achieved_hbm_bandwidth)
    with pytest.raises(UserError, match="disable_parameter_transpose_cache is Megatron-Core's"):
        load_cluster("h100-80gb").with_software(framework="torch", disable_parameter_transpose_cache=True)
