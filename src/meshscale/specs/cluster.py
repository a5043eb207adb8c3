"""ClusterSpec: the accelerator and the interconnect hierarchy a layout is placed on.

A GPU cluster is a list of tiers, fastest first: an NVLink domain of `size` devices, then the scale-out
network that joins the domains. A TPU slice is a torus of ICI links (`torus` dims) with DCN between slices.
Every achievable-efficiency factor is a named field with the public figure it comes from; nothing is fitted
to one training run.
"""

import re
from dataclasses import asdict, dataclass, replace

from meshscale.errors import UserError
from meshscale.specs.loading import build, hash_once, read_spec_file


@dataclass(frozen=True)
class Tier:
    name: str
    size: int  # devices inside one domain of this tier (8 for a DGX NVLink node); 0: the whole cluster
    bandwidth: float  # bytes/s per device, one direction (TPU ICI: per torus axis, both links, as the book)
    latency: float  # seconds per message step (alpha of the alpha-beta model)
    efficiency: float  # achievable fraction of `bandwidth` for large collectives (nccl-tests bus bandwidth)


@dataclass(frozen=True)
class Software:
    """Which communication the training framework overlaps with compute (cost/step.py applies these).
    Defaults follow Megatron-Core with its distributed optimizer (Megatron-LM `--overlap-grad-reduce
    --overlap-param-gather`), torch DDP's bucketed all-reduce and FSDP2's prefetch; TP overlap is opt-in as in
    Megatron-Core (`--tp-comm-overlap`, Transformer Engine userbuffers) and torchtitan (async TP)."""
    grad_reduce_overlap: bool = True  # gradient all-reduce / reduce-scatter buckets run during backward
    param_gather_overlap: bool = True  # ZeRO-1/2 parameter all-gather runs during the next forward
    fsdp_prefetch: bool = True  # ZeRO-3 gathers the next unit while the current one computes
    tp_comm_overlap: bool = False  # TP/SP all-gather and reduce-scatter split into chunks behind their GEMMs
    # With tp_comm_overlap, the reduce-scatters are split too (Megatron-Core's userbuffers, torch's async TP);
    # false: the all-gathers alone, as XLA's collective matmul under --xla_tpu_decompose_all_gather_einsum
    tp_overlap_scatters: bool = True
    # With SP, the reduce-scatter of the column-parallel layers' input gradient runs while their weight
    # gradient is computed (Megatron-LM since 2022 without --tp-comm-overlap: core/tensor_parallel/layers.py,
    # LinearWithGradAccumulationAndAsyncCommunication.backward); off as torch's DTensor TP and our runtime run
    tp_wgrad_overlap: bool = False
    # With tp_comm_overlap, the column-parallel layers' input-gradient reduce-scatter under SP is pipelined with the
    # dgrad GEMM that makes it (Megatron-Core's --tp-comm-overlap-rs-dgrad, TransformerConfig.tp_comm_overlap_rs_dgrad:
    # Transformer Engine's ub_overlap_rs_dgrad; MLPerf's MC_TP_OVERLAP_RS_DGRAD), not run behind the weight gradients
    # (tp_wgrad_overlap), which a LoRA's frozen weights do not have
    tp_overlap_rs_dgrad: bool = False
    # With tp_comm_overlap, the QKV projection's forward all-gather runs alone before its GEMM, not decomposed
    # behind it (Megatron-Core's ModelParallelConfig.tp_comm_overlap_disable_qkv: its TE layer gets
    # ub_overlap_ag=False and gathers with NCCL; NeMo's model.tp_comm_overlap_disable_qkv, which MLPerf's LoRA
    # configs set, MC_TP_DISABLE_QKV)
    tp_overlap_disable_qkv: bool = False
    # Under SP, a LoRA adapter beside a row-parallel matrix sends its output to each TP rank's sequence slice by
    # an all-to-all each way, where NeMo's ParallelLinearAdapter otherwise gathers it over TP (its
    # lora_tuning.a2a_experimental; MLPerf's LoRA configs set it, LORA_A2A; cost/comm.py lora_adapter_ops)
    lora_all_to_all: bool = False
    # MoE dispatch/combine all-to-alls of one micro-batch behind another's compute (Megatron-Core
    # `--overlap-moe-expert-parallel-comm`; schedule=dualpipev always does, DeepSeek-V3 sec. 3.2.1)
    ep_comm_overlap: bool = False
    # Interleaved 1F1B's (and GPipe's) stage-boundary sends run while the rank computes its other chunks
    # (Megatron-Core --overlap-p2p-communication, added 2023-05 and on by default since 2023-10; torch's
    # pipelining posts them as isend/irecv); false: each send blocks its rank until it lands, as Megatron-LM
    # before 2023 did (p2p_communication.py _communicate waited on every request, then torch.cuda.synchronize()).
    # DeepSpeed's pipeline engine never overlaps them, whatever this says (`pipeline_sends_block`).
    pp_comm_overlap: bool = True
    # framework torch, zero=3: FSDP2 (fully_shard) copies each gathered parameter out of the all-gather buffer on
    # the compute stream, a read and a write of it (torch's _fsdp_param_group.py wait_for_unshard ->
    # foreach_all_gather_copy_out); false: FSDP1, whose flat parameter is the all-gather buffer. Megatron-FSDP and
    # DeepSpeed's ZeRO-3 gather in place whatever this says.
    fsdp_copy_out: bool = True
    # Gradients travel in fp32 (FSDP2's reduce_dtype, Megatron-LM's arguments.py forces fp32 accumulation and
    # all-reduce for bf16); false: in the 2-byte compute dtype, as Megatron-LM's fp16 runs did (its
    # --accumulate-allreduce-grads-in-fp32 is off by default).
    grad_reduce_fp32: bool = True
    # ZeRO-1/2 all-gather the updated parameters in fp32 (our runtime: its parameters stay fp32 under
    # autocast); false: in the compute dtype, as Megatron-Core's distributed optimizer gathers its bf16 model
    # parameters (core/distributed/param_and_grad_buffer.py) and DeepSpeed's stage 1/2 its 16-bit partitions.
    param_gather_fp32: bool = False
    # FP8 parameters (Megatron-Core --fp8-param-gather, NeMo's fp8_params: Transformer Engine keeps the model's
    # weights as FP8 tensors beside the fp32 master): ZeRO-1/2's all-gather of the updated parameters moves 1 byte
    # a parameter, not 2; the few bf16 ones (embeddings, norms, biases) are counted at 1 too. A weight holds 1 byte
    # where no second FP8 copy is kept beside it, else 2 (Hopper's cached transpose; cost/memory.py weight_bytes),
    # and a LoRA run's frozen weights likewise. Needs fp8.
    fp8_param_gather: bool = False
    # Megatron-Core's precision-aware optimizer (--use-precision-aware-optimizer; it needs the distributed optimizer,
    # so it applies at zero >= 1): Transformer Engine's FusedAdam (TE >= 2.1) keeps the fp32 master as the 16 bits its
    # bf16 parameter lacks (store_param_remainders, on by default: core/optimizer/distrib_optimizer.py's int16
    # master shard), 2 bytes a parameter, not 4; with FP8 parameters (fp8_param_gather) the master stays fp32.
    # Needs bf16, fp8 or mxfp8 (a master to split).
    precision_aware_optimizer: bool = False
    # The dtype AdamW keeps its two moments in: "fp32", or "bf16" under the precision-aware optimizer
    # (--exp-avg-dtype bf16 --exp-avg-sq-dtype bf16; DeepSeek-V3 keeps them so, arXiv:2412.19437 sec. 3.3.2).
    adam_moments: str = "fp32"
    # The attention core in FP8 too (Transformer Engine's fp8_dpa: Megatron-Core's TransformerConfig.
    # fp8_dot_product_attention, NeMo's fp8_dot_product_attention, MLPerf's FP8_DPA=1), on cuDNN's FP8 kernels at
    # their measured speed over its bf16 ones (cost/kernels.py FP8_ATTENTION); false: FP8 recipes keep it in bf16,
    # Transformer Engine's default. Needs fp8 or mxfp8, on Hopper or Blackwell.
    fp8_attention: bool = False
    # Transformer Engine keeps no FP8 copy of a weight from one micro-batch to the next (Megatron-Core's
    # TransformerConfig.disable_parameter_transpose_cache; MLPerf's LoRA configs set it): every forward casts each
    # weight again, and on Hopper writes its transpose for the backward GEMMs (cost/kernels.py weight_cast_bytes)
    disable_parameter_transpose_cache: bool = False
    # How FP8 finds each tensor's scale: "delayed", from an amax history the cast kernel updates as it goes
    # (Transformer Engine's DelayedScaling, Megatron-Core's --fp8-recipe delayed); "current", from the tensor's own
    # amax, one more read of it before the cast (TE's Float8CurrentScaling, torchao's Float8Linear that torchtitan
    # runs); "blockwise", a scale for every 1x128 tile of an activation and 128x128 block of a weight (DeepSeek-V3's
    # fine-grained FP8, sec. 3.3.2; TE's Float8BlockScaling, Megatron-Core's --fp8-recipe blockwise; its GEMMs at
    # ClusterSpec.fp8_block_gemm_share of the tensor-wise rate). Unset: the framework's, FRAMEWORK_FP8_SCALING.
    # MXFP8 (--precision mxfp8) scales each block of 32 itself.
    fp8_scaling: str = ""
    # Element-wise work (norms, RoPE, activations, residuals) in fused kernels (Megatron's fused norm and bias-
    # activation kernels, XLA, torch.compile); false: one kernel per operator, as eager PyTorch runs it.
    fused_elementwise: bool = True
    # Eager norms as one kernel on the 2-byte activations, a read and a write an element (llm-foundry's
    # low_precision_layernorm: F.layer_norm with autocast off); false: as the block writes them (cost/step.py
    # eager_forward_elements). Fused element-wise kernels make this moot.
    low_precision_norm: bool = False
    # The fused attention kernel: "platform", the presets' rate (cuDNN through Transformer Engine on Hopper and
    # Blackwell, FlashAttention-2 on Ampere); "fa2", FlashAttention-2 (flash-attn 2.x, torch's SDPA flash backend);
    # "fa1", FlashAttention v1 (flash-attn 1.x, Transformer Engine's before 1.0; Ampere and Hopper only); "fa-triton",
    # the 2022 Triton FlashAttention (llm-foundry's attn_impl: triton). Rates: cost/kernels.py.
    # What ran on Hopper: torch's SDPA tried FlashAttention-2 first until 2.11 (cuDNN last, opt-in after 2.5's
    # bugs, pytorch#138522), cuDNN first from 2.11 (sdp_utils.cpp check_prefer_cudnn_attention, cuDNN >= 9.15);
    # NeMo's launcher set NVTE_FUSED_ATTN=0 from 2024-02 to 2024-08, so Transformer Engine ran FlashAttention-2.
    attention_kernel: str = "platform"
    # The attention's q, k and v unpadded before a variable-length kernel and its output padded after
    # (flash-attn's bert_padding.unpad_input / pad_input around flash_attn_varlen_func, as llm-foundry's
    # flash_attn_fn runs it whatever the mask and Hugging Face transformers' FlashAttention-2 path under a padding
    # mask): gather and scatter copies of them and their gradients, and host waits (cost/step.py unpad_elements).
    attention_unpad: bool = False
    # The loss as one kernel over the 2-byte logits (flash-attn's cross_entropy, llm-foundry's fused_crossentropy):
    # it reads them forward, and reads them and writes their gradient backward; false: Megatron-Core's vocab-
    # parallel cross-entropy in fp32 (cost/kernels.py loss_seconds).
    fused_cross_entropy: bool = False
    # Gradient-free cross-entropies over the logits a trainer adds each micro-batch for its metrics, each in fp32
    # under autocast (Composer's train metrics, LanguageCrossEntropy and LanguagePerplexity: 2).
    metric_cross_entropies: int = 0
    # The framework whose defaults fill what is left unset (`grad_buckets`): megatron-core, torch (DDP, FSDP2)
    # or deepspeed.
    framework: str = "megatron-core"
    # The NCCL release the collectives run on, "major.minor": NCCL's per-channel tuner rows for Blackwell changed in
    # 2.28 (cost/collectives.py per_channel); the other GPUs' are the same from 2.18 on. The default is the last
    # release before that change, which the published runs used and whose 32 thread blocks a Blackwell collective
    # holds (collectives.CHANNELS, comm.sm_share) the presets count.
    nccl: str = "2.27"
    # Parameters per gradient bucket of DDP and ZeRO-1/2 (one reduce launch each; ZeRO-3 reduces one wrapped
    # unit at a time whatever this says, as FSDP2 does). Unset: the framework's default, FRAMEWORK_BUCKETS.
    grad_bucket_params: int | None = None
    # Each layer replayed from a captured CUDA graph (Megatron-Core --cuda-graph-impl transformer_engine, TE's
    # make_graphed_callables): the host launches a graph where it ran the layer's calls (cost/overhead.py). A
    # dropless MoE layer's dispatch, experts and combine stay eager: their shapes change every step (Megatron-Core
    # captures a whole MoE layer only when it drops and pads, its CudaGraphScope.moe; the attn and moe_router
    # scopes take the rest).
    cuda_graphs: bool = False
    # MoE token dispatch and combine: "alltoall", NCCL's all-to-all (Megatron-Core's alltoall dispatcher);
    # "deepep", DeepEP's NVLink/RDMA-forwarding kernels, or "hybridep", NVIDIA's Hybrid-EP ones in DeepEP (TMA
    # copies on fewer SMs; Megatron-Core's flex dispatcher and its two backends; cost/comm.py deepep_seconds);
    # these two on NVIDIA clusters only; "einsum", GShard's dense dispatch and combine (Lepikhin et al. 2020 sec.
    # 2.2): each sequence's tokens multiplied into and out of [experts, capacity] buffers by one-hot masks, as
    # MaxText's MoE runs without megablox (layers/linears.py dense_matmul); the buffers are the model's
    # capacity_factor times an expert's balanced share, computed and moved whole whatever the routing.
    moe_dispatcher: str = "alltoall"
    # Tokens the busiest expert-parallel rank receives over the balanced share (>= 1): its experts' GEMMs and its
    # dispatch and combine take that much longer, and the step waits for it. 1: balanced, as vendor benchmarks
    # force routing (Megatron-Core --moe-router-force-load-balancing); a measured max/mean of tokens per EP rank
    # otherwise.
    moe_imbalance: float = 1.0
    # A MoE layer's permute and unpermute as Transformer Engine's fused Triton kernels (Megatron-Core
    # --moe-permute-fusion); false: torch's masked_select, index_select and scatter_add (moe_utils, Megatron-Core's
    # default), several times slower (cost/kernels.py PERMUTE_EFFICIENCY).
    moe_permute_fusion: bool = False
    # Fraction of an overlapped collective's time that can run beside compute, the rest adding to the step
    # (cost/step.py exposed_seconds): 1 where a separate engine moves the data (NCCL on GPUs, ICI DMA on TPUs);
    # calibrate measures it where collectives and compute share the cores (gloo on this CPU: 0-0.6 in full
    # calibrations; --quick's three repeats scatter up to 1).
    overlap_efficiency: float = 1.0
    # Under --precision int8, the layer parts (INT8_PARTS, joined by +) whose GEMMs AQT quantizes in the forward
    # only, their gradients in bf16 (MaxText's MLPerf 4.1 branch, enable_tff_quant: attention_out+mlp,
    # layers/gpt3.py); the rest run all three passes in int8. "": every part does.
    int8_forward_only: str = ""

    @property
    def nccl_release(self) -> tuple[int, int]:
        """`nccl` as (major, minor)."""
        major, minor = self.nccl.split(".")
        return int(major), int(minor)

    @property
    def pipeline_receives_block(self) -> bool:
        """Whether a stage-boundary receive blocks its rank for the transfer, as a send does: DeepSpeed's pipeline
        engine issues every send and every receive as a stream-ordered NCCL call of its own (runtime/pipe/p2p.py:
        send is dist.send, recv dist.recv), and its lockstep TrainSchedule (runtime/pipe/schedule.py) pairs each
        step's send with a neighbour's receive, so a middle rank waits out four transfers a micro-batch. Megatron
        sends one way while it receives the other in one batch_isend_irecv, and torch's pipelining posts its
        receives ahead."""
        return self.framework == "deepspeed"

    @property
    def pipeline_sends_block(self) -> bool:
        """Whether a stage-boundary send blocks its rank until it lands: with pp_comm_overlap off, and always under
        DeepSpeed's pipeline engine (`pipeline_receives_block`)."""
        return not self.pp_comm_overlap or self.pipeline_receives_block

    @property
    def holds_fsdp_root(self) -> bool:
        """Whether ZeRO-3 keeps its root unit (embedding, final norm, head) gathered from forward to the end of
        backward: torch's FSDP does (cost/memory.py fsdp_gathered)."""
        return self.framework == "torch"


