"""Admission policies: when a waiting request may start, given the KV cache. One class per engine policy,
registered by name (`register_admission`; `EngineConfig.admission_policy` names one). A new policy is a
class with `AdmissionPolicy`'s methods and one `register_admission` call, in a file of its own.

The scheduler (`engine.Replica`) asks `admits` — over an `AdmissionView` of the replica — before it admits
a request whose first chunk's blocks fit physically, and tells the policy when a request's blocks are taken (`admitted`) and given back (`released`:
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
- `sglang`: SGLang's conservative admission (python/sglang/srt/managers/schedule_policy.py, `PrefillAdder`;
  scheduler_components/new_token_ratio_tracker.py; schedule_batch.py, `retract_decode`): a request starts if
  its uncached prompt + min(its output, 4096) + one page is below the free and evictable KV tokens less every
  running request's min(remaining output, 4096) × `new_token_ratio`. The ratio starts at 0.7 and decays
  linearly to 0.7 × 0.14 over 600 decode steps; when decodes run out of KV, requests are retracted and the
  ratio is reset to (decoded + 20 × running) / (Σ max_new_tokens + 1) over those left (at most 1).
  A request the rule would refuse even on an empty cache (prompt + output + a page over its size) starts
  once the replica is otherwise empty: SGLang clamps max_new_tokens on arrival so that an accepted
  request fits an empty cache (scheduler.py, `max_req_len`), but a trace's output length is not clamped.
  Simplifications: the retracted request is the newest (SGLang picks the one with the fewest outputs,
  usually the same), and the prefix cache is the block cache, not a token radix tree.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import ClassVar, Protocol

from llmcap.policy_names import BUILT_IN_ADMISSIONS, add_admission_name, drop_admission_name, known_admission


def lifetime_blocks(isl: int, osl: int, block_size: int) -> int:
    """Blocks a request holds at its longest: prompt + output, less the last token (its KV is never written)."""
    return -(-(isl + osl - 1) // block_size)


class AdmissionView:
    """What a policy is shown of the replica when asked about the waiting head (the scheduler fills it).

    `lifetime_blocks`: the head's blocks at its longest (its prompt and max_tokens), of a cache of
    `num_blocks`; `free_tokens`: free and evictable KV tokens; `new_tokens`: its uncached prompt +
    min(output left, CLIP_NEW_TOKENS) + one block (at best: its whole prompt cached, when asked how long to
    wait); `running_remaining`: Σ min(output left, CLIP_NEW_TOKENS) of the running requests (0 unless the
    policy `tracks_progress`); `step`: the replica's step clock."""

    def __init__(self) -> None:
        self.lifetime_blocks = 0
        self.num_blocks = 0
        self.free_tokens = 0
        self.new_tokens = 0
        self.running_remaining = 0
        self.step = 0


class AdmissionPolicy(Protocol):
    """What the scheduler asks of and tells an admission policy."""

    tracks_progress: bool  # asks for the running requests' remaining output (costs a pass over them)

    def admits(self, view: AdmissionView) -> bool:
        """May the head start now? Asked only while other requests run or hold blocks on the replica: an
        otherwise empty replica admits whatever fits."""
        ...

    def admitted(self, lifetime_blocks: int) -> None:
        """A request needing `lifetime_blocks` over its life was admitted."""
        ...

    def released(self, lifetime_blocks: int) -> None:
        """A request's blocks were given back (it finished, was preempted, or handed off)."""
        ...

    def steps_before_admissible(self, view: AdmissionView, k: int, decoding: int) -> int:
        """How many of `k` pure-decode steps may run before this policy could admit the head (the scheduler
        looks again then); `decoding`: the sequences each step advances by one token."""
        ...

    def retracted(self, step: int, decoded: int, max_new: int, running: int) -> None:
        """Decodes ran out of KV at `step` and requests were preempted; `decoded` / `max_new`: Σ generated / Σ
        output lengths of the `running` requests left (called only when `tracks_progress`)."""
        ...


class Admission:
    """vLLM v1: admit whenever this step's blocks fit; the engine preempts the newest request when growth does not."""

    name: ClassVar[str] = "vllm"
    tracks_progress: bool = False

    def admits(self, view: AdmissionView) -> bool:
        return True

    def admitted(self, lifetime_blocks: int) -> None:
        pass

    def released(self, lifetime_blocks: int) -> None:
        pass

    def steps_before_admissible(self, view: AdmissionView, k: int, decoding: int) -> int:
        return k  # its answer only changes at events

    def retracted(self, step: int, decoded: int, max_new: int, running: int) -> None:
        pass


class MaxUtilizationAdmission(Admission):
    """TensorRT-LLM MAX_UTILIZATION: greedy admission, the last started request paused when blocks run out."""

    name: ClassVar[str] = "trtllm-max-utilization"


