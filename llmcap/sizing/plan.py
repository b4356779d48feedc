"""Step 4 end to end: feasible candidates + trace + SLOs → sized, costed deployments, in five phases (`PHASES`) on one
planning traffic (`llmcap.sizing.headroom.planning_traffic`: the target rate, the trace replayed at it, the planning
demand), derived once and handed to the one `Sizer` of the plan.

1. Prune (analytic bounds, excerpts): every feasible candidate gets analytic upper bounds on one instance's rate
   (prefill compute, decode bandwidth, KV by Little's law) from its step-time model, and its attainment when idle
   (an upper bound at any rate). The disaggregated roles are searched first (`llmcap.sizing.pd_search`: each
   prefill row's and each decode row's own per-instance rate G_P / G_D, beside an ample other pool; every pairing,
   any GPU types and prefill layouts, sized pool by pool — no fixed P:D unit); then aggregated candidates in order
   of bound per GPU, in batches of `shortlist`, while a bound can still beat the best goodput per GPU found
   (branch and bound, at most `max_simulated`; once a best is known, a candidate's search starts at the rate it
   needs to beat it and stops there if that rate fails). Each simulated unit's max feasible rate comes from
   bracket + bisection on rate-scaled excerpts (`llmcap.sizing.search`; seeds replay different excerpts, long
   enough at each rate for a queue to show, and an overloaded run fails whatever its attainment), through the
   executor. Each row's pools are sized from the planning rate with headroom per pool, in req/s, rounded once
   (`llmcap.sizing.headroom`), with cost: the analytic plan, which ranks the shapes. Every pruned or stopped
   candidate is listed in the notes with its reason.
2. Whole trace: the cheapest row's max rate is confirmed on the whole trace at that rate, stepping down until it
   holds (`confirm_whole_trace`: the chosen candidate's, re-choosing until the cheapest plan is a confirmed one;
   or every candidate's, in phase 1); the notes say what each confirmation did and which rates stay unconfirmed.
3. Scenarios: the `final_shortlist` cheapest shapes by analytic plan are each simulated end to end on the whole
   trace at the planning rate in every scenario (node loss, rolling upgrade; `llmcap.sizing.scenarios`);
   instances are added per pool until all pass (up to the shape's cost limit, `max_cost_factor` × its analytic
   $/h or `max_usd_per_hour`), and each pool is settled at its minimum (one fewer fails a scenario).
4. Choose: the cheapest shape that passes is the answer (fitted again under the other routers where the trace
   has prefix hashes); when none passes, the closest is shown with the verdict "fails" (the CLI and the stage
   exit non-zero).
5. Range: the chosen plan judged on `count_seeds` and fitted again at the ends of the step-time model's error
   (`llmcap.sizing.uncertainty`).
Then the planned deployment is replayed on the whole trace for the report (`llmcap.sizing.outcome`), the
four-ledger floor (`llmcap.sizing.ledger`) beside it.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from dataclasses import replace

import numpy as np
import pandas as pd
import pyarrow as pa

from llmcap.catalog import ModelSpec
from llmcap.errors import LlmcapError
from llmcap.sizing.executor import Executor
from llmcap.sizing.finalists import Shortlist
from llmcap.sizing.headroom import planning_traffic
from llmcap.sizing.measured import MeasuredModels
from llmcap.sizing.outcome import Choice, SizingOutcome, sizing_outcome
from llmcap.sizing.params import SizeParams
from llmcap.sizing.pd_search import disaggregated
from llmcap.sizing.pools import Pool, PoolComparison, compare_pools
from llmcap.sizing.sizer import Sizer
from llmcap.sizing.summary import SizingSummary
from llmcap.sizing.uncertainty import CountRange
from llmcap.sizing.units import SizedRow

log = logging.getLogger(__name__)


SHOWN_REASONS = 4  # distinct reasons named in the one-line error; the CLI lists every candidate's beside it


def no_feasible_candidate(candidates: pd.DataFrame) -> str:
    """The one-line error when step 2 ruled out every candidate: each distinct reason (of `reasons`, "; "-joined
    per row) with how many candidates it ruled out, commonest first — never a pointer to reasons not shown."""
    if candidates.empty:
        return "no feasible candidate to size: the candidates table has no rows"
    counts: dict[str, int] = {}
    for text in candidates["reasons"].fillna(""):
        for reason in dict.fromkeys(r.strip() for r in str(text).split("; ") if r.strip()):
            counts[reason] = counts.get(reason, 0) + 1
    ranked = sorted(counts.items(), key=lambda kv: (-kv[1], kv[0]))
    n = len(candidates)
    shown = "; ".join(f"{reason} ({k} of {n})" for reason, k in ranked[:SHOWN_REASONS])
    more = f"; and {len(ranked) - SHOWN_REASONS} more reason(s)" if len(ranked) > SHOWN_REASONS else ""
    return f"no feasible candidate to size: step 2 ruled out all {n} candidates: {shown or 'no reason recorded'}{more}"


PHASES = (
    "prune (analytic bounds, excerpts)",
    "whole trace (confirming the cheapest)",
    "scenarios (settling the shortlisted shapes)",
    "choice",
    "count range",
    "planned deployment replay",
)


def size_deployments(
    trace: pa.Table,
    candidates: pd.DataFrame,
    model: ModelSpec,
    params: SizeParams,
    executor: Executor | None = None,
    workload_id: str = "workload",
    progress: Callable[[str], None] | None = None,
    measured: MeasuredModels | None = None,
    simulate_scenarios: bool = True,
    on_phase: Callable[[int, int, str], None] | None = None,
) -> SizingOutcome:
    """The capacity table, report and summary for `trace` over the feasible rows of `candidates`, phase by phase as
    the module docstring says (`measured`: calibrated step models that replace the roofline for matching candidates;
    `simulate_scenarios` False: the analytic per-pool plan without the scenario simulations;
    `on_phase(done, total, name)`: before each of `PHASES` and once at the end, for a progress bar)."""
    feasible = candidates[candidates["feasible"]]
    if feasible.empty:
        raise LlmcapError(no_feasible_candidate(candidates))
    traffic = planning_traffic(trace, params.target_rps, params.headroom)
    sizer = Sizer(trace, model, params, traffic, executor, progress or log.info, measured)
    phase = _phase_clock(on_phase)
    phase(0)
    rows = _prune(sizer, feasible)
    phase(1)
    cheapest, rows = sizer.confirm_cheapest(rows)
    phase(2)
    shortlist = sizer.scenarios(rows) if simulate_scenarios else None
    phase(3)
    choice = _choose(sizer, cheapest, rows, shortlist)
    phase(4)
    spread = _count_range(sizer, choice)
    phase(5)
    # the planned deployment replayed on the whole trace at the planning rate, for the report's CDFs and KV plot
    out = sizing_outcome(workload_id, sizer, choice, sizer.replay(choice.chosen, choice.plan), spread, len(feasible))
    phase(len(PHASES))
    return out


def _phase_clock(on_phase: Callable[[int, int, str], None] | None) -> Callable[[int], None]:
    """`phase(done)`: logs how long the phase before `done` took and tells `on_phase` which one starts."""
    began = [time.perf_counter()]

    def phase(done: int) -> None:
        now = time.perf_counter()
        if done > 0:
            log.info("sizing phase %d/%d (%s) took %.1f s", done, len(PHASES), PHASES[done - 1], now - began[0])
        began[0] = now
        if on_phase is not None:
            on_phase(done, len(PHASES), PHASES[done] if done < len(PHASES) else "done")

    return phase


def _prune(sizer: Sizer, feasible: pd.DataFrame) -> list[SizedRow]:
    """Phase 1: the disaggregated pairings, then the aggregated candidates (the pairings' best goodput per GPU is the
    incumbent their branch and bound must beat), each with its analytic plan."""
    rows: list[SizedRow] = []
    dis = feasible[feasible["mode"] == "disaggregated"]
    if sizer.params.pd_prefill_shortlist > 0 and not dis.empty:
        rows += disaggregated(sizer, dis)
    incumbent = max((r.balanced_rps_per_gpu for r in rows), default=0.0)
    if (feasible["mode"] == "aggregated").any():
        rows = sizer.aggregated(feasible[feasible["mode"] == "aggregated"], incumbent) + rows
    return rows


def _choose(sizer: Sizer, cheapest: SizedRow, rows: list[SizedRow], shortlist: Shortlist | None) -> Choice:
    """Phase 4: the cheapest finalist that passes every scenario (`Sizer.pick`), the rows' plans the fitted ones where
    settled; without scenarios (`shortlist` None), the `cheapest` row by analytic plan."""
    assert cheapest.plan is not None
    if shortlist is None:
        return Choice(cheapest, rows, cheapest.plan)
    outcome = sizer.pick(shortlist)
    fitted, finalists = outcome.chosen.fit, [f.describe() for f in outcome.finalists]
    fits = {f.row.key: f.fit for f in outcome.finalists}
    rows = [replace(r, plan=fits[r.key].plan) if r.key in fits else r for r in rows]
    chosen = next(r for r in rows if r.key == outcome.chosen.row.key)
    assert outcome.chosen.row.plan is not None
    if not fitted.ok:
        sizer.notes.append(
            f"NO PLAN PASSES: none of the {len(finalists)} shape(s) settled on the whole trace passed every scenario "
            f"within its cost limit; the closest is shown: {outcome.chosen.line()}"
        )
    settled = {key: f.ok for key, f in fits.items()}
    return Choice(chosen, rows, outcome.chosen.row.plan, fitted, outcome.routers, finalists, settled)


def _count_range(sizer: Sizer, choice: Choice) -> CountRange | None:
    """Phase 5: the chosen plan's count range (`Sizer.count_range`), where its fit passes."""
    fitted = choice.fitted
    return sizer.count_range(choice.chosen, fitted.minimality) if fitted is not None and fitted.ok else None


