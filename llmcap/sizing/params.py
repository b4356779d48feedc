"""Knobs of the sizing step (pydantic, frozen, unknown keys rejected), ready to plug into `llmcap.config.Params`.

Times in params are milliseconds where they are SLO targets (how people write SLOs) and seconds
elsewhere; the code converts once, at the edge.
"""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import AfterValidator, BaseModel, ConfigDict, Field, model_validator

from llmcap.first_token import TTFT_INCLUDES_HANDOFF
from llmcap.policy_names import DEFAULT_ADMISSION, DEFAULT_ROUTER, known_admission, known_router

ItlStat = Literal["p50", "p99", "max", "mean", "token_p50", "token_p90", "token_p95", "token_p99", "token_p99.9"]
"""How `itl_ms` is judged. Per request: its median gap (p50), P99 gap, worst gap (max), or mean gap (mean: the
request's TPOT, vLLM's per-request `tpot`). token_pNN: the NN-th percentile of every gap of every request of the
run (token-level, as `vllm bench serve` reports ITL) — a check on the run, not on each request."""
DistMetric = Literal["ttft", "tpot", "e2e", "queue", "itl_p50", "itl_p99", "itl_max"]


class _Strict(BaseModel):
    # strict: a YAML `true` is no 1 and "3" no 3 (ints still pass for floats); no knob means anything at .inf/.nan.
    # Tuple fields say strict=False: YAML gives lists (their items stay strict).
    model_config = ConfigDict(
        extra="forbid", frozen=True, use_attribute_docstrings=True, strict=True, allow_inf_nan=False
    )


class DistributionTarget(_Strict):
    """A target on the distribution across a run's requests, e.g. P90 of TTFT ≤ 1000 ms beside a per-request P99 target:
    judged per run, like the token-level ITL; a run that misses it is infeasible whatever its attainment."""

    metric: DistMetric
    percentile: float = Field(gt=0, le=100)
    target_ms: float = Field(gt=0)


class SloParams(_Strict):
    """Per-request targets (a request qualifies only if it meets every one that is set) and the attainment goal."""

    ttft_ms: float | None = Field(default=2000.0, gt=0)
    """Time to first token, per request (with `ttft_ms_per_1k_isl`: the part every request gets)."""
    ttft_ms_per_1k_isl: float = Field(default=0.0, ge=0)
    """Length-scaled TTFT: request r's target is ttft_ms + this × ISL_r / 1000 (a 100k-token prompt cannot
    have a chat prompt's TTFT; 0 = one target for all)."""
    itl_ms: float | None = Field(default=100.0, gt=0)
    """Inter-token latency target, judged as `itl_stat` says."""
    itl_stat: ItlStat = "p99"
    """Which ITL definition must meet `itl_ms` (`ItlStat`): a per-request statistic of the request's own gaps
    (p50 | p99 | max = worst gap | mean = TPOT), or a token-level percentile across the run (token_p99, ...)."""
    ttft_includes_handoff: bool = TTFT_INCLUDES_HANDOFF
    """Disaggregated plans: TTFT ends when the decode instance emits the first token after the P→D KV handoff
    (the first token the user sees); false: when the prefill instance computes it (the handoff then shows
    as the request's first inter-token gap)."""
    tpot_ms: float | None = Field(default=None, gt=0)
    """Time per output token after the first, per request."""
    e2e_ms: float | None = Field(default=None, gt=0)
    """End-to-end deadline, per request."""
    max_queue_ms: float | None = Field(default=None, gt=0)
    """Longest time a request may wait before it is first scheduled."""
    attainment_target: float = Field(default=0.99, gt=0, le=1)
    """Share of (steady-window) requests that must qualify for a rate to count as feasible."""
    distribution: tuple[DistributionTarget, ...] = Field(default=(), strict=False)
    """Distribution-level targets across the steady window's requests (`DistributionTarget`), each judged per run."""
    availability: float | None = Field(default=None, gt=0, lt=1)
    """Share of requests served within these targets over the long run, nodes failing and being repaired
    (`headroom.node_mtbf_h`, `node_repair_h`; `llmcap.sizing.availability`); None = not planned for."""
    warmup_s: float = Field(default=0.0, ge=0)
    """Arrivals in the first `warmup_s` of the arrival span are not measured (cold caches, empty queues)."""
    drain_s: float = Field(default=0.0, ge=0)
    """Arrivals in the last `drain_s` of the arrival span are not measured (the load is already falling)."""
    warmup_frac: float = Field(default=0.0, ge=0, lt=1)
    """Warm-up as a share of the arrival span; the larger of this and `warmup_s` applies (rate-scaled traces
    shrink in time, so a fraction keeps the same requests out at every rate)."""
    drain_frac: float = Field(default=0.0, ge=0, lt=1)
    """Drain as a share of the arrival span; the larger of this and `drain_s` applies."""

    @model_validator(mode="after")
    def _window_leaves_something(self) -> SloParams:
        if self.warmup_frac + self.drain_frac >= 1:
            raise ValueError("warmup_frac + drain_frac must be < 1")
        return self


