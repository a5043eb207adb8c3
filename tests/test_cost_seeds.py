"""The seeds' worked numbers (shared/seeds/001, 003, 004), reproduced by the cost model."""

import math
from dataclasses import replace

import pytest

from meshscale.cost import comm, critical, flops, pipeline
from meshscale.cost.memory import memory_per_device
from meshscale.specs.cluster import load_cluster
from meshscale.specs.layout import Layout
from meshscale.specs.model import load_model


def checkpointed_activation_bytes(model, tokens: int, widths: tuple, dtype_bytes: int = 2) -> float:
    """Activations when only the inputs of a few matmuls per layer are saved (the scaling book's
    'checkpoint 3 matmuls per layer': widths = (ffn, ffn, hidden)): dtype * layers * tokens * sum(widths)."""
    return dtype_bytes * model.layers * tokens * sum(widths)


def slots(stages: int, microbatches: int) -> tuple[int, int]:
    """GPipe drawn as unit forward and backward slots (the lecture's picture): busy slots and all slots.
    Each stage runs m forwards and m backwards; the step lasts 2(m + p - 1) slots."""
    busy = 2 * stages * microbatches
    return busy, 2 * stages * (microbatches + stages - 1)


def utilisation(stages: int, microbatches: int) -> float:
    busy, total = slots(stages, microbatches)
    return busy / total


V5P = load_cluster("tpu-v5p")
L13 = load_model("llama2-13b")


def test_dp_critical_batch_2550_on_one_v5p_axis():
    assert critical.dp_critical(4.59e14, 1.8e11) == pytest.approx(2550, rel=1e-3)
    link = comm.group_link(V5P, 4096, 16, 1)  # a DP group along one full torus axis
    assert critical.dp_critical(V5P.peak_flops_bf16, link.raw_bandwidth) == pytest.approx(2550, rel=1e-3)


def test_fsdp_critical_batch_850_over_three_axes():
    link = comm.group_link(V5P, 4096, 4096, 1)
    assert link.raw_bandwidth == pytest.approx(3 * 1.8e11)
    assert critical.dp_critical(V5P.peak_flops_bf16, link.raw_bandwidth) == pytest.approx(850, rel=1e-3)


def test_all_to_all_on_a_torus_is_a_quarter_of_an_all_gather_and_set_by_its_longest_ring():
    """Scaling book Part 3, question 10: on a bidirectional ring an AllToAll takes a quarter of an AllGather of the
    whole array (here 16/15 of it: the gather's own shard stays). Uniform all-to-all traffic loads a torus's
    channels by its longest ring alone (Dally & Towles 2004, sec. 3.3.1), so the whole 16x16x16 v5p slice moves a
    chip's buffer in the time one 16-chip axis does, where three axes would gather 3x faster than one."""
    ring, whole, b = comm.group_link(V5P, 4096, 16, 1), comm.group_link(V5P, 4096, 4096, 1), 2**30
    gather = comm.collective_time("all_gather", 16 * b, 0, 16, ring)
    assert comm.collective_time("all_to_all", b, 0, 16, ring) == pytest.approx(gather / 4 * 16 / 15)
    assert comm.collective_time("all_to_all", b, 0, 4096, whole) == pytest.approx(
        comm.collective_time("all_to_all", b, 0, 16, ring))
    assert whole.bandwidth == pytest.approx(3 * ring.bandwidth)


def test_fsdp_tp_critical_235_and_x_opt_1333_for_llama2_13b():
    assert critical.fsdp_tp_critical(4.59e14, L13.ffn, 1.8e11, 1.8e11) == pytest.approx(235, rel=0.01)
    # X_opt = sqrt(B N M_X / (M_Y F)) with M_X = 2, M_Y = 1 as in the seed.
    assert critical.optimal_fsdp(3e6, 4096, L13.ffn, 2 * 1.8e11, 1.8e11) == pytest.approx(1333, rel=0.01)


