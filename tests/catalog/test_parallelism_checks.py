"""Impossible parallelism is one clear LlmcapError; PP splits layers the way vLLM does."""

import pytest

from llmcap.catalog import load_model
from llmcap.errors import LlmcapError
from llmcap.parallelism import Parallelism, parallelism_issues, pp_partition, validate_parallelism


def test_tp3_for_64_heads_is_rejected_with_every_reason():
    m = load_model("Llama-3.1-70B")
    with pytest.raises(LlmcapError) as exc:
        validate_parallelism(m, Parallelism(tp=3))
    msg = str(exc.value)
    assert msg.startswith("Llama-3.1-70B cannot run with TP3 PP1 EP1 DP1: ")
    assert "64 attention heads are not divisible by TP=3" in msg
    assert "8 KV heads: TP=3 must divide them or be a multiple of them" in msg


def test_tp_above_kv_heads_replicates_instead_of_failing():
    m = load_model("Qwen2.5-7B")  # 28 heads, 4 KV heads, MLP 18944
    assert parallelism_issues(m, Parallelism(tp=4)) == []
    # 28 heads / 8 is not whole: rejected even though 8 is a multiple of the 4 KV heads
    assert [c for c, _ in parallelism_issues(m, Parallelism(tp=8))] == ["heads_not_divisible_by_tp"]


def test_expert_parallel_checks():
    mixtral = load_model("Mixtral-8x7B")
    assert parallelism_issues(mixtral, Parallelism(tp=2, ep=2)) == []
    codes = [c for c, _ in parallelism_issues(mixtral, Parallelism(tp=1, dp=2, ep=16))]
    assert codes == ["ep_incompatible"]
    codes = [c for c, _ in parallelism_issues(mixtral, Parallelism(tp=4, dp=4, ep=16))]
    assert codes == ["experts_not_divisible_by_ep"]
    dense = load_model("Llama-3.1-8B")
    assert [c for c, _ in parallelism_issues(dense, Parallelism(ep=2, tp=2))] == ["ep_without_moe"]


def test_expert_tp():
    assert Parallelism(tp=8).expert_tp == 8
    assert Parallelism(tp=8, ep=8).expert_tp == 1
    assert Parallelism(tp=2, dp=4, ep=4).expert_tp == 2


def test_pp_deeper_than_layers():
    m = load_model("Llama-3.1-8B")
    assert [c for c, _ in parallelism_issues(m, Parallelism(pp=33))] == ["pp_exceeds_layers"]


@pytest.mark.parametrize(
    "layers,pp,expected",
    [(32, 4, [8, 8, 8, 8]), (61, 4, [15, 15, 16, 15]), (62, 4, [15, 16, 16, 15]), (5, 2, [3, 2]), (7, 1, [7])],
)
def test_pp_partition_matches_vllm(layers, pp, expected):
    # vLLM get_pp_indices: even split, leftovers go to the stages just before the last one
    assert pp_partition(layers, pp) == expected
