"""The exit codes every command shares, so a script can act on any of them the same way.

0 means the run did what was asked and every request is accounted for as served. The rest, from the
first that applies: 2 the input or options are unusable (one line on stderr); 3 INVALID: the
measurement is not the server's (the client sent late); 4 UNREACHABLE: nothing was served (a dead
server, a closed port); 5 FAILED: more requests (or profile runs) rejected or unfinished than allowed;
6 SLO MISSED: served, but below the attainment target; 7 ROLLED BACK: a rollout gate breached and
traffic went back to the baseline; 8 REJECTED: an approver said no; 9 TIMED OUT: no approval in time.
1 is left to Python (an unexpected error: a bug to report).
"""

from __future__ import annotations

OK = 0
USAGE = 2
INVALID = 3
UNREACHABLE = 4
FAILED = 5
SLO_MISSED = 6
ROLLED_BACK = 7
REJECTED = 8
TIMED_OUT = 9

NAMES: dict[int, str] = {
    OK: "ok",
    USAGE: "USAGE",
    INVALID: "INVALID",
    UNREACHABLE: "UNREACHABLE",
    FAILED: "FAILED",
    SLO_MISSED: "SLO MISSED",
    ROLLED_BACK: "ROLLED BACK",
    REJECTED: "REJECTED",
    TIMED_OUT: "TIMED OUT",
}

#: Codes after which the run's numbers do not describe the server's service (`valid: false` in JSON).
NOT_VALID = frozenset({INVALID, UNREACHABLE, FAILED})


def served(requests: int, ok: int, max_failed: float, what: str = "requests") -> tuple[int, str]:
    """UNREACHABLE, FAILED or OK for `requests` of which `ok` were served, `max_failed` the share allowed to fail."""
    failed = requests - ok
    if requests and ok == 0:
        return UNREACHABLE, f"not one of {requests:,} {what} was served: is the server up?"
    if failed > max_failed * requests:
        return (
            FAILED,
            f"{failed:,} of {requests:,} {what} rejected or unfinished ({failed / requests:.1%} > --max-failed {max_failed:.1%})",
        )
    return OK, f"every one of {requests:,} {what} accounted for" + (
        f" ({failed:,} failed, within --max-failed {max_failed:.1%})" if failed else " and served"
    )
