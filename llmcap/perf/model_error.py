"""How wrong a step-time model is known to be, from its own evidence: a calibrated roofline's held-out error on
the public operation timings it was fitted to, the default efficiencies' error on those timings, a measured
profile's fit residuals. The sizer scales step times by one minus and one plus this to bound the GPU count."""

from __future__ import annotations

from dataclasses import dataclass

from llmcap.perf.calibrate import CalibratedFit
from llmcap.perf.calibration import default_efficiencies_error, held_out_error
from llmcap.perf.model import StepTimeModel
from llmcap.perf.roofline import RooflineModel
from llmcap.perf.scaled import ScaledStepModel


@dataclass(frozen=True)
class ModelError:
    relative: float  # a typical |relative error| of one step's time
    basis: str  # where the figure comes from


def model_error(step: StepTimeModel) -> ModelError | None:
    """`step`'s known relative error (module docstring); None when nothing measures it."""
    if isinstance(step, ScaledStepModel):
        inner = model_error(step.model)
        return None if inner is None else ModelError(inner.relative, f"{inner.basis}, corrected ×{step.factor:.4g}")
    if isinstance(step, CalibratedFit):
        return ModelError(
            step.median_abs_rel_error, f"measured profile: median |error| of its fit, {step.median_abs_rel_error:.1%}"
        )
    if isinstance(step, RooflineModel):
        cal = step.calibration
        if cal is not None:
            e = held_out_error(cal)
            return (
                None
                if e is None
                else ModelError(
                    e, f"roofline calibrated for {cal.gpu}: held-out median |error| {e:.1%} ({cal.describe()['file']})"
                )
            )
        worst = default_efficiencies_error()
        if worst is not None:
            return ModelError(
                worst[0],
                f"roofline with the default efficiencies: their median |error| on {worst[1]}'s public timings, "
                f"the worst shipped GPU, {worst[0]:.1%}",
            )
    return None
