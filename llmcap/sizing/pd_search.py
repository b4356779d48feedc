"""The disaggregated phase of the sizing search (`llmcap.sizing.plan`): each role's per-instance rate as one
instance of a pool, searched on its own, then every (prefill row, decode row) pairing sized pool by pool."""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING

import pandas as pd

from llmcap.sizing.analytic import ceil_count
from llmcap.sizing.nearmiss import idle_miss
from llmcap.sizing.search import SearchTask, search_candidates
from llmcap.sizing.simeval import SimEvaluate
from llmcap.sizing.units import (
    RoleRow,
    SizedRow,
    Unit,
    best_per_layout,
    decode_bound,
    make_unit,
    rate_per_usd,
    unit_numerics,
)

if TYPE_CHECKING:
    from llmcap.sizing.sizer import Sizer


def disaggregated(sizer: Sizer, rows: pd.DataFrame) -> list[SizedRow]:
    """Each pool's per-instance rate searched on its own, then every (prefill row, decode row) pairing sized.

    Numerics (weight quant, KV dtype) are those of the best decode row by analytic bound per dollar: both
    pools must share them. Prefill rows (the best of each GPU/TP layout by prefill bound per dollar,
    `pd_prefill_shortlist`) are searched first, as a pool ahead of ceil(2 × pool bound / decode bound)
    instances of the best decode row (decode never binds: its bound, halved, still covers the pool's
    bound); then decode rows (`pd_decode_shortlist`) as a pool behind ceil(1.5 × pool bound / G_P)
    instances of the prefill row with the best measured G_P per dollar (`role_rates` sets the pool
    sizes). Pairings may mix GPU types and prefill layouts; each is sized pool by pool
    (`llmcap.sizing.headroom`) — no fixed P:D unit.
    """
    p = sizer.params
    units = [
        make_unit(sizer.model, r, sizer.lengths, p.slo, sizer.measured, p.admission_policy, p.prefix_tiers)
        for _, r in rows.iterrows()
    ]
    good = [u for u in units if u.unloaded_attainment >= p.slo.attainment_target]
    sizer.idle_misses += [
        idle_miss(f"{u.row['role']}: {u.key}", u.unloaded_attainment, p.slo) for u in units if u not in good
    ]
    dec = best_per_layout([u for u in good if u.row["role"] == "decode"], lambda u: rate_per_usd(decode_bound(u), u))
    if not dec:
        return []
    # Both pools run the same numerics (the handed-off KV must be readable, the tokens the same model's):
    # those of the best decode row by bound per dollar.
    numerics = unit_numerics(dec[0])
    dec = [u for u in dec if unit_numerics(u) == numerics]
    pre = [u for u in good if u.row["role"] == "prefill" and unit_numerics(u) == numerics]
    pre = best_per_layout(pre, lambda u: rate_per_usd(u.bounds.prefill_compute, u))
    if not pre:
        return []
    pre, dec = pre[: p.pd_prefill_shortlist], dec[: p.pd_decode_shortlist]
    sizer.say(
        f"disaggregated: searching the prefill pool rate of {len(pre)} row(s), then the decode pool rate of {len(dec)}"
    )
    lead_d = dec[0]

    def prefill_eval(u: Unit, n: int) -> tuple[SimEvaluate, str]:
        n_d = max(1, math.ceil(2 * n * u.bounds.prefill_compute / decode_bound(lead_d)))
        return sizer.pd_factory(u, lead_d)(n, n_d), f"ahead of {n_d} decode instance(s) of {lead_d.key}"

    pre_rows = role_rates(sizer, "prefill", pre, lambda u: u.bounds.prefill_compute, prefill_eval)
    usable = [r for r in pre_rows if r.rate > 0]
    if not usable:
        sizer.roles += pre_rows
        sizer.notes.append("disaggregated: no prefill row carries any rate under the SLOs; no P/D plan")
        return []
    lead_p = max(usable, key=lambda r: (rate_per_usd(r.rate, r.unit), r.unit.key))

    def decode_eval(u: Unit, n: int) -> tuple[SimEvaluate, str]:
        n_p = max(1, math.ceil(1.5 * n * decode_bound(u) / lead_p.rate))
        return sizer.pd_factory(lead_p.unit, u)(n_p, n), f"behind {n_p} prefill instance(s) of {lead_p.unit.key}"

    dec_rows = role_rates(sizer, "decode", dec, decode_bound, decode_eval)
    sizer.roles += pre_rows + dec_rows
    for r in pre_rows + dec_rows:
        sizer.notes.append(f"{r.role} pool rate of {r.unit.key}: G = {r.rate:.4g} req/s per instance ({r.partner})")
    out = []
    for pr in pre_rows:
        for dr in dec_rows:
            key = f"P[{pr.unit.key}]+D[{dr.unit.key}]"
            plan = None
            if pr.rate > 0 and dr.rate > 0:
                plan = sizer.plan(
                    [sizer.pool("prefill", pr.unit, pr.rate, None), sizer.pool("decode", dr.unit, dr.rate, dr.result)]
                )
            out.append(SizedRow(key, "disaggregated", pr.result, plan, pr.unit, decode=dr.unit, pd_roles=(pr, dr)))
    return out


def role_rates(
    sizer: Sizer,
    role: str,
    units: Sequence[Unit],
    bound: Callable[[Unit], float],
    make_eval: Callable[[Unit, int], tuple[SimEvaluate, str]],
) -> list[RoleRow]:
    """Each unit's per-instance rate as one instance of a pool of n (pools multiplex: one instance alone
    queues every short prompt behind a long one, so G depends on n). n = ceil(λ / (¼ × bound)) first (a
    pool under per-request latency targets runs at a quarter to a half of its analytic bound); when the
    measured rate implies a count more than a quarter (and more than one instance) away, searched once
    more at that count. A pool needing more than `pd_search_max_instances` is searched at that many, its share
    of λ (its simulations cost in proportion to the rate they replay). The search starts at the rate the pool
    searched is sized to carry: λ, or its share."""
    p, lam = sizer.params, sizer.planning
    cap = p.pd_search_max_instances
    needed = {u.key: max(1, math.ceil(lam / (0.25 * bound(u)))) for u in units}

    def off(u: Unit) -> bool:
        r = rows[u.key].rate
        return r > 0 and abs(min(cap, ceil_count(lam / r)) - min(cap, needed[u.key])) > max(
            1, 0.25 * min(cap, needed[u.key])
        )

    rows: dict[str, RoleRow] = {}
    todo = list(units)
    for _ in range(2):
        sizes = {u.key: min(cap, needed[u.key]) for u in todo}
        evals = {u.key: make_eval(u, sizes[u.key]) for u in todo}
        tasks = [
            SearchTask(
                f"{role}[{u.key}]",
                evals[u.key][0],
                p.slo.attainment_target,
                p.search,
                lam * sizes[u.key] / needed[u.key],
            )
            for u in todo
        ]
        res = search_candidates(tasks, sizer.executor)
        for u in todo:
            n = sizes[u.key]
            share = "" if n == needed[u.key] else f" (of the {needed[u.key]} its rate needs: pd_search_max_instances)"
            how = f"searched as a pool of {n}{share} {evals[u.key][1]}"
            rows[u.key] = RoleRow(role, u, res[f"{role}[{u.key}]"], how, n)
        todo = [u for u in todo if off(u)]
        for u in todo:
            needed[u.key] = max(1, ceil_count(lam / rows[u.key].rate))
        if not todo:
            break
    return [rows[u.key] for u in units]
