"""Fault and drift knobs of the twin, for tests of whatever sits in front of an engine (clients,
replay, probes, control loops).

- slowdown X: every engine step (and KV transfer) takes X times its simulated time (`TwinClock`);
- error rate p: each completion request fails with HTTP 500 before its stream starts, drawn from a
  seeded generator in arrival order (the same arrivals fail on every run);
- crash after N: the (N+1)-th completion request kills the twin: every open connection is cut
  mid-stream, the listener closes, nothing answers any more;
- stall: the engine clock stops for S seconds (no tokens, requests still accepted and queued);
- long-prompt slowdown X past N tokens: engine steps whose prefill reaches past N context tokens take
  X times their simulated time (`llmcap.perf.scaled.ScaledStepModel`): long prompts alone are slower.

All but the long-prompt slowdown (fixed at start: it is part of the step model) can be changed while
the twin runs (POST /admin/faults, loopback only).
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
from pydantic import BaseModel, ConfigDict, Field


class FaultUpdate(BaseModel):
    """A change of knobs (POST /admin/faults); absent fields stay as they are."""

    model_config = ConfigDict(extra="forbid")

    slowdown: float | None = Field(default=None, gt=0)
    error_rate: float | None = Field(default=None, ge=0, le=1)
    crash_after: int | None = Field(default=None, ge=0, description="crash at the request after this many more")
    stall_s: float | None = Field(default=None, ge=0, description="stop the engine clock this long")
    stall_at: float | None = Field(default=None, ge=0, description="... from this twin time (default: now)")


@dataclass
class Faults:
    error_rate: float = 0.0
    crash_after: int | None = None  # completion requests served before the crash (None: never)
    seed: int = 0
    requests: int = 0  # completion requests seen
    errors: int = 0  # injected 500s
    crashed: bool = False
    _rng: np.random.Generator = field(init=False, repr=False)

    def __post_init__(self) -> None:
        self._rng = np.random.default_rng(self.seed)

    def on_request(self) -> str | None:
        """Fate of the next completion request: "crash", "error" or None (serve it)."""
        self.requests += 1
        if self.crash_after is not None and self.requests > self.crash_after:
            self.crashed = True
            return "crash"
        draw = float(self._rng.random())  # drawn for every request, so one knob does not shift the other's draws
        if draw < self.error_rate:
            self.errors += 1
            return "error"
        return None

    def state(self) -> dict:
        return {
            "error_rate": self.error_rate,
            "crash_after": self.crash_after,
            "requests": self.requests,
            "errors": self.errors,
            "crashed": self.crashed,
        }
