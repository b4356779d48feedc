"""The replay check's parts without a server: the plan's unit is exactly what the size stage simulated (and what
the twin serves), the verdict's logic, the buckets, and `llmcap reproduce` treating measured outputs as measured."""

from __future__ import annotations

import numpy as np
import pyarrow as pa
import pytest

from llmcap.candidates import EnumerationSpec, enumerate_candidates
from llmcap.catalog import load_model
from llmcap.errors import LlmcapError
from llmcap.live.prompts import prompts
from llmcap.perf import decode_step_time, prefill_time
from llmcap.replaycheck import unit_from_plan
from llmcap.replaycheck.compare import bucket_labels, bucket_of, verdict
from llmcap.replaycheck.runs import _run_hashes, plan_runs
from llmcap.replaycheck.share import Share
from llmcap.sizing.headroom import planning_traffic
from llmcap.sizing.params import SizeParams
from llmcap.sizing.sizer import Sizer
from llmcap.sizing.units import Lengths, candidate_key, make_unit
from llmcap.trace.synth import scale_rate
from ops.reproduce import MEASURED, compare, out_flags

MODEL = "Llama-3.1-8B"


@pytest.fixture(scope="module")
def candidates():
    spec = EnumerationSpec.model_validate(
        {
            "gpus": ["h100", "h200"],
            "weight_quants": ["fp8"],
            "kv_dtypes": ["fp8"],
            "parallel": {"tp": [1, 2]},
            "modes": ["aggregated", "disaggregated"],
            "max_context_len": 8192,
        }
    )
    return enumerate_candidates(load_model(MODEL), spec).table


def _trace(n: int = 300, seed: int = 1) -> pa.Table:
    rng = np.random.default_rng(seed)
    return pa.table(
        {
            "request_id": np.arange(n, dtype=np.int64),
            "arrival_s": np.cumsum(rng.exponential(0.5, n)),
            "isl": rng.integers(50, 4000, n),
            "osl": rng.integers(2, 300, n),
        }
    )


def _pick(candidates, role: str, gpu: str, tp: int):
    rows = candidates[
        (candidates["role"] == role) & (candidates["gpu"] == gpu) & (candidates["tp"] == tp) & candidates["feasible"]
    ]
    return rows.iloc[0]


def test_a_pd_unit_is_what_the_size_stage_simulated(candidates) -> None:
    prefill, decode = _pick(candidates, "prefill", "H100-SXM-80GB", 1), _pick(candidates, "decode", "H200-SXM-141GB", 2)
    summary = {
        "chosen": f"P[{candidate_key(prefill)}]+D[{candidate_key(decode)}]",
        "mode": "disaggregated",
        "pool_plans": {"prefill": {"per_instance_rps": 1.5}, "decode": {"per_instance_rps": 9.0}},
    }
    params = SizeParams()
    unit = unit_from_plan(summary, candidates, MODEL, params.pd_link_latency_s, params.slo.ttft_includes_handoff)
    assert unit.rate_rps == 1.5 and unit.mode == "disaggregated"  # a 1:1 pair serves the smaller pool rate

    config, step, decode_step = unit.simulation()
    model, trace = load_model(MODEL), _trace()
    lengths = Lengths.of(trace)
    p_unit, d_unit = (
        make_unit(model, prefill.to_dict(), lengths, params.slo),
        make_unit(model, decode.to_dict(), lengths, params.slo),
    )
    traffic = planning_traffic(trace, None, params.headroom)
    factory = Sizer(trace, model, params, traffic, None, lambda _: None, None).pd_factory(p_unit, d_unit)
    sized = factory(1, 1)  # the evaluate the size stage builds for one prefill + one decode instance
    assert config.pd is not None and (config.pd.prefill_replicas, config.pd.decode_replicas) == (1, 1)
    assert config.pd.link == sized.pd.link
    assert config.pd.first_token_from == sized.pd.first_token_from
    engine_fields = (
        "num_blocks",
        "block_size",
        "max_num_seqs",
        "max_num_batched_tokens",
        "kv_bytes_per_token",
        "max_model_len",
        "enable_prefix_caching",
        "host_blocks",
    )
    for f in engine_fields:
        assert getattr(config.engine, f) == getattr(sized.engine, f), f
        assert getattr(config.pd.decode_engine, f) == getattr(sized.pd.decode_engine, f), f
    times = lambda m: np.concatenate([prefill_time(m, [512, 4000], chunk=2048), decode_step_time(m, [1, 64], 3000)])  # noqa: E731
    assert np.array_equal(times(step), times(sized.step_model)) and np.array_equal(
        times(decode_step), times(sized.decode_model)
    )
    assert not np.array_equal(times(step), times(decode_step))  # H100 TP1 prefill, H200 TP2 decode

    args = unit.twin_args()
    assert args[args.index("--decode-gpu") + 1] == "H200-SXM-141GB" and args[args.index("--decode-tp") + 1] == "2"
    assert args[args.index("--pd") + 1] == "1:1" and args[args.index("--num-blocks") + 1] == str(
        config.engine.num_blocks
    )


