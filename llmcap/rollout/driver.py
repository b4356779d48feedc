"""The rollout loop: set the candidate's weight, hold, judge every interval, roll back on a breach.

    for each step weight w (e.g. 1 -> 5 -> 25 -> 50 -> 100 %):
        [a person approves w first, where the plan says so; a rejection or a timeout rolls back]
        weight := w; every interval_s until hold_s has passed:
            observe the candidate since the step began; judge every gate against the prediction for w
            a breach: weight := 0 at once (within this interval), and the outcome names the gate(s),
            the observed value, the limit, by how much, and the evidence window

The loop knows nothing of Prefect: approvals come through the `approve` callback (the flow `rollout`
pauses its run for them), weights through a `WeightControl` (the gateway's admin API, or the gateway
object in the same process).
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import asdict, dataclass, field
from typing import Any, Protocol

import httpx

from llmcap import exit_codes
from llmcap.rollout.gates import GateResult, Prediction, Tolerances, evaluate
from llmcap.rollout.observe import MetricsSource

Approve = Callable[[float, dict[str, Any]], Awaitable[dict[str, Any]]]  # (weight, evidence) -> {"decision": ...}


@dataclass(frozen=True)
class RolloutPlan:
    steps: tuple[float, ...] = (0.01, 0.05, 0.25, 0.5, 1.0)
    hold_s: float = 60.0  # per step
    interval_s: float = 5.0  # between evaluations; a breach is acted on within one
    approve_before: tuple[float, ...] = ()  # these weights wait for a person's approval before they apply
    ttft_target_s: float = 2.0  # the SLO the attainment gate counts against

    def __post_init__(self) -> None:
        if not self.steps or any(not 0 < w <= 1 for w in self.steps) or list(self.steps) != sorted(set(self.steps)):
            raise ValueError(f"steps are increasing traffic shares in (0, 1]: {self.steps}")
        if not 0 < self.interval_s <= self.hold_s:
            raise ValueError("0 < interval_s <= hold_s")
        if stray := set(self.approve_before) - set(self.steps):
            raise ValueError(f"approvals before weights that are not steps: {sorted(stray)}")


class Clock(Protocol):
    """Where the loop reads the time and waits: the wall clock, or a virtual one in tests."""

    def now(self) -> float: ...

    async def sleep(self, seconds: float) -> None: ...


class WallClock:
    def now(self) -> float:
        return time.time()

    async def sleep(self, seconds: float) -> None:
        await asyncio.sleep(seconds)


class WeightControl(Protocol):
    async def set(self, weight: float) -> None: ...


class AdminWeights:
    """The gateway's loopback admin API (POST /admin/weights)."""

    def __init__(self, gateway_url: str) -> None:
        self.url = gateway_url.rstrip("/") + "/admin/weights"

    async def set(self, weight: float) -> None:
        async with httpx.AsyncClient(timeout=10.0) as c:
            r = await c.post(self.url, json={"candidate": weight})
            r.raise_for_status()


@dataclass
class Evaluation:
    at_s: float
    window: tuple[float, float]
    requests: float
    gates: list[GateResult]

    @property
    def breaches(self) -> list[GateResult]:
        return [g for g in self.gates if not g.passed]


@dataclass
class StepRecord:
    weight: float
    started_s: float
    ended_s: float | None = None
    approval: dict[str, Any] | None = None
    evaluations: list[Evaluation] = field(default_factory=list)


#: A rollout's exit code by its end: only one that put all traffic on the candidate exits 0.
EXIT_CODES = {
    "completed": exit_codes.OK,
    "rolled_back": exit_codes.ROLLED_BACK,
    "rejected": exit_codes.REJECTED,
    "timed_out": exit_codes.TIMED_OUT,
}


@dataclass
class RolloutOutcome:
    status: str  # completed | rolled_back | rejected | timed_out
    reason: str
    steps: list[StepRecord]
    breaches: list[GateResult] = field(default_factory=list)
    rolled_back_s: float | None = None  # when the weight went back to 0 (unix s)

    @property
    def exit_code(self) -> int:
        return EXIT_CODES[self.status]

    def to_json(self) -> dict[str, Any]:
        doc = asdict(self) | {"exit_code": self.exit_code, "outcome": exit_codes.NAMES[self.exit_code]}
        for step, rec in zip(doc["steps"], self.steps, strict=True):
            for ev, e in zip(step["evaluations"], rec.evaluations, strict=True):
                ev["verdicts"] = [g.describe() for g in e.gates]
        return doc


async def run_rollout(
    plan: RolloutPlan,
    control: WeightControl,
    source: MetricsSource,
    predictions: Mapping[float, Prediction],
    tolerances: Tolerances = Tolerances(),
    approve: Approve | None = None,
    on_event: Callable[[str], None] | None = None,
    clock: Clock = WallClock(),
) -> RolloutOutcome:
    missing = [w for w in plan.steps if w not in predictions]
    if missing:
        raise ValueError(f"no prediction for the step weights {missing}")
    say = on_event or (lambda _: None)
    steps: list[StepRecord] = []

    async def roll_back(status: str, reason: str, breaches: list[GateResult] | None = None) -> RolloutOutcome:
        await control.set(0.0)
        say(f"rolled back: {reason}")
        return RolloutOutcome(status, reason, steps, breaches or [], clock.now())

    for w in plan.steps:
        approval = None
        if w in plan.approve_before and approve is not None:
            say(f"waiting for approval before {w:.0%}")
            approval = await approve(w, _evidence(steps))
            if approval.get("decision") != "approve":
                status = "timed_out" if approval.get("decision") == "timeout" else "rejected"
                return await roll_back(
                    status,
                    f"{status.replace('_', ' ')} before {w:.0%} by {approval.get('by') or 'nobody'}: "
                    f"{approval.get('reason') or 'no reason given'}",
                )
        await source.sample()  # the window's opening sample: counters are read from here
        rec = StepRecord(w, clock.now(), approval=approval)
        await control.set(w)
        steps.append(rec)
        say(f"step {w:.0%}: holding {plan.hold_s:g} s, judging every {plan.interval_s:g} s")
        while True:
            await clock.sleep(max(0.0, min(plan.interval_s, rec.started_s + plan.hold_s - clock.now())))
            await source.sample()
            now = clock.now()
            obs = await source.observe(rec.started_s, now)
            ev = Evaluation(
                now, (rec.started_s, now), obs.requests, evaluate(obs, predictions[w], tolerances, plan.ttft_target_s)
            )
            rec.evaluations.append(ev)
            if ev.breaches:
                rec.ended_s = now
                return await roll_back(
                    "rolled_back", f"at {w:.0%}: " + "; ".join(g.describe() for g in ev.breaches), ev.breaches
                )
            if now - rec.started_s >= plan.hold_s:
                break
        rec.ended_s = clock.now()
        say(f"step {w:.0%} held: " + "; ".join(g.describe() for g in rec.evaluations[-1].gates if g.judged))
    return RolloutOutcome("completed", f"{plan.steps[-1]:.0%} of traffic on the candidate", steps)


def _evidence(steps: list[StepRecord]) -> dict[str, Any]:
    """What a person sees before approving: the last step's final verdicts."""
    if not steps or not steps[-1].evaluations:
        return {"previous_step": None}
    last = steps[-1].evaluations[-1]
    return {
        "previous_step": steps[-1].weight,
        "window_s": last.window,
        "requests": last.requests,
        "gates": [g.describe() for g in last.gates],
    }
