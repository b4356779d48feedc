"""Hand-computed exact timelines. Coefficients are dyadic (powers of two), so every time below is exact
in binary floating point and compared with ==. The arithmetic is in the comments:
step = overhead + token·prefill_tokens + pair·prefill_pairs + seq·decode_seqs + ctx·decode_context,
with prefill_pairs = new·context + new·(new + 1)/2 and a decode's context = prompt + tokens generated so far."""

from __future__ import annotations

import numpy as np
import pytest

from llmcap.perf.model import LinearStepModel
from llmcap.sim import EngineConfig, LinkConfig, PDConfig, SimConfig, simulate
from tests.sim._workloads import table

MODEL = LinearStepModel(overhead_s=1.0, per_prefill_token_s=0.125, per_decode_seq_s=0.25, per_context_token_s=1 / 64)
PAIRS = LinearStepModel(overhead_s=1.0, per_prefill_token_s=0.125, per_pair_s=1 / 64)
NOCTX = LinearStepModel(overhead_s=1.0, per_prefill_token_s=0.125, per_decode_seq_s=0.25)


def rows(result) -> list[dict]:
    return result.records.to_pylist()


def test_one_request() -> None:
    r = simulate(table({"isl": [8], "osl": [4]}), MODEL, SimConfig(engine=EngineConfig(num_blocks=10)))
    (rec,) = rows(r)
    # prefill: 1 + 8·0.125 = 2.0 -> first token at 2.0
    # decodes (context 8+1, 8+2, 8+3): 1.25 + 9/64, 1.25 + 10/64, 1.25 + 11/64
    gaps = [1.25 + 9 / 64, 1.25 + 10 / 64, 1.25 + 11 / 64]
    assert rec["first_token_s"] == 2.0 and rec["ttft_s"] == 2.0 and rec["admitted_s"] == 0.0
    assert rec["finish_s"] == 2.0 + gaps[0] + gaps[1] + gaps[2] == 6.21875
    assert rec["tpot_s"] == (6.21875 - 2.0) / 3
    assert (rec["itl_p50_s"], rec["itl_max_s"]) == (gaps[1], gaps[2])
    assert rec["itl_p99_s"] == gaps[1] + (gaps[2] - gaps[1]) * (0.99 * 2 - 1)  # linear between ranks 1 and 2
    assert rec["status"] == "ok" and rec["cached_tokens"] == 0 and rec["preemptions"] == 0
    assert sorted(r.itl_values.tolist()) == gaps and r.itl_weights.tolist() == [1, 1, 1]


def test_two_contending_requests() -> None:
    t = table({"arrival_s": [0.0, 0.5], "isl": [8, 16], "osl": [3, 2]})
    a, b = rows(simulate(t, MODEL, SimConfig(engine=EngineConfig(num_blocks=10))))
    # step 1 [0, 2]: A's prefill (1 + 8·0.125). B arrives at 0.5 and waits for the step to end.
    # step 2 [2, 5.390625]: A decodes (ctx 9) + B's prefill of 16: 1 + 16·0.125 + 0.25 + 9/64 = 3.390625
    # step 3 [5.390625, 7.3125]: A (ctx 10) and B (ctx 17) decode: 1 + 2·0.25 + 27/64 = 1.921875
    assert (a["first_token_s"], a["finish_s"]) == (2.0, 7.3125)
    assert (b["admitted_s"], b["queue_s"], b["first_token_s"], b["finish_s"]) == (2.0, 1.5, 5.390625, 7.3125)
    assert b["ttft_s"] == 4.890625 and b["itl_max_s"] == 1.921875
    assert (a["itl_p50_s"], a["itl_max_s"]) == ((3.390625 + 1.921875) / 2, 3.390625)