ATTENTION_KERNELS = ("platform", "fa2", "fa1", "fa-triton")
# Each framework's tensor-wise FP8 scaling: Megatron-Core's --fp8-recipe defaults to delayed (arguments.py), as
# DeepSpeed's Transformer Engine layers do (TE's default recipe); torchao's float8 training scales dynamically,
# from the tensor's current amax (torchao.float8 Float8LinearConfig, tensorwise).
FRAMEWORK_FP8_SCALING = {"megatron-core": "delayed", "torch": "current", "deepspeed": "delayed"}

# Each framework's default gradient bucket, in parameters, and where it is set:
# - megatron-core: max(40M, 1M x data-parallel size) parameters (megatron/core/distributed/
#   distributed_data_parallel.py, DistributedDataParallelConfig.bucket_size's default, "so that collectives do
#   not become latency-bound"); one bucket per gradient buffer where overlap_grad_reduce is off, and on every
#   pipeline stage but the first, and for every virtual chunk but the first (disable_bucketing);
# - torch: DDP's bucket_cap_mb=25, 25 MiB of the fp32 gradient (torch/nn/parallel/distributed.py), 6.55M
#   parameters; FSDP2 reduces per fully_shard unit;
# - deepspeed: ZeRO-1/2's reduce_bucket_size, 5e8 elements (deepspeed/runtime/zero/config.py).
# (parameters per bucket, and per data-parallel rank: the bucket is the larger)
FRAMEWORK_BUCKETS = {"megatron-core": (40e6, 1e6), "torch": (25 * 2**20 / 4, 0.0), "deepspeed": (5e8, 0.0)}
# [software] switches only some frameworks have: (those frameworks, where the switch comes from). Megatron-
# DeepSpeed trains with Megatron-LM's TP layers, so framework = "deepspeed" has their weight-gradient overlap.
# On a TPU slice every framework compiles through XLA, which has both TP overlaps (XLA_SWITCHES): its collective
# matmul and its async collective fusions.
XLA_SWITCHES = ("tp_comm_overlap", "tp_wgrad_overlap")
FRAMEWORK_SWITCHES = {
    "fp8_param_gather": (("megatron-core",), "Megatron-Core's (--fp8-param-gather)"),
    "precision_aware_optimizer": (("megatron-core",), "Megatron-Core's (--use-precision-aware-optimizer)"),
    "fp8_attention": (("megatron-core",), "Megatron-Core's (TransformerConfig.fp8_dot_product_attention)"),
    "disable_parameter_transpose_cache": (("megatron-core",),
                                          "Megatron-Core's (TransformerConfig.disable_parameter_transpose_cache)"),
    "moe_permute_fusion": (("megatron-core",), "Megatron-Core's (--moe-permute-fusion)"),
    "ep_comm_overlap": (("megatron-core",), "Megatron-Core's (--overlap-moe-expert-parallel-comm)"),
    "tp_comm_overlap": (("megatron-core", "torch"), "Megatron-Core's (--tp-comm-overlap) and torch's (async TP)"),
    "tp_wgrad_overlap": (("megatron-core", "deepspeed"), "Megatron-LM's (its TP layers' backward)"),
    "tp_overlap_disable_qkv": (("megatron-core",), "Megatron-Core's (ModelParallelConfig.tp_comm_overlap_disable_qkv)"),
    "tp_overlap_rs_dgrad": (("megatron-core",), "Megatron-Core's (--tp-comm-overlap-rs-dgrad)"),
    "lora_all_to_all": (("megatron-core",), "NeMo's on Megatron-Core (lora_tuning.a2a_experimental)"),
}


