"""CompiledRoofline: the tabulated roofline gives RooflineModel.step_time's numbers, and its scalar,
array and decode-run paths agree with each other bit for bit."""

import numpy as np
import pytest

from llmcap.perf import RooflineModel, StepBatch, StepTimeModel, build_step_model, causal_pairs
from llmcap.perf.roofline_compiled import MAX_TABLE_TOKENS, CompiledRoofline

CONFIGS = [
    dict(model="Llama-3.1-8B", gpu="h100"),
    dict(model="Llama-3.1-8B", gpu="h100", weight_quant="fp8"),
    dict(model="Llama-3.1-70B", gpu="h100", tp=4, pp=2),  # PP: micro-batches and the bubble
    dict(model="Mixtral-8x7B", gpu="h100", tp=2, ep=2, pp=4, weight_quant="fp8"),  # MoE, EP, PP 4
    dict(model="Mixtral-8x7B", gpu="h100"),  # MoE without EP
    dict(model="Qwen3-30B-A3B", gpu="h200", tp=2, ep=2),
    dict(model="Mistral-7B-v0.1", gpu="l40s", tp=2),  # sliding window, PCIe
    dict(model="DeepSeek-V3", gpu="b200", tp=8, ep=8, weight_quant="fp8-block"),  # MLA, dense + MoE layers
]
IDS = [
    f"{c['model']}-tp{c.get('tp', 1)}-pp{c.get('pp', 1)}-ep{c.get('ep', 1)}-{c.get('weight_quant', 'bf16')}"
    for c in CONFIGS
]
FIELDS = ("prefill_tokens", "prefill_pairs", "prefill_seqs", "decode_seqs", "decode_context", "decode_max_context")


def _sim_like_batches(n: int, seed: int) -> StepBatch:
    """Integer batches as the simulator builds them: chunks with cached context, few to many sequences
    (so every micro-batch count 1..pp occurs), pure prefill, pure decode, and empty steps."""
    rng = np.random.default_rng(seed)
    chunks = rng.integers(0, 5, n) * (rng.random(n) < 0.6)
    new = np.where(chunks > 0, rng.integers(1, 8192, n), 0)
    chunks = np.minimum(chunks, new)
    cached = rng.integers(0, 32768, n)
    seqs = np.where(rng.random(n) < 0.3, rng.integers(0, 4, n), rng.integers(0, 512, n))
    ctx = rng.integers(1, 32768, n)
    return StepBatch.build(
        prefill_tokens=new,
        prefill_pairs=causal_pairs(new, cached),
        prefill_seqs=chunks,
        decode_seqs=seqs,
        decode_context=seqs * ctx,
        decode_max_context=np.where(seqs > 0, ctx, 0),
    )


def _row(b: StepBatch, i: int) -> list[float]:
    return [float(getattr(b, f)[i]) for f in FIELDS]


@pytest.fixture(scope="module", params=CONFIGS, ids=IDS)
def models(request) -> tuple[RooflineModel, CompiledRoofline]:
    exact = build_step_model(**request.param)
    assert isinstance(exact, RooflineModel)
    return exact, exact.compile()


def test_equals_the_exact_model_on_thousands_of_batches(models) -> None:
    exact, fast = models
    assert isinstance(fast, StepTimeModel)
    b = _sim_like_batches(4000, seed=1)
    want, got = exact.step_time(b), fast.step_time(b)
    np.testing.assert_allclose(got, want, rtol=1e-12, atol=0)
    assert np.all(got > 0)


