"""Apply a Layout to a built model: recompute first (it changes no parameter), then the data-parallel
wrapper that owns gradient and parameter communication. Tensor/pipeline/context/expert parallelism
plug in here (their mesh axes already exist, see mesh.py); `runtime_supports` is the one place that
says what the runtime can run today."""

from meshscale.errors import UserError
from meshscale.specs.layout import Layout


def runtime_supports(layout: Layout) -> str | None:
    """None when the runtime can run `layout`; otherwise the reason it cannot, naming what is missing."""
    missing = [f"{key}={getattr(layout, key)}" for key in ("tp", "pp", "cp", "ep") if getattr(layout, key) > 1]
    if missing:
        return (f"the trainer does not run {', '.join(missing)} yet (data parallelism only: dp with zero=0..3); "
                "set those degrees to 1")
    return None


def check_runtime(layout: Layout) -> None:
    reason = runtime_supports(layout)
    if reason:
        raise UserError(f"layout {layout}: {reason}")


def apply_layout(model, layout: Layout, mesh, ledger, precision: str = "fp32", bucket_mb: float = 1.0):
    """Wrap `model` for `layout`; returns the data-parallel strategy (see data_parallel.Local for its
    interface: model, accumulate(last), optim_params(), grad_sq_norm(), after_step())."""
    from meshscale.parallel.data_parallel import DDP, Local
    from meshscale.parallel.recompute import apply_recompute

    check_runtime(layout)
    apply_recompute(model, layout.recompute)
    if mesh is not None:
        ledger.name_mesh(mesh)
    if layout.dp == 1:
        return Local(model)
    if layout.zero == 0:
        return DDP(model, mesh, ledger, bucket_mb)
    if layout.zero in (1, 2):
        from meshscale.parallel.zero import Zero

        return Zero(model, mesh, ledger, layout.zero, bucket_mb)
    from meshscale.parallel.fsdp import FSDP

    return FSDP(model, mesh, ledger, precision)