def is_fp8(precision: str) -> bool:
    """Whether the linear layers' GEMMs run in FP8: tensor-wise scaled (fp8) or block-scaled (mxfp8)."""
    return precision in ("fp8", "mxfp8")


# A layer's GEMMs by the part that runs them (cost/kernels.py layer_gemm_parts)
INT8_PARTS = ("attention", "attention_out", "mlp", "router", "experts", "shared_experts")


def is_quantized(precision: str) -> bool:
    """Whether the linear layers' GEMMs read 8-bit operands: FP8, or int8 (AQT's, cost/kernels.py)."""
    return is_fp8(precision) or precision == "int8"


@dataclass(frozen=True)
class ClusterSpec:
    name: str
    accelerator: str
    peak_flops_bf16: float  # dense, FLOP/s per device
    peak_flops_fp8: float
    peak_flops_fp32: float
    hbm_bytes: float
    hbm_bandwidth: float  # bytes/s
    matmul_efficiency: float  # fraction of peak the best-shaped GEMM sustains (matmul micro-benchmarks)
    tiers: tuple = ()  # Tier, fastest first
    torus: tuple = ()  # TPU: ICI torus dims of the largest slice (tier 0 is then ICI, per axis)
    default_devices: int = 8
    price_per_device_hour: float = 0.0  # USD, public on-demand list price, for `plan --objective cost`
    # Software: a fused attention kernel (FlashAttention, Dao et al. 2022) skips masked blocks and never
    # stores the s x s scores. False describes 2021-22 Megatron-LM (the published A100 runs).
    fused_attention: bool = True
    # Kernel shapes (cost/kernels.py): streaming multiprocessors a GEMM's output tiles are spread over (0: no
    # wave quantization, as on a TPU), the output tile of one GEMM block (CUTLASS/cuBLAS 128x256 on Ampere and
    # Hopper, the 128x128 MXU on TPU), the fixed per-tile cost in k (pipeline prologue and epilogue), and the
    # fraction of peak a fused attention kernel reaches forward + backward at long causal sequences (GPUs:
    # shorter ones scale along the published kernel scans, cost/kernels.py attention_shape; 0: matmul_efficiency).
    compute_units: int = 0
    gemm_tile: tuple = (128, 128)
    gemm_k_overhead: int = 0
    attention_efficiency: float = 0.0
    # Memory-bound kernels (element-wise work, norms, the loss, optimizer, casts, ring merges, a GEMM's
    # traffic) move bytes at this fraction of the datasheet `hbm_bandwidth`: a large device-to-device copy's
    # bytes read + written over it (benchmarks/kernel_scan.py, the presets' comment). 1: the datasheet figure.
    hbm_efficiency: float = 1.0
    # Fixed time of one GEMM kernel beyond its tiles and waves (GPUs): the first wave's pipeline fill, the last
    # one's epilogue drain and the launch on the device, measured by benchmarks/kernel_scan.py between back-to-
    # back launches (so no host time); small GEMMs feel it most.
    gemm_kernel_overhead_s: float = 0.0
    # FP8 training (Transformer Engine) runs the linear layers' GEMMs in FP8 at this multiple of the bf16 rate:
    # the FP8-over-BF16 speed-up cuBLAS measures on large Hopper matmuls, 1.75x (NVIDIA technical blog
    # "Boosting Matrix Multiplication Speed and Flexibility with NVIDIA cuBLAS 12.9", 2025), never above the
    # fp8 peak (so 1x where there are no FP8 units); the fused attention kernel stays in bf16.
    fp8_gemm_speedup: float = 1.75
    # MXFP8 (OCP microscaling: FP8 elements with a power-of-two scale for every 32) GEMMs on block-scaled tensor
    # cores run at this share of the tensor-wise FP8 rate; 0: no MXFP8 units, and --precision mxfp8 is refused.
    mxfp8_gemm_share: float = 0.0
    # Block-scaled FP8 GEMMs ([software] fp8_scaling = "blockwise") run at this share of the tensor-wise FP8 rate;
    # 0: no data, and blockwise scaling is refused.
    fp8_block_gemm_share: float = 0.0
    # Dense int8 peak, OP/s per device (datasheets); 0: no int8 data, and --precision int8 is refused. Int8
    # GEMMs run at `int8_gemm_speedup` times the bf16 rate where a scan measured it (0: the peaks' ratio).
    peak_flops_int8: float = 0.0
    int8_gemm_speedup: float = 0.0
    software: Software = Software()
    # Measured on the machine in hand by `meshscale calibrate` (runtime/measure/calibrate.py); presets leave them
    # empty. cost/kernels.py uses the rates, cost/overhead.py the operator and collective figures.
    op_overhead_s: float = 0.0  # host time per framework operator (Python, dispatch, autograd), tiny tensors
    fsdp_unit_overhead_s: float = 0.0  # FSDP2's host time per unit for one forward + backward, besides traffic
    fsdp_tensor_overhead_s: float = 0.0  # and per sharded (DTensor) parameter tensor in one optimizer update
    attention_rates: tuple = ()  # (seq, head_dim, FLOP/s): causal attention forward + backward
    gemm_rates: tuple = ()  # (m, n, k, FLOP/s): GEMM throughput over shapes
    # The precision both rates were measured in; they stand for that precision's kernels only (a CPU's fp32
    # GEMM rate says nothing of its bf16 one, nor a GPU's bf16 of its fp32 or FP8): others keep the preset's.
    rates_precision: str = "fp32"
    collectives: tuple = ()  # (collective, latency per step s, bus bandwidth B/s) over tier 0
    calibration: tuple = ()  # provenance, (key, value): date, host, torch, nproc, method
    # CPU hosts: how many ranks per host ran at once when the rates above were measured (calibrate's --nproc);
    # a job with more ranks per host shares the same cores (cost/overhead.py). 0: devices do not share compute.
    calibrated_ranks: int = 0
    # Power per device (W) for energy per token: board power when busy, idle power otherwise (see POWER_W).
    board_power_w: float = 0.0
    idle_power_w: float = 0.0
    # NCCL's view (cost/collectives.py): the GPU generation whose tuner constants apply ("": not NCCL; the
    # alpha-beta model of cost/comm.py), the bus bandwidth of NVLink SHARP all-reduce inside the NVLink domain
    # (bytes/s, nccl-tests' measured ceiling; 0: no NVLS), and the host CPU (NCCL's LL cap and network post
    # overhead depend on it).
    gpu_arch: str = ""
    nvls_bandwidth: float = 0.0
    host_cpu: str = "intel"
    # Fraction of compute throughput lost while a collective runs beside it (cost/comm.py sm_share), where
    # measured on the machine in hand; unset: the SMs NCCL's channels hold on NVIDIA GPUs, 0 elsewhere.
    overlap_slowdown: float | None = None
    # Spread (standard deviation, a fraction) of device speed across a fleet of the same SKU: a synchronous step
    # waits for the slowest device (cost/step.py slowest_of). 0: identical devices.
    device_spread: float = 0.0
    # Bytes/s one way between a device and its host's memory, the datasheet's PCIe link: activation offload
    # (Layout.offload) moves over it. 0: no figure, and predict refuses offload.
    host_bandwidth: float = 0.0
    # Host time of one torch.nn.Linear forward on the CPU thread that launches a GPU's kernels (Python, the
    # dispatcher, the launch): the unit cost/overhead.py counts a framework's layers in, since an eager
    # framework's pass takes at least as long as its host takes to issue it. 0: not charged (XLA compiles a TPU's
    # whole step; a calibrated machine measures op_overhead_s instead).
    host_linear_s: float = 0.0

    __hash__ = hash_once

    def __post_init__(self):
        for key, kinds, what in (("tiers", (Tier, dict), "a table of Tier fields"),
                                 *((k, (dict, list, tuple), "a row (a list or a table)")
                                   for k in ("attention_rates", "gemm_rates", "collectives"))):
            for row in getattr(self, key):
                if not isinstance(row, kinds):
                    raise UserError(f"cluster {self.name}: each entry of {key} must be {what}, got {row!r}")
        tiers = tuple(t if isinstance(t, Tier) else build(Tier, dict(t), f"cluster {self.name} tier")
                      for t in self.tiers)
        object.__setattr__(self, "tiers", tiers)
        object.__setattr__(self, "torus", tuple(self.torus))
        object.__setattr__(self, "gemm_tile", tuple(self.gemm_tile))
        if isinstance(self.software, dict):
            object.__setattr__(self, "software", build(Software, self.software, f"cluster {self.name} [software]"))
        for key in ("attention_rates", "gemm_rates", "collectives"):  # TOML arrays and tables -> hashable rows
            rows = getattr(self, key)
            object.__setattr__(self, key, tuple(tuple(r.values()) if isinstance(r, dict) else tuple(r) for r in rows))
        if isinstance(self.calibration, dict):
            object.__setattr__(self, "calibration", tuple((k, str(v)) for k, v in self.calibration.items()))
        self.validate()

    def validate(self):
        for key in ("peak_flops_bf16", "hbm_bytes", "hbm_bandwidth"):
            if not getattr(self, key) > 0:
                raise UserError(f"cluster {self.name}: {key} must be positive")
        if not 0 < self.matmul_efficiency <= 1:
            raise UserError(f"cluster {self.name}: matmul_efficiency must be in (0, 1]")
        if not 0 < self.hbm_efficiency <= 1:
            raise UserError(f"cluster {self.name}: hbm_efficiency must be in (0, 1] (the achieved fraction of "
                            f"hbm_bandwidth), got {self.hbm_efficiency!r}")
        if not self.gemm_kernel_overhead_s >= 0:
            raise UserError(f"cluster {self.name}: gemm_kernel_overhead_s must be >= 0 seconds, "
                            f"got {self.gemm_kernel_overhead_s!r}")
        if not 0 <= self.attention_efficiency <= 1:
            raise UserError(f"cluster {self.name}: attention_efficiency must be in [0, 1] (0: matmul_efficiency)")
        if self.fp8_gemm_speedup < 1:
            raise UserError(f"cluster {self.name}: fp8_gemm_speedup must be >= 1 (FP8 GEMMs over bf16 ones)")
        if not (self.peak_flops_int8 >= 0 and self.int8_gemm_speedup >= 0):
            raise UserError(f"cluster {self.name}: peak_flops_int8 (OP/s; 0: no int8 data) and int8_gemm_speedup (over "
                            f"bf16 GEMMs; 0: the peaks' ratio) must be >= 0, got {self.peak_flops_int8!r} and "
                            f"{self.int8_gemm_speedup!r}")
        if not 0 <= self.mxfp8_gemm_share <= 1:
            raise UserError(f"cluster {self.name}: mxfp8_gemm_share must be in [0, 1] (MXFP8 GEMMs' share of the "
                            f"tensor-wise FP8 rate; 0: no MXFP8 units), got {self.mxfp8_gemm_share!r}")
        if not 0 <= self.fp8_block_gemm_share <= 1:
            raise UserError(f"cluster {self.name}: fp8_block_gemm_share must be in [0, 1] (block-scaled FP8 GEMMs' "
                            f"share of the tensor-wise FP8 rate; 0: no data), got {self.fp8_block_gemm_share!r}")
        if len(self.gemm_tile) != 2 or min(self.gemm_tile) < 1 or self.compute_units < 0 or self.gemm_k_overhead < 0:
            raise UserError(f"cluster {self.name}: gemm_tile needs two positive sizes; compute_units and "
                            "gemm_k_overhead must be >= 0")
        if not self.tiers:
            raise UserError(f"cluster {self.name}: give at least one interconnect tier")
        for t in self.tiers:
            if not (t.bandwidth > 0 and 0 < t.efficiency <= 1 and t.latency >= 0 and t.size >= 0):
                raise UserError(f"cluster {self.name}: tier {t.name} needs bandwidth > 0, efficiency in (0, 1], "
                                "latency >= 0, size >= 0")

        if self.gpu_arch not in ("", "volta", "ampere", "hopper", "blackwell"):
            raise UserError(f"cluster {self.name}: gpu_arch must be one of volta, ampere, hopper, blackwell "
                            "(or empty: not an NCCL cluster)")
        if self.host_cpu not in ("intel", "amd", "arm") or self.nvls_bandwidth < 0:
            raise UserError(f"cluster {self.name}: host_cpu must be intel, amd or arm and nvls_bandwidth >= 0")
        if self.host_bandwidth < 0:
            raise UserError(f"cluster {self.name}: host_bandwidth must be >= 0 (bytes/s one way to host memory; "
                            f"0: none), got {self.host_bandwidth!r}")
        sw = self.software
        if sw.framework not in FRAMEWORK_BUCKETS:
            raise UserError(f"cluster {self.name}: [software] framework must be one of "
                            f"{', '.join(FRAMEWORK_BUCKETS)}, got {sw.framework!r}")
        if sw.grad_bucket_params is not None and (isinstance(sw.grad_bucket_params, bool) or not
                                                  isinstance(sw.grad_bucket_params, (int, float)) or
                                                  not sw.grad_bucket_params >= 1):
            raise UserError(f"cluster {self.name}: [software] grad_bucket_params must be a positive number of "
                            f"parameters per gradient bucket (leave it out for {sw.framework}'s default), "
                            f"got {sw.grad_bucket_params!r}")
        if sw.cuda_graphs is not False and (sw.cuda_graphs is not True or sw.framework != "megatron-core"
                                            or not self.host_linear_s):
            raise UserError(f"cluster {self.name}: [software] cuda_graphs is Megatron-Core's (--cuda-graph-impl) on a "
                            f"GPU cluster (host_linear_s > 0): true or false with framework = \"megatron-core\", "
                            f"got {sw.cuda_graphs!r} with {sw.framework}")
        for knob, (frameworks, source) in FRAMEWORK_SWITCHES.items():
            value = getattr(sw, knob)
            xla = self.torus and knob in XLA_SWITCHES
            if value is not False and (value is not True or sw.framework not in frameworks and not xla):
                allowed = " or ".join(f'"{f}"' for f in frameworks)
                raise UserError(f"cluster {self.name}: [software] {knob} is {source}: true or false with framework = "
                                f"{allowed}, got {value!r} with {sw.framework}")
        if sw.fp8_scaling not in ("", "delayed", "current", "blockwise"):
            raise UserError(f"cluster {self.name}: [software] fp8_scaling must be delayed, current or blockwise (leave "
                            f"it out for {sw.framework}'s, {FRAMEWORK_FP8_SCALING[sw.framework]}), got "
                            f"{sw.fp8_scaling!r}")
        if sw.fp8_scaling == "blockwise" and sw.framework == "torch":
            raise UserError(f"cluster {self.name}: [software] fp8_scaling blockwise is Transformer Engine's "
                            "Float8BlockScaling, which torchao's float8 training (framework torch) does not run: use "
                            "current, or framework = \"megatron-core\"")
        archs = ("ampere", "hopper") if sw.attention_kernel == "fa1" else ("ampere", "hopper", "blackwell")
        if sw.attention_kernel not in ATTENTION_KERNELS or (sw.attention_kernel != "platform" and
                                                            self.gpu_arch not in archs):
            raise UserError(f"cluster {self.name}: [software] attention_kernel must be one of "
                            f"{', '.join(ATTENTION_KERNELS)} (fa2 and fa-triton on an NVIDIA cluster from Ampere on, "
                            f"gpu_arch ampere, hopper or blackwell; fa1 on ampere or hopper), got "
                            f"{sw.attention_kernel!r} with gpu_arch {self.gpu_arch or 'unset'}")
        if sw.attention_unpad and not self.gpu_arch:
            raise UserError(f"cluster {self.name}: [software] attention_unpad is flash-attn's (bert_padding around its "
                            "varlen kernel) on an NVIDIA cluster (gpu_arch set); drop it")
        if not sw.metric_cross_entropies >= 0:
            raise UserError(f"cluster {self.name}: [software] metric_cross_entropies must be a whole number >= 0, "
                            f"got {sw.metric_cross_entropies!r}")
        if sw.adam_moments not in ("fp32", "bf16") or sw.adam_moments == "bf16" and not sw.precision_aware_optimizer:
            raise UserError(f"cluster {self.name}: [software] adam_moments must be fp32, or bf16 with "
                            f"precision_aware_optimizer = true (Megatron-Core's --exp-avg-dtype under "
                            f"--use-precision-aware-optimizer), got {sw.adam_moments!r}")
        deepep = sw.moe_dispatcher in ("deepep", "hybridep")  # DeepEP's kernels, NVIDIA's only
        if not (sw.moe_dispatcher in ("alltoall", "einsum") or deepep and self.gpu_arch):
            raise UserError(f"cluster {self.name}: [software] moe_dispatcher must be alltoall or einsum, or deepep or "
                            f"hybridep on an NVIDIA cluster (gpu_arch set), got {sw.moe_dispatcher!r}")
        if sw.moe_dispatcher == "hybridep" and sw.framework != "megatron-core":
            raise UserError(f"cluster {self.name}: [software] moe_dispatcher = \"hybridep\" is Megatron-Core's "
                            f"(--moe-flex-dispatcher-backend hybridep): needs framework = \"megatron-core\", got "
                            f"{sw.framework}")
        if not re.fullmatch(r"\d+\.\d+", str(sw.nccl)):
            raise UserError(f"cluster {self.name}: [software] nccl must be an NCCL release as \"major.minor\" (e.g. "
                            f"\"2.27\"), got {sw.nccl!r}")
        if not set(filter(None, sw.int8_forward_only.split("+"))) <= set(INT8_PARTS):
            raise UserError(f"cluster {self.name}: [software] int8_forward_only must name layer parts joined by + "
                            f"({', '.join(INT8_PARTS)}), or be empty, got {sw.int8_forward_only!r}")
        if not sw.moe_imbalance >= 1:
            raise UserError(f"cluster {self.name}: [software] moe_imbalance must be >= 1 (the busiest expert-parallel "
                            f"rank's tokens over the balanced share; 1: balanced), got {sw.moe_imbalance!r}")
        if not 0 <= self.software.overlap_efficiency <= 1:
            raise UserError(f"cluster {self.name}: [software] overlap_efficiency must be in [0, 1]")
        if self.overlap_slowdown is not None and (isinstance(self.overlap_slowdown, bool) or not isinstance(
                self.overlap_slowdown, (int, float)) or not 0 <= self.overlap_slowdown < 1):
            raise UserError(f"cluster {self.name}: overlap_slowdown must be a number in [0, 1) (the fraction of "
                            f"compute lost beside a collective), got {self.overlap_slowdown!r}")
        if not 0 <= self.device_spread < 0.5:
            raise UserError(f"cluster {self.name}: device_spread must be in [0, 0.5) (the standard deviation of "
                            f"device speed, a fraction), got {self.device_spread!r}")
        if not self.host_linear_s >= 0:
            raise UserError(f"cluster {self.name}: host_linear_s must be >= 0 seconds (the host time of one "
                            f"torch.nn.Linear forward; 0: none), got {self.host_linear_s!r}")
        if self.calibrated_ranks < 0:
            raise UserError(f"cluster {self.name}: calibrated_ranks must be >= 0 (0: devices do not share cores)")
        overheads = (self.op_overhead_s, self.fsdp_unit_overhead_s, self.fsdp_tensor_overhead_s)
        if min(overheads) < 0 or any(r[-1] <= 0 for r in self.attention_rates + self.gemm_rates):
            raise UserError(f"cluster {self.name}: op_overhead_s and the fsdp overheads must be >= 0 and measured "
                            "rates positive")
        if self.rates_precision not in ("fp32", "bf16"):
            raise UserError(f"cluster {self.name}: rates_precision must be fp32 or bf16 (what gemm_rates and "
                            f"attention_rates were measured in), got {self.rates_precision!r}")
        if any(len(c) != 3 or c[1] < 0 or c[2] <= 0 for c in self.collectives):
            raise UserError(f"cluster {self.name}: each of collectives needs collective, latency >= 0, "
                            "bandwidth > 0")

    def with_software(self, **changes) -> "ClusterSpec":
        """This cluster with these [software] fields changed (a run's own NCCL release, the runtime's switches)."""
        return replace(self, software=replace(self.software, **changes))

    def check_precision(self, precision: str) -> None:
        """FP8 asked of a cluster without FP8 data (no fp8 peak, as A100 has no FP8 tensor cores) or MXFP8 of
        one without block-scaled units (before Blackwell): one line."""
        if is_fp8(precision) and not self.peak_flops_fp8:
            raise UserError(f"cluster {self.name}: no FP8 data (peak_flops_fp8 is 0: {self.accelerator} has no FP8 "
                            "matrix units on record); use --precision bf16, or a cluster file giving peak_flops_fp8")
        if precision == "int8" and not self.peak_flops_int8:
            raise UserError(f"cluster {self.name}: no int8 data (peak_flops_int8 is 0: int8 training is planned on "
                            "TPUs, whose datasheets give an int8 peak); use --precision bf16, or a cluster file giving "
                            "peak_flops_int8")
        if precision == "fp8" and self.fp8_recipe(precision) == "blockwise" and not self.fp8_block_gemm_share:
            raise UserError(f"cluster {self.name}: no FP8 block-scaling data (fp8_block_gemm_share is 0: no "
                            f"measurement of {self.accelerator}'s block-scaled FP8 GEMMs on record); use [software] "
                            "fp8_scaling delayed or current, or a cluster file giving fp8_block_gemm_share")
        if precision == "mxfp8" and not self.mxfp8_gemm_share:
            raise UserError(f"cluster {self.name}: no MXFP8 data (mxfp8_gemm_share is 0: {self.accelerator} has no "
                            "block-scaled FP8 matrix units on record; NVIDIA's came with Blackwell); use --precision "
                            "fp8, or a cluster file giving mxfp8_gemm_share")
        if self.software.fp8_param_gather and not is_fp8(precision):
            raise UserError(f"cluster {self.name}: [software] fp8_param_gather gathers FP8 parameters; it needs "
                            f"--precision fp8 or mxfp8, got {precision}: drop it or change the precision")
        if self.software.precision_aware_optimizer and precision not in ("bf16", "fp8", "mxfp8"):
            raise UserError(f"cluster {self.name}: [software] precision_aware_optimizer splits a mixed-precision "
                            f"run's fp32 master; it needs --precision bf16, fp8 or mxfp8, got {precision}: drop it "
                            f"or change the precision")
        if self.software.fp8_attention and not is_fp8(precision):
            raise UserError(f"cluster {self.name}: [software] fp8_attention runs the attention core in FP8; it needs "
                            f"--precision fp8 or mxfp8, got {precision}: drop it or change the precision")
        if self.software.int8_forward_only and precision != "int8":
            raise UserError(f"cluster {self.name}: [software] int8_forward_only says which parts AQT quantizes; it "
                            f"needs --precision int8, got {precision}: drop it or change the precision")

    def peak_flops(self, precision: str) -> float:
        peak = {"bf16": self.peak_flops_bf16, "fp8": self.peak_flops_fp8 or self.peak_flops_bf16,
                "fp32": self.peak_flops_fp32 or self.peak_flops_bf16 / 2, "int8": self.peak_flops_int8}
        return peak.get("fp8" if is_fp8(precision) else precision, self.peak_flops_bf16)

    def gemm_peak(self, precision: str) -> float:
        """The peak the linear layers' GEMMs run against (matmul_efficiency of it at best): FP8 GEMMs at the
        measured speed-up over bf16 ones, within the fp8 peak; MXFP8 and block-scaled ones at their share of that
        (`fp8_recipe`); int8 ones (kernels.linear_pass_seconds) at their measured speed-up over bf16 ones, else at
        the int8 peak."""
        if is_fp8(precision):
            fp8 = min(self.peak_flops("fp8"), self.peak_flops_bf16 * self.fp8_gemm_speedup)
            share = {"mxfp8": self.mxfp8_gemm_share, "blockwise": self.fp8_block_gemm_share}
            return fp8 * share.get(self.fp8_recipe(precision), 1.0)
        if precision == "int8" and self.int8_gemm_speedup:
            return self.peak_flops_bf16 * self.int8_gemm_speedup
        return self.peak_flops(precision)

    def bf16_work_peak(self, precision: str) -> float:
        """The peak of the work 8-bit recipes keep in bf16: the attention core (Transformer Engine's fp8_dpa is
        off by default, and [software] fp8_attention is costed as its measured speed over bf16's; AQT quantizes the
        projections' dot_generals) and the output head (Megatron-Core's output
        layer is not a Transformer Engine module; MaxText reads the logits off the embedding with a plain dot)."""
        return self.peak_flops("bf16" if is_quantized(precision) else precision)

    @property
    def fp8_scaling(self) -> str:
        """FP8's scaling, [software] fp8_scaling or the framework's."""
        return self.software.fp8_scaling or FRAMEWORK_FP8_SCALING[self.software.framework]

    def fp8_recipe(self, precision: str) -> str:
        """The FP8 recipe the kernels run: "mxfp8", or FP8's scaling ("delayed", "current", "blockwise"). Blackwell
        runs blockwise scaling with MXFP8's kernels (Transformer Engine emulates it so: its gemm_profiling page)."""
        blockwise_as_mx = self.fp8_scaling == "blockwise" and self.gpu_arch == "blackwell"
        return "mxfp8" if precision == "mxfp8" or blockwise_as_mx else self.fp8_scaling

    @property
    def achieved_hbm_bandwidth(self) -> float:
        """Bytes/s the cost model charges memory traffic at: the datasheet bandwidth that copies reach."""
        return self.hbm_bandwidth * self.hbm_efficiency

    @property
    def fast_domain(self) -> int:
        """Devices joined by the fastest tier (NVLink domain, or the whole ICI slice on a TPU)."""
        if self.torus:
            return _prod(self.torus)
        return self.tiers[0].size or 1 << 62

    def to_dict(self) -> dict:
        return asdict(self)