class SearchParams(_Strict):
    """Max-feasible-rate search: bracket from an initial guess, then bisection (see `llmcap.sizing.search`)."""

    seeds: tuple[Annotated[int, Field(ge=0)], ...] = Field(default=(0, 1, 2), min_length=1, strict=False)
    """Seeds evaluated at every rate."""
    feasibility: Literal["all_seeds", "mean"] = "all_seeds"
    """`all_seeds`: feasible only if every seed meets the attainment target (default, conservative);
    `mean`: if the mean attainment over seeds does."""
    rel_tol: float = Field(default=0.02, gt=0, lt=1)
    """Stop when (infeasible − feasible) ≤ rel_tol × feasible."""
    initial_rate: float | None = Field(default=None, gt=0)
    """First rate to try (req/s); None = the analytic guess the caller passes, else 1 req/s."""
    min_rate: float = Field(default=1e-3, gt=0)
    """Below this the candidate is declared infeasible (max rate 0)."""
    max_rate: float = Field(default=1e6, gt=0)
    """The bracket never expands past this; reaching it is reported, not hidden."""
    guard_points: int = Field(default=2, ge=0)
    """Monotonicity guard: after bisection, also evaluate this many rates below the answer."""
    guard_step: float = Field(default=0.25, gt=0, lt=1)
    """Guard rates are answer × (1 − i × guard_step), i = 1..guard_points (clipped at min_rate)."""
    max_evaluations: int = Field(default=64, ge=1)
    """Rates (not rate × seed) evaluated per search at most."""
    confirm_step: float = Field(default=0.2, gt=0, lt=1)
    """Whole-trace confirmation: after a failure with no confirmed rate below it, the next rate tried is
    the failed one × (1 − confirm_step); once one holds, bisection to `rel_tol`."""
    max_confirmations: int = Field(default=12, ge=1)
    """Whole-trace evaluations per confirmation at most (then the last confirmed rate, or 0, is kept)."""


class SteadyParams(_Strict):
    """How long each search evaluation replays, and when a run counts as overloaded whatever its attainment
    (see `llmcap.sizing.simeval` and `llmcap.sizing.stability`)."""

    span_ttft_multiple: float = Field(default=30.0, ge=0)
    """The replayed arrival span is at least this many TTFT targets (the mean request's), so a queue that
    grows faster than the target has time to show."""
    span_drain_multiple: float = Field(default=10.0, ge=0)
    """... and at least this many drain times (last finish − last arrival of the run), so the requests in
    flight at the window's edges are a small part of it. A run that passes but spans less is replayed once
    at this length (at most the whole trace); one that already fails is judged as it is."""
    ttft_growth: float = Field(default=0.5, gt=0)
    """Overloaded when the median TTFT of the steady window's last `edge_frac` of arrivals exceeds that of
    its first by more than this share of the TTFT target (the queue is still growing)."""
    min_served_ratio: float = Field(default=0.9, gt=0, le=1)
    """Overloaded when fewer requests finish inside the steady window than this share of those arriving in it."""
    edge_frac: float = Field(default=0.25, gt=0, le=0.5)
    """Share of the steady window's arrivals (by arrival order) compared at its start and at its end."""


