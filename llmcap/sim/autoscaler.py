"""The autoscaler of a simulated pool (aggregated, or one pool of a P/D deployment): a forecast floor under a
reactive layer (docs/domain.md).

Every `interval_s` the cluster reads vLLM's own gauges from each ready replica and asks `Autoscaler.decide`:

    N_target(t) = clamp(max(N_floor(t), N_reactive(t)), min_replicas, max_replicas)

- N_floor(t): the step schedule in the config (a forecast of the rate ÷ one instance's max rate, computed
  by the caller, e.g. `llmcap.sizing.autoscale_whatif`). It counts every replica asked for, ready or starting:
  a floor has to be ordered T_ready ahead, which is the caller's job.
- N_reactive(t): Kubernetes HPA's rule on vLLM's own gauges averaged over ready replicas and over the last
  `metric_window_s` of ticks (as a PromQL avg_over_time would feed an HPA external metric), desired =
  ceil(ready × value / target), the largest wins. `vllm:kv_cache_usage_perc` and `vllm:num_requests_running`
  are utilisations: they move the count both ways, and not while value / target is within 1 ± tolerance.
  `vllm:num_requests_waiting` is a queue, which stays long until new capacity is routable: it only triggers
  scale-ups, above its target.
  Scale-down goes to the largest recommendation of the last `scale_down_window_s` (HPA's stabilization
  window, 300 s by default); a reactive scale-up adds at most max(100%, 4 replicas) (HPA's default policy)
  and waits `scale_up_cooldown_s` (default T_ready: until the last one is routable) before the next, or a
  queue that has not drained yet would keep doubling the count.
- Removal: replicas still starting are cancelled first (newest first); then the youngest ready replica
  that has served `min_residency_s` stops taking requests and drains.
- A shared GPU budget (`SimConfig.max_total_gpus`, P/D: both pools): `share_budget` below. Every pool first keeps
  what it holds up to its own target; the GPUs left go one instance at a time to the pool with the largest unmet
  share of its target ((target − granted) ÷ target), ties to the decode pool (a short decode pool stalls every
  prefill's handoff). A drained instance's GPUs count as free once it stops taking requests.

Kubernetes reference: https://kubernetes.io/docs/tasks/run-application/horizontal-pod-autoscale/
("Algorithm details", "Stabilization window", "Default Behavior").
"""

from __future__ import annotations

import math
from bisect import bisect_right
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass

from llmcap.sim.config import AutoscaleConfig
from llmcap.sim.engine import Replica

SCALE_UP_PODS = 4  # HPA default: per period, add up to 100% of the current count or 4 pods, whichever is more


@dataclass(frozen=True)
class ScaleTick:
    """One control evaluation: what the autoscaler saw and what it asked for."""

    t: float
    ready: int
    starting: int
    waiting_avg: float
    kv_usage_avg: float
    running_avg: float
    floor: int
    reactive: int
    target: int


class Autoscaler:
    def __init__(self, cfg: AutoscaleConfig) -> None:
        self.cfg = cfg
        self.recent: deque[tuple[float, int]] = deque()  # (t, reactive recommendation) within the window
        self.seen: deque[tuple[float, float, float, float]] = (
            deque()
        )  # (t, waiting, KV usage, running averages) within metric_window_s
        self.last_up = -math.inf
        self.ticks: list[ScaleTick] = []

    def floor(self, t: float) -> int:
        i = bisect_right(self.cfg.floor_times_s, t) - 1
        return self.cfg.floor_replicas[i] if i >= 0 else 0

    def initial(self) -> int:
        cfg = self.cfg
        n = cfg.initial_replicas if cfg.initial_replicas is not None else self.floor(0.0)
        return min(max(n, cfg.min_replicas), cfg.max_replicas)

    def _recommendation(self, ready: int, current: int, waiting_avg: float, kv_avg: float, running_avg: float) -> int:
        cfg = self.cfg
        desired = []
        for value, target in (
            (kv_avg, cfg.kv_usage),
            (running_avg, cfg.running_per_replica),
        ):  # utilisation gauges: both ways
            if target is not None:
                ratio = value / target
                desired.append(current if abs(ratio - 1.0) <= cfg.tolerance else math.ceil(ready * ratio))
        if cfg.waiting_per_replica is not None and waiting_avg > cfg.waiting_per_replica * (1.0 + cfg.tolerance):
            desired.append(math.ceil(ready * waiting_avg / cfg.waiting_per_replica))  # a queue: a trigger, up only
        return max(desired) if desired else current

    def decide(
        self, t: float, ready: int, starting: int, waiting_avg: float, kv_avg: float, running_avg: float = 0.0
    ) -> int:
        cfg = self.cfg
        current = ready + starting
        self.seen.append((t, waiting_avg, kv_avg, running_avg))
        while self.seen[0][0] <= t - cfg.metric_window_s:
            self.seen.popleft()
        waiting_avg, kv_avg, running_avg = (sum(x[i] for x in self.seen) / len(self.seen) for i in (1, 2, 3))
        rec = self._recommendation(ready, current, waiting_avg, kv_avg, running_avg)
        self.recent.append((t, rec))
        while self.recent[0][0] < t - cfg.scale_down_window_s:
            self.recent.popleft()
        cooldown = cfg.t_ready_s if cfg.scale_up_cooldown_s is None else cfg.scale_up_cooldown_s
        if rec > current:
            reactive = current if t - self.last_up < cooldown else min(rec, max(2 * current, current + SCALE_UP_PODS))
        else:
            reactive = min(current, max(r for _, r in self.recent))
        floor = self.floor(t)
        target = min(max(floor, reactive, cfg.min_replicas), cfg.max_replicas)
        if target > current and reactive > floor:
            self.last_up = t
        self.ticks.append(ScaleTick(t, ready, starting, waiting_avg, kv_avg, running_avg, floor, reactive, target))
        return target