def test_an_aggregated_unit_and_a_missing_row(candidates) -> None:
    row = _pick(candidates, "both", "H100-SXM-80GB", 1)
    summary = {
        "chosen": candidate_key(row),
        "mode": "aggregated",
        "pool_plans": {"instances": {"per_instance_rps": 2.5}},
    }
    unit = unit_from_plan(summary, candidates, MODEL, 0.0, True)
    config, _, decode_step = unit.simulation()
    assert config.pd is None and decode_step is None and unit.rate_rps == 2.5
    assert config.engine.num_blocks == int(row["kv_tokens_per_instance"]) // int(row["block_size"])
    with pytest.raises(LlmcapError, match="not a feasible row"):
        unit_from_plan(summary | {"chosen": "H100-SXM-80GB/nope"}, candidates, MODEL, 0.0, True)
    # sized with the engine's stated KV (size.kv_budget): the plan's deployment record holds its blocks, and the unit serves them
    engine_kv = summary | {"deployment": {"sim_config": {"engine": {"num_blocks": 1000}}}}
    assert unit_from_plan(engine_kv, candidates, MODEL, 0.0, True).simulation()[0].engine.num_blocks == 1000
    # P/D: the decode pool's own engine when it has one (else the prefill's), as the autoscale what-if reads them too
    from llmcap.sizing.planned import sized_blocks

    pd_record = {"engine": {"num_blocks": 1000}, "pd": {"decode_engine": {"num_blocks": 3000}}}
    assert sized_blocks({"deployment": {"sim_config": pd_record}}) == (1000, 3000)
    assert sized_blocks({"deployment": {"sim_config": {"engine": {"num_blocks": 1000}, "pd": {}}}}) == (1000, 1000)
    assert sized_blocks(summary) == (None, None)


Z2 = 1.959963984540054**2  # z² of a two-sided 95% interval


def test_the_verdict() -> None:
    # every request met: the Wilson lower bound is n / (n + z²), which reaches 0.99 from n ≥ 0.99·z²/0.01 = 380.3
    assert 380 / (380 + Z2) < 0.99 <= 381 / (381 + Z2)
    confirmed = verdict({0.8: [(381, 381)], 1.0: [(300, 381)], 1.2: [(0, 100)]}, 0.99)
    assert confirmed["knee_in_band"] is True and confirmed["outcome"] == "confirmed" and confirmed["knee_scale"] == 0.8
    assert confirmed["text"].startswith("confirmed: holds at 0.8x (95% bounds 0.990–1.000 on 381 requests)")
    short = verdict({0.8: [(380, 380)], 1.2: [(0, 100)]}, 0.99)  # one request short of resolving the target
    assert short["outcome"] == "inconclusive" and short["judgement"] == {"0.8x": "inconclusive", "1.2x": "fails"}
    assert short["knee_in_band"] is False and "too few to resolve 0.99" in short["text"]
    # one miss in 40 decides nothing: 39/40 has an upper bound of 0.9956 ≥ 0.99; 30/40 (upper 0.858) fails
    assert verdict({0.8: [(40, 40)], 1.2: [(39, 40)]}, 0.99)["judgement"]["1.2x"] == "inconclusive"
    assert verdict({0.8: [(40, 40)], 1.2: [(30, 40)]}, 0.99)["judgement"]["1.2x"] == "fails"
    held = verdict({0.8: [(400, 400)], 1.2: [(400, 400)]}, 0.99)
    assert (
        held["outcome"] == "contradicted"
        and held["fails_at_high"] is False
        and held["text"].startswith("NOT confirmed")
    )
    failed = verdict({0.8: [(50, 100)], 1.0: [(40, 100)], 1.2: [(0, 0)]}, 0.99)
    assert failed["holds_at_low"] is False and failed["knee_scale"] is None and failed["outcome"] == "contradicted"
    assert failed["judgement"]["1.2x"] == "inconclusive" and failed["bounds"]["1.2x"] == [0.0, 1.0]  # nothing judged
    seeds = verdict({0.8: [(400, 400), (380, 380)], 1.2: [(0, 100), (0, 100)]}, 0.99)  # every seed must hold
    assert seeds["judgement"]["0.8x"] == "inconclusive" and "on 380 requests" in seeds["text"]
    late = verdict({0.8: [(381, 381)], 1.2: [(0, 100)]}, 0.99, invalid=["1.2x"])
    assert late["knee_in_band"] is False and late["outcome"] == "invalid" and "INVALID runs 1.2x" in late["text"]


