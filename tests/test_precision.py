"""The precision recipes and --compile in one process: what a rank holds under each recipe against the cost
model's bytes per parameter, float8 layers where fp8 or mxfp8 is asked for (their refusal off-GPU:
test_train_cli), and a compiled run against the eager one. (Parity of bf16 and bf16-pure across layouts:
tests/test_train_matrix.py.)"""

import pytest
import torch

STEPS = 2


def _resolved(**kw):
    from meshscale.runtime.loop.config import TrainConfig, resolve

    return resolve(TrainConfig(**{"model": "tiny", "steps": STEPS, "global_batch": 4, "val_batches": 1, **kw}), 1)


def _tokens():
    from meshscale.runtime.loop.data import load_tokens

    return load_tokens(None)[: 1 << 18]


def _nbytes(tensors) -> int:
    return sum(t.numel() * t.element_size() for t in tensors)


def held_bytes(precision: str) -> dict:
    """Parameters, gradients (after a backward) and optimizer state (after a step) one process holds."""
    from meshscale.runtime.loop.trainer import Training, microbatches

    t = Training(_resolved(precision=precision), torch.device("cpu"), _tokens(), log=False)
    params = t.par.optim_params()
    t.step_fn(microbatches(t.data, 0, t.cfg, t.layout, t.mine))
    grads = [p.grad for p in params]
    t.optimizer.step()
    state = [v for s in t.optimizer.state.values() for v in s.values() if torch.is_tensor(v) and v.dim() > 0]
    return {"params": _nbytes(params), "grads": _nbytes(grads), "optimizer": _nbytes(state),
            "dtypes": {p.dtype for p in params} | {g.dtype for g in grads} | {v.dtype for v in state}}


@pytest.mark.parametrize("precision", ["fp32", "bf16", "bf16-pure"])
def test_held_bytes_are_the_cost_models(precision):
    from meshscale.cost.memory import memory_per_device
    from meshscale.specs.layout import Layout
    from meshscale.specs.model import PRESETS

    held = held_bytes(precision)
    want = memory_per_device(PRESETS["tiny"], Layout(dp=1), 4, precision=precision)
    if precision == "bf16":
        # torch's mixed precision: the fp32 parameters are the master weights and the gradients are fp32
        # (4 + 4 + 8 B/param); the cost model books ZeRO's split of the same 16 B/param (2 + 2 + 12), the
        # one Megatron and DeepSpeed hold. Equal in total (and so under zero=0 and zero=3), not per part.
        assert held["dtypes"] == {torch.float32}
        assert held["params"] + held["grads"] + held["optimizer"] == want.params + want.grads + want.optimizer
        assert held["params"] == 2 * want.params and held["optimizer"] == want.optimizer * 8 / 12
    else:
        assert held["dtypes"] == {torch.float32 if precision == "fp32" else torch.bfloat16}
        assert (held["params"], held["grads"], held["optimizer"]) == (want.params, want.grads, want.optimizer)


def test_fp8_swaps_the_eligible_linears_for_torchao_float8_ones():
    """The conversion itself runs anywhere (only the float8 matmuls need the GPU): every block linear becomes
    torchao's Float8Linear under the same parameter names; the output head stays a plain Linear."""
    from torchao.float8.float8_linear import Float8Linear

    from meshscale.models.transformer import meta_model
    from meshscale.parallel.precision import apply_precision
    from meshscale.specs.model import PRESETS

    model = meta_model(PRESETS["tiny"], "cpu")
    names = [n for n, _ in model.named_parameters()]
    apply_precision(model, "fp8")
    assert [n for n, _ in model.named_parameters()] == names
    linears = {n: type(m) for n, m in model.named_modules() if isinstance(m, torch.nn.Linear)}
    assert type(model.output) is torch.nn.Linear
    assert all(kind is Float8Linear for n, kind in linears.items() if n.startswith("layers."))
    assert sum(kind is Float8Linear for kind in linears.values()) == 7 * PRESETS["tiny"].layers


def test_mxfp8_wraps_the_eligible_linears_weights_for_torchao_block_scaled_matmuls():
    """The same for mxfp8: torchao's MXFP8 training op swaps each block linear's weight for its wrapper tensor (whose
    matmuls quantize both operands in blocks of 32), names and modules unchanged; the output head stays bf16, and
    so do linears whose widths are no multiple of 32 (tiny's 176-wide MLP)."""
    from torchao.prototype.moe_training.tensor import MXFP8TrainingWeightWrapperTensor

    from meshscale.models.transformer import meta_model
    from meshscale.parallel.precision import apply_precision
    from meshscale.specs.model import PRESETS

    model = meta_model(PRESETS["tiny"], "cpu")
    names = [n for n, _ in model.named_parameters()]
    apply_precision(model, "mxfp8")
    assert [n for n, _ in model.named_parameters()] == names
    wrapped = {n for n, m in model.named_modules()
               if isinstance(m, torch.nn.Linear) and isinstance(m.weight, MXFP8TrainingWeightWrapperTensor)}
    blocks = {n: m for n, m in model.named_modules() if isinstance(m, torch.nn.Linear) and n.startswith("layers.")}
    assert wrapped == {n for n, m in blocks.items() if m.in_features % 32 == 0 and m.out_features % 32 == 0}
    assert 0 < len(wrapped) < len(blocks) and "output" not in wrapped


def test_compiled_blocks_train_as_the_eager_ones():
    """--compile (inductor on CPU) against eager on the same 2 steps: inductor fuses the elementwise chains and
    may reorder a reduction, so the losses agree to 1e-5 relative, not bit for bit."""
    from meshscale.runtime.loop.trainer import train

    eager, compiled = (train(_resolved(compile=c), torch.device("cpu"), _tokens(), log=False) for c in (False, True))
    for a, b in zip(compiled["rows"], eager["rows"]):
        assert abs(a["loss"] - b["loss"]) <= 1e-5 * abs(b["loss"]), (a["loss"], b["loss"])
        assert abs(a["grad_norm"] - b["grad_norm"]) <= 1e-4 * b["grad_norm"]
    assert abs(compiled["val_loss"] - eager["val_loss"]) <= 1e-5 * eager["val_loss"]
