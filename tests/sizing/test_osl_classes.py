"""OSL classes (`size.pools_split_cap`, `llmcap size --pools-split-cap`): requests whose max_tokens cap is far above
the typical output compared as their own pool against one shared deployment, as the ISL split is."""

from __future__ import annotations

import json

import numpy as np
import pyarrow as pa
import pytest
from typer.testing import CliRunner

from llmcap.cli import app
from llmcap.errors import LlmcapError
from llmcap.sizing.params import SizeParams
from llmcap.sizing.plan import request_classes
from tests._size_cli import size_args

N = 300


def _osl(i: int) -> int:
    return 20 + (i * 13) % 150


def _cap(i: int) -> int | None:
    return 4096 if i % 5 == 0 else (None if i % 5 == 1 else _osl(i) + 10)  # a fifth ask for 4,096; a fifth state no cap


def test_the_classes_split_at_a_multiple_of_the_median_output() -> None:
    table = pa.table(
        {
            "isl": [100] * N,
            "osl": [_osl(i) for i in range(N)],
            "max_tokens": pa.array([_cap(i) for i in range(N)], pa.int64()),
        }
    )
    median = float(np.median([_osl(i) for i in range(N)]))
    where, ((typical_name, typical), (long_name, long_cap)) = request_classes(table, None, 8.0)
    bound = 8.0 * median  # 4,096 is above it; every other cap is osl + 10 ≤ 179
    assert 179 < bound < 4096 and where == f"max_tokens 8× the median OSL ({bound:,.0f})"
    assert long_name == f"max_tokens > {bound:,.0f}" and typical_name == f"max_tokens ≤ {bound:,.0f} or none"
    assert (
        long_cap.tolist() == [i % 5 == 0 for i in range(N)] and (typical == ~long_cap).all()
    )  # no cap: the typical class
    with pytest.raises(LlmcapError, match="needs pools_split_isl or pools_split_cap"):
        request_classes(table, None, None)


def test_one_split_at_a_time() -> None:
    with pytest.raises(ValueError, match="pools_split_isl and pools_split_cap each split the requests in two"):
        SizeParams(pools_split_isl=1024, pools_split_cap=8.0)
    with pytest.raises(ValueError):
        SizeParams(pools_split_cap=1.0)  # a cap at the median itself is no class of its own


def test_size_compares_the_long_cap_pool_with_the_shared_one(tmp_path, monkeypatch) -> None:
    monkeypatch.delenv("COLUMNS", raising=False)
    trace = tmp_path / "t.csv"
    trace.write_text(
        "arrival_s,isl,osl,max_tokens\n"
        + "".join(f"{i * 0.2:.1f},{200 + (i * 37) % 800},{_osl(i)},{_cap(i) or ''}\n" for i in range(N))
    )
    args = size_args("--admission-policy", "trtllm-guaranteed-no-evict", trace=trace)
    r = CliRunner().invoke(app, [*args, "--pools-split-cap", "8"])
    assert r.exit_code == 0, r.output
    s = json.loads(r.stdout)
    pools = s["pools"]
    long_share = sum(i % 5 == 0 for i in range(N)) / N  # 60 of 300 requests ask for 4,096 tokens
    (typical, long_cap) = pools["split"]
    assert typical["name"].startswith("max_tokens ≤ ") and long_cap["name"].startswith("max_tokens > ")
    assert long_cap["rate_rps"] == pytest.approx(s["target_rps"] * long_share) and typical["rate_rps"] == pytest.approx(
        s["target_rps"] * (1 - long_share)
    )
    assert pools["cheaper"] in ("shared", "split") and pools["shared"][0]["rate_rps"] == pytest.approx(s["target_rps"])
    # the comparison is the shared base $/h against the two classes' sum
    assert pools["saving_usd_per_hour"] == pytest.approx(
        abs(sum(p["usd_per_hour"] for p in pools["shared"]) - typical["usd_per_hour"] - long_cap["usd_per_hour"])
    )
    r = CliRunner().invoke(app, [*args, "--pools-split-cap", "8", "--pools-split-isl", "512"])
    assert r.exit_code == 2 and "give one" in r.output
