"""The sizing decision's summary: what `summary.json` holds, typed, so every reader's keys are checked.

JSON-ready values only (the file is written with `json.dumps` as is), in the order they are written."""

from __future__ import annotations

from typing import Any, NotRequired, TypedDict


class HeadroomSummary(TypedDict):
    rps: float  # the headroom this risk adds to the pool's planning rate
    instances: int
    reasoning: str


class PoolPlanSummary(TypedDict):
    configuration: str  # the pool's candidate key
    per_instance_rps: float  # G: one instance's max feasible rate (excerpt search; it seeds the count)
    routed_rps: dict[str, float]  # "mean" and "busiest" instance's arrivals/s as the plan's router split the replay
    gpus_per_instance: int
    base_instances: int
    instances: int
    gpus: int
    usd_per_hour: float
    headroom: dict[str, HeadroomSummary]  # by risk
    placement: str


class PoolSizes(TypedDict):
    name: str
    rate_rps: float
    gpus: int
    usd_per_hour: float


class RequestClassPools(TypedDict):
    """Request-class pools against one shared deployment (`size.pools_split_isl`)."""

    cheaper: str  # "shared" or "split"
    reason: NotRequired[str]  # why no split was possible
    saving_usd_per_hour: NotRequired[float]
    shared: NotRequired[list[PoolSizes]]
    split: NotRequired[list[PoolSizes]]


class FinalistSummary(TypedDict):
    """A shape whose counts were settled on the whole trace in every scenario (`size.final_shortlist`)."""

    candidate: str
    mode: str
    analytic_gpus: int  # the per-pool plan from the searched per-instance rates, before any scenario ran
    analytic_usd_per_hour: float
    gpus: int  # after the scenario fit
    usd_per_hour: float
    counts: dict[str, int]  # instances per pool after the fit
    passes: bool
    binding: str | None  # passing: the scenario one instance fewer fails; failing: the scenario still failing
    failed: str | None  # the failing scenario's line (failing shapes)
    cost_limit_usd_per_hour: float | None  # where a failing shape's growth stopped
    line: str


class SizingSummary(TypedDict):
    verdict: (
        str  # "passes": the plan passes every scenario; "fails": no shape passed within its cost limit (not an answer)
    )
    target_rps: float
    slo_definitions: dict[str, str]
    planning_rps: float
    chosen: str  # the chosen candidate key ("P[a]+D[b]" for a pairing)
    mode: str
    router: str
    admission_policy: str  # the engine's (llmcap.sim.admission)
    routers_compared: dict[str, dict[str, Any]] | None
    pd_ratio: str | None  # "N_P:N_D"
    max_rps_per_unit: float
    gpus_per_unit: int
    base_instances: int
    base_gpus: int
    instances: int
    gpus: int
    usd_per_hour: float
    pool_plans: dict[str, PoolPlanSummary]
    analytic_gpus: int  # the per-pool plan before the scenario simulations
    combination_rule: str
    scenarios: list[str] | None
    scenarios_pass: bool | None
    finalists: list[FinalistSummary] | None  # the shapes settled on the whole trace, cheapest analytic plan first
    checked_traffic: str  # what the whole-deployment checks replayed: the whole trace, or its busiest span
    minimality: list[str] | None
    fit_history: list[str] | None
    count_range: dict[str, Any] | None
    ledger: dict[str, Any]
    prefix_tiers: (
        list[dict[str, Any]] | None
    )  # the planned deployment's replay: each offload tier's hits, load, lookups, net gain
    network: (
        dict[str, Any] | None
    )  # P/D: the prefill instances' link provisioning and the replay's handoff percentiles (llmcap.sizing.network)
    deployment: dict[
        str, Any
    ]  # the planned deployment as `llmcap simulate --plan` replays it (`llmcap.sizing.planned`)
    candidates_feasible: int
    candidates_simulated: int
    notes: list[str]


class CapacitySummary(SizingSummary):
    """The plan's summary as `llmcap size` and the size stage write it: the sizing, the request-class pools
    when asked for, and what timed the steps."""

    pools: NotRequired[RequestClassPools]
    step_model_source: str
    step_model_corrections: list[dict[str, Any]]
    roofline_calibrations: dict[str, dict[str, str]]
    # per pool of the chosen plan: its configuration and what sized it (llmcap.planning.pool_provenance)
    pool_provenance: dict[str, dict[str, str]]
    # per configuration an engine stated a KV capacity for: planned, measured and used tokens per instance (llmcap.sizing.kvbudget)
    kv_budget: list[dict[str, Any]]
    engine_preset: NotRequired[
        dict[str, dict[str, Any]]
    ]  # by GPU: the engine defaults the candidates took (llmcap.engine_presets)