def test_llama2_13b_memory_26gb_params_104gb_adam_and_42tb_activations():
    mem = memory_per_device(L13, Layout(dp=1), 1, precision="bf16-pure")
    assert mem.params == pytest.approx(26e9, rel=0.01)
    # the seed's Adam state is two fp32 moments (8 B/param), the fp32 recipe's; bf16-pure keeps them in bf16
    assert memory_per_device(L13, Layout(dp=1), 1, precision="fp32").optimizer == pytest.approx(104e9, rel=0.01)
    assert mem.optimizer == pytest.approx(52e9, rel=0.01)
    acts = checkpointed_activation_bytes(L13, 16e6, (L13.ffn, L13.ffn, L13.hidden))
    assert acts == pytest.approx(42e12, rel=0.01)
    assert acts / mem.params > 1600  # "activations are 1,615x larger than parameters"
    # The default mixed precision keeps an fp32 master copy too: 16 bytes/param.
    full = memory_per_device(L13, Layout(dp=1), 1)
    assert (full.params + full.grads + full.optimizer) / L13.param_count() == pytest.approx(16)


def test_300ms_per_step_at_40_percent_mfu():
    seconds = flops.six_pt(L13, 3e6) / (V5P.peak_flops_bf16 * 4096 * 0.4)
    assert seconds == pytest.approx(0.30, rel=0.05)


def test_three_stages_three_microbatches_use_18_of_30_slots():
    assert slots(3, 3) == (18, 30)
    assert utilisation(3, 3) == pytest.approx(0.6)
    # the 12 idle slots against 18 busy: GPipe's (p-1)/m
    assert pipeline.bubble_ratio(Layout(dp=1, pp=3, schedule="gpipe"), 3) == pytest.approx(12 / 18)


@pytest.mark.parametrize("n", [2, 4, 8, 64])
def test_ring_all_reduce_moves_2_n_minus_1_over_n(n):
    link = comm.Link("x", bandwidth=1e9, raw_bandwidth=1e9, latency=0.0, steps=n - 1)
    t = comm.collective_time("all_reduce", 1e9, 1, n, link)
    assert t == pytest.approx(2 * (n - 1) / n)
    assert comm.collective_time("all_gather", 1e9, 1, n, link) == pytest.approx((n - 1) / n)


def test_param_counts_feed_the_6pt_rule():
    assert L13.param_count() == pytest.approx(13.0e9, rel=0.01)
    assert math.isclose(flops.six_pt(L13, 1), 6 * L13.param_count())


def test_tpu_slices_are_cube_multiples_shaped_for_the_innermost_group():
    """A v4/v5p slice is made of 4x4x4 cubes: 12-way TP (PaLM's) gets a whole 12-chip ring of a 12x16x16 pod
    and its full per-axis bandwidth; a job beyond the largest slice splits into equal slices over DCN."""
    v4 = load_cluster("tpu-v4")
    assert comm.torus_shape(v4, 6144, 12) == (12, 16, 16)
    tp = comm.group_link(v4, 6144, 12, 1)
    assert (tp.tier, tp.raw_bandwidth) == ("ici", v4.tiers[0].bandwidth)
    dp = comm.group_link(v4, 6144, 512, 12)  # 256 per pod, two pods
    assert dp.tier == "ici+dcn" and dp.raw_bandwidth == 2 * v4.tiers[0].bandwidth
    for devices, inner in ((256, 8), (256, 1), (128, 8), (4096, 16), (64, 4)):
        dims = comm.torus_shape(V5P, devices, inner)
        assert math.prod(dims) == devices and all(d % 4 == 0 and d <= 16 for d in dims)
    assert comm.torus_shape(V5P, 256, 8)[0] == 8  # the group fills the first axis
    assert comm.torus_shape(load_cluster("tpu-v5e"), 64, 1) == (8, 8)  # v5e: powers of two, 2D


def test_a_group_takes_whole_axes_of_a_given_slice_in_any_order():
    """JAX's create_device_mesh lays the tensor axis on whichever whole physical axes multiply to its size: on a
    4x4x8 slice, 8-way TP is the ring of 8 (one axis, with wraparound), not a 4-ring and half of another, and
    the 16-way FSDP group beside it gets the two 4-rings."""
    sliced = replace(V5P, torus=(4, 4, 8), tiers=(replace(V5P.tiers[0], size=128), V5P.tiers[1]))
    assert comm.torus_shape(sliced, 128, 8) == (8, 4, 4)
    assert comm.group_link(sliced, 128, 8, 1).raw_bandwidth == V5P.tiers[0].bandwidth
    assert comm.group_link(sliced, 128, 16, 8).raw_bandwidth == 2 * V5P.tiers[0].bandwidth