def _prod(xs) -> int:
    out = 1
    for x in xs:
        out *= x
    return out


GB = 1e9
HOST_LINEAR_S = {"intel": 13.5e-6, "amd": 13.5e-6, "arm": 37.1e-6}  # a torch.nn.Linear forward (_gpu's comment)
MiB, GiB = 2**20, 2**30  # HBM stacks come in binary sizes: an "80 GB" GPU holds 80 GiB


def _gpu(name, accel, bf16, fp8, fp32, hbm, hbm_bw, eff, nvlink, nvlink_size, nic, price, sms, attention,
         nvlink_eff=0.80, nic_eff=0.96, fast="nvlink", fast_latency=1.5e-6, **kw) -> ClusterSpec:
    # Latencies: NCCL ring step ~1-2 us inside NVLink, ~5 us across InfiniBand (nccl-tests small-message
    # all_reduce on DGX systems: ~10-20 us for 8 GPUs, ~30-60 us across nodes).
    # GEMM blocks: cuBLAS/CUTLASS bf16 kernels on Ampere and Hopper tile the output 128x256 and fill a
    # 3-stage shared-memory pipeline of k-slices of 64 before the first MMA, so each tile pays ~128 of k
    # (NVIDIA "Matrix Multiplication Background" guide: tile and wave quantization; Anthony et al. 2024,
    # arXiv:2401.14489, sec. 4: GEMM throughput against shape).
    # Software: Megatron-Core's defaults (the Software dataclass), the framework the published GPU runs use.
    # Device spread: Sinha et al. 2022 (SC22, arXiv:2208.11035) measured 8% average performance variation
    # (fastest to slowest, outliers aside) among same-SKU GPUs of clusters of thousands (Summit, Vortex,
    # Frontera, Longhorn: V100; Corona: MI60), from power management and manufacturing; read as the expected
    # range 2 sigma sqrt(2 ln n) of n ~ 5,000 normal draws, sigma = 1%. No figure for newer GPUs: the same.
    # Achieved HBM and the fixed GEMM time: benchmarks/kernel_scan.py on this workplace's H100, 2026-11-28
    # (benchmarks/data/kernel_scan_h100.json): a 4 GiB copy moved 3,025 of 3,350 GB/s (0.90; an add 3,070,
    # 0.92; the device notes' 2026-11-13 copy, about 3.0 TB/s, agrees); its one-wave GEMMs (512 and 1024 x
    # 4096 x 4096, 2048^3, bf16 and FP8, within one wave of 128x256 tiles) took 4.1-8.6 us more than their
    # tiles and waves, median 6.3 us. Other GPUs have no such scan here: the H100's figures stand in.
    # Host time of a torch.nn.Linear forward, bf16, CPU time per call beside its GPU kernel (NVIDIA/
    # TransformerEngine issue #2053, 2025-08, hidden 2048, 8192 tokens): 13.5 us on DGX H100's Xeon 8480C, 37.1
    # on GB200's Grace (33.2 on GH200's). AMD EPYC hosts: no figure, the Xeon's.
    tiers = (Tier(fast, nvlink_size, nvlink, fast_latency, nvlink_eff), Tier("ib", 0, nic, 5e-6, nic_eff))
    kw.setdefault("host_linear_s", HOST_LINEAR_S[kw.get("host_cpu", "intel")])
    kw.setdefault("software", Software(framework="megatron-core"))
    kw.setdefault("device_spread", 0.01)
    kw.setdefault("hbm_efficiency", 0.90)
    kw.setdefault("gemm_kernel_overhead_s", 6.3e-6)
    return ClusterSpec(name=name, accelerator=accel, peak_flops_bf16=bf16, peak_flops_fp8=fp8,
                       peak_flops_fp32=fp32, hbm_bytes=hbm, hbm_bandwidth=hbm_bw, matmul_efficiency=eff,
                       tiers=tiers, default_devices=nvlink_size, price_per_device_hour=price, compute_units=sms,
                       gemm_tile=(128, 256), gemm_k_overhead=128, attention_efficiency=attention, **kw)