def class_pools(
    trace: pa.Table,
    candidates: pd.DataFrame,
    model: ModelSpec,
    params: SizeParams,
    shared: SizingOutcome,
    split_isl: int | None = None,
    executor: Executor | None = None,
    measured: MeasuredModels | None = None,
    split_cap: float | None = None,
) -> PoolComparison:
    """One shared deployment (the plan already sized) against one per request class (`request_classes`), each class
    sized on its own sub-trace at its share of the target rate with its own best configuration (P/D pools sized
    separately too). Compared on base GPUs (the bare counts at the mean rate; headroom applies to either, and
    per-class scenarios are not simulated)."""
    s = shared.summary
    pools_shared = [Pool("shared", s["target_rps"], s["base_gpus"], _base_usd(s))]
    split = []
    where, classes = request_classes(trace, split_isl, split_cap)
    for name, mask in classes:
        n = int(mask.sum())
        if n < 2:
            raise LlmcapError(f"request-class split at {where} leaves {n} request(s) in class '{name}'")
        sub = trace.filter(pa.array(mask))
        rate = s["target_rps"] * n / trace.num_rows
        update = {"target_rps": rate, "pools_split_isl": None, "pools_split_cap": None}
        try:
            out = size_deployments(
                sub,
                candidates,
                model,
                params.model_copy(update=update),
                executor,
                name,
                measured=measured,
                simulate_scenarios=False,
            )
        except LlmcapError as exc:
            raise LlmcapError(f"class '{name}' ({n:,} requests) alone: {exc}") from None
        o = out.summary
        split.append(Pool(f"{name}: {o['chosen']}", rate, o["base_gpus"], _base_usd(o)))
    return compare_pools(pools_shared, split)


