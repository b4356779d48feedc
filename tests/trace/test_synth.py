"""What-if synthesis: joint resampling keeps the ISL/OSL dependence; rate scaling hits its target."""

from __future__ import annotations

import numpy as np
import pyarrow as pa
import pytest
from scipy.stats import spearmanr

from llmcap.config import ArrivalSpec, CharacteriseParams, CleanParams
from llmcap.trace import characterise, ingest, mean_rate, resample_joint, scale_rate, synthesize
from llmcap.trace.arrivals import generate_arrivals
from llmcap.trace.prefix import leading_reuse_unbounded
from tests.conftest import TRACES


@pytest.fixture(scope="module")
def synthetic_source() -> pa.Table:
    return ingest(TRACES["mooncake_synthetic"]).trace  # Spearman −0.517: a strong dependence to keep


@pytest.fixture(scope="module")
def azure() -> pa.Table:
    return ingest(TRACES["azure_conv"]).trace


def test_joint_resampling_keeps_spearman(synthetic_source: pa.Table) -> None:
    source = spearmanr(synthetic_source["isl"], synthetic_source["osl"]).statistic
    sample = resample_joint(synthetic_source, 50_000, np.random.default_rng(11))
    assert abs(spearmanr(sample["isl"], sample["osl"]).statistic - source) < 0.02
    # what independent marginals would have done (the mistake this guards against):
    rng = np.random.default_rng(11)
    isl = rng.choice(synthetic_source["isl"].to_numpy(), 50_000)
    osl = rng.choice(synthetic_source["osl"].to_numpy(), 50_000)
    assert abs(spearmanr(isl, osl).statistic) < 0.02


def test_rate_scaling_hits_target_and_keeps_burst_shape(azure: pa.Table) -> None:
    for target in (2.0, 5.53, 40.0):
        scaled = scale_rate(azure, target)
        assert mean_rate(scaled) == pytest.approx(target, rel=0.01)
    before = characterise(azure, CharacteriseParams(lru_cache_blocks=[]))
    after = characterise(
        scale_rate(azure, 2 * mean_rate(azure)), CharacteriseParams(lru_cache_blocks=[], rps_windows_s=[30.0])
    )
    # twice the rate over half the time: the 60 s shape of the source is the 30 s shape of the result
    assert after["rps_windows"]["30s"]["cv"] == pytest.approx(before["rps_windows"]["60s"]["cv"], rel=1e-6)
    assert after["interarrival_cv"] == pytest.approx(before["interarrival_cv"], rel=1e-9)


@pytest.mark.parametrize("spec", [ArrivalSpec(rate_rps=8.0), ArrivalSpec(process="gamma", cv=3.0, rate_rps=2.0)])
def test_arrival_processes_hit_rate_and_cv(spec: ArrivalSpec) -> None:
    t = generate_arrivals(200_000, spec, np.random.default_rng(3))
    assert (t.size - 1) / t[-1] == pytest.approx(spec.rate_rps, rel=0.01)
    gaps = np.diff(t)
    assert gaps.std() / gaps.mean() == pytest.approx(spec.cv, rel=0.03)


def test_diurnal_modulation_swings_the_rate() -> None:
    spec = ArrivalSpec(rate_rps=10.0, diurnal_amplitude=0.5, diurnal_period_s=1_000.0)
    t = generate_arrivals(100_000, spec, np.random.default_rng(5))
    phase = (t % 1_000.0) / 1_000.0
    peak = ((phase > 0.2) & (phase < 0.3)).sum()  # sin ≈ +1 around phase 0.25 → rate ≈ 15
    trough = ((phase > 0.7) & (phase < 0.8)).sum()  # sin ≈ −1 around 0.75 → rate ≈ 5
    assert peak / trough == pytest.approx(3.0, rel=0.1)
    assert (t.size - 1) / t[-1] == pytest.approx(10.0, rel=0.02)


def test_synthesize_is_seeded(synthetic_source: pa.Table) -> None:
    spec = ArrivalSpec(rate_rps=4.0)
    a = synthesize(synthetic_source, 5_000, spec, np.random.default_rng(9))
    b = synthesize(synthetic_source, 5_000, spec, np.random.default_rng(9))
    c = synthesize(synthetic_source, 5_000, spec, np.random.default_rng(10))
    assert a.equals(b) and not a.equals(c)


@pytest.mark.parametrize("name", ["mooncake_synthetic", "mooncake_conversation"])
def test_resampled_prefix_reuse_follows_the_source(name: str) -> None:
    source = ingest(TRACES[name]).trace
    sample = synthesize(source, 50_000, ArrivalSpec(rate_rps=10.0), np.random.default_rng(2))
    src_hit = characterise(source, CharacteriseParams(lru_cache_blocks=[]))["prefix"]["ideal_hit_ratio"]
    hit = characterise(sample, CharacteriseParams(lru_cache_blocks=[]))["prefix"]["ideal_hit_ratio"]
    # not ~100% (verbatim copies would hit on every repeat draw); within 3 points of the source
    # (the gap is the cold first request of each prefix group)
    assert abs(hit - src_hit) < 0.03
    assert (sample["prefix_hit_tokens"].to_numpy() <= sample["isl"].to_numpy()).all()


def test_no_request_reuses_more_than_its_source_did() -> None:
    source = ingest(TRACES["mooncake_synthetic"]).trace
    rng = np.random.default_rng(4)
    picks = np.random.default_rng(4).integers(0, source.num_rows, size=20_000)  # the draws resample_joint makes
    sample = resample_joint(source, 20_000, rng)
    assert sample["isl"].to_numpy().tolist() == source["isl"].to_numpy()[picks].tolist()
    assert (leading_reuse_unbounded(sample["hash_ids"]) <= leading_reuse_unbounded(source["hash_ids"])[picks]).all()


def test_length_only_trace_uses_params_arrivals() -> None:
    from llmcap.config import TraceParams

    params = TraceParams(file="x", arrivals=ArrivalSpec(rate_rps=25.0, seed=4))
    trace = ingest(TRACES["vidur_arxiv"], params, CleanParams()).trace
    assert mean_rate(trace) == pytest.approx(25.0, rel=0.02)


def test_spread_ties_undoes_whole_second_timestamps():
    import numpy as np
    import pyarrow as pa

    from llmcap.trace.synth import spread_ties

    # Mooncake-like: 3 requests per whole second → 2 of every 3 gaps are zero
    t = pa.table({"arrival_s": np.repeat(np.arange(10.0), 3), "isl": np.arange(30), "osl": np.ones(30, dtype=np.int64)})
    out = spread_ties(t, np.random.default_rng(0)).column("arrival_s").to_numpy()
    assert np.all(np.diff(out) > 0)  # no more simultaneous arrivals, order kept
    assert np.array_equal(np.floor(out), t.column("arrival_s").to_numpy())  # each stays inside its own 1 s tick
    assert np.array_equal(out, spread_ties(t, np.random.default_rng(0)).column("arrival_s").to_numpy())  # seeded
    assert out.tolist() != spread_ties(t, np.random.default_rng(1)).column("arrival_s").to_numpy().tolist()
    few_ties = pa.table({"arrival_s": [0.0, 0.5, 0.5, 1.7, 2.0]})
    assert spread_ties(few_ties, np.random.default_rng(0)) is few_ties  # rare ties: a real burst, left alone