def test_chunked_prefill_interleaves_with_decodes() -> None:
    model = LinearStepModel(
        overhead_s=1.0, per_prefill_token_s=0.125, per_pair_s=1 / 256, per_decode_seq_s=0.25, per_context_token_s=1 / 64
    )
    t = table({"arrival_s": [0.0, 0.5], "isl": [4, 20], "osl": [4, 1]})
    cfg = SimConfig(engine=EngineConfig(num_blocks=20, max_num_seqs=4, max_num_batched_tokens=8))
    a, b = rows(simulate(t, model, cfg))
    # step 1 [0, 1.5390625]: A prefill 4 tokens, pairs 4·5/2 = 10: 1 + 0.5 + 10/256
    s1 = 1 + 0.5 + 10 / 256
    # step 2: A decodes (ctx 5), budget 8 - 1 = 7 -> B's first chunk of 7 (pairs 7·8/2 = 28)
    s2 = 1 + 7 * 0.125 + 28 / 256 + 0.25 + 5 / 64
    # step 3: A decodes (ctx 6), B's second chunk of 7 after 7 cached (pairs 7·7 + 28 = 77)
    s3 = 1 + 7 * 0.125 + 77 / 256 + 0.25 + 6 / 64
    # step 4: A's last decode (ctx 7), B's last 6 tokens after 14 (pairs 6·14 + 21 = 105) -> B's only token
    s4 = 1 + 6 * 0.125 + 105 / 256 + 0.25 + 7 / 64
    assert a["first_token_s"] == s1 and a["finish_s"] == s1 + s2 + s3 + s4
    assert b["admitted_s"] == s1 and b["prefill_s"] == s2 + s3 + s4
    assert b["first_token_s"] == b["finish_s"] == s1 + s2 + s3 + s4 and b["tpot_s"] is None and b["itl_max_s"] is None


def test_preemption_and_recompute() -> None:
    # 4 blocks of 4 tokens. A and B (4-token prompts, 6 tokens out) start together: one block each.
    cfg = SimConfig(
        engine=EngineConfig(
            num_blocks=4, block_size=4, max_num_seqs=4, max_num_batched_tokens=16, enable_prefix_caching=False
        )
    )
    a, b = rows(simulate(table({"isl": [4, 4], "osl": [6, 6]}), NOCTX, cfg))
    # step 1 [0, 2]: both prefills, 1 + 8·0.125 -> first tokens at 2.0
    # steps 2-5 (1 + 2·0.25 = 1.5 each; step 2 takes a second block each, 4 used) -> 3.5, 5, 6.5, 8
    # step 6 at 8.0: A (8 tokens in KV) needs a third block, none free: B, the newest, is preempted
    #   (its 2 blocks freed), A decodes alone: 1.25 -> A's 6th token at 9.25, done.
    # step 7 at 9.25: B recomputes prompt + 5 generated = 9 tokens: 1 + 9·0.125 = 2.125 -> token 6 at 11.375
    assert (a["finish_s"], a["preemptions"], a["itl_max_s"]) == (9.25, 0, 1.5)
    assert (b["first_token_s"], b["finish_s"], b["preemptions"]) == (2.0, 11.375, 1)
    assert b["itl_max_s"] == 11.375 - 8.0 and b["itl_p50_s"] == 1.5
    assert b["admitted_s"] == 0.0  # first admission; the recompute does not move it


def test_prefix_hit_skips_prefill_compute() -> None:
    # trace blocks of 4 tokens = engine blocks of 4: one block per hash
    t = table({"arrival_s": [0.0, 5.0], "isl": [8, 12], "osl": [1, 1], "hash_ids": [[1, 2], [1, 2, 3]]}, trace_block=4)
    a, b = rows(simulate(t, PAIRS, SimConfig(engine=EngineConfig(num_blocks=10, block_size=4))))
    # A: 8 new tokens, pairs 36: 1 + 1 + 36/64 = 2.5625; its two blocks stay cached after it finishes.
    # B: blocks 1, 2 hit (block 3 would be its last: vLLM always computes the last prompt block's tokens)
    #    -> 4 new tokens after 8 cached, pairs 4·8 + 10 = 42: 1 + 0.5 + 42/64 = 2.15625
    assert a["finish_s"] == 2.5625 and a["cached_tokens"] == 0
    assert b["cached_tokens"] == 8 and b["prefill_s"] == 2.15625 and b["finish_s"] == 7.15625


