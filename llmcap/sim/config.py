"""Simulator knobs: one engine (replica), the links of a disaggregated deployment, and the run itself.

Defaults follow vLLM v1 where it has one (max_num_seqs 256, max_num_batched_tokens 8192, block 16).
`num_blocks` has no default: it comes from the memory plan (`llmcap.memory.plan_memory`).
"""

from __future__ import annotations

import math
from itertools import pairwise
from typing import Annotated

from pydantic import AfterValidator, BaseModel, ConfigDict, Field, model_validator

from llmcap.first_token import DEFAULT_FIRST_TOKEN_FROM, FirstTokenFrom
from llmcap.policy_names import DEFAULT_QUEUE, DEFAULT_ROUTER, known_admission, known_queue, known_router


class _Frozen(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class TierConfig(_Frozen):
    """An offload tier of the prefix cache below HBM (host DRAM, local SSD, a remote store): evicted prefix
    segments move there, and a prompt that finds its prefix there loads it back instead of computing it."""

    name: str = Field(min_length=1, description="what it is (host, ssd, remote, ...)")
    blocks: int = Field(gt=0, description="capacity in KV blocks of the engine's block size")
    bandwidth_bytes_s: float = Field(gt=0, description="load bandwidth into HBM")
    lookup_s: float = Field(
        default=0.0,
        ge=0,
        description="latency of asking the tier whether it holds a prefix (paid "
        "by every admission that looks there, found or not)",
    )


def tier_of(name: str, gb: float, gbps: float, lookup_ms: float, block_bytes: float) -> TierConfig:
    """A tier given as people give it (GB capacity, GB/s, ms) in the engine's KV blocks of `block_bytes`."""
    return TierConfig(
        name=name, blocks=int(gb * 1e9 // block_bytes), bandwidth_bytes_s=gbps * 1e9, lookup_s=lookup_ms / 1e3
    )


class EngineConfig(_Frozen):
    """One replica: scheduler limits, paged KV cache, prefix cache and its optional host-memory tier."""

    num_blocks: int = Field(gt=0, description="KV blocks of the replica (all ranks hold the same sequences)")
    block_size: int = Field(default=16, gt=0, description="tokens per KV block")
    max_num_seqs: int = Field(default=256, gt=0, description="most sequences running at once")
    max_num_batched_tokens: int = Field(default=8192, gt=0, description="token budget of one step (chunked prefill)")
    enable_prefix_caching: bool = True
    admission_policy: Annotated[str, AfterValidator(known_admission)] = Field(
        default="vllm",
        description="when a waiting request may start (llmcap.sim.admission: vllm, trtllm-max-utilization, trtllm-guaranteed-no-evict, sglang)",
    )
    scheduling_policy: Annotated[str, AfterValidator(known_queue)] = Field(
        default=DEFAULT_QUEUE,
        description="the waiting queue's order (vLLM --scheduling-policy, llmcap.sim.queues: fcfs, priority)",
    )
    max_loras: int = Field(
        default=0,
        ge=0,
        description="LoRA adapters one batch may hold (vLLM --max-loras): a waiting request of "
        "another adapter is skipped while that many are running (0 = no limit)",
    )
    host_blocks: int = Field(default=0, ge=0, description="host-memory tier capacity in blocks (0 = no tier)")
    host_bandwidth_bytes_s: float = Field(default=25e9, gt=0, description="host -> HBM load bandwidth")
    tiers: tuple[TierConfig, ...] = Field(default=(), description="offload tiers below the host tier, nearest first")
    kv_bytes_per_token: float = Field(default=0.0, ge=0, description="KV bytes per token (host loads, P/D handoff)")
    max_model_len: int | None = Field(
        default=None,
        gt=0,
        description="longest prompt + requested output accepted; longer requests are rejected on "
        "arrival, as vLLM's API server rejects them (None: no limit but the KV cache)",
    )

    def offload_tiers(self) -> tuple[TierConfig, ...]:
        """The prefix cache's tiers below HBM, nearest first: the host tier (`host_blocks`), then `tiers`."""
        host = (
            (TierConfig(name="host", blocks=self.host_blocks, bandwidth_bytes_s=self.host_bandwidth_bytes_s),)
            if self.host_blocks
            else ()
        )
        return host + self.tiers

    @model_validator(mode="after")
    def _tier_names_differ(self) -> EngineConfig:
        names = [t.name for t in self.offload_tiers()]
        if len(set(names)) != len(names):
            raise ValueError(f"offload tiers need distinct names, got {names}")
        return self

    @model_validator(mode="after")
    def _budget_covers_decodes(self) -> EngineConfig:
        # vLLM requires it too: otherwise a full decode batch could not be scheduled in one step
        if self.max_num_batched_tokens < self.max_num_seqs:
            raise ValueError(
                f"max_num_batched_tokens ({self.max_num_batched_tokens}) must be >= max_num_seqs ({self.max_num_seqs})"
            )
        return self


class LinkConfig(_Frozen):
    """A KV-transfer link: transfers queue FIFO on it; each occupies it for bytes / bandwidth, then
    lands `latency_s` later (the latency is pipelined, the bandwidth is not)."""

    bandwidth_bytes_s: float = Field(default=50e9, gt=0)
    latency_s: float = Field(default=0.0, ge=0)


class PDConfig(_Frozen):
    """Disaggregated prefill/decode: two pools; every prefill replica owns one outgoing link."""

    prefill_replicas: int = Field(gt=0)
    decode_replicas: int = Field(gt=0)
    link: LinkConfig = LinkConfig()
    first_token_from: FirstTokenFrom = (
        DEFAULT_FIRST_TOKEN_FROM  # where TTFT ends (llmcap.first_token: after the KV handoff)
    )
    decode_engine: EngineConfig | None = None  # None: the same engine config as the prefill pool


class AutoscaleConfig(_Frozen):
    """Aggregated replicas added and removed while the run goes: N_target(t) = max(N_floor(t), N_reactive(t)),
    clamped to [min_replicas, max_replicas] (see `llmcap.sim.autoscaler` for the rules and their sources).

    A replica asked for at t is routable at t + t_ready_s (capacity counts only once the router admits it)
    and starts with an empty prefix cache; a removed one takes no new requests and finishes what it holds.
    """

    min_replicas: int = Field(default=1, gt=0)
    max_replicas: int = Field(default=64, gt=0)
    initial_replicas: int | None = Field(default=None, gt=0, description="ready at t=0; None: the floor at t=0")
    interval_s: float = Field(default=15.0, gt=0, description="control period (Kubernetes HPA's sync period)")
    t_ready_s: float = Field(
        default=600.0,
        ge=0,
        description="scale-up decision -> routable (schedule, image, weights, init, graphs, health)",
    )
    pod_running_after_s: float | None = Field(
        default=None,
        ge=0,
        description="scale-up decision -> pod running (scheduled, image pulled); reported only (None: not known)",
    )
    model_ready_after_s: float | None = Field(
        default=None,
        ge=0,
        description="scale-up decision -> model ready (weights, init, graphs: first healthy /health); reported only",
    )
    gpus_per_replica: int = Field(
        default=1, gt=0, description="GPUs one replica holds (SimConfig.max_total_gpus counts them)"
    )
    waiting_per_replica: float | None = Field(
        default=2.0,
        gt=0,
        description="target of vllm:num_requests_waiting averaged over ready replicas (None: not a signal)",
    )
    kv_usage: float | None = Field(
        default=0.8,
        gt=0,
        le=1,
        description="target of vllm:kv_cache_usage_perc averaged over ready replicas (None: not a signal)",
    )
    running_per_replica: float | None = Field(
        default=None,
        gt=0,
        description="target of vllm:num_requests_running averaged over ready replicas (None: not a signal)",
    )
    metric_window_s: float = Field(default=60.0, gt=0, description="gauges averaged over the ticks of this window")
    tolerance: float = Field(default=0.1, ge=0, description="no reactive change while metric/target is within 1 ± this")
    scale_down_window_s: float = Field(
        default=300.0, ge=0, description="scale down to the largest recommendation of this window"
    )
    scale_up_cooldown_s: float | None = Field(
        default=None, ge=0, description="no reactive scale-up this soon after the last one (None: t_ready_s)"
    )
    min_residency_s: float = Field(
        default=600.0, ge=0, description="a replica serves at least this long before removal"
    )
    floor_times_s: tuple[float, ...] = Field(
        default=(), description="the forecast floor as steps: from floor_times_s[i] on ..."
    )
    floor_replicas: tuple[int, ...] = Field(
        default=(), description="... at least floor_replicas[i] replicas (ready or starting)"
    )

    @model_validator(mode="after")
    def _consistent(self) -> AutoscaleConfig:
        if self.max_replicas < self.min_replicas:
            raise ValueError(f"max_replicas ({self.max_replicas}) < min_replicas ({self.min_replicas})")
        if len(self.floor_times_s) != len(self.floor_replicas):
            raise ValueError("floor_times_s and floor_replicas must have the same length")
        if any(b <= a for a, b in pairwise(self.floor_times_s)):
            raise ValueError("floor_times_s must increase")
        points = [x for x in (self.pod_running_after_s, self.model_ready_after_s) if x is not None] + [self.t_ready_s]
        if any(b < a for a, b in pairwise(points)):
            raise ValueError(f"scale-up points must be ordered: pod running <= model ready <= t_ready_s, got {points}")
        if (
            self.waiting_per_replica is None
            and self.kv_usage is None
            and self.running_per_replica is None
            and not self.floor_replicas
        ):
            raise ValueError(
                "an autoscaler needs a floor or at least one reactive signal (waiting_per_replica, kv_usage, running_per_replica)"
            )
        return self


class SimConfig(_Frozen):
    """A whole run. `reference=True` advances one engine step per event (the slow oracle used in tests)."""

    engine: EngineConfig
    replicas: int = Field(default=1, gt=0, description="aggregated replicas (ignored with pd)")
    router: Annotated[str, AfterValidator(known_router)] = Field(
        default=DEFAULT_ROUTER, description="a registered router (llmcap.sim.routers)"
    )
    prefix_load_penalty: float = Field(
        default=0.5, ge=0, description="prefix_aware: score = hit tokens - penalty x outstanding tokens"
    )
    pd: PDConfig | None = None
    autoscale: AutoscaleConfig | None = Field(
        default=None,
        description="the aggregated replicas (P/D: the prefill pool) scaled at run time (`replicas` or the pool size: ignored)",
    )
    decode_autoscale: AutoscaleConfig | None = Field(
        default=None, description="P/D: the decode pool scaled at run time"
    )
    max_total_gpus: int | None = Field(
        default=None,
        gt=0,
        description="GPUs the autoscaled pools may hold together (llmcap.sim.autoscaler.share_budget); None: no limit",
    )
    reference: bool = False
    timeseries_resolution_s: float = Field(default=1.0, gt=0)
    max_time_s: float = Field(default=math.inf, gt=0, description="stop the clock here; unfinished requests say so")
    max_run_steps: int = Field(default=1 << 16, gt=0, description="longest multi-step decode advance")
    itl_exact: bool | None = Field(
        default=None,
        description="token-weighted ITL as exact (value, weight) pairs (memory grows with engine steps) or a "
        "log-binned histogram (1000 bins/decade, 0.23% wide); None: exact up to 200,000 requests",
    )

    @model_validator(mode="after")
    def _autoscale_aggregated(self) -> SimConfig:
        if self.decode_autoscale is not None and self.pd is None:
            raise ValueError("decode_autoscale scales the decode pool of a P/D deployment: set pd")
        if (
            self.autoscale is not None
            and self.decode_autoscale is not None
            and self.autoscale.interval_s != self.decode_autoscale.interval_s
        ):
            raise ValueError(
                "the prefill and decode autoscalers run on one control period: give them the same interval_s"
            )
        if self.max_total_gpus is not None and self.autoscale is None and self.decode_autoscale is None:
            raise ValueError("max_total_gpus is a budget of autoscaled pools: set autoscale or decode_autoscale")
        if self.autoscale is not None and self.router == "power_of_two":
            raise ValueError(
                "the power_of_two router draws its pairs for a fixed pool: pick another router with autoscale"
            )
        return self