def _mi300(name, accel, hbm, hbm_bw) -> ClusterSpec:
    """AMD's MI300 die (MI300X, MI325X): one compute part, its HBM the difference; figures under PRESETS."""
    return _gpu(name, accel, 1307.4e12, 2614.9e12, 163.4e12, hbm, hbm_bw, 0.50, 448 * GB, 8, 50 * GB, 0.0, 304,
                0.251, nvlink_eff=0.707, fast="xgmi", fast_latency=12e-6, hbm_efficiency=0.78,
                host_bandwidth=55 * GB)


XLA = Software(framework="megatron-core", tp_wgrad_overlap=True)  # TPU software as _tpu's comment says


def _tpu(name, accel, bf16, int8, hbm, hbm_bw, ici_axis, dcn, torus, price, host, eff=0.90, mxu=128,
         int8_speedup=0.0) -> ClusterSpec:
    # ICI figure per torus axis with wraparound (two links, both directions), as the scaling book's W_ici.
    # What an ICI collective reaches of it, and a hop's latency: the book's profiles on v5e (Part 3, "Sharded
    # Matrices", worked problem on an AllGather over a 4-chip axis): 34 MB in 680 us where the link rate gives
    # 560 (0.83 once its hops' latency is taken off), and 32 kB shards over 3 hops in ~8 us where bandwidth
    # takes 2.1 (2 us a hop). DCN per chip (host NIC bandwidth / chips per host; the book's Part 2: "around 2.5e10
    # bytes / second per host"). What a cross-slice all-reduce reaches of it: 198 of 400 Gb/s a host (0.495), 1 GiB
    # a chip, 2 v6e slices of 4 chips on two 200 Gb/s NICs, libtpu 0.0.44 (a public measurement, 2026-08, public-
    # code index document 65728546346: best of 10-15 runs after 200 warm-ups, 198.0 +- 6.0 over three; raw TCP
    # reached 347.8 each way): MegaScale lowers psum to one host transfer and sums on the host CPU. Its hop latency
    # (10 us) rests on no measurement, and MaxText's multi-slice runs grow ~1.2 ms a layer per slice whatever their
    # bytes (docs/accuracy.md, "What a slice costs"). Matmuls run on MXUs of 128x128 up to v5p and 256x256 on
    # v6e (Cloud TPU system architecture pages; "performance guide": dimensions are padded to multiples of the
    # MXU's); large MXU-aligned matmuls run near peak (scaling book Part 1 takes them at peak; we keep 10% for the
    # vector-unit epilogue), and XLA schedules tiles without GPU-style waves.
    # Measured: XLA's bare bf16 jnp.matmul on v5e sustained 92.3% of peak at 8192^3 and 84.3% at 4096^3, Python
    # dispatch included (JAX's Pallas TPU matmul guide, docs/pallas/tpu/matmul.ipynb outputs); training's
    # matmuls carry fused epilogues that bare one has not.
    # Software: MaxText shards with FSDP (zero=3: one reduce per layer, whatever the framework); for zero 0-2 XLA
    # combines all-reduces up to a threshold we have no published figure for: Megatron-Core's buckets stand in.
    # XLA runs collectives as async fusions its scheduler places beside independent work (MaxText's configs set
    # --xla_tpu_enable_async_collective_fusion), so SP's backward reduce-scatter runs beside the weight-gradient
    # matmuls it does not feed (tp_wgrad_overlap).
    # No FP8: the docs give these chips a bf16 peak and an int8 one (integer MXU arithmetic), none for FP8. Int8
    # matmuls reach the same fraction of their peak as bf16 ones where no int8 scan is on record (v6e's below).
    tiers = (Tier("ici", _prod(torus), ici_axis, 2e-6, 0.83), Tier("dcn", 0, dcn, 10e-6, 0.495))
    return ClusterSpec(name=name, accelerator=accel, peak_flops_bf16=bf16, peak_flops_fp8=0.0,
                       peak_flops_fp32=bf16 / 2, peak_flops_int8=int8, int8_gemm_speedup=int8_speedup,
                       hbm_bytes=hbm, hbm_bandwidth=hbm_bw, matmul_efficiency=eff, tiers=tiers, torus=torus,
                       default_devices=_prod(torus), price_per_device_hour=price, gemm_tile=(mxu, mxu), software=XLA,
                       host_bandwidth=host)


