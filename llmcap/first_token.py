"""Where a request handed from a prefill to a decode instance (P/D) shows its first token: one definition of
P/D TTFT for the simulator, the twin, sizing, replay and the reports.
"""

from __future__ import annotations

from typing import Literal, get_args

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
