"""Step-time models: the `StepTimeModel` seam, roofline, measured profiles and their calibration."""

from llmcap.perf.model import LinearStepModel, StepBatch, StepTimeModel, causal_pairs, decode_step_time, prefill_time

__all__ = ["LinearStepModel", "StepBatch", "StepTimeModel", "causal_pairs", "decode_step_time", "prefill_time"]
