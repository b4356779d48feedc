"""Step 4 end to end on a real trace: candidates → simulated max rates → sized plan, deterministic, and the
same table whether the search runs in-process or on a real Dask LocalCluster."""

from __future__ import annotations

import io

import pyarrow.compute as pc
import pyarrow.parquet as pq
import pytest

from llmcap.candidates import EnumerationSpec, enumerate_candidates
from llmcap.catalog import load_model
from llmcap.perf.calibration import shipped_calibration
from llmcap.report.capacity import capacity_report, render_html, render_markdown
from llmcap.sizing.executor import DaskExecutor
from llmcap.sizing.params import SearchParams, SizeParams, SloParams
from llmcap.sizing.plan import size_deployments
from llmcap.trace import ingest
from tests.conftest import TRACES

MODEL = load_model("Llama-3.1-8B")
PARAMS = SizeParams(
    slo=SloParams(ttft_ms=500, itl_ms=60, attainment_target=0.95, warmup_frac=0.1, drain_frac=0.1),
    search=SearchParams(seeds=(0, 1), rel_tol=0.1, guard_points=1),
    excerpt_requests=300,
    shortlist=2,
    pd_prefill_shortlist=2,
    pd_decode_shortlist=1,
)


@pytest.fixture(scope="module")
def trace():
    return ingest(TRACES["azure_conv"]).trace.slice(0, 2000)


@pytest.fixture(scope="module")
def candidates():
    spec = EnumerationSpec(gpus=["h100"], weight_quants=["bf16", "fp8"], parallel={"tp": [1, 2]}, max_context_len=16384)
    return enumerate_candidates(MODEL, spec).table


PHASES_SEEN: list[tuple[int, int, str]] = []


@pytest.fixture(scope="module")
def outcome(trace, candidates):
    return size_deployments(trace, candidates, MODEL, PARAMS, on_phase=lambda *phase: PHASES_SEEN.append(phase))


def test_progress_reports_every_phase_in_order_then_done(outcome):
    from llmcap.sizing.plan import PHASES

    assert [(k, len(PHASES), name) for k, name in enumerate(PHASES)] + [
        (len(PHASES), len(PHASES), "done")
    ] == PHASES_SEEN


def _bytes(table) -> bytes:
    buf = io.BytesIO()
    pq.write_table(table, buf)
    return buf.getvalue()


def test_plan_sizes_a_deployment_that_meets_the_target(outcome, trace):
    s = outcome.summary
    # the default target is the trace's own mean rate; the chosen plan covers it with at least one instance
    assert s["target_rps"] == pytest.approx(
        trace.num_rows / (trace["arrival_s"][-1].as_py() - trace["arrival_s"][0].as_py())
    )
    pools = s["pool_plans"]
    assert s["base_instances"] == sum(q["base_instances"] for q in pools.values()) >= 1
    assert s["instances"] == sum(q["instances"] for q in pools.values()) and s["gpus"] == sum(
        q["gpus"] for q in pools.values()
    )
    for q in pools.values():
        assert set(q["headroom"]) == {"traffic", "failure", "deployment", "memory", "control"}
        assert all(h["reasoning"] for h in q["headroom"].values())
        assert q["gpus"] == q["instances"] * q["gpus_per_instance"]
    rows = outcome.table.to_pylist()
    assert {r["mode"] for r in rows} == {"aggregated", "prefill", "decode", "disaggregated"}
    chosen = next(r for r in rows if r["candidate"] == s["chosen"])
    # the chosen row is the cheapest sized one, and what it was sized from met the attainment target
    assert chosen["usd_per_hour"] == min(r["usd_per_hour"] for r in rows if r["usd_per_hour"] is not None)
    assert chosen["attainment"] >= PARAMS.slo.attainment_target and chosen["max_rps"] > 0
    # the chosen deployment was simulated end to end in every scenario, and every scenario passes
    assert s["scenarios_pass"] and s["scenarios"] and all(line.endswith("pass") for line in s["scenarios"])
    # the report's latency CDFs and KV plot replay the planned deployment on the whole trace, whatever its mode
    rep = capacity_report(outcome, PARAMS.slo)
    assert rep.records is not None and rep.records.num_rows == trace.num_rows and rep.kv_usage
    assert "Not simulated." not in render_html(rep) and f"({trace.num_rows:,} requests)" in rep.replay
    assert s["checked_traffic"] == f"the whole trace ({trace.num_rows:,} requests)"  # short: no busiest span