# matmul_efficiency: the fraction of the dense peak the best-shaped bf16 GEMM sustains, the ceiling of the
# shape-aware GEMM model (cost/kernels.py). GPUs: the matmul-FLOPS finder scans of torch.matmul over shapes
# (Bekman, ml-engineering, compute/accelerator/README.md and benchmarks/README.md). Training keeps the GPU at
# its power limit, so the sustained figure (MSMF, after thermal soak) applies, not the boost burst (MAMF):
# H200 = H100 silicon at 700 W, MSMF 702.9 of 989 TFLOP/s (0.711; MAMF 828); B200 MSMF 1426-1456 of 2250
# (0.640; MAMF 1751). GB200 is rated 2.5 PFLOP/s, 11% over B200, but its MAMF is 1822 of 2500, 4% over B200's
# (same table), so GB200 takes B200's efficiencies times 1822/1751 x 2.25/2.5 = 0.9365: 0.599, and 0.378 for
# attention below; GB300 (not measured) takes GB200's, as B300 takes B200's. A100 (MAMF 271.2, 0.869; no MSMF
# there): Azure's cuBLASLt scan on ND A100 v4 after 10,000 warm-up launches (Azure/AI-benchmarking-guide
# Azure_Results/ND_A100_v4_results.md, fp16, the rate of bf16 on A100), 256.5 TFLOP/s at 16384^3 (0.822; 253.7
# at 8192^3, 250.8 at 6144x12288x12288), 0.946 of its MAMF; the 400 W part holds its clock where the 700-1000 W
# ones fall to 0.81-0.85 of theirs.
# attention_efficiency: a fused attention kernel's forward + backward rate (backward counted as 2.5x the
# forward's FLOPs, the papers' convention) at long causal sequences, head_dim 128, as training sustains it;
# shorter sequences and context-parallel chunks run slower along the same scans (cost/kernels.py
# attention_shape). A100: FlashAttention-2 forward + backward on the same soaked Azure node, 179.5 of 312
# TFLOP/s at seq 8192, head_dim 64, batch 2 (0.575; Dao 2023, arXiv:2307.08691, fig. 4, has ~189 at head_dim
# 128 from a short burst). H100/H200: cuDNN (Transformer Engine's kernel),
# forward 539 and backward ~467 TFLOP/s at 16k causal, 486 together (Shah et al. 2024, arXiv:2407.08608,
# figs. 5-6, measured at a fixed 1830 MHz, the clock of the 989 TFLOP/s peak), times H100's sustained/burst
# GEMM ratio 702.9/794.5 (MSMF/MAMF): 0.434. Blackwell (no scan before 2025 on record): Hopper's 0.491 of the
# peak times B200's own 1441/1751: 0.404 (GB200 and GB300: 0.378, above). cuDNN's own B200 scan agrees within
# 3% (NVIDIA/cudnn-frontend benchmark/sdpa_benchmark_training/artifacts, PyTorch's cuDNN back end, 16k causal:
# forward 1332, backward 1075 TFLOP/s, 1137 together, times 1441/1751: 0.416). Newer cuDNN runs faster there
# (9.22 on GB200, 2026: 0.467 by the same reading), so the figure stands for the cuDNN of 2024-25 runs.
# Bus-bandwidth efficiencies are nccl-tests all_reduce busbw over the link rate on DGX systems:
# A100 NVLink3 ~230 of 300 GB/s (0.78), H100 NVLink4 ~360-380 of 450 GB/s (0.80). A NIC: 0.96 of its line rate,
# as NCCL's team measures across nodes: DGX A100's 8 HDR NICs 192 of 200 GB/s of all-reduce busbw
# (NVIDIA/nccl#812), 24 GB/s a HDR NIC (NVIDIA/nccl#412), 46-48 and 48-49 GB/s a ConnectX-7 at NDR
# (NVIDIA/nccl-tests#290, #267); rings between GB200 partitions moved 49.2 (NVIDIA/nccl#1801, within 3% here);
# NVLink5 ring 680 of 900 GB/s at 8 GiB on a GB200 tray (Azure/AI-benchmarking-guide ND_GB200_v6_results.md,
# NCCL 2.25.1, NCCL_ALGO=Ring: 0.76, B200's too). NVLS (NVLink SHARP) all-reduce ceilings: 8 H100/H200 ~480
# GB/s (NCCL's maintainer in NVIDIA/nccl-tests#212; Azure ND_H200_v5_results.md 8 GiB: 480), 72 GB200
# 835-847 GB/s at 4-8 GiB (coreweave/nccl-tests#43); 8 B200 840.6-844.9 at 16-32 GiB on two clusters
# (togethercomputer/together-nccl-tests baselines/use3a-ss and flapping-airplanes, NCCL 2.29.7 and 2.28.9).
# fp8_gemm_speedup per generation: the sustained FP8 GEMM rate over the preset's sustained BF16 one, where a
# soaked FP8 scan exists: Azure's AI-benchmarking-guide, cuBLASLt FP8 after 10,000 warm-up launches, 16384^3
# (the shape of A100's figure): H100 1377.3 TFLOP/s over 0.711 x 989 = 703.2, 1.959 (H800: the same silicon);
# H200 1366.3, 1.943; GB200 2906.9 over 0.599 x 2500 = 1497.5, 1.941. FP8 keeps 0.98 of its burst MAMF under
# soak where BF16 keeps 0.885 (H100), so the burst ratio (1402.6/794.5 = 1.77) understated it. Without a soaked
# scan, the FP8 over the BF16 MAMF of the same scan (ml-engineering compute/accelerator/README.md, "Maximum
# Achievable Matmul FLOPS comparison table"): B200 3432.5/1745.0 = 1.97, B300 3353.3/1769.0 = 1.90 (GB300:
# B300's; not measured); MI300X the 1.75 default, which its own soaked hipBLASLt scan agrees with (below).
# Transformer Engine's GEMM benchmark (NVIDIA/TransformerEngine docs/examples/gemm_profiling and
# benchmarks/gemm/benchmark_gemm.py, 2026: a 4096-hidden layer's twelve GEMMs at 15,872 tokens, operands
# quantized beforehand) agrees: tensor-wise FP8 over BF16 1.923 on B300 (13.102 / 6.812 ms; preset 1.90) and
# 1.905 on H200 NVL (31.968 / 16.785; preset 1.943). mxfp8_gemm_share, from the same B300 run: MXFP8's twelve
# GEMMs took 7.161 ms against tensor-wise FP8's 6.812, 0.951. B200, GB200 and GB300 (the same block-scaled
# tensor cores) take B300's share; Hopper and older have none.
# gpu_arch selects NCCL's tuner constants (cost/collectives.py); DGX A100's host is AMD EPYC 7742, DGX H100's
# Intel Xeon 8480C, GB200's Grace (Arm).
# host_bandwidth, the datasheets' host link, one way: A100 SXM PCIe Gen4 64 GB/s (32), H100/H800/H200 SXM PCIe
# Gen5 128 GB/s (64), MI300X/MI325X PCIe Gen5 x16 128 GB/s (64); TPUs, the scaling book's Part 2 ("PCIe
# bandwidth is typically around 1.5e10 bytes / second per chip", 16 GB/s each way on v4, 32 GB/s on v6e); none
# stated here for B200/B300 (0). Where a pinned copy was measured, its rate, the slower way: Azure's
# AI-benchmarking-guide (nvbandwidth host to device / device to host) 51 / 52 GB/s on ND H100 v5, 52 / 52 on
# ND H200 v5, 201 / 193 on ND GB200 v6 (Grace's NVLink-C2C; GB300, the same link, takes it), and on ND MI300X
# v5 (TransferBench) 55 / 56. Its ND A100 v4 row, 26.3 / 6.3, reads as that VM's and not the DGX A100's (a
# one-way gap of 4x no datasheet explains): A100 keeps the link's rate.
MXFP8_GEMM_SHARE = 6.812 / 7.161  # the B300 measurement above: MXFP8 GEMMs at 0.951 of tensor-wise FP8
# Block-scaled FP8 on Hopper, from the same benchmark's H200 NVL run: Float8BlockScaling's twelve GEMMs took 22.882 ms
# a layer with their operands quantized in the call (the page has no pre-quantized figure for it: Hopper's cuBLAS
# takes no 2D-by-2D block-scaled operands). Its quantization moves what delayed scaling's does (a read, a row-wise and
# a column-wise write, no amax pass) plus an fp32 scale per 128, 4 1/16 bytes an element to 4 (kernels.fp8_cast_bytes),
# so it takes delayed's measured 2.193 ms x 4.0625 / 4; the GEMMs the rest, 20.65 ms against tensor-wise's 16.785.
# Hopper presets take it (their tensor cores are the H200's); Blackwell runs blockwise scaling as MXFP8
# (ClusterSpec.fp8_recipe).
FP8_BLOCK_GEMM_SHARE = 16.785 / (22.882 - 2.193 * 4.0625 / 4)
PRESETS: dict[str, ClusterSpec] = {
    # NVIDIA A100 datasheet: 312 TFLOP/s bf16, 19.5 fp32 (156 TF32), no FP8, 80 GB HBM2e at 2.039 TB/s, 108 SMs
    # (nvidia-smi reports 81920 MiB);
    # DGX A100: NVLink3 600 GB/s bidirectional per GPU (300 one way), 8x HDR 200 Gb/s NICs (25 GB/s per GPU).
    "a100-80gb": _gpu("a100-80gb", "A100-SXM4-80GB", 312e12, 0.0, 19.5e12, 81920 * MiB, 2.039e12, 0.822,
                      300 * GB, 8, 25 * GB, 1.8, 108, 0.575, nvlink_eff=0.78, gpu_arch="ampere", host_cpu="amd",
                      host_bandwidth=32 * GB),
    # The datasheet's 40 GB A100 SXM: HBM2 at 1.555 TB/s, the same die, clocks and NVLink3 (DGX A100 320GB: the
    # same 8 HDR NICs); no price on record.
    "a100-40gb": _gpu("a100-40gb", "A100-SXM4-40GB", 312e12, 0.0, 19.5e12, 40960 * MiB, 1.555e12, 0.822,
                      300 * GB, 8, 25 * GB, 0.0, 108, 0.575, nvlink_eff=0.78, gpu_arch="ampere", host_cpu="amd",
                      host_bandwidth=32 * GB),
    # NVIDIA H100 SXM datasheet: 989 TFLOP/s bf16 dense, 1979 fp8, 67 fp32; 80 GB HBM3 at 3.35 TB/s, 132 SMs
    # (nvidia-smi reports 81559 MiB);
    # DGX H100: NVLink4 900 GB/s bidirectional (450 one way), 8x ConnectX-7 NDR 400 Gb/s (50 GB/s per GPU).
    "h100-80gb": _gpu("h100-80gb", "H100-SXM5-80GB", 989e12, 1979e12, 67e12, 81559 * MiB, 3.35e12, 0.711,
                      450 * GB, 8, 50 * GB, 2.5, 132, 0.434, gpu_arch="hopper", nvls_bandwidth=480 * GB,
                      host_bandwidth=51 * GB, fp8_gemm_speedup=1.959, fp8_block_gemm_share=FP8_BLOCK_GEMM_SHARE),
    # NVIDIA H800 SXM5 (datasheet): H100's compute and HBM with NVLink cut to 400 GB/s bidirectional (200 one
    # way); DeepSeek-AI 2024 (DeepSeek-V3 report sec. 3.1) and DeepEP's README describe its clusters: 8 GPUs on
    # NVSwitch, a ConnectX-7 400 Gb/s (50 GB/s) NIC per GPU, NVLink measured at ~160 GB/s (0.80, H100's
    # fraction). No NVLS or price on record.
    "h800": _gpu("h800", "H800-SXM5-80GB", 989e12, 1979e12, 67e12, 81559 * MiB, 3.35e12, 0.711,
                 200 * GB, 8, 50 * GB, 0.0, 132, 0.434, gpu_arch="hopper", host_bandwidth=64 * GB,
                 fp8_gemm_speedup=1.959, fp8_block_gemm_share=FP8_BLOCK_GEMM_SHARE),
    # NVIDIA H200 datasheet: same compute as H100, 141 GB HBM3e at 4.8 TB/s (nvidia-smi: 143771 MiB); DGX H200
    # has the fabric of DGX H100. benchmarks/kernel_scan.py on this workplace's H200, 2026-11-28
    # (benchmarks/data/kernel_scan_h200.json): a 4 GiB copy 4,253 GB/s of 4,800 (0.89; an add 4,387, 0.91);
    # the one-wave GEMMs 6.2-13.0 us over their tiles and waves, median 8.1 us.
    "h200": _gpu("h200", "H200-SXM-141GB", 989e12, 1979e12, 67e12, 143771 * MiB, 4.8e12, 0.711,
                 450 * GB, 8, 50 * GB, 3.5, 132, 0.434, gpu_arch="hopper", nvls_bandwidth=480 * GB,
                 fp8_gemm_speedup=1.943, hbm_efficiency=0.89, gemm_kernel_overhead_s=8.1e-6, host_bandwidth=52 * GB,
                 fp8_block_gemm_share=FP8_BLOCK_GEMM_SHARE),
    # NVIDIA B200 (DGX B200 datasheet): 2.25 PFLOP/s bf16 dense, 4.5 fp8, 180 GB HBM3e at 8 TB/s (per GPU of
    # the 1440 GB system), 148 SMs, NVLink5 1.8 TB/s bidirectional (900 one way), 8x ConnectX-7 400 Gb/s.
    "b200": _gpu("b200", "B200-180GB", 2.25e15, 4.5e15, 75e12, 180 * GB, 8e12, 0.640,
                 900 * GB, 8, 50 * GB, 5.0, 148, 0.404, nvlink_eff=0.76, gpu_arch="blackwell", fp8_gemm_speedup=1.97,
                 nvls_bandwidth=840 * GB, mxfp8_gemm_share=MXFP8_GEMM_SHARE),
    # GB200 NVL72 datasheet: 72 GPUs in one NVLink domain, 2.5 PFLOP/s bf16 dense, 5 fp8 per GPU,
    # 186 GB HBM3e at 8 TB/s, NVLink5 900 GB/s one way. Across racks a ConnectX-7 400 Gb/s NIC (50 GB/s) per GPU:
    # "4x NVIDIA ConnectX-7 single port 400G OSFP NIC" per 4-GPU compute tray (DGX GB200 user guide, Hardware);
    # ConnectX-8's 800 Gb/s came with GB300.
    "gb200-nvl72": _gpu("gb200-nvl72", "GB200", 2.5e15, 5e15, 80e12, 186 * GB, 8e12, 0.599,
                        900 * GB, 72, 50 * GB, 6.0, 148, 0.378, nvlink_eff=0.76, gpu_arch="blackwell",
                        nvls_bandwidth=840 * GB, host_cpu="arm", fp8_gemm_speedup=1.941, host_bandwidth=193 * GB,
                        mxfp8_gemm_share=MXFP8_GEMM_SHARE),
    # NVIDIA Blackwell Ultra, from the datasheets (HGX B300: per GPU 2.25 PFLOP/s bf16 dense, 4.5 fp8 (the same
    # as B200; FP4 is what grew), 288 GB HBM3e at 8 TB/s, NVLink5 900 GB/s one way, ConnectX-8 800 Gb/s (100 GB/s)
    # per GPU; GB300 NVL72: 72 GPUs, 2.5 PFLOP/s bf16 dense and 5 fp8 per GPU, 288 GB at 8 TB/s). Blackwell
    # Ultra has 160 SMs. B300's BF16 MAMF (1769) is within 1% of B200's, so B200's GEMM and attention fractions
    # stand, and GB200's for GB300; no NVLink or NVLS figures yet: B200's and GB200's (the same NVLink switch
    # system) stand in; no price or power on record.
    "b300": _gpu("b300", "B300-288GB", 2.25e15, 4.5e15, 75e12, 288 * GB, 8e12, 0.640, 900 * GB, 8, 100 * GB, 0.0,
                 160, 0.404, nvlink_eff=0.76, gpu_arch="blackwell", fp8_gemm_speedup=1.90, nvls_bandwidth=840 * GB,
                 mxfp8_gemm_share=MXFP8_GEMM_SHARE),
    "gb300-nvl72": _gpu("gb300-nvl72", "GB300", 2.5e15, 5e15, 80e12, 288 * GB, 8e12, 0.599, 900 * GB, 72, 100 * GB,
                        0.0, 160, 0.378, nvlink_eff=0.76, gpu_arch="blackwell", nvls_bandwidth=840 * GB,
                        host_cpu="arm", fp8_gemm_speedup=1.90, host_bandwidth=193 * GB,
                        mxfp8_gemm_share=MXFP8_GEMM_SHARE),
    # AMD Instinct MI300X datasheet: 1307.4 TFLOP/s bf16 dense, 2614.9 fp8, 163.4 fp32 matrix, 192 GB HBM3 at
    # 5.3 TB/s, 304 CUs; 8 GPUs fully connected by Infinity Fabric, 7 links of 64 GB/s one way (448 GB/s);
    # 400 Gb/s NIC per GPU. MI325X: the same compute die, 256 GB HBM3E at 6 TB/s. GEMM: MAMF 781.9 of 1300
    # (ml-engineering's MAMF table, ROCm 6.2; 0.601), sustained by the burst-to-sustained ratio measured on
    # NVIDIA's 700-1000 W parts (0.83, H100 and B200 MSMF/MAMF; see matmul_efficiency above): 0.50. Measured on
    # ND MI300X v5 (Azure's AI-benchmarking-guide, its AMD port, Azure_Results/ND_MI300X_v5_results.md, 2025-02,
    # ROCm 6.2, RCCL 2.22.3): hipBLASLt FP8 after 10,000 warm-up launches, 1148.7-1159.5 TFLOP/s at
    # 6144x12288x12288, where 0.50 x 1.75 (fp8_gemm_speedup) x 1307.4 gives 1144; a stream copy 4.11-4.15 TB/s
    # of 5.3 (0.78); FlashAttention-2 (ROCm's, Dao's benchmark, head_dim 64, batch 2, seq 8192, as A100's figure
    # above) 328.6 TFLOP/s forward + backward (0.251). Collectives are RCCL's, not NCCL's tuner (gpu_arch unset:
    # alpha-beta). RCCL's all-reduce over the 8 GPUs costs 72 us, then moves bytes at 316.8 GB/s bus bandwidth
    # (0.707 of the links; its 8 GiB figure): that fits its curve within 6.6% from 1 MiB to 8 GiB
    # (benchmarks/nccl_curves.py). The alpha-beta all-reduce takes 2 log2(8) = 6 steps: 12 us a step. No RCCL
    # all-gather or reduce-scatter curve is on record; they pay the same step, 7 of them. MI325X (not measured)
    # takes MI300X's fractions.
    "mi300x": _mi300("mi300x", "MI300X-192GB", 192 * GB, 5.3e12),
    "mi325x": _mi300("mi325x", "MI325X-256GB", 256 * GB, 6.0e12),
    # TPU v6e (Trillium; Cloud TPU docs): 918 TFLOP/s bf16, 1836 int8, 32 GiB HBM at 1.64 TB/s, 2D torus 16x16
    # (256 chips a pod), ICI 9e10 B/s bidirectional per link (scaling book Part 2), 1.8e11 per axis; DCN 1.25e10
    # B/s per chip and PCIe 3.2e10 (the same part: "12.5e9 for TPU v6e" against v5e's 3.125e9); $2.70 per
    # chip-hour on demand. Its matmuls do not run near peak as v5e's do: a bf16 8192^3 jax.lax.dot_general took
    # 1,510.9 us of device time in a profiler trace, 727.7 TFLOP/s, 0.79 of peak (yangwhale/gpu-tpu-pedia
    # tpu/v7_perf results_trace_test.csv, 2026-02-11; 0.75 timed from Python at 4096 x 8192 x 8192, findings.md),
    # so 0.79 is its ceiling here, not v5e's 0.90. Int8 matmuls do not reach twice that: the same repository's
    # Python-timed scan (results_v6e.csv, 2026-02-09) ran 8192^3 in 1,645.7 us in bf16 and 973.9 in int8; less the
    # 134.8 us the bf16 one spent beyond its traced device time, int8 runs 1.80x bf16 (0.71 of its peak).
    "tpu-v6e": _tpu("tpu-v6e", "TPU v6e", 918e12, 1836e12, 32 * GiB, 1.64e12, 1.8e11, 12.5e9, (16, 16), 2.7, 32e9,
                    eff=0.79, mxu=256, int8_speedup=1.80),
    # TPU v5p (Cloud TPU docs, scaling book Part 2): 4.59e14 bf16, 9.18e14 int8, 95 GiB HBM at 2.765 TB/s,
    # ICI 9e10 B/s bidirectional per link, so 1.8e11 per torus axis with wraparound (the book's W_ici);
    # pods of up to 8960 chips, 16x16x16 = 4096 per slice here; DCN 6.25e9 B/s per chip (Cloud TPU v5p docs:
    # "data center network bandwidth per chip, 50 Gbps").
    "tpu-v5p": _tpu("tpu-v5p", "TPU v5p", 4.59e14, 9.18e14, 95 * GiB, 2.765e12, 1.8e11, 6.25e9,
                    (16, 16, 16), 4.2, 1.5e10),
    # TPU v5e: 1.97e14 bf16, 3.94e14 int8, 16 GiB HBM at 8.1e11 B/s, 2D torus 16x16, ICI 4.5e10 per link
    # bidirectional (9e10 per axis with wraparound), DCN 3.125e9 per chip (Cloud TPU v5e docs: "data center
    # network bandwidth per Pod, 6.4 Tbps" over its 256 chips).
    "tpu-v5e": _tpu("tpu-v5e", "TPU v5e", 1.97e14, 3.94e14, 16 * GiB, 8.1e11, 9e10, 3.125e9, (16, 16), 1.2, 1.5e10),
    # TPU v4: 2.75e14 bf16 and as many int8 OP/s (the docs give both 275 T), 32 GiB HBM at 1.2e12 B/s, 3D torus
    # up to 16x16x16 (4096), ICI 4.5e10 per link bidirectional (9e10 per axis), DCN ~6.25e9 per chip.
    "tpu-v4": _tpu("tpu-v4", "TPU v4", 2.75e14, 2.75e14, 32 * GiB, 1.2e12, 9e10, 6.25e9, (16, 16, 16), 3.2, 16e9),
    # This machine: 2 AMD EPYC cores, 23 GB RAM, torch CPU kernels, gloo over loopback TCP, one core per rank.
    # fp32: measured 3.3-3.5e10 FLOP/s for single-thread torch GEMMs from 512x64x176 (tiny's shapes) to
    # 1024^3 (2026-11-23); bf16 has no native CPU GEMM here, rough 1e10. gloo all_reduce over loopback,
    # 2 ranks (tests/multirank.py): 0.77-0.87 GB/s bus bandwidth for 4-16 MB, 0.77 ms for 4 bytes (two ring
    # steps, ~0.35 ms each) while three engineers shared the cores. Issue 4's trainer measures whole steps.
    # Software: torch's (FSDP2 units), with our runtime's gradient buckets: its default --bucket-mb 25, torch
    # DDP's bucket_cap_mb, of fp32 gradient (the "torch" FRAMEWORK_BUCKETS; runtime/loop/config.py bucket_mb,
    # parallel/data_parallel.py grad_buckets), and its eager element-wise operators (runtime/measure/live.py
    # run_cluster), so that `predict` here and `train --predict` agree.
    "local-cpu": ClusterSpec(name="local-cpu", accelerator="cpu (2 cores)", peak_flops_bf16=1e10,
                             peak_flops_fp8=0.0, peak_flops_fp32=3.4e10, hbm_bytes=8 * GB, hbm_bandwidth=10e9,
                             matmul_efficiency=1.0, tiers=(Tier("loopback", 0, 0.87e9, 3.5e-4, 1.0),),
                             default_devices=2, gemm_tile=(1, 1),
                             software=Software(framework="torch", param_gather_fp32=True, fused_elementwise=False)),
}

