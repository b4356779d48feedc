"""The rollout loop (llmcap.rollout.driver.run_rollout) on a virtual clock, with a fake metrics source and a
fake weight control: when it judges, when it rolls back, and what each approval answer does. No Prefect,
no servers, no waiting: an hour of rollout runs in milliseconds."""

from __future__ import annotations

import asyncio
import json
import re
import time
from typing import Any

import httpx
import numpy as np
import pytest

from llmcap import exit_codes
from llmcap.rollout.driver import AdminWeights, RolloutPlan, WallClock, run_rollout
from llmcap.rollout.gates import Prediction, Tolerances
from llmcap.rollout.histogram import Buckets
from llmcap.rollout.observe import Observation

STEPS = (0.05, 0.25, 1.0)
HOLD, INTERVAL = 60.0, 5.0


def _ttft(p99_s: float) -> Buckets:
    return Buckets(
        np.array([p99_s, 2 * p99_s + 1, np.inf]), np.array([990.0, 1000.0, 1000.0])
    )  # PromQL p99 exactly p99_s


PRED = Prediction(0.0, 1000, _ttft(0.2), _ttft(0.02), 0.3, 2.0, 0.0)
PREDICTIONS = dict.fromkeys(STEPS, PRED)


class VirtualClock:
    def __init__(self) -> None:
        self.t = 1_000.0

    def now(self) -> float:
        return self.t

    async def sleep(self, seconds: float) -> None:
        self.t += seconds
        await asyncio.sleep(0)


class Weights:
    def __init__(self, clock: VirtualClock) -> None:
        self.clock, self.log = clock, []

    async def set(self, weight: float) -> None:
        self.log.append((self.clock.now(), weight))


class Source:
    """As predicted until `breach_at` (virtual seconds); from then on TTFT p99 is 0.4 s (limit 0.35 s; still under the 0.5 s SLO)."""

    def __init__(self, clock: VirtualClock, breach_at: float = float("inf")) -> None:
        self.clock, self.breach_at, self.observed, self.windows = clock, breach_at, [], []

    async def sample(self) -> None:
        return None

    async def observe(self, start_s: float, end_s: float) -> Observation:
        self.observed.append(end_s)
        self.windows.append((start_s, end_s))
        ttft = _ttft(0.4 if end_s >= self.breach_at else 0.2)
        # the waiting queue's max grows 0.1 a second into the step (6 after 60 s: under its limit, 2 + 8)
        return Observation(start_s, end_s, 1000, 0, ttft, _ttft(0.02), 0.3, 0.1 * (end_s - start_s), 0.0)


EVIDENCE: list[dict[str, Any]] = []  # what each approval was shown, in order


def rollout(breach_at: float = float("inf"), approve_before: tuple[float, ...] = (), answer: str | None = None):
    clock = VirtualClock()
    weights, source = Weights(clock), Source(clock, clock.t + breach_at)
    asked: list[float] = []
    EVIDENCE.clear()

    async def approve(weight: float, evidence: dict[str, Any]) -> dict[str, Any]:
        asked.append(weight)
        EVIDENCE.append(evidence)
        await clock.sleep(30.0)  # a person takes half a minute
        return {"decision": answer, "by": "carol" if answer != "timeout" else None, "reason": "test"}

    plan = RolloutPlan(STEPS, HOLD, INTERVAL, approve_before, 0.5)
    outcome = asyncio.run(run_rollout(plan, weights, source, PREDICTIONS, Tolerances(), approve, clock=clock))
    start = 1_000.0
    return outcome, [(t - start, w) for t, w in weights.log], [t - start for t in source.observed], asked


def test_as_predicted_it_holds_each_step_for_its_hold_judging_every_interval() -> None:
    outcome, weights, observed, _ = rollout()
    assert outcome.status == "completed" and outcome.exit_code == exit_codes.OK
    assert weights == [(0.0, 0.05), (60.0, 0.25), (120.0, 1.0)]
    assert observed == pytest.approx([5.0 * k for k in range(1, 37)])  # every 5 s, 12 judgements per step
    assert [len(s.evaluations) for s in outcome.steps] == [12, 12, 12]