def test_each_pools_routed_rates_split_the_replay_the_plan_serves(outcome):
    s = outcome.summary
    replay = capacity_report(outcome, PARAMS.slo).records
    assert replay is not None
    span = pc.max(replay["arrival_s"]).as_py() - pc.min(replay["arrival_s"]).as_py()
    for pool, q in s["pool_plans"].items():
        routed = q["routed_rps"]
        column = replay["decode_replica" if pool == "decode" else "prefill_replica"]
        served = int(pc.sum(pc.is_valid(column)).as_py())  # every request routed to an instance of the pool
        # the instances' shares add up to every routed request over the replay's span; the busiest has at least its share
        assert routed["mean"] * q["instances"] == pytest.approx(served / span)
        assert routed["busiest"] >= routed["mean"] > 0


def test_pd_pairings_size_each_pool_from_its_own_searched_rate(outcome):
    pairs = [r for r in outcome.table.to_pylist() if r["mode"] == "disaggregated"]
    roles = {(r["mode"], r["candidate"]): r for r in outcome.table.to_pylist() if r["mode"] in ("prefill", "decode")}
    assert pairs and {m for m, _ in roles} == {"prefill", "decode"}
    # every searched prefill row is paired with every searched decode row (more than one prefill layout)
    n_pre, n_dec = sum(m == "prefill" for m, _ in roles), sum(m == "decode" for m, _ in roles)
    assert n_pre == 2 and len(pairs) == n_pre * n_dec
    for r in pairs:
        n_p, n_d = (int(x) for x in r["pd_ratio"].split(":"))
        assert n_p >= 1 and n_d >= 1  # pools sized separately: no fixed decode count per unit


def test_pd_rows_carry_the_handoff_percentiles_and_the_link_provisioning(outcome):
    from llmcap.catalog import get_gpu
    from llmcap.sizing.table import HANDOFF_COLUMNS

    rows = outcome.table.to_pylist()
    roles = {(r["mode"], r["candidate"]): r for r in rows if r["mode"] in ("prefill", "decode")}
    nic_gbps = get_gpu("h100").nic_bytes_s * 8 / 1e9
    for r in (r for r in rows if r["mode"] == "disaggregated"):
        pre = roles["prefill", r["candidate"].split("]+D[")[0].removeprefix("P[")]
        # a pairing's handoff is its prefill role's search (whose one link carries G_P), each part p50 ≤ p99
        assert all(r[c] == pre[c] is not None for c in HANDOFF_COLUMNS)
        for part in ("handoff_post", "handoff_transfer", "visible_wait"):
            assert 0 <= r[f"{part}_ms_p50"] <= r[f"{part}_ms_p99"]
        # the link is the prefill instance's NICs, one per GPU; the verdict states required ÷ link
        assert r["pd_link_gbps"] == pytest.approx(nic_gbps * pre["gpus_per_instance"])
        share = r["pd_link_required_gbps"] / r["pd_link_gbps"]
        assert r["pd_link_verdict"] == (f"fits ({share:.0%} of the link)" if share <= 1 else f"over by {share - 1:.0%}")
    assert all(
        r["pd_link_verdict"] is None and r["handoff_post_ms_p50"] is None for r in rows if r["mode"] == "aggregated"
    )
    network = outcome.summary["network"]
    md = render_markdown(capacity_report(outcome, PARAMS.slo))
    assert "## KV budget and P→D network" in md
    if outcome.summary["mode"] == "aggregated":
        assert network is None and "P→D network: not disaggregated" in md
    else:
        assert network is not None and network["provisioning"]["line"] in md
        assert (
            0
            <= network["replay_handoff_ms"]["handoff_post_ms_p50"]
            <= network["replay_handoff_ms"]["handoff_post_ms_p99"]
        )


