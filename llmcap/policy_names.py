"""The names of the simulator's pluggable policies — routers, admission policies and waiting-queue
(scheduling) policies — each the built-in ones plus any registered since.

Kept apart from the simulator so that validating a params file (every stage does) knows the names without
importing it: `llmcap.sim.routers.register_router`, `llmcap.sim.admission.register_admission` and
`llmcap.sim.queues.register_queue` add the policy and its name together.
"""

from __future__ import annotations

from llmcap.errors import LlmcapError

BUILT_IN_ROUTERS = ("round_robin", "least_outstanding_tokens", "power_of_two", "prefix_aware")
DEFAULT_ROUTER = "least_outstanding_tokens"

BUILT_IN_ADMISSIONS = ("vllm", "trtllm-max-utilization", "trtllm-guaranteed-no-evict", "sglang")
DEFAULT_ADMISSION = "vllm"

# vLLM's --scheduling-policy: the waiting queue's order (fcfs: arrival; priority: the request's priority,
# lower first, then arrival), which also picks the preemption victim
BUILT_IN_QUEUES = ("fcfs", "priority")
DEFAULT_QUEUE = "fcfs"


class _Names:
    """One kind's registered names, the built-in ones first (they cannot be dropped)."""

    def __init__(self, kind: str, built_in: tuple[str, ...]) -> None:
        self.kind, self.built_in = kind, built_in
        self._names = list(built_in)

    def add(self, name: str) -> None:
        if name not in self._names:
            self._names.append(name)

    def drop(self, name: str) -> None:
        if name in self._names and name not in self.built_in:
            self._names.remove(name)

    def all(self) -> tuple[str, ...]:
        return tuple(self._names)

    def known(self, name: str) -> str:
        """`name` if a policy of that name is registered (a configuration's validator), else a ValueError."""
        if name not in self._names:
            raise ValueError(f"unknown {self.kind} {name!r}; registered: {', '.join(self._names)}")
        return name

    def option(self, name: str, flag: str) -> str:
        """`name` if registered, else the command line's one-line error for `flag`."""
        if name not in self._names:
            raise LlmcapError(f"{flag} must be one of {', '.join(self._names)}, got {name!r}")
        return name


ROUTER_NAMES = _Names("router", BUILT_IN_ROUTERS)
ADMISSION_NAMES = _Names("admission policy", BUILT_IN_ADMISSIONS)
QUEUE_NAMES = _Names("scheduling policy", BUILT_IN_QUEUES)

# what an admission policy holds for a request (a registered policy declares them when it is registered)
_never_preempts = {"trtllm-guaranteed-no-evict"}  # reserves a request's whole KV life at admission
_reserves_output = {"trtllm-guaranteed-no-evict", "sglang"}  # admits against the output a request may still generate


def add_admission_name(name: str, *, never_preempts: bool, reserves_output: bool) -> None:
    ADMISSION_NAMES.add(name)
    for traits, has in ((_never_preempts, never_preempts), (_reserves_output, reserves_output)):
        if has:
            traits.add(name)
        else:
            traits.discard(name)


def drop_admission_name(name: str) -> None:
    if name not in BUILT_IN_ADMISSIONS:
        ADMISSION_NAMES.drop(name)
        _never_preempts.discard(name)
        _reserves_output.discard(name)


def never_preempts(admission: str) -> bool:
    """Whether the policy reserves each request's whole KV life, so that nothing is ever preempted."""
    return admission in _never_preempts


def reserves_output(admission: str) -> bool:
    """Whether the policy admits against the output a request may still generate (its max_tokens)."""
    return admission in _reserves_output


def router_names() -> tuple[str, ...]:
    return ROUTER_NAMES.all()


def known_router(name: str) -> str:
    return ROUTER_NAMES.known(name)


def known_admission(name: str) -> str:
    return ADMISSION_NAMES.known(name)


def admission_option(name: str) -> str:
    return ADMISSION_NAMES.option(name, "--admission-policy")


def known_queue(name: str) -> str:
    return QUEUE_NAMES.known(name)


def queue_option(name: str) -> str:
    return QUEUE_NAMES.option(name, "--scheduling-policy")
