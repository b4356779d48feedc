"""LoRA adapters per batch (`EngineConfig.max_loras`, vLLM's --max-loras): a waiting request whose adapter would make
the running batch hold more adapters than that is skipped, keeps its place, and the next one is tried (vLLM v1's
scheduler, `Scheduler.schedule`: "Scheduling would exceed max_loras, skip"). Requests of the base model are never held."""

from __future__ import annotations

import numpy as np

from llmcap.sim import EngineConfig, SimConfig, simulate
from tests.sim._workloads import MODEL, table

ENGINE = dict(num_blocks=4096, block_size=16, max_num_seqs=8, max_num_batched_tokens=2048, enable_prefix_caching=False)


def admitted(adapters: list[str | None], max_loras: int, osl: int = 50) -> list[float]:
    n = len(adapters)
    trace = table({"isl": np.full(n, 100), "osl": np.full(n, osl), "arrival_s": np.zeros(n), "adapter": adapters})
    engine = EngineConfig(**ENGINE, max_loras=max_loras)
    r = simulate(trace, MODEL, SimConfig(engine=engine, replicas=1))
    assert r.summary["completed"] == n
    return r.records.column("admitted_s").to_pylist()


def test_one_adapter_per_batch_skips_the_others_in_order() -> None:
    a0, b, a2, c = admitted(["a", "b", "a", "c"], max_loras=1)
    # step one: a (0) starts, b is skipped, the second a (2) joins, c is skipped; b starts once both a's are done,
    # then c once b is
    assert a0 == a2 == 0.0 and 0.0 < b < c


def test_two_adapters_per_batch_and_the_base_model_is_never_held() -> None:
    a0, b, a2, c, base = admitted(["a", "b", "a", "c", None], max_loras=2)
    assert (
        a0 == b == a2 == base == 0.0 and c > 0.0
    )  # c would be a third adapter: it waits, the base-model request does not


def test_no_limit_or_no_adapters_changes_nothing() -> None:
    assert admitted(["a", "b", "a", "c"], max_loras=0) == [0.0] * 4
    n = 6
    plain = table({"isl": np.full(n, 100), "osl": np.full(n, 50), "arrival_s": np.zeros(n)})
    runs = [
        simulate(plain, MODEL, SimConfig(engine=EngineConfig(**ENGINE, max_loras=k), replicas=1)).records
        for k in (0, 1)
    ]
    assert runs[0].equals(runs[1])  # a trace without adapters: the limit has nothing to hold back
