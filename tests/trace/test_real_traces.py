"""The shipped public traces read with the row counts and statistics their SOURCE.md files state.

Expected figures are copied from the traces' SOURCE.md files (data/raw/*/, tests/fixtures/traces/*/),
computed there with an independent throwaway script, and compared at the rounding shown there.
"""

from __future__ import annotations

import pytest

from llmcap.config import CharacteriseParams, CleanParams
from llmcap.trace import characterise, ingest, read_trace
from tests.conftest import TRACES

# name: rows, duration_s (1 dp), mean_rps (2 dp), ISL mean/p50/p90/p99/max, OSL mean/p50/p90/p99/max,
# Pearson, Spearman (3 dp), inter-arrival CV (2 dp), 60 s count CV / peak÷mean (2 dp)
EXPECTED = {
    "mooncake_conversation": dict(
        rows=12_031,
        duration=3537.0,
        rps=3.40,
        isl=(12_035, 6_909, 27_367, 85_400, 126_195),
        osl=(342.6, 350, 597, 1_118.5, 2_000),
        pearson=0.072,
        spearman=0.072,
        ia_cv=3.03,
        w60=(0.12, 1.21),
        w1=(1.52, 8.23),
    ),
    "mooncake_synthetic": dict(
        rows=3_993,
        duration=1022.0,
        rps=3.91,
        isl=(15_325, 11_587, 38_611, 66_456, 191_378),
        osl=(149.1, 69, 389, 768, 893),
        pearson=-0.374,
        spearman=-0.517,
        ia_cv=1.01,
        w60=(0.07, 1.17),
        w1=(0.53, 3.33),
    ),
    "azure_conv": dict(
        rows=19_366,
        duration=3501.7,
        rps=5.53,
        isl=(1_154.7, 1_020, 2_734.5, 4_142, 14_050),
        osl=(211.1, 129, 424, 601, 1_000),
        pearson=-0.112,
        spearman=0.073,
        ia_cv=1.09,
        w60=(0.22, 1.52),
        w1=(0.50, 2.89),
    ),
}


def _decimals(x: float) -> int:
    text = repr(float(x))
    return 0 if text.endswith(".0") else len(text.split(".")[1])


def _close_at_rounding(actual: float, shown: float) -> bool:
    return round(actual, _decimals(shown)) == pytest.approx(shown)


@pytest.mark.parametrize("name", sorted(EXPECTED))
def test_statistics_match_source_md(name: str) -> None:
    exp = EXPECTED[name]
    # SOURCE.md describes the files as they are: keep exact duplicates (the Mooncake conversation
    # file holds one, lines 7728/7733; test_clean covers dropping it).
    result = ingest(TRACES[name], clean=CleanParams(duplicates="keep"))
    assert result.report.rows_in == exp["rows"]
    assert result.report.rows_kept == exp["rows"]
    s = characterise(result.trace, CharacteriseParams())
    assert round(s["duration_s"], 1) == exp["duration"]
    assert round(s["mean_rps"], 2) == exp["rps"]
    for key, values in (("isl", exp["isl"]), ("osl", exp["osl"])):
        for stat, shown in zip(("mean", "p50", "p90", "p99", "max"), values, strict=True):
            assert _close_at_rounding(s[key][stat], shown), (key, stat, s[key][stat], shown)
    assert round(s["corr_pearson"], 3) == exp["pearson"]
    assert round(s["corr_spearman"], 3) == exp["spearman"]
    assert round(s["interarrival_cv"], 2) == exp["ia_cv"]
    assert (round(s["rps_windows"]["60s"]["cv"], 2), round(s["rps_windows"]["60s"]["peak_to_mean"], 2)) == exp["w60"]
    assert (round(s["rps_windows"]["1s"]["cv"], 2), round(s["rps_windows"]["1s"]["peak_to_mean"], 2)) == exp["w1"]


@pytest.mark.parametrize(
    ("name", "ideal_tokens", "ideal_blocks", "ge1", "ge2", "unique", "total"),
    [
        ("mooncake_conversation", 0.374, 0.366, 0.9999, 0.387, 182_790, 288_500),
        ("mooncake_synthetic", 0.651, 0.640, 0.446, 0.438, 43_924, 121_877),
    ],
)
def test_prefix_reuse_matches_source_md(name, ideal_tokens, ideal_blocks, ge1, ge2, unique, total) -> None:
    result = ingest(TRACES[name], clean=CleanParams(duplicates="keep"))
    p = characterise(result.trace, CharacteriseParams(lru_cache_blocks=[]))["prefix"]
    assert p["block_size"] == 512
    for key, shown in (
        ("ideal_hit_ratio", ideal_tokens),
        ("ideal_block_hit_ratio", ideal_blocks),
        ("requests_reusing_ge1_block", ge1),
        ("requests_reusing_ge2_blocks", ge2),
    ):
        assert _close_at_rounding(p[key], shown), (key, p[key], shown)
    assert (p["unique_blocks"], p["total_blocks"]) == (unique, total)


def test_vidur_length_only_trace_gets_generated_arrivals() -> None:
    raw = read_trace(TRACES["vidur_arxiv"])
    assert raw.format == "lengths" and raw.rows == 28_257 and raw.generated_arrivals
    result = ingest(TRACES["vidur_arxiv"])
    s = characterise(result.trace, CharacteriseParams(lru_cache_blocks=[]))
    assert s["rows"] == 28_257
    assert (round(s["isl"]["mean"], 1), s["isl"]["p50"], s["isl"]["p90"], round(s["isl"]["p99"], 1)) == (
        2588.1,
        2730,
        3702,
        3933.4,
    )
    assert (round(s["osl"]["mean"], 1), s["osl"]["p50"], s["osl"]["p90"], round(s["osl"]["p99"], 1)) == (
        291.4,
        167,
        372,
        3271.3,
    )
    assert (round(s["corr_pearson"], 3), round(s["corr_spearman"], 3)) == (-0.463, -0.114)
    # Poisson arrivals at the default 1 req/s: mean rate within 2% over 28k requests, CV ≈ 1
    assert s["mean_rps"] == pytest.approx(1.0, rel=0.02)
    assert s["interarrival_cv"] == pytest.approx(1.0, abs=0.03)


def test_azure_absolute_start_is_kept_as_metadata() -> None:
    result = ingest(TRACES["azure_conv"])
    assert result.report.start == "2023-11-16T18:15:46.680590000"
    meta = result.trace.schema.metadata
    assert meta[b"llmcap.start"] == b"2023-11-16T18:15:46.680590000"
    arrival = result.trace.column("arrival_s").to_numpy()
    assert arrival[0] == 0.0
    # second row of the file: 18:15:50.9951690 − 18:15:46.6805900 = 4.314579 s (100 ns digits kept)
    assert arrival[1] == pytest.approx(4.314579, abs=1e-9)
