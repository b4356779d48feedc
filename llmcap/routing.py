"""Router names: the built-in policies and any registered since (`llmcap.sim.routers.register_router`); and
where a request handed from a prefill to a decode instance (P/D) shows its first token.

Kept apart from the simulator so that validating a params file (every stage does) knows the names without
importing the simulator; `llmcap.sim.routers` provides a policy class for each built-in name.
"""

from __future__ import annotations

from typing import Literal, get_args

BUILT_IN_ROUTERS = ("round_robin", "least_outstanding_tokens", "power_of_two", "prefix_aware")
DEFAULT_ROUTER = "least_outstanding_tokens"

_names: list[str] = list(BUILT_IN_ROUTERS)


def add_router_name(name: str) -> None:
    if name not in _names:
        _names.append(name)


def drop_router_name(name: str) -> None:
    if name in _names and name not in BUILT_IN_ROUTERS:
        _names.remove(name)


def router_names() -> tuple[str, ...]:
    return tuple(_names)


def known_router(name: str) -> str:
    """`name`, if a router of that name is registered (a configuration's validator)."""
    if name not in _names:
        raise ValueError(f"unknown router {name!r}; registered: {', '.join(_names)}")
    return name


FirstTokenFrom = Literal["prefill", "decode"]
FIRST_TOKEN_FROM: tuple[FirstTokenFrom, ...] = get_args(FirstTokenFrom)

# One definition of P/D TTFT for the simulator, the twin, sizing, replay and the reports: it ends when the decode
# instance emits the first token after the P→D KV handoff (the first token the user sees). Every default of it
# (SloParams.ttft_includes_handoff, PDConfig.first_token_from, the commands' options) is derived from this one.
TTFT_INCLUDES_HANDOFF = True


def first_token_from(ttft_includes_handoff: bool) -> FirstTokenFrom:
    """The pool whose first token ends TTFT: `decode` after the handoff, `prefill` when it computes the token."""
    return "decode" if ttft_includes_handoff else "prefill"


def includes_handoff(first_token: str) -> bool:
    """Whether TTFT measured at `first_token` ("prefill" | "decode") includes the P→D KV handoff."""
    return first_token == "decode"


DEFAULT_FIRST_TOKEN_FROM: FirstTokenFrom = first_token_from(TTFT_INCLUDES_HANDOFF)
