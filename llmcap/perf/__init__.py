"""Step-time models: the `StepTimeModel` seam, roofline, measured profiles and their calibration."""

from llmcap import _native

_native.load("perf")  # first: the compiled scalar roofline (if built from these sources) before anything imports it

from llmcap.perf.model import LinearStepModel, StepBatch, StepTimeModel, causal_pairs, decode_step_time, prefill_time

__all__ = ["LinearStepModel", "StepBatch", "StepTimeModel", "causal_pairs", "decode_step_time", "prefill_time"]

from llmcap.perf.efficiency import RooflineParams, matmul_efficiency  # noqa: E402
from llmcap.perf.roofline import OpCost, RooflineModel, build_step_model  # noqa: E402

__all__ += ["OpCost", "RooflineModel", "RooflineParams", "build_step_model", "matmul_efficiency"]

from llmcap.perf.calibrate import CalibratedFit, StepObservations, fit_step_model  # noqa: E402
from llmcap.perf.fingerprint import EnvironmentFingerprint, FieldChange, fingerprint_hash, is_stale  # noqa: E402
from llmcap.perf.profile import (  # noqa: E402
    POINTS_SCHEMA,
    STEPS_SCHEMA,
    Interpolated,
    Profile,
    ProfileStepModel,
    interpolate,
    read_profile,
)

__all__ += [
    "POINTS_SCHEMA",
    "STEPS_SCHEMA",
    "CalibratedFit",
    "EnvironmentFingerprint",
    "FieldChange",
    "Interpolated",
    "Profile",
    "ProfileStepModel",
    "StepObservations",
    "fingerprint_hash",
    "fit_step_model",
    "interpolate",
    "is_stale",
    "read_profile",
]
