"""The roofline's per-step arithmetic in plain floats: `CompiledRoofline`'s scalar path.

Kept apart from llmcap.perf.roofline (numpy, the exact model) so that mypyc can compile it with the
simulator core (llmcap._native): the simulator times most steps one at a time, where a numpy call
would cost more than the step's few dozen flops. Attention is a transcription of the one numpy
definition, llmcap.perf.attention (`prefill_attention`, `decode_attention`): the same operations in the
same order, so a step timed here equals the same step timed by numpy bit for bit
(tests/perf/test_attention.py, tests/perf/test_roofline_compiled.py, tests/sim).
"""

from __future__ import annotations

from llmcap.perf.attention import AttentionCoefficients


class ScalarRoofline:
    """Attention in closed form plus table look-ups for everything else (pp = 1 tables: `ta1`, `la1`); every
    step time × `factor` (1.0: the roofline's own, bit for bit; else a `ScaledStepModel`'s, as it rounds)."""

    def __init__(
        self,
        attention: AttentionCoefficients,
        overhead: float,
        groups: list[tuple[int | None, float]],
        factor: float = 1.0,
    ) -> None:
        # the coefficients as native float attributes: read per step without a Python attribute lookup
        self.per_pair = attention.per_pair
        self.peak = attention.peak
        self.amax = attention.amax
        self.half = attention.half
        self.kv = attention.kv
        self.c_pf = attention.c_pf
        self.bw = attention.bw
        self.bw_kv = attention.bw_kv
        self.dec_peak = attention.dec_peak
        self.overhead = overhead
        self.factor = factor
        # pp = 1: (window, layers) of the only stage, as parallel float lists (window -1.0 = none): no
        # tuple or int unboxing per step
        self.g_window = [-1.0 if w is None else float(w) for w, _ in groups]
        self.g_layers = [float(c) for _, c in groups]
        self.ta1: list[float] = []
        self.la1: list[float] = []
        self.n = 0

    def set_tables(self, ta1: list[float], la1: list[float]) -> None:
        """The stage-time tables by token rows T and logit rows L (CompiledRoofline grows them)."""
        self.ta1, self.la1, self.n = ta1, la1, len(ta1)

    def attn(self, pt: float, pr: float, dq: float, cx: float, w: int | None) -> float:
        """One layer's attention with window w or None: `layer_attention_time` (llmcap.perf.attention)."""
        return self._attn(pt, pr, dq, cx, -1.0 if w is None else float(w))

    # The attention arithmetic is written out in each method that runs per step (a call per step costs
    # as much as the arithmetic), every time as in llmcap.perf.attention. Windows are floats here, -1.0
    # for none (pt * w with w a float holding the integer window is the same product as with the int);
    # min/max are spelled out (`_min`, `_max`: Python's own choice of operand) so they compile to compares.

    def _attn(self, pt: float, pr: float, dq: float, cx: float, w: float) -> float:
        """`prefill_attention(...).time() + decode_attention(...).time()`, operation for operation."""
        if w >= 0.0:
            pr = _min(pr, pt * w)
            cx = _min(cx, dq * w)
        te = _max(pt, 1.0)
        eff = self.amax * te / (te + self.half)
        ap = _max(self.per_pair * pr / (self.peak * eff), pt * self.c_pf / self.bw)
        ad = _max(self.per_pair * cx / self.dec_peak, (cx * self.kv + dq * self.c_pf) / self.bw_kv)
        return ap + ad

    def step(self, p_tok: float, p_pairs: float, p_seqs: float, d_seqs: float, d_ctx: float) -> float:
        """Seconds of one step at pp = 1, or -1.0 when T or L is not an integer inside the tables."""
        T = p_tok + d_seqs
        L = p_seqs + d_seqs
        n = float(self.n)
        if not (0.0 <= T < n and 0.0 <= L < n):
            return -1.0
        ti, li = int(T), int(L)
        if float(ti) != T or float(li) != L:  # exact: both below the table size
            return -1.0
        t = self.ta1[ti] + self.la1[li]
        windows, layers = self.g_window, self.g_layers
        for g in range(len(layers)):
            t = t + layers[g] * self._attn(p_tok, p_pairs, d_seqs, d_ctx, windows[g])
        return (t + self.overhead) * self.factor

    def decode_step(self, fb: float, ctx: float) -> float:
        """`step(0, 0, 0, fb, ctx)` of a pure-decode step whose batch fb (an integer) is inside the tables,
        without the checks and the prefill terms: T = L = fb, and prefill attention is exactly +0.0, so
        each group adds its decode attention alone (ap + ad == ad for ad >= +0.0), `decode_attention`'s
        arithmetic (llmcap.perf.attention). Same bits."""
        i = int(fb)
        t = self.ta1[i] + self.la1[i]
        windows, layers = self.g_window, self.g_layers
        for g in range(len(layers)):
            w = windows[g]
            cx = _min(ctx, fb * w) if w >= 0.0 else ctx
            t = t + layers[g] * _max(self.per_pair * cx / self.dec_peak, (cx * self.kv + fb * self.c_pf) / self.bw_kv)
        return (t + self.overhead) * self.factor

    def decode_scan(self, t: float, fb: float, ctx: float, j: int, k: int, until: float) -> tuple[int, float]:
        """`StepTimer.run_scan` over `decode_step`s: from step j starting at t (context ctx, growing by fb a
        step), the first step in [j, k) ending at or after `until` and its start, or (k, the end of step
        k - 1). The step's terms that do not depend on the context are computed once (same values, same
        operations per step: `decode_attention`'s with one full-attention group), so a step costs a few flops."""
        i = int(fb)
        base, over, f = self.ta1[i] + self.la1[i], self.overhead, self.factor
        pp, dp, kv, bw, fixed = self.per_pair, self.dec_peak, self.kv, self.bw_kv, fb * self.c_pf
        simple = len(self.g_layers) == 1 and self.g_window[0] < 0.0
        lay = self.g_layers[0] if simple else 0.0
        while j < k:
            if simple:
                a, b = pp * ctx / dp, (ctx * kv + fixed) / bw
                e = t + (((base + lay * (b if b > a else a)) + over) * f)
            else:
                e = t + self.decode_step(fb, ctx)
            if e >= until:
                return j, t
            t = e
            ctx += fb
            j += 1
        return k, t


def _max(a: float, b: float) -> float:
    """max(a, b) exactly as Python picks: the first unless the second is greater."""
    return b if b > a else a


def _min(a: float, b: float) -> float:
    """min(a, b) exactly as Python picks: the first unless the second is smaller."""
    return b if b < a else a