class ReadyPhases(_Strict):
    """Worker ready time by phase (s): the autoscaler asks for an instance → the router admits it. T_ready is their sum.
    The defaults are assumptions for a 70B-class model in FP8 on a GPU node already in the cluster (no node to
    provision, no warm image or weight cache); each phase says what it rests on. Measure yours: `llmcap profile
    --serve-cmd` times process start → first healthy /health (the last four phases but admission)."""

    schedule_s: float = Field(default=30.0, ge=0)
    """Pod bound to a node with free GPUs and its containers created. Assumed: Kubernetes binds in seconds; volume
    attach and the device plugin's GPU allocation take most of it. A node the cluster autoscaler must add first
    takes minutes more (cloud VM boot + driver): add it here when your pool starts cold."""
    image_pull_s: float = Field(default=180.0, ge=0)
    """The serving image pulled (vLLM's CUDA image is ~10 GB compressed): ~60 MB/s effective from a registry,
    with layer extraction. 0 when the image is pre-pulled on the node (a DaemonSet or a node image)."""
    weight_load_s: float = Field(default=240.0, ge=0)
    """Weights read into HBM: 70 GB (70B parameters in FP8) at ~300 MB/s from network storage or a model hub mirror.
    A local NVMe cache at ~2 GB/s makes it ~35 s."""
    engine_init_s: float = Field(default=60.0, ge=0)
    """Engine start: process and distributed (NCCL) init across the TP group, the memory-profiling forward pass
    that sizes the KV cache, and the cache's allocation (vLLM logs each)."""
    compile_s: float = Field(default=60.0, ge=0)
    """torch.compile and CUDA graph capture (vLLM logs 'Graph capturing finished in N secs'): tens of seconds per
    batch-size set, less with a warm compile cache."""
    admission_s: float = Field(default=30.0, ge=0)
    """First healthy /health → the router sends it traffic: readiness probe period × success threshold (10 s × 1)
    plus the endpoint slice's propagation to the gateway and its own health check (~20 s)."""

    @property
    def pod_running_s(self) -> float:
        """Ask → pod running: scheduled and its image pulled."""
        return self.schedule_s + self.image_pull_s

    @property
    def model_ready_s(self) -> float:
        """Ask → model ready (first healthy /health): pod running, weights, init, graphs."""
        return self.pod_running_s + self.weight_load_s + self.engine_init_s + self.compile_s

    @property
    def total_s(self) -> float:
        """Ask → router admitted: T_ready."""
        return self.model_ready_s + self.admission_s


class _ReadyTime(_Strict):
    """T_ready as phases (`ready`), or one number (`t_ready_s`) that overrides their sum."""

    ready: ReadyPhases = ReadyPhases()
    """Scale-up time by phase; T_ready = their sum."""
    t_ready_s: float | None = Field(default=None, ge=0)
    """Scale-up decision → routable, as one number: overrides the sum of `ready` (its phases then only apportion it)."""

    @property
    def ready_time_s(self) -> float:
        return self.ready.total_s if self.t_ready_s is None else self.t_ready_s

    @property
    def ready_points_s(self) -> tuple[float, float, float]:
        """(pod running, model ready, router admitted) after the ask; an override scales the phases to its total."""
        r = self.ready
        k = 1.0 if self.t_ready_s is None or r.total_s == 0 else self.t_ready_s / r.total_s
        return (r.pod_running_s * k, r.model_ready_s * k, self.ready_time_s)