def test_buckets() -> None:
    assert bucket_labels([4096, 16384]) == ["<4096", "4096-16383", ">=16384"]
    assert bucket_labels([]) == ["all"]
    assert list(bucket_of(np.array([1, 4095, 4096, 16383, 16384, 10**6]), [4096, 16384])) == [
        "<4096",
        "<4096",
        "4096-16383",
        "4096-16383",
        ">=16384",
        ">=16384",
    ]


def test_runs_replay_one_window_per_seed_at_every_scale_as_a_round_robin_share() -> None:
    trace = _trace()  # 2 req/s
    share = Share(planning_rps=2.0, instances_per_unit_rate=4.0)  # a round robin over 4 instances
    runs = plan_runs(trace, share, 1.5, [0.8, 1.0, 1.2], [0, 5], 20)
    assert [(r.label, r.seed) for r in runs] == [
        ("0.8x", 0),
        ("1x", 0),
        ("1.2x", 0),
        ("0.8x", 5),
        ("1x", 5),
        ("1.2x", 5),
    ]
    on_clock = scale_rate(trace, 2.0)
    for r in runs:
        # every 4th request of an 80-request window, its gaps kept on the planning clock / the run's load
        assert r.requests.num_rows == 20 and "round-robin share 1 in 4" in r.traffic
        arrival, ids = r.requests.column("arrival_s").to_numpy(), r.requests.column("request_id").to_numpy()
        source = on_clock.column("arrival_s").to_numpy()[ids]
        assert arrival[0] == 0.0 and np.diff(ids).tolist() == [4] * 19
        np.testing.assert_allclose(arrival, (source - source[0]) / (r.scale * 1.5), atol=1e-9)
    assert runs[0].requests.column("request_id") == runs[2].requests.column("request_id")
    assert runs[0].requests.column("request_id") != runs[3].requests.column("request_id")
    # above the planning rate there is no share to take: every request of the window, closer together
    (fast,) = plan_runs(trace, Share(planning_rps=2.0, instances_per_unit_rate=0.5), 1.0, [1.0], [0], 20)
    assert fast.requests.num_rows == 20 and fast.rate_rps == pytest.approx(4.0 * 20 / 19, rel=0.3)
    # no run finds its prompts cached by an earlier one: shared prefixes are shared within a run only
    hashes = pa.array([[1, 2, 3], [1, 2, 9], None])
    prompts_of = lambda seed: prompts(
        np.array([64, 64, 8]), _run_hashes(pa.table({"hash_ids": hashes}), seed), 16, 1000, seed
    )  # noqa: E731
    a, b = prompts_of(runs[0].prompt_seed), prompts_of(runs[1].prompt_seed)
    assert a[0][:32] == a[1][:32] and a[0][32:48] != a[1][32:48]
    assert not {tuple(p[:16]) for p in a} & {tuple(p[:16]) for p in b}
    assert len({r.prompt_seed for r in runs}) == len(runs)


def test_reproduce_reports_measured_outputs_as_measured(tmp_path) -> None:
    dvc_yaml = {
        "stages": {
            "replay": {
                "outs": [
                    "data/predicted.parquet",
                    {"data/measured.parquet": {"meta": {"measured": True}}},
                    {"data/report": {"cache": False, "meta": {"measured": True}}},
                ]
            }
        }
    }
    assert out_flags(dvc_yaml) == ({"data/report"}, {"data/measured.parquet", "data/report"})
    (tmp_path / "data").mkdir()
    for name in ("predicted.parquet", "measured.parquet"):
        (tmp_path / "data" / name).write_bytes(b"new bytes")
    lock = {
        "schema": "2.0",
        "stages": {
            "replay": {
                "cmd": "x",
                "outs": [
                    {"path": "data/predicted.parquet", "md5": "0" * 32},
                    {"path": "data/measured.parquet", "md5": "0" * 32},
                ],
            }
        },
    }
    status = {r["path"]: r["status"] for r in compare(tmp_path, tmp_path, lock, dvc_yaml, None, pulled=False)}
    assert status == {"data/predicted.parquet": "differs", "data/measured.parquet": MEASURED}