def test_scalar_arrays_and_decode_runs_agree_bit_for_bit(models) -> None:
    _, fast = models
    b = _sim_like_batches(1500, seed=2)
    arrays = fast.step_time(b)
    scalars = np.array([fast.step_time_scalar(*_row(b, i)) for i in range(len(b))])
    assert scalars.tobytes() == arrays.tobytes()
    # a run of pure-decode steps, as the simulator's StepTimer times them
    for seqs, ctx0 in ((1, 7), (37, 40_000), (256, 1_000_000)):
        ctx = np.arange(50, dtype=np.float64) * seqs + ctx0
        zeros = np.zeros(ctx.size)
        run = fast.decode_times(float(seqs), ctx)
        assert (
            run.tobytes() == fast.step_time_arrays(zeros, zeros, zeros, np.full(ctx.size, float(seqs)), ctx).tobytes()
        )
        assert run[17] == fast.step_time_scalar(0.0, 0.0, 0.0, float(seqs), float(ctx[17]))
    # steps of mixed batch sizes at once (the simulator's bulk write of its step log; pp = 1 only)
    seqs = np.array([1, 37, 256, 37, 1, 200], dtype=np.int64)
    ctx = np.array([7.0, 40_000.0, 1e6, 41_111.0, 9.0, 123_456.0])
    if fast.pp != 1:
        with pytest.raises(ValueError, match="pp = 1"):
            fast.decode_times_batch(seqs, ctx)
        return
    batch = fast.decode_times_batch(seqs, ctx)
    one_by_one = np.array([fast.decode_times(float(s), np.array([c]))[0] for s, c in zip(seqs, ctx, strict=True)])
    assert batch.tobytes() == one_by_one.tobytes()
    assert batch[2] == fast.step_time_scalar(0.0, 0.0, 0.0, 256.0, 1e6)
    # the scalar path's decode step (no checks, no prefill terms) is `step` bit for bit
    rng = np.random.default_rng(5)
    for seqs_i, ctx_i in zip(rng.integers(1, 257, 400).tolist(), rng.integers(1, 2_000_000, 400).tolist(), strict=True):
        fb, cx = float(seqs_i), float(ctx_i)
        assert fast.scalar.decode_step(fb, cx) == fast.scalar.step(0.0, 0.0, 0.0, fb, cx)
    with pytest.raises(ValueError, match="inside the tables"):
        fast.decode_times_batch(np.array([fast._n]), np.array([1.0]))


def test_decode_max_context_is_ignored_like_the_roofline_does(models) -> None:
    exact, fast = models
    b = _sim_like_batches(200, seed=3)
    other = StepBatch(*(getattr(b, f) for f in FIELDS[:-1]), np.zeros(len(b)))
    assert exact.step_time(other).tobytes() == exact.step_time(b).tobytes()
    assert fast.step_time(other).tobytes() == fast.step_time(b).tobytes()


def test_tables_grow_past_their_size_and_stay_exact() -> None:
    exact = build_step_model("Qwen3-30B-A3B", "h100", tp=2, ep=2)
    assert isinstance(exact, RooflineModel)
    fast = exact.compile(max_tokens=100)
    small = fast._n
    big = StepBatch.build(
        prefill_tokens=[20_000.0, 5.0],
        prefill_pairs=[3e8, 15.0],
        prefill_seqs=[3.0, 1.0],
        decode_seqs=[300.0, 0.0],
        decode_context=[9e5, 0.0],
    )
    np.testing.assert_allclose(fast.step_time(big), exact.step_time(big), rtol=1e-12, atol=0)
    assert fast._n > 20_300 > small
    # the scalar path grows them too, and an entry does not depend on how its table grew
    again = exact.compile(max_tokens=10)
    assert again.step_time_scalar(*_row(big, 0)) == fast.step_time(big)[0]
    at_once = exact.compile(max_tokens=again._n - 1)
    assert (
        at_once._n == again._n
        and at_once._ta.tobytes() == again._ta.tobytes()
        and at_once._la.tobytes() == again._la.tobytes()
    )


def test_a_scaled_scalar_view_times_every_step_times_its_factor_as_the_tables_grow() -> None:
    from llmcap.perf.scaled import ScaledStepModel

    fast = build_step_model("Llama-3.1-8B", "h100").compile(max_tokens=100)
    scaled = ScaledStepModel(fast, 1.13)
    view = scaled.timing_form().scalar  # what the simulator's step timer runs natively
    assert view is not None and view.n == fast.scalar.n
    fast.step_time_scalar(3000.0, 3000.0 * 1500.0, 1.0, 40.0, 40.0 * 900.0)  # grows the tables: the view reads them too
    assert view.n == fast.scalar.n > 3040
    for row in (
        (3000.0, 3000.0 * 1500.0, 1.0, 40.0, 40.0 * 900.0),
        (0.0, 0.0, 0.0, 64.0, 64.0 * 2048.0),
        (17.0, 153.0, 1.0, 0.0, 0.0),
    ):
        batch = StepBatch.build(
            prefill_tokens=[row[0]],
            prefill_pairs=[row[1]],
            prefill_seqs=[row[2]],
            decode_seqs=[row[3]],
            decode_context=[row[4]],
        )
        assert view.step(*row) == scaled.step_time(batch)[0] == fast.scalar.step(*row) * 1.13
    assert view.decode_step(64.0, 64.0 * 2048.0) == fast.scalar.decode_step(64.0, 64.0 * 2048.0) * 1.13
    assert (
        ScaledStepModel(fast, 1.13, min_context=64).timing_form().scalar is None
    )  # scaled for long prompts only: no scalar view