class HeadroomParams(_ReadyTime):
    """Headroom per pool as scenarios on the deployment (see `llmcap.sizing.headroom`): traffic at the planning
    rate with the larger of one node lost or one rolling-upgrade step out, under the KV limit."""

    traffic_method: Literal["replay", "forecast_error"] = "replay"
    """The planning rate: `replay` = the target itself (every scenario replays the whole trace at that mean, so
    the trace's own bursts are in it; no peak factor on top), `forecast_error` = target × (1 + forecast_error)."""
    traffic_window_s: float = Field(default=60.0, gt=0)
    """Window of the stated windowed-rate percentile and of the autoscaler's ramp."""
    traffic_percentile: float = Field(default=99.0, gt=0, le=100)
    """Which percentile of the windowed rate the report states the replay covers."""
    forecast_error: float = Field(default=0.2, ge=0)
    """Relative forecast error at the chosen quantile (0.2 = actual may be 20% above forecast)."""
    node_failures: int = Field(default=1, ge=0)
    """Nodes that may be lost (the fullest ones of a pool) while the rest still carry the planning rate."""
    node_mtbf_h: float = Field(default=6335.0, gt=0)
    """Mean time between failures of one node, for `slo.availability`. The default is Llama 3's training fleet:
    419 unexpected interruptions in 54 days on 2,048 eight-GPU H100 nodes (2,048 × 54 × 24 / 419 ≈ 6,335 h)."""
    node_repair_h: float = Field(default=4.0, ge=0)
    """Time until a failed node's instances serve again (replaced or repaired, model loaded), for `slo.availability`."""
    max_surge: int = Field(default=1, ge=0)
    """Rolling upgrade: new instances started before old ones stop (their GPUs must exist: out of service)."""
    max_unavailable: int = Field(default=0, ge=0)
    """Rolling upgrade: instances down at once."""
    kv_safe_fraction: float = Field(default=0.9, gt=0, le=1)
    """P99 KV tokens per instance at the operating point must stay below this share of its KV capacity."""
    ramp_rps_per_s: float | None = Field(default=None, ge=0)
    """Demand growth (req/s per second) an autoscaler must cover during t_ready; None = the trace's largest
    windowed rise. Reported, not added."""


class ComputeParams(_Strict):
    """Where (candidate, rate) evaluations run."""

    dask_address: str | None = None
    """A Dask scheduler address (tcp://host:8786, or inproc:// in tests); None = local processes."""
    workers: int = Field(default=1, ge=1)
    """Local process workers; 1 runs in-process (no pickling, easiest to debug)."""


class AutoscaleParams(_ReadyTime):
    """Stage `autoscale`: the chosen plan on a synthesized diurnal day, static vs autoscaled (`llmcap.sizing.autoscale_whatif`)."""

    enabled: bool = True
    amplitude: float = Field(default=0.6, ge=0, lt=1)
    """Rate = planning rate × (1 + amplitude · sin 2πt/period)."""
    period_s: float = Field(default=14_400.0, gt=0)
    """One diurnal cycle. Shorter than a day keeps the simulation short; its ramps are then steeper than a real
    day's for the same T_ready, which is conservative for the autoscaler."""
    duration_s: float = Field(default=14_400.0, gt=0)
    interval_s: float = Field(default=15.0, gt=0)
    min_residency_s: float = Field(default=600.0, ge=0)
    scale_down_window_s: float = Field(default=300.0, ge=0)
    metric_window_s: float = Field(default=60.0, gt=0)
    waiting_per_replica: float = Field(default=2.0, gt=0)
    utilization: float = Field(default=0.8, gt=0, le=1)
    """A pool's KV-usage target is one instance's usage at this share of its max feasible rate."""
    forecast_error: float = Field(default=0.1, ge=0)
    """The synthesized day's floor margin (0.1: the rate may be 10% above the curve); a fitted forecast measures its own."""
    forecast: Literal["fit", "synthetic"] = "fit"
    """`fit`: where the trace spans ≥ 2 days, fit its daily (≥ 2 weeks: and weekly) seasonality on the first part, take the
    error from the held-back rest, and serve that rest as it came, beside a flat forecast's floor
    (`llmcap.sizing.forecast`); a shorter trace keeps the synthesized day, and the report says so. `synthetic`: always
    the synthesized day's own curve × (1 + forecast_error)."""
    forecast_bin_s: float = Field(default=900.0, gt=0)
    """The arrival rate is fitted and judged per bin of this width."""
    forecast_holdout: float = Field(default=0.2, gt=0, lt=1)
    """Share of the trace's span held back (its end) to measure the forecast error and to serve as the day."""
    forecast_error_quantile: float = Field(default=0.95, gt=0, le=1)
    """The error is this quantile of actual ÷ forecast − 1 over the held-back bins."""
    forecast_harmonics: int = Field(default=3, ge=1, le=12)
    """Harmonics per seasonal period (daily, weekly)."""
    max_total_gpus: int | None = Field(default=None, gt=0)
    """One GPU budget for the autoscaled pools together (P/D: prefill and decode; `llmcap.sim.autoscaler.share_budget`:
    each keeps what it holds, the rest goes to the pool with the larger unmet share, ties to decode); None: no limit."""
    floor_fractions: tuple[Annotated[float, Field(ge=0, le=1.5)], ...] = Field(
        default=(0.0, 0.5, 1.0), min_length=1, strict=False
    )
    """Forecast floors tried, as shares of the full floor (0: purely reactive)."""
    windows: int = Field(default=24, ge=1)
    """Attainment is also reported for the worst of this many equal windows of the day."""