class NoEvictAdmission(Admission):
    """TensorRT-LLM GUARANTEED_NO_EVICT: admit only when the request's whole-life blocks fit beside every
    running request's (so growth never needs a preemption)."""

    name: ClassVar[str] = "trtllm-guaranteed-no-evict"

    def __init__(self) -> None:
        self.reserved = 0  # Σ whole-life blocks of the running requests

    def admits(self, view: AdmissionView) -> bool:
        return self.reserved + view.lifetime_blocks <= view.num_blocks

    def admitted(self, lifetime_blocks: int) -> None:
        self.reserved += lifetime_blocks

    def released(self, lifetime_blocks: int) -> None:
        self.reserved -= lifetime_blocks


CLIP_NEW_TOKENS = 4096  # SGLANG_CLIP_MAX_NEW_TOKENS_ESTIMATION
INIT_NEW_TOKEN_RATIO = 0.7  # SGLANG_INIT_NEW_TOKEN_RATIO × schedule_conservativeness 1.0
MIN_NEW_TOKEN_RATIO = INIT_NEW_TOKEN_RATIO * 0.14  # SGLANG_MIN_NEW_TOKEN_RATIO_FACTOR
NEW_TOKEN_RATIO_DECAY = (INIT_NEW_TOKEN_RATIO - MIN_NEW_TOKEN_RATIO) / 600  # SGLANG_NEW_TOKEN_RATIO_DECAY_STEPS
RETRACT_DECODE_STEPS = 20  # SGLANG_RETRACT_DECODE_STEPS


class SglangAdmission(Admission):
    """SGLang: admit while the free KV covers the newcomer's prompt and output and a decaying share of the
    running requests' remaining outputs."""

    name: ClassVar[str] = "sglang"
    tracks_progress: bool = True

    def __init__(self) -> None:
        self.ratio_at_reset = INIT_NEW_TOKEN_RATIO
        self.reset_step = 0

    def new_token_ratio(self, step: int) -> float:
        """The ratio after the decode steps since its last reset."""
        return max(MIN_NEW_TOKEN_RATIO, self.ratio_at_reset - NEW_TOKEN_RATIO_DECAY * (step - self.reset_step))

    def admits(self, view: AdmissionView) -> bool:
        return view.new_tokens < view.free_tokens - view.running_remaining * self.new_token_ratio(view.step)

    def steps_before_admissible(self, view: AdmissionView, k: int, decoding: int) -> int:
        # After j steps the running outputs left are at least `running_remaining - decoding·j`, the ratio at
        # least its value then and the free tokens at most today's: the first j where even that bound
        # admits is the earliest the scheduler must look (bisection: the bound only loosens with j).
        step, fewest_new, free_tokens, running_remaining = (
            view.step,
            view.new_tokens,
            view.free_tokens,
            view.running_remaining,
        )
        lo, hi = 1, k
        while lo < hi:
            j = (lo + hi) // 2
            if fewest_new < free_tokens - max(running_remaining - decoding * j, 0) * self.new_token_ratio(step + j):
                hi = j
            else:
                lo = j + 1
        return lo

    def retracted(self, step: int, decoded: int, max_new: int, running: int) -> None:
        self.ratio_at_reset = min(1.0, (decoded + RETRACT_DECODE_STEPS * running) / (max_new + 1))
        self.reset_step = step


ADMISSION_POLICIES: dict[str, Callable[[], AdmissionPolicy]] = {}


def register_admission(
    name: str, policy: Callable[[], AdmissionPolicy], *, never_preempts: bool = False, reserves_output: bool = False
) -> None:
    """Make `policy` (a class taking no arguments; one instance per replica) available as
    `admission_policy: name` everywhere. `never_preempts`: it reserves each request's whole KV life;
    `reserves_output`: it admits against the output a request may still generate (its max_tokens) — what
    the plans say their scheduler was assumed to know."""
    if name in ADMISSION_POLICIES and ADMISSION_POLICIES[name] is not policy:
        raise ValueError(f"admission policy {name!r} is already registered")
    ADMISSION_POLICIES[name] = policy
    add_admission_name(name, never_preempts=never_preempts, reserves_output=reserves_output)


def unregister_admission(name: str) -> None:
    """Forget a registered (not built-in) admission policy."""
    if name in BUILT_IN_ADMISSIONS:
        raise ValueError(f"admission policy {name!r} is built in")
    ADMISSION_POLICIES.pop(name, None)
    drop_admission_name(name)


def make_admission(name: str) -> AdmissionPolicy:
    """A fresh instance of the named policy (each replica keeps its own reservations)."""
    return ADMISSION_POLICIES[known_admission(name)]()


for _policy in (Admission, MaxUtilizationAdmission, NoEvictAdmission, SglangAdmission):
    ADMISSION_POLICIES[_policy.name] = _policy  # their traits are in llmcap.policy_names already
assert tuple(ADMISSION_POLICIES) == BUILT_IN_ADMISSIONS  # one class per built-in name (llmcap.policy_names)
