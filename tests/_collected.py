"""A pytest plugin (`-p tests._collected`) that prints one line per collected test: its id, its markers and
whether it needs the real engine (the `vllm_engine` fixture, directly or through another fixture)."""

from __future__ import annotations

import pytest

PREFIX = "COLLECTED\t"


def pytest_collection_finish(session: pytest.Session) -> None:
    for item in session.items:
        markers = sorted({m.name for m in item.iter_markers()})
        engine = "vllm_engine" in getattr(item, "fixturenames", ())
        print(f"{PREFIX}{item.nodeid}\t{','.join(markers)}\t{int(engine)}")