class PrefixTier(_Strict):
    """An offload tier of the prefix cache, per instance (`size.prefix_tiers`, `size --tier`)."""

    name: str = Field(min_length=1)
    gb: float = Field(gt=0, description="capacity, GB per instance")
    gbps: float = Field(gt=0, description="load bandwidth into HBM, GB/s")
    lookup_ms: float = Field(
        default=0.0, ge=0, description="latency of asking it for a prefix, paid by every admission that looks"
    )

    def spec(self) -> str:
        return f"{self.name}:{self.gb:g}:{self.gbps:g}:{self.lookup_ms:g}"


MIN_CHECKED_REQUESTS = 1000  # the shortest busiest span `whole_trace_max_requests` may ask for


class SizeParams(_Strict):
    """Stage `size` (step 4): SLOs, the search, headroom, where evaluations run, and how much to simulate."""

    slo: SloParams = SloParams(ttft_ms=2000.0, ttft_ms_per_1k_isl=200.0, warmup_frac=0.1, drain_frac=0.1)
    search: SearchParams = SearchParams(seeds=(0, 1), rel_tol=0.05)
    headroom: HeadroomParams = HeadroomParams()
    compute: ComputeParams = ComputeParams()
    target_rps: float | None = Field(default=None, gt=0)
    """Planning rate (req/s); None = the trace's own mean rate (headroom then covers its peaks)."""
    excerpt_requests: int = Field(default=1500, ge=10)
    """Fewest requests per search evaluation: each seed replays a different run of at least this many
    consecutive requests (more at high rates: `steady`)."""
    steady: SteadyParams = SteadyParams()
    whole_trace_max_requests: int = Field(default=20_000, ge=0)
    """A trace with more requests than this has its whole-deployment checks (confirmation, scenario fit, router and
    count range) replay its busiest span of this many consecutive requests instead (`llmcap.sizing.checked`; the
    report names it); the planned deployment's final replay still runs on the whole trace. 0 = always the whole trace."""
    confirm_whole_trace: Literal["chosen", "all", "off"] = "chosen"
    """Confirm max rates by simulating the whole trace at them, stepping down until one holds: `chosen` = the
    cheapest plan's candidate (re-choosing until the cheapest is confirmed), `all` = every searched one
    (more simulation), `off` = excerpts only. Unconfirmed rates are listed in the notes."""
    prefix_tiers: list[PrefixTier] = []
    """Offload tiers of each instance's prefix cache below HBM, nearest first (host DRAM, local SSD, a remote
    store): evicted prefixes are loaded back from them instead of computed, at their bandwidth and lookup cost."""
    admission_policy: Annotated[str, AfterValidator(known_admission)] = DEFAULT_ADMISSION
    """The serving engine's admission policy (`llmcap.sim.admission`): `vllm` (admit what this step's blocks allow,
    preempt and recompute when decodes outgrow the cache), `trtllm-guaranteed-no-evict` (TensorRT-LLM's default:
    admit only what fits for its whole life, never preempt), `trtllm-max-utilization`, `sglang` (admit while the free KV
    covers the newcomer and a decaying share of the running requests' remaining outputs)."""
    router: Annotated[str, AfterValidator(known_router)] = DEFAULT_ROUTER
    """Router of a pool's instances (of the prefill pool, P/D), in the scenario simulations."""
    prefix_routing: Literal["search", "off"] = "search"
    """`search`: where the trace has prefix hashes, the chosen plan's scenario fit also runs with the prefix_aware router
    (most cached prompt tokens, less a load penalty) and the router needing the cheaper deployment is kept (ties: `router`);
    `off`: `router` only."""
    shortlist: int = Field(default=4, ge=1)
    """Aggregated candidates searched per round (in order of analytic bound per GPU)."""
    max_simulated: int = Field(default=12, ge=1)
    """Branch and bound stops after this many aggregated candidates even if bounds could still win."""
    pd_prefill_shortlist: int = Field(default=2, ge=0)
    """Disaggregated: prefill rows whose pool rate G_P is searched (the best row of each GPU/parallel layout, by
    analytic prefill bound per dollar); every pairing with a searched decode row is sized. 0 = no P/D."""
    pd_decode_shortlist: int = Field(default=1, ge=1)
    """Disaggregated: decode rows whose pool rate G_D is searched (best per layout by analytic decode bound per dollar)."""
    pd_search_max_instances: int = Field(default=8, ge=1)
    """Disaggregated: the largest pool a role's per-instance rate is searched in (at that pool's share of the planning
    rate). A larger pool multiplexes a little better but costs simulation in proportion to its traffic; the whole-trace
    scenario fit settles the real counts."""
    pd_link_latency_s: float = Field(default=20e-6, ge=0)
    """KV-transfer link latency; bandwidth = the prefill instance's NICs (catalog)."""
    pd_network_overhead: float = Field(default=1.25, ge=1)
    """P→D provisioning (`llmcap.sizing.network`): a prefill instance's link must carry max(burst, concurrent flows) ×
    this (transport framing, retransmits, ranks' NICs not evenly loaded). Reported per plan; the count does not use it."""
    kv_budget: Literal["engine", "plan"] = "engine"
    """KV tokens per instance: `engine` = what the engine stated for a candidate's configuration (a matching profile's
    `kv_capacity_tokens`, `llmcap size --kv-from-log`) where it did, else the memory plan's; `plan` = the memory plan's
    always (the engine's is shown beside it). `llmcap.sizing.kvbudget`."""
    pools_split_isl: int | None = Field(default=None, gt=0)
    """Also compare one shared pool with a pool per request class (prompts ≤ this many tokens vs longer),
    each class sized on its own sub-trace; None = skip."""
    pools_split_cap: float | None = Field(default=None, gt=1)
    """Also compare one shared pool with a pool for the requests whose max_tokens is more than this many times the
    trace's median output (a cap far above the typical output: what reserving admission holds) and one for the rest
    (no cap stated included), as `pools_split_isl` does; None = skip. One split at a time."""
    count_seeds: tuple[Annotated[int, Field(ge=0)], ...] = Field(default=(1, 2), strict=False)
    """Seeds on which the final plan's scenarios, and each pool with one instance fewer, are simulated again
    for the count's range (`llmcap.sizing.uncertainty`; the search's first seed is the point answer's). () = off."""
    final_shortlist: int = Field(default=3, ge=1)
    """Deployment shapes (an aggregated candidate or a P/D pairing), cheapest analytic plan first, whose counts are
    settled by simulating the whole trace in every scenario; the cheapest that passes them all is the answer."""
    max_cost_factor: float = Field(default=4.0, gt=1)
    """The scenario fit grows a shape up to this many times its analytic plan's $/h; a shape still failing there
    is a near miss (what it reached, the scenario that still fails)."""
    model_error_range: bool = True
    """The count's range also from the step-time model's own error: the plan fitted again with step times × (1 ∓ e)
    (`llmcap.sizing.uncertainty`; two more scenario fits). False: the range is seeds only."""
    max_usd_per_hour: float | None = Field(default=None, gt=0)
    """An absolute cost limit on every plan ($/h); None = only `max_cost_factor`."""

    @model_validator(mode="after")
    def _span_long_enough(self) -> SizeParams:
        if 0 < self.whole_trace_max_requests < MIN_CHECKED_REQUESTS:
            raise ValueError(
                f"whole_trace_max_requests {self.whole_trace_max_requests}: a busiest span of fewer than "
                f"{MIN_CHECKED_REQUESTS:,} requests cannot judge an attainment target; set 0 (always the whole trace) "
                f"or at least {MIN_CHECKED_REQUESTS:,}"
            )
        return self

    @model_validator(mode="after")
    def _one_split(self) -> SizeParams:
        if self.pools_split_isl is not None and self.pools_split_cap is not None:
            raise ValueError(
                "pools_split_isl and pools_split_cap each split the requests in two: set one (null the other)"
            )
        return self