def test_simulations_of_one_configuration_share_its_tables_and_its_scaled_views(monkeypatch) -> None:
    from llmcap.perf import roofline_compiled
    from llmcap.perf.scaled import ScaledStepModel

    one = build_step_model("Llama-3.1-8B", "h100", weight_quant="fp8")
    again = build_step_model("Llama-3.1-8B", "h100", weight_quant="fp8")  # built apart (as on another job)
    other = build_step_model("Llama-3.1-8B", "h100", weight_quant="fp8", kv_dtype="fp8")
    assert isinstance(one, RooflineModel) and isinstance(again, RooflineModel) and isinstance(other, RooflineModel)
    shared, other_tables = one.timing_form(), other.timing_form()
    assert again.timing_form() is shared and other_tables is not shared
    # grown by one simulation, the shared tables time every step as a fresh compile does, bit for bit
    shared.step_time_scalar(9000.0, 9000.0 * 4500.0, 1.0, 200.0, 200.0 * 3000.0)
    fresh = one.compile()
    rows = [(9000.0, 9000.0 * 4500.0, 1.0, 200.0, 200.0 * 3000.0), (0.0, 0.0, 0.0, 64.0, 64.0 * 2048.0)]
    assert [shared.step_time_scalar(*r) for r in rows] == [fresh.step_time_scalar(*r) for r in rows]
    # one scaled view per factor, however many simulations ask for it: the shared model's views stay few
    views = [ScaledStepModel(again, 1.2).timing_form().scalar for _ in range(3)]
    assert views[0] is not None and all(v is views[0] for v in views)
    assert ScaledStepModel(one, 0.8).timing_form().scalar is not views[0]
    # the process keeps the last SHARED_TABLES configurations: a third one asked for drops the least recent
    monkeypatch.setattr(roofline_compiled, "SHARED_TABLES", 2)
    assert other.timing_form() is other_tables and one.timing_form() is shared  # `one`'s now the most recent
    build_step_model("Llama-3.1-8B", "h100", tp=2).timing_form()
    assert one.timing_form() is shared and other.timing_form() is not other_tables


def test_off_table_batches_take_the_exact_path() -> None:
    exact = build_step_model("Llama-3.1-70B", "h100", tp=4, pp=2)
    assert isinstance(exact, RooflineModel)
    fast = exact.compile()
    # non-integer counts (a fitted or averaged batch), beyond the table cap, and an empty step
    b = StepBatch.build(
        prefill_tokens=[100.5, MAX_TABLE_TOKENS + 10.0, 0.0, 64.0],
        prefill_pairs=[7000.0, 1e12, 0.0, 2080.0],
        prefill_seqs=[1.0, 1.0, 0.0, 1.0],
        decode_seqs=[3.0, 0.0, 0.0, 2.5],
        decode_context=[3000.0, 0.0, 0.0, 2000.0],
    )
    want = exact.step_time(b)
    got = fast.step_time(b)
    assert got[[0, 1, 3]].tobytes() == want[[0, 1, 3]].tobytes()  # computed by the exact model itself
    assert got[2] == pytest.approx(want[2], rel=1e-12) and got[2] == exact.params.step_overhead_s
    assert [fast.step_time_scalar(*_row(b, i)) for i in range(len(b))] == got.tolist()


def test_build_step_model_compiled_keeps_breakdown_and_specs() -> None:
    fast = build_step_model("Mixtral-8x7B", "h100", tp=2, ep=2, compiled=True)
    assert isinstance(fast, CompiledRoofline)
    assert fast.parallelism.ep == 2 and fast.model is fast.exact.model and fast.gpu.name == fast.exact.gpu.name
    b = _sim_like_batches(10, seed=4)
    t = fast.step_time(b)
    for i in range(len(b)):
        assert sum(r.time_s for r in fast.breakdown(b, i)) == pytest.approx(t[i], rel=1e-12)
