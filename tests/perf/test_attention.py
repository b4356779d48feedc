"""llmcap.perf.attention is the one definition of the roofline's attention: the exact model's ops come
from it, and the scalar path (ScalarRoofline, compiled with the simulator core) transcribes it bit for bit."""

import numpy as np
import pytest

from llmcap.perf import StepBatch, build_step_model
from llmcap.perf.attention import (
    AttentionCoefficients,
    decode_attention,
    decode_attention_time,
    layer_attention_time,
    prefill_attention,
)
from llmcap.perf.roofline_scalar import ScalarRoofline

WINDOWS = [None, 1, 7, 4096, 131_072]


def _coefficients(rng: np.random.Generator) -> list[AttentionCoefficients]:
    real = [
        build_step_model(m, g, tp=tp).attention
        for m, g, tp in (("Llama-3.1-8B", "h100", 1), ("Mistral-7B-v0.1", "l40s", 2), ("DeepSeek-V3", "b200", 8))
    ]
    drawn = [
        AttentionCoefficients(
            per_pair=float(rng.uniform(1e3, 1e5)),
            peak=float(rng.uniform(1e14, 5e15)),
            amax=float(rng.uniform(0.05, 1.0)),
            half=float(rng.uniform(0.0, 5000.0)),
            kv=float(rng.uniform(64, 1e5)),
            c_pf=float(rng.uniform(64, 1e6)),
            bw=float(rng.uniform(1e11, 8e12)),
            bw_kv=float(rng.uniform(1e11, 8e12)),
        )
        for _ in range(5)
    ]
    return real + drawn


def _steps(rng: np.random.Generator, n: int) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """Prefill tokens and pairs, decode sequences and context: integers as the simulator steps them,
    fractions as a micro-batch's share of a step, and zeros (no prefill, no decode, empty steps)."""
    pt = rng.integers(0, 20_000, n).astype(np.float64)
    pr = pt * rng.integers(0, 300_000, n) + pt * (pt + 1) / 2
    dq = rng.integers(0, 1024, n).astype(np.float64)
    cx = dq * rng.integers(1, 200_000, n)
    share = rng.integers(1, 5, n).astype(np.float64)
    frac = rng.random(n) < 0.3
    pt, pr, dq, cx = (np.where(frac, v / share, v) for v in (pt, pr, dq, cx))
    for v in (pt, pr, dq, cx):
        v[rng.random(n) < 0.2] = 0.0
    pt[:8], pr[:8], dq[:8], cx[:8] = 0.0, 0.0, 0.0, 0.0
    return pt, pr, dq, cx


@pytest.mark.parametrize("window", WINDOWS)
def test_the_scalar_layer_attention_is_the_numpy_definition_bit_for_bit(window: int | None) -> None:
    rng = np.random.default_rng(11)
    for c in _coefficients(rng):
        pt, pr, dq, cx = _steps(rng, 3000)
        scalar = ScalarRoofline(c, 0.0, [(window, 1.0)])
        got = np.array(
            [scalar.attn(*v, window) for v in zip(pt.tolist(), pr.tolist(), dq.tolist(), cx.tolist(), strict=True)]
        )
        assert got.tobytes() == layer_attention_time(c, pt, pr, dq, cx, window).tobytes()


@pytest.mark.parametrize("window", WINDOWS)
def test_the_scalar_decode_step_and_scan_are_the_numpy_definition_bit_for_bit(window: int | None) -> None:
    rng = np.random.default_rng(12)
    for c in _coefficients(rng):
        seqs = rng.integers(0, 512, 2000).astype(np.float64)
        ctx = seqs * rng.integers(0, 200_000, seqs.size)
        ctx[rng.random(seqs.size) < 0.1] = 0.0
        scalar = ScalarRoofline(c, 0.0, [(window, 1.0)])
        scalar.set_tables([0.0] * 512, [0.0] * 512)  # the step is then its attention alone
        got = np.array([scalar.decode_step(b, x) for b, x in zip(seqs.tolist(), ctx.tolist(), strict=True)])
        assert got.tobytes() == decode_attention_time(c, seqs, ctx, window).tobytes()
        # a run of decode steps: ends are the running sum of those steps
        b, x0 = float(seqs[0]) or 1.0, float(ctx[0])
        run = decode_attention_time(c, b, np.arange(300, dtype=np.float64) * b + x0, window)
        assert scalar.decode_scan(0.0, b, x0, 0, 300, float("inf")) == (300, float(np.cumsum(run)[-1]))


def test_the_exact_model_costs_its_attention_ops_with_it() -> None:
    model = build_step_model("Mistral-7B-v0.1", "l40s", tp=2)  # sliding-window layers
    c, window = model.attention, model.model.layer_window[0]
    assert window is not None
    tokens, pairs, seqs, context = np.array([512.0]), np.array([3e6]), np.array([64.0]), np.array([64 * 9000.0])
    b = StepBatch.build(
        prefill_tokens=tokens, prefill_pairs=pairs, prefill_seqs=[1.0], decode_seqs=seqs, decode_context=context
    )
    ops = {r.op: r for r in model.breakdown(b)}
    layers = model.model.num_layers
    for op, terms in (
        ("attn_prefill", prefill_attention(c, tokens, pairs, window)),
        ("attn_decode", decode_attention(c, seqs, context, window)),
    ):
        assert ops[op].flops == pytest.approx(layers * float(terms.flops[0]), rel=1e-12)
        assert ops[op].bytes == pytest.approx(layers * float(terms.nbytes[0]), rel=1e-12)
        assert ops[op].time_s == pytest.approx(layers * float(terms.time()[0]), rel=1e-12)


def test_coefficients_of_a_grouped_query_model() -> None:
    c = build_step_model("Llama-3.1-8B", "h100").attention  # 32 query heads, 8 KV heads of 128, bf16 KV
    assert c.per_pair == 2.0 * 32 * (2 * 128)
    assert c.kv == 2 * 8 * 128 * 2
    assert c.c_pf == c.kv + 2 * 32 * 128 * 2.0
    assert c.dec_peak == c.peak * c.amax


def test_attention_layers_list_every_layer_of_every_stage_once() -> None:
    model = build_step_model("Llama-3.1-70B", "h100", tp=4, pp=2)
    stages = model.attention_layers()
    assert len(stages) == 2 and [sum(n for _, n in s) for s in stages] == [40, 40]
    assert {w for s in stages for w, _ in s} == {None}
