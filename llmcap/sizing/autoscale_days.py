"""The day an autoscaling what-if serves (`llmcap.sizing.autoscale_whatif`): a synthesized diurnal day, or the trace's
held-back part as it came. Either gives its rate curve, its peak and its requests."""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
import pyarrow as pa
import pyarrow.compute  # noqa: F401 (pa.compute)
from numpy.typing import ArrayLike

from llmcap.trace.params import ArrivalSpec
from llmcap.trace.synth import synthesize


@dataclass(frozen=True)
class DiurnalDay:
    """λ(t) = mean · (1 + amplitude · sin(2πt / period)) over [0, duration) (the synthesis' own curve)."""

    mean_rps: float
    amplitude: float
    period_s: float = 86_400.0
    duration_s: float = 86_400.0

    def rate_at(self, t: ArrayLike) -> np.ndarray:
        return self.mean_rps * (1.0 + self.amplitude * np.sin(2.0 * np.pi * np.asarray(t) / self.period_s))

    @property
    def peak_rps(self) -> float:
        return float(self.rate_at(np.linspace(0.0, self.duration_s, 8193)).max())

    def requests(self, trace: pa.Table, rng: np.random.Generator) -> pa.Table:
        """The day: requests drawn whole from `trace` (lengths and prefixes together) on its arrival curve."""
        n = max(2, round(self.mean_rps * self.duration_s))
        spec = ArrivalSpec(rate_rps=self.mean_rps, diurnal_amplitude=self.amplitude, diurnal_period_s=self.period_s)
        return synthesize(trace, n, spec, rng)

    def describe(self) -> str:
        return (
            f"a synthesized diurnal day: rate = {self.mean_rps:.4g} × (1 + {self.amplitude:g} sin 2πt/{self.period_s:,.0f} s) req/s "
            f"over {self.duration_s:,.0f} s (peak {self.peak_rps:.4g} req/s), requests drawn whole from the trace"
        )

    def to_dict(self) -> dict:
        return {
            "kind": "synthetic",
            "mean_rps": self.mean_rps,
            "peak_rps": self.peak_rps,
            "amplitude": self.amplitude,
            "period_s": self.period_s,
            "duration_s": self.duration_s,
        }


@dataclass(frozen=True)
class TraceDay:
    """The trace's own requests from `start_s` (trace time) on, as they came, re-based to t = 0: the held-back part a
    fitted forecast had not seen. Its rate curve is the arrival count per `bin_s`."""

    trace: pa.Table
    start_s: float
    bin_s: float = 900.0

    @property
    def _arrivals(self) -> np.ndarray:
        a = self.trace.column("arrival_s").to_numpy()
        return a[a >= self.start_s] - self.start_s

    @property
    def duration_s(self) -> float:
        a = self._arrivals
        return float(a[-1]) if a.size else 0.0

    @property
    def mean_rps(self) -> float:
        return self._arrivals.size / max(self.duration_s, 1e-9)

    def _binned(self) -> np.ndarray:
        n = max(1, math.ceil(self.duration_s / self.bin_s))
        return np.histogram(self._arrivals, bins=n, range=(0.0, n * self.bin_s))[0] / self.bin_s

    def rate_at(self, t: ArrayLike) -> np.ndarray:
        rate = self._binned()
        return rate[np.clip((np.asarray(t) // self.bin_s).astype(np.int64), 0, rate.size - 1)]

    @property
    def peak_rps(self) -> float:
        return float(self._binned().max())

    def requests(self, trace: pa.Table, rng: np.random.Generator) -> pa.Table:
        keep = self.trace.filter(pa.compute.greater_equal(self.trace.column("arrival_s"), self.start_s))
        return keep.set_column(keep.schema.get_field_index("arrival_s"), "arrival_s", pa.array(self._arrivals))

    def describe(self) -> str:
        return (
            f"the trace's held-back final {self.duration_s / 3600:,.3g} h as it came (mean {self.mean_rps:.4g} req/s, peak "
            f"{self.peak_rps:.4g} req/s per {self.bin_s:g} s)"
        )

    def to_dict(self) -> dict:
        return {
            "kind": "trace",
            "mean_rps": self.mean_rps,
            "peak_rps": self.peak_rps,
            "start_s": self.start_s,
            "duration_s": self.duration_s,
            "bin_s": self.bin_s,
        }


Day = DiurnalDay | TraceDay