def share_budget(current: list[int], wanted: list[int], gpus: list[int], budget: int) -> list[int]:
    """Each pool's granted count under `budget` GPUs (module docstring): `current` instances held (ready or starting),
    `wanted` the autoscaler's target, `gpus` per instance; pools in order prefill (or aggregated) then decode."""
    granted = [min(c, w) for c, w in zip(current, wanted, strict=True)]
    free = budget - sum(n * g for n, g in zip(granted, gpus, strict=True))
    while True:
        open_ = [i for i in range(len(wanted)) if granted[i] < wanted[i] and gpus[i] <= free]
        if not open_:
            return granted
        i = max(open_, key=lambda j: ((wanted[j] - granted[j]) / wanted[j], j))  # ties: the later pool (decode)
        granted[i] += 1
        free -= gpus[i]


class ScaledPool:
    """The replicas of an autoscaled pool: every one ever asked for (`members`, by index), the routable ones
    (`active`: the router's pool, changed in place) and those still starting; and when each was asked for,
    became routable and stopped taking requests (NaN: never)."""

    def __init__(self, scaler: Autoscaler, make: Callable[[int, float], Replica], role: str = "both") -> None:
        self.scaler = scaler
        self.role = role  # "both" (aggregated), "prefill" or "decode"
        self.make = make  # (index, time asked) -> a fresh replica: an empty prefix cache
        self.members: list[Replica] = []
        self.active: list[Replica] = []
        self.starting: list[Replica] = []
        self.asked_s: list[float] = []
        self.ready_s: list[float] = []
        self.stopped_s: list[float] = []

    def ask(self, t: float) -> Replica:
        r = self.make(len(self.members), t)
        self.members.append(r)
        self.asked_s.append(t)
        self.ready_s.append(math.nan)
        self.stopped_s.append(math.nan)
        return r

    def start(self, n: int) -> None:
        """`n` replicas ready at t=0."""
        for _ in range(n):
            r = self.ask(0.0)
            self.ready_s[r.index] = 0.0
            self.active.append(r)

    def tick(self, t: float) -> list[Replica]:
        """Evaluate the autoscaler at t and apply its target; the replicas asked for now (their readiness
        is the caller's event, `t_ready_s` later)."""
        return self.apply(t, self.want(t))

    def held(self) -> int:
        return len(self.active) + len(self.starting)

    def want(self, t: float) -> int:
        """The autoscaler's target at t (from the ready replicas' gauges)."""
        waiting = kv = running = 0.0
        for r in self.active:
            r.sample_until(t)  # (the time series' sampling cursor must pass t first: queries stay monotone)
            state = r.state_at(t)
            running += state[0]
            waiting += state[1]
            kv += state[2] / r.kv.num_blocks
        ready = len(self.active)
        return self.scaler.decide(t, ready, len(self.starting), waiting / ready, kv / ready, running / ready)

    def apply(self, t: float, target: int) -> list[Replica]:
        """Grow or shrink to `target` at t; the replicas asked for now."""
        asked = []
        while len(self.active) + len(self.starting) < target:
            r = self.ask(t)
            self.starting.append(r)
            asked.append(r)
        while self.starting and len(self.active) + len(self.starting) > target:
            r = self.starting.pop()  # cancelled before it served: its GPUs were held until now
            self.stopped_s[r.index] = t
        residency = self.scaler.cfg.min_residency_s
        while len(self.active) + len(self.starting) > target:
            eligible = [r for r in self.active if t - self.ready_s[r.index] >= residency]
            if not eligible:
                break
            r = max(eligible, key=lambda x: (self.ready_s[x.index], x.index))  # the youngest drains first
            self.active.remove(r)
            self.stopped_s[r.index] = t
        return asked

    def ready(self, r: Replica, t: float) -> bool:
        """`r`'s start-up ended at t: routable now, unless it was cancelled meanwhile."""
        if r not in self.starting:
            return False
        self.starting.remove(r)
        self.ready_s[r.index] = t
        self.active.append(r)
        return True
