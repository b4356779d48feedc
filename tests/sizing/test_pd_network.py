"""P→D network: the handoff's post / transfer / visible-wait percentiles on a hand-computed timeline, and the
provisioning rule per prefill instance and NIC (`llmcap.sizing.network`) against a link too small for it."""

from __future__ import annotations

import numpy as np
import pytest

from llmcap.perf.model import LinearStepModel
from llmcap.sim import EngineConfig, LinkConfig, PDConfig, SimConfig, simulate
from llmcap.sizing.network import GBPS, Provisioning, handoff_line, table_columns
from llmcap.sizing.simeval import handoff_metrics, ok_rows
from tests.sim._workloads import table

NOCTX = LinearStepModel(overhead_s=1.0, per_prefill_token_s=0.125, per_decode_seq_s=0.25)


def test_handoff_percentiles_of_two_requests_sharing_one_link() -> None:
    engine = EngineConfig(
        num_blocks=10, block_size=4, max_num_seqs=8, max_num_batched_tokens=8, kv_bytes_per_token=10.0
    )
    pd = PDConfig(prefill_replicas=1, decode_replicas=1, link=LinkConfig(bandwidth_bytes_s=20.0, latency_s=0.5))
    result = simulate(table({"isl": [8, 8], "osl": [2, 2]}), NOCTX, SimConfig(engine=engine, pd=pd))
    # prefill (budget 8): A [0, 2], B [2, 4]. Link: 80 B at 20 B/s = 4 s, + 0.5 s latency.
    # A posted at 2, on the link at once [2, 6]: post 0, transfer 4.5, lands 6.5 → visible wait 4.5.
    # B posted at 4, the link is busy until 6: post 2, on the link [6, 10], transfer 4.5, lands 10.5 → visible wait 6.5.
    assert result.handoff_post_s is not None and result.handoff_post_s.tolist() == [0.0, 2.0]
    m = handoff_metrics(result, ok_rows(result.records))
    # two values: p50 is their mean, p99 = low + 0.99 × (high − low) (linear interpolation); in ms
    assert m["handoff_post_ms_p50"] == pytest.approx(1000.0) and m["handoff_post_ms_p99"] == pytest.approx(1980.0)
    assert m["handoff_transfer_ms_p50"] == pytest.approx(4500.0) and m["handoff_transfer_ms_p99"] == pytest.approx(
        4500.0
    )
    assert m["visible_wait_ms_p50"] == pytest.approx(5500.0) and m["visible_wait_ms_p99"] == pytest.approx(6480.0)
    assert handoff_line(m) == (
        "post p50 1,000.0 ms, p99 1,980.0 ms; transfer p50 4,500.0 ms, p99 4,500.0 ms; "
        "visible wait p50 5,500.0 ms, p99 6,480.0 ms"
    )
    # only B's row: its own values
    only_b = handoff_metrics(result, np.array([False, True]))
    assert (only_b["handoff_post_ms_p50"], only_b["visible_wait_ms_p99"]) == pytest.approx((2000.0, 6500.0))


def test_aggregated_runs_hand_nothing_off() -> None:
    result = simulate(
        table({"isl": [8, 8], "osl": [2, 2]}), NOCTX, SimConfig(engine=EngineConfig(num_blocks=10, block_size=4))
    )
    assert result.handoff_post_s is None
    # aggregated records hold transfer and visible wait 0: p50 = p99 = 0, and no post time
    m = handoff_metrics(result, ok_rows(result.records))
    assert "handoff_post_ms_p50" not in m and m["visible_wait_ms_p99"] == 0.0


# 100 MB per request; 40 req/s at the peak over 4 prefill instances; one instance prefills 12 req/s flat out
LINK = dict(payload_bytes=100e6, peak_rps=40.0, instances=4, flat_out_rps=12.0, overhead=1.25, nics=2)