# Power per device, (board power, idle power) in W, for `meshscale scale`'s energy per token: a device draws
# board power while kernels run, compute or communication (Fernandez et al. 2024, arXiv:2411.13055, measured
# H100 power per GPU falling only 5.9% from 128 to 2,048 GPUs while throughput per GPU fell 37%), and idle
# power in the pipeline bubble. Board power: NVIDIA datasheets (A100 SXM 400 W, H100/H200 SXM 700 W, B200
# 1000 W, GB200 1200 W per GPU); TPU v4 170 W mean per chip (Jouppi et al. 2023, ISCA, Table 3). Idle: ~60 W
# for SXM boards (nvidia-smi power.draw at rest on DGX A100/H100), 90 W for Blackwell, 1/3 of board for TPU v4.
# TPU v5e/v5p and this machine have no published figure and report no energy.
POWER_W = {"a100-80gb": (400, 60), "a100-40gb": (400, 60), "h100-80gb": (700, 60), "h800": (700, 60),
           "h200": (700, 60), "b200": (1000, 90), "gb200-nvl72": (1200, 90), "tpu-v4": (170, 57)}
for _name, (_board, _idle) in POWER_W.items():
    PRESETS[_name] = replace(PRESETS[_name], board_power_w=_board, idle_power_w=_idle)


def load_cluster(name_or_path: str) -> ClusterSpec:
    """A preset name, or a JSON/TOML file holding ClusterSpec fields (tiers as a list of tables)."""
    if name_or_path in PRESETS:
        return PRESETS[name_or_path]
    data = read_spec_file(name_or_path, PRESETS, "cluster")
    data.setdefault("name", name_or_path)
    base = data.pop("base", None)  # {"base": "h100-80gb", "matmul_efficiency": 0.5} overrides a preset
    if base is not None:
        if base not in PRESETS:
            raise UserError(f"{name_or_path}: unknown base preset {base!r}; choose one of {', '.join(PRESETS)}")
        preset = PRESETS[base]
        if isinstance(data.get("software"), dict):  # a [software] table overrides the base's one key by key
            data["software"] = {**asdict(preset.software), **data["software"]}
        data = {**{name: getattr(preset, name) for name in ClusterSpec.__dataclass_fields__}, **data}
    hint = "" if base else f'; give them, or start from a preset: base = "h100-80gb" (any of {", ".join(PRESETS)})'
    return build(ClusterSpec, data, name_or_path, hint, also_known=("base",))


__all__ = ["ClusterSpec", "Software", "Tier", "PRESETS", "load_cluster"]
