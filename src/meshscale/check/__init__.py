"""A second opinion on a running job: its log's measured step beside the cost model's prediction of the
layout its config describes, the quantity that differs most, and a faster layout as a config diff in the
framework's own terms (the prediction scaled by what the log measured)."""

import difflib
import math
from dataclasses import dataclass, field

from meshscale.check.logs import Measured, detect, nccl_release, read_log
from meshscale.cost import bands
from meshscale.cost import Prediction, predict
from meshscale.errors import UserError
from meshscale.export import Job, best_expressible, framework_module, read
from meshscale.plan.explain import components
from meshscale.specs.cluster import ClusterSpec
from meshscale.specs.layout import Layout
from meshscale.specs.model import ModelSpec

BETTER = 0.97  # a proposal must be predicted at least 3% faster


@dataclass(frozen=True)
class Row:
    name: str
    unit: str
    measured: float
    predicted: float
    band: dict | None = None  # the step time's error band (cost/bands.py); None for memory, which it does not cover
    rate: bool = False  # work over the step time (tokens/s, TFLOP/s): the band's error is the step time's

    @property
    def ratio(self) -> float:
        return self.measured / self.predicted

    @property
    def measured_range(self) -> tuple[float, float] | None:
        """Where the measured value lies if the prediction errs no more than the band's p90."""
        return bands.measured_range(self.predicted, self.band, self.rate) if self.band else None

    @property
    def within(self) -> str | None:
        """"median", "p90" or "outside": how far off the prediction is against its category's band."""
        return bands.within(self.predicted, self.measured, self.band, self.rate) if self.band else None

    def to_dict(self) -> dict:
        rng = self.measured_range
        return {"name": self.name, "unit": self.unit, "measured": self.measured, "predicted": self.predicted,
                "ratio": self.ratio, "band": self.band,
                "error": bands.error(self.predicted, self.measured, self.rate) if self.band else None,
                "band_range": list(rng) if rng else None, "within_band": self.within}


@dataclass
class Check:
    framework: str
    prediction: Prediction
    measured: Measured
    rows: list[Row]
    worst: Row  # of step time and memory, the one whose measured/predicted ratio is farthest from 1
    breakdown: dict  # the predicted step's terms, seconds
    proposal: Prediction | None = None
    expected_step_s: float | None = None  # the proposal's prediction times measured/predicted of this job
    diff: list[str] = field(default_factory=list)
    nccl: str = ""  # the NCCL release the log names, which the prediction takes ("": none named)

    def to_dict(self) -> dict:
        return {"framework": self.framework, "layout": self.prediction.layout, "steps_read": self.measured.steps,
                "nccl": self.nccl or None,
                "rows": [r.to_dict() for r in self.rows], "worst": self.worst.name,
                "predicted_terms_s": self.breakdown,
                "proposal": self.proposal.to_dict() if self.proposal else None,
                "expected_step_time_s": self.expected_step_s, "config_diff": self.diff}


def check(log_text: str, config_text: str, cluster: ClusterSpec, devices: int | None = None,
          model: ModelSpec | None = None, framework: str | None = None) -> Check:
    framework = framework or detect(log_text)
    shape = read(framework, config_text, devices)
    model = model or shape.model
    if model is None:
        raise UserError(f"the {framework} config names no model meshscale knows; give --model")
    if model.seq != shape.seq:
        model = model.with_seq(shape.seq)
    layout = shape.layout
    release = nccl_release(log_text)
    if release:  # the job's own NCCL (Blackwell's tuner rows and thread blocks moved in 2.28)
        cluster = cluster.with_software(nccl=release)
    pred = predict(model, cluster, layout, shape.global_batch, shape.precision)
    measured = read_log(log_text, framework, shape.global_batch * model.seq, layout.devices)
    band = pred.band  # measured on step times: it carries to the rates of that step, not to memory
    rows = [Row(name, unit, m, p, b, rate) for name, unit, m, p, b, rate in (
        ("step time", "s", measured.step_time_s, pred.step_time_s, band, False),
        ("tokens/s per device", "", measured.tokens_per_s_per_device, pred.tokens_per_s / layout.devices, band, True),
        ("TFLOP/s per device", "", measured.tflops_per_device,
         pred.model_flops_per_step / pred.step_time_s / layout.devices / 1e12, band, True),
        ("memory per device", "B", measured.memory_bytes, pred.memory_per_device_bytes["total"], None, False),
    ) if m is not None]
    # step time and memory are what the log measures apart; tokens/s is the step time's inverse and TFLOP/s
    # counts FLOPs by each framework's own formula, so they are shown beside them but not ranked
    worst = max((r for r in rows if r.name in ("step time", "memory per device")), key=lambda r: abs(math.log(r.ratio)))
    out = Check(framework, pred, measured, rows, worst, components(pred), nccl=release)
    best = best_expressible(framework, model, cluster, layout.devices, shape.global_batch, shape.precision, {})
    if best is not None and best.step_time_s < BETTER * pred.step_time_s:
        out.proposal = best
        out.expected_step_s = best.step_time_s * measured.step_time_s / pred.step_time_s
        render = framework_module(framework).render
        now = render(Job(model, cluster, layout.resolve_mbs(shape.global_batch), shape.global_batch,
                         shape.precision, 1))
        new = render(Job(model, cluster, _layout(best, shape.global_batch), shape.global_batch, shape.precision, 1))
        out.diff = [line.rstrip("\n") for line in difflib.unified_diff(
            now.splitlines(), new.splitlines(), "now", "proposed", lineterm="", n=0)
            if not line.startswith("@@") and "meshscale" not in line]
    return out


def _layout(pred: Prediction, global_batch: int) -> Layout:
    return Layout.parse(pred.layout).resolve_mbs(global_batch)


__all__ = ["Check", "Row", "check"]