@pytest.fixture(scope="module")
def busy(trace, candidates):
    """The same trace planned at 10× its rate: pools of several instances, where minimality means something."""
    return size_deployments(trace, candidates, MODEL, PARAMS.model_copy(update={"target_rps": 50.0}))


def test_final_plan_passes_every_scenario_and_each_pool_one_fewer_fails_one(busy):
    fit = busy.evidence.fit
    assert fit is not None and fit.ok
    names = {r.scenario.name for r in fit.results}
    assert (
        "traffic" in names
        and any(n.startswith("node loss") for n in names)
        and any(n.startswith("upgrade") for n in names)
    )
    assert all(r.passed for r in fit.results)
    assert all(r.scenario.counts() for r in fit.results)
    planned = fit.plan.counts()
    assert max(planned.values()) > 1  # a real pool, not a lone instance
    assert {m.pool for m in fit.minimality} == set(planned)
    for m in fit.minimality:
        assert m.instances == planned[m.pool] - 1
        assert m.failed is not None and not m.failed.passed  # one fewer fails at least one scenario
        # the failing deployment really has one instance fewer of that pool than the plan's same scenario
        assert m.failed.scenario.counts()[m.pool] < planned[m.pool]
    assert busy.summary["gpus"] == fit.plan.total_gpus


def test_count_range_is_reported_and_contains_the_point_answer(busy):
    cr = busy.summary["count_range"]
    assert cr is not None and cr["seeds"] == [PARAMS.search.seeds[0], *PARAMS.count_seeds]
    assert cr["low_gpus"] <= cr["point_gpus"] == busy.summary["gpus"] <= cr["high_gpus"]
    assert set(cr["rate_by_seed"]) == set(busy.summary["pool_plans"])  # a seed spread of G per pool
    for pool, rates in cr["rate_by_seed"].items():
        assert set(rates) == {str(s) for s in PARAMS.search.seeds} and all(r > 0 for r in rates.values()), pool
    md = render_markdown(capacity_report(busy, PARAMS.slo))
    assert "## Count range" in md and cr["lines"][0] in md


def test_final_count_is_within_the_stated_factor_of_the_four_ledgers(outcome, busy):
    from llmcap.sizing.ledger import FACTOR

    for out in (outcome, busy):
        ledger = out.evidence.ledger
        assert ledger is not None and ledger.final_gpus == out.summary["gpus"]
        # the ledger is a floor (100% busy, no SLO, no headroom) and the plan within FACTOR of it
        assert ledger.gpus <= out.summary["gpus"] <= FACTOR * ledger.gpus, ledger.line()
        assert ledger.line() in render_markdown(capacity_report(out, PARAMS.slo))


def test_same_inputs_give_byte_identical_tables(outcome, trace, candidates):
    again = size_deployments(trace, candidates, MODEL, PARAMS)
    assert _bytes(again.table) == _bytes(outcome.table)
    assert again.summary == outcome.summary


def test_dask_cluster_gives_the_same_table(outcome, trace, candidates):
    from dask.distributed import LocalCluster

    with (
        LocalCluster(n_workers=2, threads_per_worker=1, processes=False, dashboard_address=":0") as cluster,
        DaskExecutor(cluster.scheduler_address) as ex,
    ):
        on_dask = size_deployments(trace, candidates, MODEL, PARAMS, executor=ex)
    assert _bytes(on_dask.table) == _bytes(outcome.table)
    assert (
        on_dask.summary == outcome.summary
    )  # the fits and seed checks run whole on the workers: the same plan and range


