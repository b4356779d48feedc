"""Router names: the built-in policies and any registered since (`llmcap.sim.routers.register_router`).

Kept apart from the simulator so that validating a params file (every stage does) knows the names without
importing the simulator; `llmcap.sim.routers` provides a policy class for each built-in name.
"""

from __future__ import annotations

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
