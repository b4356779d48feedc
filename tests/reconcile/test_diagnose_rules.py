"""Each diagnosis rule (llmcap.reconcile.diagnose) at its threshold, on hand-made series in the twin's metric
names: scrapes once a second for 40 s, windows of 10 s ([0, 10), [10, 20), [20, 30), [30, 39]). Gauges are
averaged over a window (waiting summed over the two engines, KV usage the fullest engine); counters are read
as growth from the last scrape before the window to its last, divided by that span (10 s)."""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
import pytest

from llmcap.errors import LlmcapError
from llmcap.reconcile.diagnose import CAVEAT, READINGS, Finding, diagnose
from llmcap.reconcile.metric_schema import schema_for
from llmcap.reconcile.params import DiagnoseParams
from llmcap.reconcile.series import to_table

TWIN = schema_for("llmcap-twin")
P = DiagnoseParams()  # window 10 s, 2 windows, waiting >= 1, KV < 0.7 / >= 0.9, 0.05 preemptions/s, hit drop 0.2,
# ITL rise 25% with the link >= 80% busy
T = 40
LATE = 10  # the pattern runs from this second on: windows 2-4


def series(
    waiting: Callable[[int], float] = lambda t: 0.0,
    kv: tuple[Callable[[int], float], Callable[[int], float]] = (lambda t: 0.2, lambda t: 0.1),
    preempted: Callable[[int], float] = lambda t: 0.0,
    hit_rate: Callable[[int], float] = lambda t: 0.5,
    itl_s: Callable[[int], float] = lambda t: 0.02,
    busy: Callable[[int], float] = lambda t: 0.0,
    running: Callable[[int], float] = lambda t: 4.0,
    queries: Callable[[int], float] = lambda t: 100.0,
    tokens: Callable[[int], float] = lambda t: 50.0,
    n: int = T,
):
    """Scrapes of two engines at seconds 0 .. n-1. Per-second rates become counters: preempted/s, a hit rate of
    `queries` (100) a second, a mean ITL over `tokens` (50) a second, a link busy share. `running` is per engine;
    a KV usage of None is not reported in that scrape."""
    cum = {"pre": 0.0, "q": 0.0, "h": 0.0, "isum": 0.0, "icount": 0.0, "busy": 0.0}
    scrapes = []
    for t in range(n):
        if t > 0:  # what happened in (t-1, t]
            cum["pre"] += preempted(t)
            cum["q"] += queries(t)
            cum["h"] += queries(t) * hit_rate(t)
            cum["icount"] += tokens(t)
            cum["isum"] += tokens(t) * itl_s(t)
            cum["busy"] += busy(t)
        snap = {}
        for e, share in (("0", 0.5), ("1", 0.5)):
            snap[(TWIN.waiting, e)] = waiting(t) * share
            snap[(TWIN.running, e)] = running(t)
            if (usage := kv[int(e)](t)) is not None:
                snap[(TWIN.kv_usage, e)] = usage
            snap[(TWIN.preemptions, e)] = cum["pre"] * share
            snap[(TWIN.prefix_queries, e)] = cum["q"] * share
            snap[(TWIN.prefix_hits, e)] = cum["h"] * share
            snap[(f"{TWIN.itl}_sum", e)] = cum["isum"] * share
            snap[(f"{TWIN.itl}_count", e)] = cum["icount"] * share
            snap[(TWIN.kv_link_busy, e)] = cum["busy"] * share
        scrapes.append((float(t), snap))
    return to_table(scrapes)


def late(value: float, before: float = 0.0) -> Callable[[int], float]:
    return lambda t: value if t >= LATE else before


def found(**kw) -> list[tuple[str, float, float]]:
    return [(f.kind, f.start_s, f.end_s) for f in diagnose(series(**kw), P).findings]


def test_the_windows_and_their_values() -> None:
    d = diagnose(series(waiting=late(3.0), preempted=late(0.2)), P)
    assert [(w.start_s, w.end_s) for w in d.windows] == [(0.0, 10.0), (10.0, 20.0), (20.0, 30.0), (30.0, 39.0)]
    w1 = d.windows[1].values
    assert w1["waiting"] == pytest.approx(3.0) and w1["running"] == pytest.approx(8.0)  # summed over engines
    assert w1["kv_usage"] == pytest.approx(0.2)  # the fullest engine, not the mean (0.15)
    assert w1["preemptions_per_s"] == pytest.approx(0.2) and w1["prefix_hit_rate"] == pytest.approx(0.5)
    assert w1["itl_mean_s"] == pytest.approx(0.02) and w1["link_busy"] == pytest.approx(0.0)
    assert d.windows[0].values["waiting"] == 0.0 and d.schema == "llmcap-twin" and d.missing == ()


