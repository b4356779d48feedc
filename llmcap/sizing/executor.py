"""Where (candidate, rate) evaluations run: one `map(fn, items) -> list` (input order), local or Dask.

- `LocalExecutor(workers=1)`: in-process, a plain loop (no pickling; easiest to debug and profile).
- `LocalExecutor(workers>1)`: a `ProcessPoolExecutor` with the "spawn" start method (a forked child of a
  threaded parent — Dask, matplotlib — can deadlock), started when the executor is made, its workers importing
  the sizer's modules while the caller prepares its first tasks.
- `DaskExecutor(address)`: a `dask.distributed.Client` on an existing scheduler. dask is imported here
  only, and only when used.
`fn` and the items must pickle for the last two (module-level functions, `functools.partial`, dataclasses).
Executors are context managers; `close()` releases the pool / client and is idempotent.
"""

from __future__ import annotations

import importlib
import multiprocessing
from collections.abc import Callable, Sequence
from concurrent.futures import ProcessPoolExecutor
from typing import Any, Protocol, TypeVar

from llmcap.sizing.params import ComputeParams

T = TypeVar("T")
R = TypeVar("R")


class Executor(Protocol):
    def map(self, fn: Callable[[T], R], items: Sequence[T]) -> list[R]: ...

    def slots(self) -> int:
        """How many items run at once."""
        ...

    def close(self) -> None: ...


class _Closing:
    def __enter__(self) -> Any:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:  # pragma: no cover - overridden
        raise NotImplementedError


WARM_MODULES = ("llmcap.sizing.deployed", "llmcap.sizing.search")  # what every sizing task unpickles into


def _warm() -> None:
    for name in WARM_MODULES:
        importlib.import_module(name)


class LocalExecutor(_Closing):
    def __init__(self, workers: int = 1) -> None:
        if workers < 1:
            raise ValueError("workers must be >= 1")
        self.workers = workers
        self._pool: ProcessPoolExecutor | None = None
        if workers > 1:  # started now, importing the sizer's modules while the caller prepares its first tasks
            self._pool = ProcessPoolExecutor(workers, mp_context=multiprocessing.get_context("spawn"))
            for _ in range(workers):
                self._pool.submit(_warm)

    def slots(self) -> int:
        return self.workers

    def map(self, fn: Callable[[T], R], items: Sequence[T]) -> list[R]:
        items = list(items)
        if self.workers == 1 or len(items) <= 1:
            return [fn(x) for x in items]
        if self._pool is None:
            self._pool = ProcessPoolExecutor(self.workers, mp_context=multiprocessing.get_context("spawn"))
        return list(self._pool.map(fn, items))

    def close(self) -> None:
        if self._pool is not None:
            self._pool.shutdown(wait=True)
            self._pool = None


class DaskExecutor(_Closing):
    def __init__(self, address: str) -> None:
        from dask.distributed import Client  # lazy: only sweeps on a cluster pay for the import

        self.address = address
        self._client: Any = Client(address, set_as_default=False)

    def slots(self) -> int:
        if self._client is None:
            raise RuntimeError("DaskExecutor is closed")
        return max(1, sum(w.get("nthreads", 1) for w in self._client.scheduler_info()["workers"].values()))

    def map(self, fn: Callable[[T], R], items: Sequence[T]) -> list[R]:
        items = list(items)
        if not items:
            return []
        if self._client is None:
            raise RuntimeError("DaskExecutor is closed")
        # pure=False: never hash arbitrary callables into keys; every call is its own task.
        futures = self._client.map(fn, items, pure=False)
        return list(self._client.gather(futures))

    def close(self) -> None:
        if self._client is not None:
            self._client.close()
            self._client = None


def make_executor(params: ComputeParams) -> LocalExecutor | DaskExecutor:
    """Dask when `dask_address` is set, else local processes (`workers`)."""
    if params.dask_address:
        return DaskExecutor(params.dask_address)
    return LocalExecutor(params.workers)
