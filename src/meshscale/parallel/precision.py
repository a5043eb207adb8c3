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

--compile: torch.compile on each transformer block (one graph per block, as torchtitan does it: the
collectives between blocks and around them, FSDP2's gathers, the pipeline's sends, stay outside the graphs).
"""

import shutil

import torch
from torch import nn

from meshscale.cost.memory import PRECISIONS

RECIPES = tuple(PRECISIONS)  # the names the planner and the cost model use
FP8_CAPABILITY = (8, 9)  # Ada and Hopper: the first GPUs with float8 tensor cores (torch._scaled_mm)


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
    return MixedPrecisionPolicy(param_dtype=torch.bfloat16 if precision in ("bf16", "fp8") else None,
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

        convert_to_float8_training(module, module_filter_fn=fp8_eligible)


def fp8_eligible(module: nn.Module, name: str) -> bool:
    """torch._scaled_mm needs both dimensions to be multiples of 16; the output head stays in bf16 (its logits
    feed the loss: torchtitan and torchao's recipes leave it out too)."""
    return (isinstance(module, nn.Linear) and name != "output"
            and module.in_features % 16 == 0 and module.out_features % 16 == 0)


def fp8_refusal(device_type: str, tp: int) -> str | None:
    """Why --precision fp8 cannot run here, or None."""
    if device_type != "cuda":
        return ("--precision fp8 needs an NVIDIA GPU with float8 matrix units (compute capability 8.9+: L4, "
                "L40S, H100, H200, B200); this run is on the CPU: use --precision bf16")
    major, minor = torch.cuda.get_device_capability(0)
    if (major, minor) < FP8_CAPABILITY:
        return (f"--precision fp8 needs compute capability 8.9 or newer; this GPU "
                f"({torch.cuda.get_device_name(0)}) is {major}.{minor}: use --precision bf16")
    if tp > 1:
        return ("--precision fp8 runs with tp=1 (the tensor-parallel linear layers are meshscale's own, not "
                "torchao's float8 ones): use --precision bf16 with tp, or fp8 with dp/zero/pp")
    try:
        import torchao.float8  # noqa: F401
    except ImportError:
        return "--precision fp8 trains through torchao's float8 linear layers: pip install 'meshscale[fp8]'"
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