@pytest.mark.parametrize(
    ("waiting", "kv", "kinds"),
    [
        (1.0, 0.69, ["compute_bound"]),  # waiting at its threshold, KV just under "low"
        (0.99, 0.69, []),  # waiting just under it: no queue
        (1.0, 0.70, []),  # KV at "low": neither free (< 0.7) nor full (>= 0.9)
        (1.0, 0.89, []),
        (1.0, 0.90, ["memory_bound"]),  # KV at "high": full
    ],
)
def test_queueing_is_read_by_kv_usage(waiting: float, kv: float, kinds: list[str]) -> None:
    got = found(waiting=late(waiting), kv=(late(kv, 0.1), lambda t: 0.0))
    assert got == [(k, 10.0, 39.0) for k in kinds]


# thresholds and rates that are exact binary fractions, so a rate accumulated as a counter meets its threshold exactly
EXACT = DiagnoseParams(preemptions_per_s=0.0625, network_high=0.75)


@pytest.mark.parametrize(("rate", "kinds"), [(0.0625, ["preemptions"]), (0.0625 - 2**-10, [])])
def test_preemptions_at_their_rate(rate: float, kinds: list[str]) -> None:
    d = diagnose(series(preempted=late(rate)), EXACT)
    assert [(f.kind, f.start_s, f.end_s) for f in d.findings] == [(k, 10.0, 39.0) for k in kinds]
    if kinds:
        f = d.findings[0]
        assert f.values == pytest.approx({"preemptions_per_s": rate, "kv_usage": 0.2}) and f.windows == 3
        assert (
            f.reading == READINGS["preemptions"]
            and f.caveat == CAVEAT
            and str(f).startswith("[10, 39) s: operating point")
        )


@pytest.mark.parametrize(("hit", "kinds"), [(0.6, ["prefix_hit_drop"]), (0.61, [])])
def test_a_prefix_hit_drop_against_the_runs_best_earlier_window(hit: float, kinds: list[str]) -> None:
    d = diagnose(series(hit_rate=late(hit, 0.8)), P)  # 0.8 in the first window: 0.6 is a drop of 0.2
    assert [(f.kind, f.start_s, f.end_s) for f in d.findings] == [(k, 10.0, 39.0) for k in kinds]
    if kinds:
        assert d.findings[0].baseline == pytest.approx({"prefix_hit_rate": 0.8})


def test_a_baseline_series_replaces_the_runs_own_best() -> None:
    healthy = series(hit_rate=lambda t: 0.9)
    d = diagnose(series(hit_rate=lambda t: 0.7), P, baseline=healthy)  # 0.7 all along: a drop of 0.2 from 0.9
    assert [(f.kind, f.start_s, f.end_s) for f in d.findings] == [("prefix_hit_drop", 0.0, 39.0)]
    assert d.findings[0].baseline == pytest.approx({"prefix_hit_rate": 0.9}) and d.findings[0].windows == 4
    assert diagnose(series(hit_rate=lambda t: 0.7), P).findings == []  # without it, 0.7 is the run's own best


@pytest.mark.parametrize(
    ("itl", "busy", "kinds"),
    [
        (2**-6 * 1.25, 0.75, ["transfer_contention"]),  # ITL 25% over the best earlier window (2^-6 s), link 75% busy
        (2**-6 * 1.25 - 2**-14, 0.75, []),
        (2**-6 * 1.25, 0.75 - 2**-8, []),
    ],
)
def test_transfer_contention_needs_slower_tokens_and_a_busy_link(itl: float, busy: float, kinds: list[str]) -> None:
    d = diagnose(series(itl_s=late(itl, 2**-6), busy=late(busy)), EXACT)
    assert [(f.kind, f.start_s, f.end_s) for f in d.findings] == [(k, 10.0, 39.0) for k in kinds]


def test_one_window_is_a_blip_and_findings_are_ordered() -> None:
    blip = lambda t: 3.0 if 10 <= t < 20 else 0.0  # noqa: E731 - one window of queueing
    assert found(waiting=blip) == []
    both = diagnose(
        series(waiting=late(3.0), preempted=lambda t: 0.1 if t >= 20 else 0.0), DiagnoseParams(min_windows=1)
    )
    assert [(f.kind, f.start_s) for f in both.findings] == [("compute_bound", 10.0), ("preemptions", 20.0)]
    assert both.to_dict()["findings"][0]["window_s"] == [10.0, 39.0] and both.to_dict()["windows"] == 4