def request_classes(
    trace: pa.Table, split_isl: int | None, split_cap: float | None
) -> tuple[str, list[tuple[str, np.ndarray]]]:
    """(where the split is, [(class name, its requests)]): prompts of at most `split_isl` tokens vs longer ones, or
    requests whose max_tokens exceeds `split_cap` × the median output vs the rest (no cap stated: the rest)."""
    if split_isl is not None:
        isl = trace.column("isl").to_numpy()
        return f"ISL {split_isl:,}", [
            (f"ISL ≤ {split_isl:,}", isl <= split_isl),
            (f"ISL > {split_isl:,}", isl > split_isl),
        ]
    if split_cap is None:
        raise LlmcapError("a request-class split needs pools_split_isl or pools_split_cap")
    bound = split_cap * float(np.median(trace.column("osl").to_numpy()))
    caps = trace.column("max_tokens").to_numpy(zero_copy_only=False).astype(np.float64)  # null: NaN, never above
    long_cap = np.nan_to_num(caps, nan=0.0) > bound
    return (
        f"max_tokens {split_cap:g}× the median OSL ({bound:,.0f})",
        [(f"max_tokens ≤ {bound:,.0f} or none", ~long_cap), (f"max_tokens > {bound:,.0f}", long_cap)],
    )


def _base_usd(summary: SizingSummary) -> float:
    """$/h of the base counts (each pool's base GPUs at its GPU's price)."""
    pools = summary["pool_plans"].values()
    return float(sum(q["usd_per_hour"] * q["base_instances"] / q["instances"] for q in pools))
