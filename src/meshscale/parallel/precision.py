"""How the blocks compute: the training recipes `--precision` names (the cost model's PRECISIONS, cost/memory.py),
as parameter dtypes and the casts around the matrix multiplies:

  fp32       fp32 everywhere.
  bf16       fp32 parameters (the master weights), bf16 compute under torch.autocast, fp32 gradients and fp32
             gradient reduction: DDP and our ZeRO reduce the fp32 gradients; FSDP2 gathers bf16 copies and
             reduce-scatters in fp32 (MixedPrecisionPolicy, parallel/fsdp.py).
  bf16-pure  bf16 parameters, gradients, reductions and AdamW moments (torch's AdamW keeps its state in the
             parameter's dtype): no master copy.
  fp8        bf16's recipe with every eligible linear layer's matrix multiplies in float8 through torchao's
             Float8Linear (dynamic tensor-wise scales; Micikevicius et al. 2022, "FP8 Formats for Deep
             Learning"), on GPUs with float8 matrix units (compute capability 8.9 and newer).
  mxfp8      the same with block-scaled float8 (OCP Microscaling MX v1.0: a power-of-two scale for every 32
             elements) through torchao's MXFP8 training op, on GPUs with block-scaled tensor cores (Blackwell,
             compute capability 10.0 and newer).

--compile: torch.compile on each transformer block (one graph per block, as torchtitan does it: the
collectives between blocks and around them, FSDP2's gathers, the pipeline's sends, stay outside the graphs).
"""

import shutil

import torch
from torch import nn

from meshscale.cost.memory import PRECISIONS
from meshscale.specs.cluster import is_fp8

# the names the planner and the cost model use, but int8: AQT's int8 training is a TPU recipe (MaxText's), planned
# and written out (--emit maxtext) but not run by a torch trainer
RECIPES = tuple(p for p in PRECISIONS if p != "int8")
# compute capability of the first GPUs with float8 tensor cores (Ada, Hopper), with block-scaled ones (Blackwell)
FP8_CAPABILITY = {"fp8": (8, 9), "mxfp8": (10, 0)}


def autocast(precision: str, device: torch.device):
    """The context every forward runs in: bf16 autocast for the 16-bit recipes (under bf16-pure it keeps
    softmax and the other autocast-to-fp32 ops in fp32, as under bf16)."""
    return torch.autocast(device.type, dtype=torch.bfloat16, enabled=precision != "fp32")


def parameter_dtype(precision: str) -> torch.dtype:
    return torch.bfloat16 if precision == "bf16-pure" else torch.float32


def fsdp_policy(precision: str):
    """FSDP2's MixedPrecisionPolicy for the recipe: bf16 gathers and fp32 reduce-scatters under bf16 and fp8;
    under bf16-pure the parameters are bf16 already and so is the reduction; fp32 throughout otherwise."""
    from torch.distributed.fsdp import MixedPrecisionPolicy

    if precision == "bf16-pure":
        return MixedPrecisionPolicy(param_dtype=None, reduce_dtype=None)
    return MixedPrecisionPolicy(param_dtype=torch.bfloat16 if precision == "bf16" or is_fp8(precision) else None,
                                reduce_dtype=torch.float32)


def apply_precision(module: nn.Module, precision: str) -> None:
    """Give a chunk its recipe's parameters (meta or real; each keeps its identity, so tied parameters stay
    tied and a TP slice keeps its origin) and, under fp8, its float8 linear layers. Before data parallelism
    wraps it, so DDP's buckets, ZeRO's flat shards and FSDP2's shards take the parameters' dtype."""
    dtype = parameter_dtype(precision)
    with torch.no_grad():
        for p in module.parameters():
            if p.dtype != dtype:
                p.data = p.data.to(dtype)
    if precision == "fp8":
        from torchao.float8 import convert_to_float8_training

        convert_to_float8_training(module, module_filter_fn=lambda m, name: fp8_eligible(m, name, 16))
    elif precision == "mxfp8":
        from torchao.prototype.moe_training.config import MXFP8TrainingOpConfig
        from torchao.quantization import quantize_

        quantize_(module, MXFP8TrainingOpConfig(), filter_fn=lambda m, name: fp8_eligible(m, name, 32))


def fp8_eligible(module: nn.Module, name: str, multiple: int) -> bool:
    """Whether a layer's matrix multiplies go to float8: torch._scaled_mm needs both dimensions to be multiples
    of 16, MXFP8's scale blocks of 32; the output head stays in bf16 (its logits feed the loss: torchtitan and
    torchao's recipes leave it out too)."""
    return (isinstance(module, nn.Linear) and name != "output"
            and module.in_features % multiple == 0 and module.out_features % multiple == 0)


def fp8_refusal(precision: str, device_type: str, tp: int) -> str | None:
    """Why --precision fp8 or mxfp8 cannot run here, or None."""
    need = FP8_CAPABILITY[precision]
    units = ("float8 matrix units (compute capability 8.9+: L4, L40S, H100, H200, B200)" if precision == "fp8"
             else "block-scaled float8 tensor cores (Blackwell, compute capability 10.0+: B200, GB200, B300)")
    if device_type != "cuda":
        return f"--precision {precision} needs an NVIDIA GPU with {units}; this run is on the CPU: use --precision bf16"
    major, minor = torch.cuda.get_device_capability(0)
    if (major, minor) < need:
        instead = "fp8" if (major, minor) >= FP8_CAPABILITY["fp8"] else "bf16"  # a Hopper asked for mxfp8
        return (f"--precision {precision} needs compute capability {need[0]}.{need[1]} or newer; this GPU "
                f"({torch.cuda.get_device_name(0)}) is {major}.{minor}: use --precision {instead}")
    if tp > 1:
        return (f"--precision {precision} runs with tp=1 (the tensor-parallel linear layers are meshscale's own, "
                f"not torchao's float8 ones): use --precision bf16 with tp, or {precision} with dp/zero/pp")
    try:
        if precision == "fp8":
            import torchao.float8  # noqa: F401
        else:
            import torchao.prototype.moe_training.config  # noqa: F401
    except ImportError:
        return (f"--precision {precision} trains through torchao's float8 layers: pip install 'meshscale[fp8]' "
                f"(torchao {'0.12' if precision == 'fp8' else '0.18'} or newer)")
    return None


def compile_blocks(module: nn.Module) -> None:
    """torch.compile every transformer block's forward in place (after recompute wraps it). The forward, not the
    module's call: the hooks around it (FSDP2's gathers and reduce-scatters, TP's) stay eager, outside the graph,
    and the parameters keep their names (checkpoints and --init-from are unchanged)."""
    for block in module.layers.values():
        block.forward = torch.compile(block.forward)


def compile_refusal(device_type: str) -> str | None:
    """Why --compile cannot run here, or None: on CPU, inductor compiles its kernels with the C++ compiler."""
    if device_type == "cpu" and not any(shutil.which(cc) for cc in ("c++", "g++", "clang++")):
        return ("--compile on the CPU needs a C++ compiler (inductor builds its kernels with it): install g++ "
                "or leave --compile out")
    return None
