"""Admission policies: when a waiting request may start, given the KV cache. One class per engine policy,
registered by name in `ADMISSION_POLICIES` (`EngineConfig.admission_policy` names one).

The scheduler (`engine.Replica`) asks `admits` before it admits a request whose first chunk's blocks fit
physically, and tells the policy when a request's blocks are taken (`admitted`) and given back (`released`:
completion, preemption, hand-off). Preemption itself is the engine's: when a step's blocks run out the
newest running request is freed and later recomputed. A policy that reserves ahead never lets that happen.

- `vllm`: vLLM v1 (vllm/v1/core/sched/scheduler.py, `Scheduler.schedule`): a waiting request is admitted
  when the blocks of the tokens it computes this step fit (`KVCacheManager.allocate_slots`); decode growth
  that does not fit preempts the most recently admitted running request (`self.running.pop()`), whose
  blocks are freed and whose tokens are recomputed when it is admitted again.
- `trtllm-max-utilization`: TensorRT-LLM's MAX_UTILIZATION capacity scheduler
  (cpp/tensorrt_llm/batch_manager/capacityScheduler.cpp, `MaxUtilizationScheduler`): requests are scheduled
  while the next step's blocks fit, and when they do not, the last started request is paused (its blocks
  freed, recomputed on resumption) — the same mechanics as `vllm` at this model's resolution.
- `trtllm-guaranteed-no-evict`: TensorRT-LLM's default GUARANTEED_NO_EVICT (same file,
  `GuaranteedNoEvictScheduler::impl`): every request in progress keeps the blocks it needs to run to
  completion reserved (`NoEvictScheduledBlocksManager`); a new request starts only if the blocks of its
  whole prompt and output fit beside those reservations, and the first that does not stops admission
  (FCFS). Nothing is ever preempted, at the price of a smaller batch when KV is short.
"""

from __future__ import annotations

from typing import ClassVar

from llmcap.admission_names import ADMISSION_POLICY_NAMES


def lifetime_blocks(isl: int, osl: int, block_size: int) -> int:
    """Blocks a request holds at its longest: prompt + output, less the last token (its KV is never written)."""
    return -(-(isl + osl - 1) // block_size)


class Admission:
    """vLLM v1: admit whenever this step's blocks fit; the engine preempts the newest request when growth does not."""

    name: ClassVar[str] = "vllm"

    def admits(self, lifetime_blocks: int, num_blocks: int) -> bool:
        """May a request needing `lifetime_blocks` over its whole life start now (cache of `num_blocks`)?"""
        return True

    def admitted(self, lifetime_blocks: int) -> None:
        """A request needing `lifetime_blocks` over its life was admitted."""

    def released(self, lifetime_blocks: int) -> None:
        """A request's blocks were given back (it finished, was preempted, or handed off)."""


class MaxUtilizationAdmission(Admission):
    """TensorRT-LLM MAX_UTILIZATION: greedy admission, the last started request paused when blocks run out."""

    name: ClassVar[str] = "trtllm-max-utilization"


class NoEvictAdmission(Admission):
    """TensorRT-LLM GUARANTEED_NO_EVICT: admit only when the request's whole-life blocks fit beside every
    running request's (so growth never needs a preemption)."""

    name: ClassVar[str] = "trtllm-guaranteed-no-evict"

    def __init__(self) -> None:
        self.reserved = 0  # Σ whole-life blocks of the running requests

    def admits(self, lifetime_blocks: int, num_blocks: int) -> bool:
        return self.reserved + lifetime_blocks <= num_blocks

    def admitted(self, lifetime_blocks: int) -> None:
        self.reserved += lifetime_blocks

    def released(self, lifetime_blocks: int) -> None:
        self.reserved -= lifetime_blocks


ADMISSION_POLICIES: dict[str, type[Admission]] = {p.name: p for p in (Admission, MaxUtilizationAdmission, NoEvictAdmission)}
assert tuple(ADMISSION_POLICIES) == ADMISSION_POLICY_NAMES  # one class per name (llmcap.admission_names)
