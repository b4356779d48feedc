"""The traffic split: weight applied to a stable key point; sticky, monotone in the weight."""

from __future__ import annotations

from itertools import pairwise

import pytest

from llmcap.gateway.split import TrafficSplit, point, sticky_key

KEYS = [b"session:%d" % i for i in range(4000)]


def test_the_candidate_share_follows_the_weight():
    for w in (0.0, 0.05, 0.25, 0.5, 1.0):
        share = sum(TrafficSplit(w).side(k) == "candidate" for k in KEYS) / len(KEYS)
        assert share == pytest.approx(w, abs=0.025)


def test_raising_the_weight_only_moves_keys_to_the_candidate():
    steps = [0.01, 0.05, 0.25, 0.5, 1.0]
    on_candidate = [{k for k in KEYS if TrafficSplit(w).side(k) == "candidate"} for w in steps]
    for smaller, larger in pairwise(on_candidate):
        assert smaller <= larger and len(larger) > len(smaller)


def test_keys_session_first_then_prefix_then_arrival():
    body = {"prompt": list(range(1000)), "model": "m"}
    assert sticky_key({"x-session-id": "abc"}, body, 7) == b"session:abc"
    assert sticky_key({}, {**body, "user": "u1"}, 7) == b"session:u1"
    same_prefix = {"prompt": list(range(256)) + [9, 9, 9]}
    assert sticky_key({}, body, 1) == sticky_key({}, same_prefix, 2)  # shares the first 256 tokens
    assert sticky_key({}, body, 1, prefix_tokens=0) == b"arrival:1"
    assert sticky_key({}, {"messages": [{"role": "user", "content": "hi"}]}, 3).startswith(b"prefix:")
    assert sticky_key({}, {}, 3) == b"arrival:3"


def test_points_are_stable_and_shadow_samples_differ_by_target():
    assert point(b"k") == point(b"k") and 0 <= point(b"k") < 1
    a = {k for k in KEYS if TrafficSplit.mirrored(k, 0.3, "a")}
    b = {k for k in KEYS if TrafficSplit.mirrored(k, 0.3, "b")}
    assert len(a) == pytest.approx(0.3 * len(KEYS), rel=0.1) and a != b


def test_a_weight_outside_0_1_is_refused():
    with pytest.raises(ValueError, match="share of traffic"):
        TrafficSplit(1.5)