def test_request_class_pools_compare_shared_and_split(outcome, trace, candidates):
    from llmcap.sizing.plan import class_pools

    cmp = class_pools(trace, candidates, MODEL, PARAMS, outcome, split_isl=1024)
    isl = trace.column("isl").to_numpy()
    short, long_ = cmp.split
    # each class plans for its share of the shared target rate
    assert short.rate_rps == pytest.approx(outcome.summary["target_rps"] * (isl <= 1024).mean())
    assert short.rate_rps + long_.rate_rps == pytest.approx(outcome.summary["target_rps"])
    assert cmp.cheaper in ("shared", "split")
    assert cmp.saving_usd_per_hour == pytest.approx(abs(cmp.shared_usd_per_hour - cmp.split_usd_per_hour))
    assert cmp.cheaper in cmp.summary()


def test_a_matching_measured_profile_replaces_the_roofline(trace, candidates):
    from llmcap.perf import LinearStepModel, RooflineModel
    from llmcap.sizing.measured import config_key
    from llmcap.sizing.units import Lengths, make_unit

    rows = candidates[candidates["feasible"] & (candidates["mode"] == "aggregated")]
    row, other = rows.iloc[0], rows[rows["tp"] != rows.iloc[0]["tp"]].iloc[0]
    fitted = LinearStepModel(overhead_s=0.004, per_prefill_token_s=2e-5, per_decode_seq_s=1e-4)
    measured = {config_key(row): fitted}
    lengths = Lengths.of(trace)
    assert make_unit(MODEL, row, lengths, PARAMS.slo, measured).step_model is fitted
    assert isinstance(make_unit(MODEL, other, lengths, PARAMS.slo, measured).step_model, RooflineModel)


def _aggregated_curves(out):
    """Searched aggregated candidates (P/D role searches are not confirmed: their deployment is simulated whole in every scenario)."""
    return {k: r for k, r in out.evidence.curves.items() if not k.startswith(("prefill: ", "decode: "))}


def test_whole_trace_confirmation_of_the_chosen_candidate_or_of_all(outcome, trace, candidates):
    # default ("chosen"): an aggregated choice's rate is confirmed on the whole trace, the others are listed as excerpt-only
    on = outcome.summary["chosen"] if outcome.summary["mode"] == "aggregated" else None
    if on is not None:
        chosen = outcome.evidence.curves[on]
        assert chosen.confirmation is not None and chosen.max_rate == outcome.summary["max_rps_per_unit"]
        assert chosen.max_rate <= chosen.confirmation.search_rate and chosen.best in chosen.confirmation.points
    unconfirmed = [k for k, r in _aggregated_curves(outcome).items() if r.confirmation is None and r.max_rate > 0]
    listed = [n for n in outcome.summary["notes"] if n.startswith("max rates from excerpts only")]
    assert bool(unconfirmed) == bool(listed) and all(k in listed[0] for k in unconfirmed)
    every = size_deployments(trace, candidates, MODEL, PARAMS.model_copy(update={"confirm_whole_trace": "all"}))
    assert all(
        r.confirmation is not None or r.max_rate == 0 for r in _aggregated_curves(every).values()
    )  # nothing to confirm at 0
    confirmed = [r for r in every.evidence.curves.values() if r.confirmation is not None]
    assert len(confirmed) == sum(n.startswith("whole-trace confirmation of") for n in every.summary["notes"]) > 1
    off = size_deployments(trace, candidates, MODEL, PARAMS.model_copy(update={"confirm_whole_trace": "off"}))
    assert all(r.confirmation is None for r in off.evidence.curves.values())


def test_each_row_names_its_admission_policy_and_what_timed_its_steps(outcome):
    t = outcome.table.to_pydict()
    assert set(t["admission_policy"]) == {"vllm"}  # size.admission_policy's default
    h100 = shipped_calibration("H100-SXM-80GB")
    assert h100 is not None and set(t["step_model"]) == {
        f"roofline, calibrated (H100-SXM-80GB/roofline.yaml, sha256 {h100.sha256[:12]})"
    }
