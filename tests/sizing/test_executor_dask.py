"""The pluggable executor: in-process, local processes and a real Dask LocalCluster give identical results."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from synthetic import Knee

from llmcap.sizing.executor import DaskExecutor, LocalExecutor, make_executor
from llmcap.sizing.params import ComputeParams, SearchParams
from llmcap.sizing.search import SearchTask, search_candidates, search_max_rate

TASKS = [
    SearchTask("a", Knee(3.0, jitter=0.1), 0.99, SearchParams(), initial_rate=1.0),
    SearchTask("b", Knee(11.0), 0.95, SearchParams(seeds=(0, 5)), initial_rate=20.0),
    SearchTask("c", Knee(0.7, jitter=0.2), 0.99, SearchParams(feasibility="mean"), initial_rate=0.1),
]


def square(x: int) -> int:
    return x * x


@pytest.fixture(scope="module")
def cluster_address() -> Iterator[str]:
    from dask.distributed import LocalCluster

    # Threads, not processes, locally (docs/stack-notes.md); its HTTP server on a free port (8787 may be another test worker's).
    with LocalCluster(n_workers=2, threads_per_worker=1, processes=False, dashboard_address=":0") as cluster:
        yield cluster.scheduler_address


def test_local_in_process_keeps_order():
    with LocalExecutor() as ex:
        assert ex.map(square, [3, 1, 2]) == [9, 1, 4]
        assert ex.map(square, []) == []


def test_local_processes_match_in_process():
    local = search_candidates(TASKS)
    with make_executor(ComputeParams(workers=2)) as ex:
        assert isinstance(ex, LocalExecutor) and ex.workers == 2
        assert ex.map(square, list(range(6))) == [0, 1, 4, 9, 16, 25]
        assert search_candidates(TASKS, ex) == local


def test_dask_matches_local(cluster_address):
    local = search_candidates(TASKS)
    with make_executor(ComputeParams(dask_address=cluster_address)) as ex:
        assert isinstance(ex, DaskExecutor)
        assert ex.map(square, list(range(10))) == [x * x for x in range(10)]
        assert search_candidates(TASKS, ex) == local
        # the seeds of one rate through Dask
        assert search_max_rate(Knee(4.0, 0.1), 0.99, SearchParams(), 1.0, executor=ex) == search_max_rate(
            Knee(4.0, 0.1), 0.99, SearchParams(), 1.0
        )
    ex.close()  # idempotent
    with pytest.raises(RuntimeError):
        ex.map(square, [1])


def test_dask_and_local_give_byte_identical_capacity_tables(cluster_address, tmp_path):
    from capacity_fixture import searches, table_from

    from llmcap.sizing.table import write_parquet

    local = write_parquet(table_from(searches()), tmp_path / "local.parquet")
    with make_executor(ComputeParams(dask_address=cluster_address)) as ex:
        dask = write_parquet(table_from(searches(ex)), tmp_path / "dask.parquet")
    assert local.read_bytes() == dask.read_bytes()
