"""The twin's clocks (dilation, slowdown, stalls) and its prefix-cache keys."""

from __future__ import annotations

import pytest

from llmcap.twin.clock import TwinClock
from llmcap.twin.prefix import block_keys, text_token_ids


def test_dilation_maps_wall_to_twin_time():
    clock = TwinClock(dilation=4.0, wall0=100.0)
    assert clock.tau(108.0) == 2.0
    assert clock.wall(2.0) == 108.0
    assert clock.sigma(2.0) == 2.0  # no slowdown: the engine runs at twin time
    assert clock.wall_of(3.0) == 112.0


def test_slowdown_stretches_engine_time_from_its_change_on():
    clock = TwinClock(wall0=0.0)
    clock.set_slowdown(3.0, tau=10.0)
    assert clock.sigma(10.0) == 10.0  # what happened before the change stays put
    assert clock.sigma(16.0) == pytest.approx(12.0)  # 6 twin seconds = 2 engine seconds
    assert clock.tau_of(13.0) == pytest.approx(19.0)
    clock.set_slowdown(1.0, tau=16.0)
    assert clock.sigma(20.0) == pytest.approx(16.0)


def test_a_stall_stops_the_engine_clock_and_pushes_later_events_back(monkeypatch):
    now = [5.0]
    monkeypatch.setattr("llmcap.twin.clock.time.perf_counter", lambda: now[0])
    clock = TwinClock(wall0=0.0)
    clock.stall(2.0, at=6.0)
    assert clock.tau_of(6.0) == 6.0  # reached just as the stall starts
    assert clock.sigma(6.0) == 6.0 and clock.sigma(7.5) == 6.0 and clock.sigma(8.0) == 6.0
    assert clock.sigma(9.0) == pytest.approx(7.0)
    assert clock.tau_of(5.5) == 5.5  # before the stall: unchanged
    assert clock.tau_of(6.5) == pytest.approx(8.5)  # after it: later by its length
    assert clock.stalled(7.0) and not clock.stalled(8.0)
    now[0] = 10.0
    assert clock.sigma() == pytest.approx(8.0)
    assert not clock.stalled()


def test_block_keys_are_chained_per_full_block():
    a = block_keys(list(range(40)), 16)
    b = block_keys(list(range(32)) + [7] * 20, 16)
    c = block_keys([99] + list(range(1, 40)), 16)
    assert len(a) == 2 and len(b) == 3  # the partial last block has no key
    assert a == b[:2]  # a shared prefix shares its keys
    assert c[0] != a[0] and c[1] != a[1]  # a different first block changes every key after it
    assert all(0 <= k < 2**63 for k in a + b + c)
    assert block_keys(list(range(40)), 16) == a  # deterministic across calls (and processes: blake2b)


def test_text_prompts_get_stand_in_token_ids():
    assert len(text_token_ids("abcdefgh")) == 2
    assert text_token_ids("hello world, again")[:2] == text_token_ids("hello world!")[:2]
