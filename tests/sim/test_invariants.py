"""Invariants on random workloads, checked after every replica decision."""

from __future__ import annotations

import numpy as np
import pyarrow.compute as pc
import pytest

from llmcap.sim import simulate
from llmcap.sim.engine import Replica
from tests.sim._workloads import MODEL, random_config, random_trace


class _Watch:
    """After every replica decision: the clock never goes backwards, KV counts stay within [0, capacity]."""

    def __init__(self) -> None:
        self.checks = 0
        self.violations: list[str] = []
        self.last: dict[int, float] = {}

    def __call__(self, rep: Replica, t: float) -> None:
        if t < self.last.get(id(rep), -np.inf):
            self.violations.append(f"time went back on replica {rep.index}: {t}")
        self.last[id(rep)] = t
        kv = rep.kv
        if not (0 <= kv.plain <= kv.free <= kv.num_blocks):
            self.violations.append(f"KV counts out of range: plain {kv.plain}, free {kv.free}, of {kv.num_blocks}")
        lru = kv.evictable()
        if (
            sum(nb for _, nb in lru) != kv.free - kv.plain
            or len(lru) != kv.n_lru
            or any(s.ref < 0 for s in kv.segments.values())
        ):
            self.violations.append("LRU blocks disagree with the free count, or a negative ref count")
        if (
            rep.decode_batch != sum(1 for r in rep.running.values() if r.decoding)
            or len(rep.running) > rep.cfg.max_num_seqs
        ):
            self.violations.append("decoding set or max_num_seqs broken")
        self.checks += 1


@pytest.mark.parametrize("seed", range(30))
def test_invariants(seed: int) -> None:
    watch = _Watch()
    rng = np.random.default_rng(1000 + seed)
    trace = random_trace(rng, int(rng.integers(10, 80)))
    cfg = random_config(rng, seed)
    r = simulate(trace, MODEL, cfg, rng=np.random.default_rng(seed), on_decision=watch)
    assert watch.checks > 0 and watch.violations == []
    rec = r.records
    status = rec.column("status").to_numpy(zero_copy_only=False)
    ok = status == "ok"
    assert set(status) <= {"ok", "rejected"}  # no clock limit: everything admissible finishes
    assert rec.column("request_id").to_pylist() == list(range(trace.num_rows))  # each request exactly once
    osl = rec.column("osl").to_numpy()
    # every generated token but each request's first has exactly one gap in the distribution
    assert int(r.itl_weights.sum()) == int((osl[ok] - 1).sum())
    tokens = int(r.timeseries.column("tokens").to_numpy().sum()) if r.timeseries.num_rows else 0
    assert tokens >= int(osl[ok].sum())  # generated tokens all went through steps (plus prefill work)
    for a, b in (("arrival_s", "admitted_s"), ("admitted_s", "first_token_s"), ("first_token_s", "finish_s")):
        d = pc.subtract(rec.column(b), rec.column(a)).to_numpy(zero_copy_only=False)
        assert np.all(d[ok] >= 0), (a, b)
    kv = r.timeseries.column("kv_usage").to_numpy()
    assert np.all((kv >= 0) & (kv <= 1))


def test_generated_tokens_equal_sum_of_osl_without_preemption() -> None:
    rng = np.random.default_rng(3)
    trace = random_trace(rng, 50)
    cfg = random_config(rng, 1).model_copy(update={"pd": None})
    cfg = cfg.model_copy(
        update={"engine": cfg.engine.model_copy(update={"num_blocks": 10_000, "enable_prefix_caching": False})}
    )
    r = simulate(trace, MODEL, cfg)
    isl = trace.column("isl").to_numpy()
    osl = trace.column("osl").to_numpy()
    assert r.summary["preemptions"] == 0 and r.summary["completed"] == trace.num_rows
    # tokens through the model = every prompt token once + every generated token but the last
    assert int(r.timeseries.column("tokens").to_numpy().sum()) == int(isl.sum() + osl.sum() - trace.num_rows)