def test_a_link_too_small_is_over_by_the_share_it_lacks() -> None:
    # burst 40 / 4 × 100 MB = 1.0 GB/s; concurrent flows 12 × 100 MB = 1.2 GB/s (binds); × 1.25 = 1.5 GB/s required
    small = Provisioning(**LINK, nic_bytes_s=0.5e9)  # 2 NICs × 0.5 GB/s = 1.0 GB/s: 1.5 / 1.0 = 150%
    assert small.burst_bytes_s == pytest.approx(1.0e9) and small.flows_bytes_s == pytest.approx(1.2e9)
    assert small.required_bytes_s == pytest.approx(1.5e9) and small.link_bytes_s == 1.0e9
    assert not small.fits and small.verdict() == "over by 50%"
    assert small.line().endswith("(2 NIC(s), link 8 Gbit/s): over by 50%") and "(concurrent flows)" in small.line()
    # per NIC: 1.5 GB/s ÷ 2 = 0.75 GB/s = 6 Gbit/s of a 4 Gbit/s NIC
    d = small.as_dict()
    assert (
        d["required_gbps_per_nic"] == pytest.approx(6.0)
        and d["nic_gbps"] == pytest.approx(4.0)
        and d["verdict"] == "over by 50%"
    )
    assert table_columns(small) == {
        "pd_link_required_gbps": pytest.approx(12.0),
        "pd_link_gbps": pytest.approx(8.0),
        "pd_link_verdict": "over by 50%",
    }
    # 2 NICs × 1 GB/s: 1.5 / 2.0 = 75% of the link
    big = Provisioning(**LINK, nic_bytes_s=1.0e9)
    assert big.fits and big.verdict() == "fits (75% of the link)"
    # a burst above the flat-out flows binds instead: 80 / 4 × 100 MB = 2.0 GB/s × 1.25 = 2.5 GB/s
    bursty = Provisioning(**(LINK | {"peak_rps": 80.0}), nic_bytes_s=1.0e9)
    assert (
        bursty.required_bytes_s == pytest.approx(2.5e9)
        and bursty.verdict() == "over by 25%"
        and "(burst)" in bursty.line()
    )
    assert GBPS == 1.25e8
    assert table_columns(None) == {"pd_link_required_gbps": None, "pd_link_gbps": None, "pd_link_verdict": None}


def test_a_pd_plan_reports_its_link_per_prefill_instance_and_nic() -> None:
    """A P/D-only sizing (Llama-3.1-8B on H100s, 20 req/s): the chosen plan's provisioning in the summary and the report,
    from the trace's own payload; an overhead large enough (size.pd_network_overhead) turns the verdict to "over"
    without changing the count."""
    from llmcap.candidates import EnumerationSpec, enumerate_candidates
    from llmcap.catalog import get_gpu
    from llmcap.report.capacity import capacity_report, render_markdown
    from llmcap.sizing.plan import size_deployments
    from llmcap.trace import ingest
    from tests.conftest import TRACES
    from tests.sizing.test_size_plan import MODEL, PARAMS

    trace = ingest(TRACES["azure_conv"]).trace.slice(0, 2000)
    spec = EnumerationSpec(
        gpus=["h100"],
        weight_quants=["fp8"],
        kv_dtypes=["bf16"],
        parallel={"tp": [1]},
        max_context_len=16384,
        modes=["disaggregated"],
    )
    candidates = enumerate_candidates(MODEL, spec).table
    params = PARAMS.model_copy(update={"target_rps": 20.0})
    out = size_deployments(trace, candidates, MODEL, params)
    assert out.summary["mode"] == "disaggregated" and out.summary["network"] is not None
    link = out.summary["network"]["provisioning"]
    # the whole prompt's KV moves: Llama-3.1-8B bf16 holds 2 (K, V) × 32 layers × 8 KV heads × 128 × 2 B = 131,072 B per token
    mean_isl = float(trace.column("isl").to_numpy().mean())
    assert link["payload_mb"] == pytest.approx(131_072 * mean_isl / 1e6)
    n_p = out.summary["pool_plans"]["prefill"]["instances"]
    assert link["prefill_instances"] == n_p and link["burst_gbps"] == pytest.approx(
        link["peak_rps"] / n_p * link["payload_mb"] * 1e6 / GBPS
    )
    assert link["required_gbps"] == pytest.approx(max(link["burst_gbps"], link["flows_gbps"]) * 1.25)
    assert link["nic_gbps"] == pytest.approx(get_gpu("h100").nic_bytes_s / GBPS) and link["nics"] == 1
    md = render_markdown(capacity_report(out, params.slo))
    assert link["line"] in md and link["verdict"].startswith("fits")
    replay = out.summary["network"]["replay_handoff_ms"]
    assert all(
        0 <= replay[f"{p}_ms_p50"] <= replay[f"{p}_ms_p99"]
        for p in ("handoff_post", "handoff_transfer", "visible_wait")
    )

    overhead = 2 * link["link_gbps"] / max(link["burst_gbps"], link["flows_gbps"])  # twice what the link carries
    tight = size_deployments(trace, candidates, MODEL, params.model_copy(update={"pd_network_overhead": overhead}))
    assert (
        tight.summary["network"]["provisioning"]["verdict"] == "over by 100%"
        and tight.summary["gpus"] == out.summary["gpus"]
    )
