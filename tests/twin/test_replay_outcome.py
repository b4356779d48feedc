"""`llmcap replay`'s exit-code contract on hand-made summaries: each code at its boundary, and the order in which they apply."""

from __future__ import annotations

import pytest

from llmcap import exit_codes
from llmcap.commands.replay import outcome


def _summary(
    ok: int, rejected: int = 0, unfinished: int = 0, late_ms: float = 1.0, attainment: float | None = None
) -> dict:
    s = {
        "requests": ok + rejected + unfinished,
        "status": {"ok": ok, "rejected": rejected, "unfinished": unfinished},
        "send_valid": late_ms <= 50.0,
        "send_lateness_ms": {"max": late_ms},
        "max_lateness_ms": 50.0,
    }
    return s | ({} if attainment is None else {"slo": {"attainment": attainment}})


@pytest.mark.parametrize(
    ("summary", "code"),
    [
        (_summary(100), 0),
        (_summary(99, rejected=1), 0),  # 1 of 100 = 1.0%: at --max-failed 0.01, not beyond it
        (_summary(98, rejected=1, unfinished=1), exit_codes.FAILED),  # 2 of 100 > 1%
        (_summary(0, rejected=7, unfinished=3), exit_codes.UNREACHABLE),  # nothing served
        (_summary(100, late_ms=50.1), exit_codes.INVALID),  # one send 0.1 ms past the bound
        (
            _summary(0, rejected=10, late_ms=80.0),
            exit_codes.INVALID,
        ),  # late sends say nothing of the server: INVALID first
        (_summary(100, attainment=0.99), 0),  # exactly the target holds
        (_summary(100, attainment=0.989), exit_codes.SLO_MISSED),
        (_summary(50, unfinished=50, attainment=0.5), exit_codes.FAILED),  # lost requests before a missed SLO
    ],
)
def test_each_exit_code_at_its_boundary(summary: dict, code: int) -> None:
    got, why = outcome(summary, max_failed=0.01, attainment_target=0.99)
    assert got == code, why
    assert why