def test_host_tier_hit_costs_its_load() -> None:
    engine = EngineConfig(
        num_blocks=3, block_size=4, host_blocks=10, kv_bytes_per_token=1.0, host_bandwidth_bytes_s=8.0
    )
    t = table(
        {
            "arrival_s": [0.0, 3.0, 10.0],
            "isl": [8, 12, 12],
            "osl": [1, 1, 1],
            "hash_ids": [[1, 2], [7, 8, 9], [1, 2, 3]],
        },
        trace_block=4,
    )
    a, c, b = rows(simulate(t, PAIRS, SimConfig(engine=engine)))
    # A caches blocks 1, 2. C needs all 3 blocks: both of A's are evicted to the host tier.
    # C: 1 + 12·0.125 + 78/64 = 3.71875 -> 6.71875. B at 10.0: blocks 1, 2 load from the host
    #   (2 blocks · 4 tokens · 1 B / 8 B/s = 1.0 s on the step), then 4 new tokens as in the HBM hit.
    assert c["finish_s"] == 3.0 + 3.71875
    assert (b["cached_tokens"], b["host_cached_tokens"]) == (8, 8)
    assert b["finish_s"] == 10.0 + 2.15625 + 1.0


@pytest.mark.parametrize("first_token_from", ["prefill", "decode"])
def test_pd_transfer_under_link_contention(first_token_from: str) -> None:
    engine = EngineConfig(
        num_blocks=10, block_size=4, max_num_seqs=8, max_num_batched_tokens=8, kv_bytes_per_token=10.0
    )
    pd = PDConfig(
        prefill_replicas=1,
        decode_replicas=1,
        link=LinkConfig(bandwidth_bytes_s=20.0, latency_s=0.5),
        first_token_from=first_token_from,
    )
    a, b = rows(simulate(table({"isl": [8, 8], "osl": [2, 2]}), NOCTX, SimConfig(engine=engine, pd=pd)))
    # prefill side (budget 8): A [0, 2], B [2, 4] (1 + 8·0.125 each)
    # link: 80 B at 20 B/s = 4 s + 0.5 s latency. A on the link [2, 6], lands 6.5;
    #   B posted at 4 waits behind A: on the link [6, 10], lands 10.5.
    # decode side: each lands on an idle replica and decodes one step, 1 + 0.25 = 1.25
    assert (a["prefill_s"], b["queue_s"], b["prefill_s"]) == (2.0, 2.0, 2.0)
    assert a["transfer_s"] == b["transfer_s"] == 4.5
    assert (a["visible_wait_s"], b["visible_wait_s"]) == (4.5, 6.5)
    assert (a["finish_s"], b["finish_s"]) == (7.75, 11.75)
    assert (a["prefill_replica"], a["decode_replica"]) == (0, 0)
    if first_token_from == "prefill":
        assert (a["ttft_s"], b["ttft_s"]) == (2.0, 4.0)
        assert (a["itl_max_s"], b["itl_max_s"]) == (7.75 - 2.0, 11.75 - 4.0)
    else:
        assert (a["ttft_s"], b["ttft_s"]) == (6.5, 10.5)
        assert (a["itl_max_s"], b["itl_max_s"]) == (1.25, 1.25)


def test_request_that_can_never_fit_is_rejected() -> None:
    t = table({"isl": [64, 8], "osl": [10, 2]})
    big, small = rows(simulate(t, MODEL, SimConfig(engine=EngineConfig(num_blocks=4, block_size=16))))
    # 64 + 10 - 1 = 73 tokens need 5 blocks of 16 > 4
    assert big["status"] == "rejected" and big["admitted_s"] is None and big["prefill_replica"] is None
    assert small["status"] == "ok"


def test_a_long_requests_itl_stats_are_its_gaps_order_statistics() -> None:
    # A decodes 600 tokens while short requests (one gap each) of many prompt lengths come and go, so A's
    # gaps are far from sorted, and more of them than the step log sorts (it selects the statistics it reads)
    short = 40
    t = table(
        {
            "arrival_s": [0.0] + [5.0 + 19.0 * k for k in range(short)],
            "isl": [8] + [8 * ((7 * k) % 23 + 1) for k in range(short)],
            "osl": [600] + [2] * short,
        }
    )
    r = simulate(t, MODEL, SimConfig(engine=EngineConfig(num_blocks=200)))
    a, *others = rows(r)
    gaps = list(np.repeat(r.itl_values, r.itl_weights))
    for other in others:
        gaps.remove(other["itl_max_s"])  # each short request's one gap: the rest are A's
    assert len(gaps) == 599 and a["finish_s"] > others[-1]["finish_s"]
    assert a["itl_p50_s"] == pytest.approx(np.quantile(gaps, 0.5), rel=1e-12)
    assert a["itl_p99_s"] == pytest.approx(np.quantile(gaps, 0.99), rel=1e-12)
    assert a["itl_max_s"] == max(gaps)