def test_an_empty_series_is_an_error_and_missing_quantities_are_named() -> None:
    with pytest.raises(LlmcapError, match="^the metric series is empty: nothing to diagnose$"):
        diagnose(series().slice(0, 0), P)
    table = series(waiting=late(3.0))
    no_kv = table.filter(np.asarray(table.column("name").to_pylist()) != TWIN.kv_usage)
    d = diagnose(no_kv, P, schema=TWIN)
    assert "kv_usage" in d.missing and d.findings == []  # without KV usage the queueing rules cannot tell


def windows(table, params: DiagnoseParams = P) -> list[tuple[float, float]]:
    return [(w.start_s, w.end_s) for w in diagnose(table, params).windows]


def test_windows_at_the_edges_of_the_series() -> None:
    assert windows(series(n=2)) == [(0.0, 1.0)]  # two scrapes are one window
    assert windows(series(n=1)) == []  # one scrape has no span
    # scrapes 0 .. 40: the last edge falls on the last scrape, which belongs to the last window [30, 40]:
    # waiting 3 in that scrape alone is 3 / 11 over the window's 11 scrapes (30 .. 40)
    d = diagnose(series(waiting=lambda t: 3.0 if t == 40 else 0.0, n=41), P)
    assert [(w.start_s, w.end_s) for w in d.windows] == [(0.0, 10.0), (10.0, 20.0), (20.0, 30.0), (30.0, 40.0)]
    assert d.windows[-1].values["waiting"] == pytest.approx(3 / 11)
    # no scrape in [10, 30): those windows are left out, the ones after them are still read
    table = series()
    gap = table.filter(np.isin(table.column("time_s").to_numpy(), np.arange(10, 30), invert=True))
    assert windows(gap) == [(0.0, 10.0), (30.0, 39.0)]


def test_the_first_window_counts_from_its_first_scrape() -> None:
    # 0.1 preemptions a second: the first window has no scrape before it, so its growth runs from the scrape at 0 s to
    # the one at 9 s: 0.9 over 9 s; the next one from 9 s to 19 s: 1.0 over 10 s. Both 0.1 a second
    d = diagnose(series(preempted=lambda t: 0.1), P)
    assert [w.values["preemptions_per_s"] for w in d.windows] == pytest.approx([0.1] * 4)


def test_a_gauge_is_averaged_over_its_own_window() -> None:
    # running per engine: 8 before 10 s, 2 in [10, 20), 1 after: summed over the two engines 16, 4, 2
    d = diagnose(series(running=lambda t: 8.0 if t < 10 else 2.0 if t < 20 else 1.0), P)
    assert [w.values["running"] for w in d.windows] == pytest.approx([16.0, 4.0, 2.0, 2.0])


def test_kv_usage_counts_only_the_scrapes_that_report_it() -> None:
    # engine 0 reports 0.8 at odd seconds before 30 s, engine 1 never: a scrape without it is no empty cache (not 0)
    # and a window without any is unknown (NaN), so the queueing rules do not read it
    d = diagnose(series(waiting=lambda t: 3.0, kv=(lambda t: 0.8 if t % 2 and t < 30 else None, lambda t: None)), P)
    assert [w.values["kv_usage"] for w in d.windows[:3]] == pytest.approx([0.8] * 3) and np.isnan(
        d.windows[3].values["kv_usage"]
    )
    # 0.8 is neither free (< 0.7) nor full (>= 0.9): no reading, in any window
    assert d.findings == []


def test_a_window_without_queries_or_tokens_has_no_rate() -> None:
    d = diagnose(series(queries=lambda t: 0.0, tokens=lambda t: 0.0), P)
    assert all(np.isnan(w.values["prefix_hit_rate"]) and np.isnan(w.values["itl_mean_s"]) for w in d.windows)
    # a single query (a hit: rate 1.0) and a single token (2^-6 s) in [10, 20) are a rate, however few
    one = lambda t: 1.0 if t == 15 else 0.0  # noqa: E731
    d = diagnose(series(queries=one, tokens=one, hit_rate=lambda t: 1.0, itl_s=lambda t: 2**-6), P)
    assert (d.windows[1].values["prefix_hit_rate"], d.windows[1].values["itl_mean_s"]) == (1.0, 2**-6)
    assert np.isnan(d.windows[0].values["prefix_hit_rate"]) and np.isnan(d.windows[2].values["itl_mean_s"])