@pytest.mark.parametrize("breach_at", [7.0, 10.0, 71.0, 179.0])
def test_a_breach_rolls_back_within_one_interval(breach_at: float) -> None:
    outcome, weights, observed, _ = rollout(breach_at=breach_at)
    assert outcome.status == "rolled_back" and outcome.exit_code == exit_codes.ROLLED_BACK
    rolled_back_at, last = weights[-1]
    assert last == 0.0 and breach_at <= rolled_back_at <= breach_at + INTERVAL
    assert observed[-1] == rolled_back_at  # the breaching judgement is the last one, acted on at once
    assert "ttft_p99" in outcome.reason and [b.gate for b in outcome.breaches] == ["ttft_p99"]
    assert max(w for _, w in weights) == STEPS[int(breach_at // HOLD)]  # never went past the step it breached in


@pytest.mark.parametrize(
    ("answer", "status", "code"),
    [("reject", "rejected", exit_codes.REJECTED), ("timeout", "timed_out", exit_codes.TIMED_OUT)],
)
def test_a_refused_or_unanswered_approval_rolls_back_and_goes_no_further(answer: str, status: str, code: int) -> None:
    outcome, weights, _, asked = rollout(approve_before=(0.25,), answer=answer)
    assert asked == [0.25]
    assert outcome.status == status and outcome.exit_code == code
    assert weights == [(0.0, 0.05), (90.0, 0.0)]  # 60 s at 5%, 30 s waiting for a person, then back to 0: 25% never set
    assert len(outcome.steps) == 1


def test_an_approval_lets_the_step_proceed_after_the_wait() -> None:
    outcome, weights, _, asked = rollout(approve_before=(0.25, 1.0), answer="approve")
    assert outcome.status == "completed" and asked == [0.25, 1.0]
    assert weights == [(0.0, 0.05), (90.0, 0.25), (180.0, 1.0)]
    assert outcome.steps[1].approval == {"decision": "approve", "by": "carol", "reason": "test"}


def test_an_approver_sees_the_last_steps_final_verdicts() -> None:
    rollout(approve_before=(0.05, 0.25), answer="approve")
    first, second = EVIDENCE
    assert first == {"previous_step": None}  # nothing judged before the first step
    assert (
        second["previous_step"] == 0.05 and second["requests"] == 1000 and second["window_s"] == (1_030.0, 1_090.0)
    )  # after 30 s waiting for the first approval
    assert len(second["gates"]) == 7 and all(g.endswith(": pass") for g in second["gates"])


def test_the_outcome_document() -> None:
    outcome, _, _, _ = rollout(breach_at=12.0)
    doc = outcome.to_json()
    assert (doc["status"], doc["exit_code"], doc["outcome"]) == ("rolled_back", exit_codes.ROLLED_BACK, "ROLLED BACK")
    assert doc["rolled_back_s"] == 1_015.0 and len(doc["steps"]) == 1 and doc["breaches"][0]["gate"] == "ttft_p99"
    verdicts = [ev["verdicts"] for ev in doc["steps"][0]["evaluations"]]
    assert len(verdicts) == 3 and all(len(v) == 7 for v in verdicts)  # judged at 5, 10 and 15 s
    assert "ttft_p99: observed 0.4 breaks the limit <= 0.35" in verdicts[-1][1] and verdicts[0][1].endswith(": pass")


@pytest.mark.parametrize(
    ("steps", "hold", "interval", "approve", "message"),
    [
        ((), 60.0, 5.0, (), "increasing traffic shares"),
        ((0.5, 0.25), 60.0, 5.0, (), "increasing traffic shares"),
        ((0.25, 0.25), 60.0, 5.0, (), "increasing traffic shares"),
        ((0.0, 1.0), 60.0, 5.0, (), "increasing traffic shares"),
        ((0.5, 1.5), 60.0, 5.0, (), "increasing traffic shares"),
        ((0.5, 1.0), 60.0, 61.0, (), "0 < interval_s <= hold_s"),
        ((0.5, 1.0), 60.0, 0.0, (), "0 < interval_s <= hold_s"),
        ((0.5, 1.0), 60.0, 5.0, (0.75,), "approvals before weights that are not steps: [0.75]"),
    ],
)
def test_a_plan_that_cannot_be_run_is_refused(steps, hold, interval, approve, message) -> None:
    with pytest.raises(ValueError, match=re.escape(message)):
        RolloutPlan(steps, hold, interval, approve, 0.5)
    RolloutPlan((0.5, 1.0), 60.0, 60.0, (1.0,), 0.5)  # the edges that are fine: interval = hold, approval before a step


def run(plan: RolloutPlan, approve=None, predictions=PREDICTIONS, breach_at: float = float("inf")):
    """The loop with every event it reports; times relative to the clock's start."""
    clock, events = VirtualClock(), []
    weights, source = Weights(clock), Source(clock, clock.t + breach_at)
    outcome = asyncio.run(run_rollout(plan, weights, source, predictions, Tolerances(), approve, events.append, clock))
    return outcome, events, source


def test_the_steps_and_their_evaluations_are_recorded_with_their_times() -> None:
    outcome, _, source = run(RolloutPlan(STEPS, HOLD, INTERVAL, (), 0.5))
    assert outcome.reason == "100% of traffic on the candidate" and outcome.rolled_back_s is None
    assert [(s.weight, s.started_s - 1_000.0, s.ended_s - 1_000.0, s.approval) for s in outcome.steps] == [
        (0.05, 0.0, 60.0, None),
        (0.25, 60.0, 120.0, None),
        (1.0, 120.0, 180.0, None),
    ]
    first = outcome.steps[0].evaluations
    assert [e.at_s - 1_000.0 for e in first] == [5.0 * k for k in range(1, 13)]
    # each judgement observes the step from its start: windows [0, 5], [0, 10], ... [0, 60]; then [60, 65], ...
    assert [e.window for e in first] == [(1_000.0, 1_000.0 + 5.0 * k) for k in range(1, 13)] and source.windows[12] == (
        1_060.0,
        1_065.0,
    )
    assert outcome.to_json()["steps"][0]["approval"] is None


def test_a_breach_ends_its_step_when_it_is_judged() -> None:
    outcome, _, _ = run(
        RolloutPlan(STEPS, HOLD, INTERVAL, (), 0.5), breach_at=71.0
    )  # judged at 75 s, 15 s into the 25% step
    assert [(s.started_s - 1_000.0, s.ended_s - 1_000.0) for s in outcome.steps] == [(0.0, 60.0), (60.0, 75.0)]
    assert outcome.rolled_back_s == 1_075.0


def test_the_last_judgement_of_a_step_falls_at_the_end_of_its_hold() -> None:
    # hold 10 s judged every 4.75 s (exact in binary): at 4.75, 9.5 and then 0.5 s later at 10, not 4.75 s later
    outcome, _, source = run(RolloutPlan((1.0,), 10.0, 4.75, (), 0.5))
    assert [t - 1_000.0 for t in source.observed] == [4.75, 9.5, 10.0] and outcome.status == "completed"


def test_what_the_loop_reports_as_it_goes() -> None:
    async def approve(weight: float, evidence: dict[str, Any]) -> dict[str, Any]:
        return {"decision": "approve", "by": "carol"}

    outcome, events, _ = run(RolloutPlan(STEPS, HOLD, INTERVAL, (0.25,), 0.5), approve, breach_at=71.0)
    held = events[1]
    assert events[0] == "step 5%: holding 60 s, judging every 5 s"
    # the held line lists the last judgement's gates: waiting 0.1 x 60 s = 6 (the first judgement's was 0.5)
    assert held.startswith(
        "step 5% held: error_rate: observed 0 within the limit <= 0.02, predicted 0: pass; ttft_p99: observed 0.2 within"
    )
    assert "; waiting: observed 6 within the limit <= 10, predicted 2: pass; " in held and held.count(": pass") == 7
    assert events[2:] == [
        "waiting for approval before 25%",
        "step 25%: holding 60 s, judging every 5 s",
        "rolled back: at 25%: ttft_p99: observed 0.4 breaks the limit <= 0.35, predicted 0.2: BREACH by 0.05",
    ]
    assert outcome.reason == events[-1].removeprefix("rolled back: ")


@pytest.mark.parametrize(
    ("answer", "status", "reason"),
    [
        (
            {"decision": "reject", "by": "carol", "reason": "not tonight"},
            "rejected",
            "rejected before 25% by carol: not tonight",
        ),
        ({"decision": "timeout"}, "timed_out", "timed out before 25% by nobody: no reason given"),
        ({"decision": "maybe", "by": "", "reason": ""}, "rejected", "rejected before 25% by nobody: no reason given"),
    ],
)
def test_a_refusal_says_who_and_why(answer: dict[str, Any], status: str, reason: str) -> None:
    async def approve(weight: float, evidence: dict[str, Any]) -> dict[str, Any]:
        return answer

    outcome, events, _ = run(RolloutPlan(STEPS, HOLD, INTERVAL, (0.25,), 0.5), approve)
    assert (outcome.status, outcome.reason) == (status, reason) and events[-1] == f"rolled back: {reason}"


def test_every_step_needs_a_prediction() -> None:
    with pytest.raises(ValueError, match=re.escape("no prediction for the step weights [1.0]")):
        run(RolloutPlan(STEPS, HOLD, INTERVAL, (), 0.5), predictions={0.05: PRED, 0.25: PRED})


def test_a_sub_second_interval_is_a_plan() -> None:
    assert RolloutPlan((1.0,), 1.0, 0.5, (), 0.5).interval_s == 0.5
    with pytest.raises(ValueError, match=r"^0 < interval_s <= hold_s$"):
        RolloutPlan((1.0,), 1.0, 0.0, (), 0.5)


def test_the_wall_clock_waits_and_reads_unix_time() -> None:
    start = time.monotonic()
    asyncio.run(WallClock().sleep(0.02))
    assert time.monotonic() - start >= 0.02 and abs(WallClock().now() - time.time()) < 1.0


@pytest.mark.parametrize("url", ["http://gw:8100", "http://gw:8100/"])
def test_admin_weights_posts_the_candidates_share(monkeypatch: pytest.MonkeyPatch, url: str) -> None:
    seen = []

    def handler(request: httpx.Request) -> httpx.Response:
        seen.append((str(request.url), json.loads(request.content), request.extensions["timeout"]))
        return httpx.Response(200 if len(seen) == 1 else 500)

    real = httpx.AsyncClient
    monkeypatch.setattr(httpx, "AsyncClient", lambda **kw: real(transport=httpx.MockTransport(handler), **kw))
    weights = AdminWeights(url)
    asyncio.run(weights.set(0.25))
    ((posted, body, timeout),) = seen
    assert (posted, body) == ("http://gw:8100/admin/weights", {"candidate": 0.25})
    assert all(v is not None for v in timeout.values())  # a gateway that does not answer is given up on
    with pytest.raises(httpx.HTTPStatusError):  # the gateway refused: the loop must not go on as if it had moved
        asyncio.run(weights.set(0.5))


def test_a_breach_of_several_gates_names_each() -> None:
    # predicted KV usage 0: its limit is 0 + 0.2, and the observed 0.3 breaks it from the first judgement, with TTFT
    kv_free = Prediction(0.0, 1000, _ttft(0.2), _ttft(0.02), 0.0, 2.0, 0.0)
    outcome, _, _ = run(
        RolloutPlan(STEPS, HOLD, INTERVAL, (), 0.5), predictions=dict.fromkeys(STEPS, kv_free), breach_at=0.0
    )
    assert outcome.reason == (
        "at 5%: ttft_p99: observed 0.4 breaks the limit <= 0.35, predicted 0.2: BREACH by 0.05; "
        "kv_usage: observed 0.3 breaks the limit <= 0.2, predicted 0: BREACH by 0.1"
    )
    assert [b.gate for b in outcome.breaches] == ["ttft_p99", "kv_usage"] and outcome.rolled_back_s == 1_005.0