def test_a_baseline_series_gives_the_itl_to_compare_against() -> None:
    healthy = series(itl_s=lambda t: 2**-6)
    run = series(itl_s=lambda t: 2**-6 * 1.25, busy=lambda t: 0.75)  # 25% slower tokens all along, the link 75% busy
    d = diagnose(run, EXACT, baseline=healthy)
    assert [(f.kind, f.start_s, f.end_s) for f in d.findings] == [("transfer_contention", 0.0, 39.0)]
    f = d.findings[0]
    assert f.values == pytest.approx({"itl_mean_s": 2**-6 * 1.25, "link_busy": 0.75}) and f.baseline == pytest.approx(
        {"itl_mean_s": 2**-6}
    )
    # without the baseline, the run's own best earlier window is as slow: nothing to see
    assert diagnose(run, EXACT).findings == []


def test_a_baseline_of_one_query_and_one_token_is_still_a_baseline() -> None:
    one = lambda t: 1.0 if t == 5 else 0.0  # noqa: E731
    healthy = series(queries=one, tokens=one, hit_rate=lambda t: 0.9, itl_s=lambda t: 2**-6)
    run = series(hit_rate=lambda t: 0.7, itl_s=lambda t: 2**-6 * 1.25, busy=lambda t: 0.75)
    d = diagnose(run, EXACT, baseline=healthy)
    assert [f.kind for f in d.findings] == ["prefix_hit_drop", "transfer_contention"]
    assert d.findings[0].baseline == pytest.approx({"prefix_hit_rate": 0.9}) and d.findings[1].baseline == {
        "itl_mean_s": 2**-6
    }
    # a baseline without queries or tokens has no rates: it shows nothing, and is no error
    idle = series(queries=lambda t: 0.0, tokens=lambda t: 0.0)
    assert diagnose(run, EXACT, baseline=idle).findings == []


def test_a_finding_of_exactly_min_windows_is_kept() -> None:
    two = lambda t: 3.0 if 10 <= t < 30 else 0.0  # noqa: E731 - queueing in windows [10, 20) and [20, 30): 2 = min_windows
    assert found(waiting=two) == [("compute_bound", 10.0, 30.0)]


def test_what_a_finding_says() -> None:
    (f,) = diagnose(series(waiting=late(1.0), kv=(late(0.69, 0.1), lambda t: 0.0)), P).findings
    assert (f.values, f.baseline) == (pytest.approx({"waiting": 1.0, "kv_usage": 0.69}), {})
    assert str(f) == f"[10, 39) s: {READINGS['compute_bound']} — waiting 1, kv_usage 0.69; {CAVEAT}"
    (f,) = diagnose(series(hit_rate=late(0.6, 0.8)), P).findings
    assert (f.values, f.baseline) == (pytest.approx({"prefix_hit_rate": 0.6}), pytest.approx({"prefix_hit_rate": 0.8}))
    assert (
        str(f)
        == f"[10, 39) s: {READINGS['prefix_hit_drop']} — prefix_hit_rate 0.6 (baseline prefix_hit_rate 0.8); {CAVEAT}"
    )


def test_the_diagnosis_document() -> None:
    d = diagnose(series(preempted=late(0.0625)), EXACT)
    assert d.to_dict() == {
        "schema": "llmcap-twin",
        "missing": [],
        "windows": 4,
        "findings": [
            {
                "kind": "preemptions",
                "window_s": [10.0, 39.0],
                "values": pytest.approx({"preemptions_per_s": 0.0625, "kv_usage": 0.2}),
                "baseline": {},
                "reading": READINGS["preemptions"],
                "caveat": CAVEAT,
            }
        ],
    }


def test_a_finding_lists_every_value_and_baseline() -> None:
    f = Finding(
        "transfer_contention",
        10.0,
        39.0,
        {"itl_mean_s": 0.025, "link_busy": 0.8},
        {"itl_mean_s": 0.02, "link_busy": 0.1},
        "reading",
        3,
    )
    assert (
        str(f)
        == f"[10, 39) s: reading — itl_mean_s 0.025, link_busy 0.8 (baseline itl_mean_s 0.02, link_busy 0.1); {CAVEAT}"
    )
