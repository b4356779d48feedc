"""`CompiledRoofline`: a `RooflineModel`'s step times from tables over integer token counts, the
simulator's fast path for the roofline (built by `RooflineModel.compile`; it reads the model's per-layer
arithmetic, so it lives beside it in this package)."""

from __future__ import annotations

from collections import OrderedDict
from typing import TYPE_CHECKING

import numpy as np

from llmcap.catalog.gpus import GpuSpec
from llmcap.catalog.models import ModelSpec
from llmcap.parallelism import Parallelism
from llmcap.perf.attention import decode_attention_time, layer_attention_time
from llmcap.perf.efficiency import RooflineParams
from llmcap.perf.model import F64, StepBatch
from llmcap.perf.ops import OpCost
from llmcap.perf.roofline_scalar import ScalarRoofline

if TYPE_CHECKING:  # the model is read, never built, here: it builds this (RooflineModel.compile)
    from llmcap.perf.roofline import RooflineModel


# Tables grow on demand up to this many tokens; integer steps beyond it (and non-integer ones) take the
# exact path. 2**20 tokens is far past any engine's max_num_batched_tokens + max_num_seqs.
MAX_TABLE_TOKENS = 1 << 20
_TABLE_BLOCK = 2048  # tables grow by whole blocks of token counts


# `shared_tables`: the compiled rooflines this process keeps, most recently used last
SHARED_TABLES = 16
_shared: OrderedDict[tuple[object, ...], CompiledRoofline] = OrderedDict()


def shared_tables(roofline: RooflineModel) -> CompiledRoofline:
    """The process's one `CompiledRoofline` of this configuration: every simulation of it reads (and grows)
    the same tables instead of tabulating them again. Sharing changes no bit (entries are computed in fixed
    blocks); the last `SHARED_TABLES` configurations are kept."""
    key = roofline.identity()
    compiled = _shared.pop(key, None)
    if compiled is None:
        compiled = CompiledRoofline(roofline)
    _shared[key] = compiled
    while len(_shared) > SHARED_TABLES:
        _shared.popitem(last=False)
    return compiled


class CompiledRoofline:
    """`RooflineModel.step_time`, evaluated from tables: the simulator's fast path for the roofline.

    Why it is exact: with m = clip(prefill_seqs + decode_seqs, 1, pp) micro-batches, every op except
    attention costs a function of the micro-batch's rows T/m alone (T = prefill_tokens + decode_seqs:
    norms, projections, MLP, router, experts, TP all-reduce, EP all-to-all, embedding, final norm, PP
    sends), or of its logit rows L/m alone (L = prefill_seqs + decode_seqs: lm_head, logits gather), and m
    is a function of L. So per (m, stage) the model's own code is run once over a grid of integer T and
    of integer L; a step then costs two look-ups per stage, plus prefill and decode attention (a few flops
    per window size, in closed form: llmcap.perf.attention), plus the PP bubble from the stage times
    exactly as `_evaluate` forms it, plus the fixed overhead. Only the summation order differs from
    `RooflineModel.step_time` (results agree to ~1e-15 relative). `decode_max_context` is unused by the
    roofline, hence here too.

    `step_time_scalar` (plain floats), `step_time_arrays` and `decode_times` (numpy) do the same IEEE
    operations in the same order, so a step timed alone equals the same step inside a vectorised run,
    bit for bit (the simulator's reference and multi-step modes rely on it). Table entries are computed
    in fixed blocks, so their bits do not depend on how the tables grew. Integer
    token counts beyond the tables grow them (up to `MAX_TABLE_TOKENS`); anything else — non-integer
    counts, larger steps — is timed by the exact model.
    """

    def __init__(self, roofline: RooflineModel, max_tokens: int = 0) -> None:
        self.exact = roofline
        r, p, par = roofline, roofline.params, roofline.parallelism
        self.pp = par.pp
        self._overhead = float(p.step_overhead_s)
        self.attention = r.attention  # attention is timed in closed form, the rest from the tables
        # layers per stage and window size: attention is all that differs between kinds of layers there
        self._windows: list[int | None] = []
        self._stage_groups: list[list[tuple[int, float]]] = []
        for stage in r.attention_layers():
            group: dict[int, float] = {}
            for window, cnt in stage:
                if cnt == 0:
                    continue
                if window not in self._windows:
                    self._windows.append(window)
                g = self._windows.index(window)
                group[g] = group.get(g, 0.0) + float(cnt)
            self._stage_groups.append(sorted(group.items()))
        self._groups1 = [(self._windows[g], c) for g, c in self._stage_groups[0]] if par.pp == 1 else []
        self.scalar = ScalarRoofline(self.attention, self._overhead, self._groups1)
        self._scalars = [self.scalar]  # and the scaled views (`scaled_scalar`): every one reads the tables as they grow
        self._scaled: dict[float, ScalarRoofline] = {}  # one view per factor: a shared model's list stays bounded
        self._n = 0
        self._ta, self._la, self._hop = (
            np.zeros((par.pp, par.pp, 0)),
            np.zeros((par.pp, par.pp, 0)),
            np.zeros((par.pp, 0)),
        )
        self._grow(int(max_tokens) + 1)

    # ---------------------------------------------------------------- tables

    def _grow(self, n: int) -> None:
        """Extend the tables to cover T, L in [0, n) (at least doubling, whole blocks)."""
        n = min(max(n, 2 * self._n), MAX_TABLE_TOKENS + 1)
        blocks = [self._block(lo) for lo in range(self._n, n, _TABLE_BLOCK)]
        ta = np.concatenate([self._ta] + [b[0] for b in blocks], axis=-1)
        la = np.concatenate([self._la] + [b[1] for b in blocks], axis=-1)
        hop = np.concatenate([self._hop] + [b[2] for b in blocks], axis=-1)
        self._ta, self._la, self._hop = ta, la, hop
        # plain-float copies for the scalar path (list indexing beats numpy scalar access ~5x)
        self._ta_l = ta.tolist()
        self._la_l = la.tolist()
        self._hop_l = hop.tolist()
        self._ta1, self._la1 = self._ta_l[0][0], self._la_l[0][0]
        for scalar in self._scalars:
            scalar.set_tables(self._ta1, self._la1)
        self._n = ta.shape[-1]  # last: readers check it before indexing

    def _block(self, lo: int) -> tuple[F64, F64, F64]:
        """Stage times for T (and L) in [lo, lo + _TABLE_BLOCK): fixed blocks, so an entry's bits never
        depend on how the table grew (numpy may vectorise a ufunc differently at another offset)."""
        r, pp, n = self.exact, self.pp, _TABLE_BLOCK
        grid = np.arange(lo, lo + n, dtype=np.float64)
        ta = np.zeros((pp, pp, n))  # [m - 1, stage, T]
        la = np.zeros((pp, pp, n))  # [m - 1, stage, L]
        hop = np.zeros((pp, n))  # [m - 1, T]
        for mi in range(pp):
            # the model divides by the float micro-batch count too; the grid stands for T and for L
            ta[mi], la[mi], hop[mi] = r.row_terms(grid / float(mi + 1))
        return ta, la, hop

    def scaled_scalar(self, factor: float) -> ScalarRoofline:
        """The scalar path with every step time × `factor` (`llmcap.perf.scaled`), on this model's tables."""
        view = self._scaled.get(factor)
        if view is None:
            view = ScalarRoofline(self.attention, self._overhead, self._groups1, factor)
            view.set_tables(self._ta1, self._la1)
            self._scalars.append(view)
            self._scaled[factor] = view
        return view

    # ---------------------------------------------------------------- evaluation

    def step_time_scalar(
        self, p_tok: float, p_pairs: float, p_seqs: float, d_seqs: float, d_ctx: float, d_max: float = 0.0
    ) -> float:
        """Seconds of one step, in plain floats (arguments as the `StepBatch` fields)."""
        T = p_tok + d_seqs
        L = p_seqs + d_seqs
        n = self._n
        if not (0.0 <= T < n and 0.0 <= L < n) or int(T) != T or int(L) != L:
            if 0.0 <= T <= MAX_TABLE_TOKENS and 0.0 <= L <= MAX_TABLE_TOKENS and int(T) == T and int(L) == L:
                self._grow(int(max(T, L)) + 1)
                return self.step_time_scalar(p_tok, p_pairs, p_seqs, d_seqs, d_ctx, d_max)
            return self._exact_one(p_tok, p_pairs, p_seqs, d_seqs, d_ctx, d_max)
        if self.pp == 1:
            return self.scalar.step(p_tok, p_pairs, p_seqs, d_seqs, d_ctx)
        m = min(max(L, 1.0), float(self.pp))
        mi, ti, li = int(m) - 1, int(T), int(L)
        pt, pr, dq, cx = p_tok / m, p_pairs / m, d_seqs / m, d_ctx / m
        a = [self.scalar.attn(pt, pr, dq, cx, w) for w in self._windows]
        ta, la = self._ta_l[mi], self._la_l[mi]
        st = []
        for s, groups in enumerate(self._stage_groups):
            x = ta[s][ti] + la[s][li]
            for g, cnt in groups:
                x = x + cnt * a[g]
            st.append(x)
        trav = st[0]
        for x in st[1:]:
            trav = trav + x
        trav = trav + self._hop_l[mi][ti]
        bubble = max(0.0, m * max(st) - trav)
        return (trav + bubble) + self._overhead

    def _exact_one(
        self, p_tok: float, p_pairs: float, p_seqs: float, d_seqs: float, d_ctx: float, d_max: float
    ) -> float:
        b = StepBatch(*(np.array([v], dtype=np.float64) for v in (p_tok, p_pairs, p_seqs, d_seqs, d_ctx, d_max)))
        return float(self.exact.step_time(b)[0])

    def step_time_arrays(
        self, p_tok: F64, p_pairs: F64, p_seqs: F64, d_seqs: F64, d_ctx: F64, d_max: F64 | None = None
    ) -> F64:
        """`step_time_scalar` over arrays of equal length (float64), element for element the same."""
        T = p_tok + d_seqs
        L = p_seqs + d_seqs
        ok = (
            (T >= 0)
            & (L >= 0)
            & (T <= MAX_TABLE_TOKENS)
            & (L <= MAX_TABLE_TOKENS)
            & (np.floor(T) == T)
            & (np.floor(L) == L)
        )
        if not ok.all():
            out = np.empty(T.size)
            d = np.zeros(T.size) if d_max is None else d_max
            bad = ~ok
            out[bad] = self.exact.step_time(
                StepBatch(p_tok[bad], p_pairs[bad], p_seqs[bad], d_seqs[bad], d_ctx[bad], d[bad])
            )
            if ok.any():
                out[ok] = self.step_time_arrays(p_tok[ok], p_pairs[ok], p_seqs[ok], d_seqs[ok], d_ctx[ok])
            return out
        if T.size and max(T.max(), L.max()) >= self._n:
            self._grow(int(max(T.max(), L.max())) + 1)
        ti, li = T.astype(np.intp), L.astype(np.intp)
        if self.pp == 1:
            t = self._ta[0, 0][ti] + self._la[0, 0][li]
            for w, cnt in self._groups1:
                t = t + cnt * layer_attention_time(self.attention, p_tok, p_pairs, d_seqs, d_ctx, w)
            return t + self._overhead
        m = np.clip(L, 1.0, float(self.pp))
        mi = m.astype(np.intp) - 1
        pt, pr, dq, cx = p_tok / m, p_pairs / m, d_seqs / m, d_ctx / m
        a = [layer_attention_time(self.attention, pt, pr, dq, cx, w) for w in self._windows]
        st = []
        for s, groups in enumerate(self._stage_groups):
            x = self._ta[mi, s, ti] + self._la[mi, s, li]
            for g, cnt in groups:
                x = x + cnt * a[g]
            st.append(x)
        trav = st[0]
        for x in st[1:]:
            trav = trav + x
        trav = trav + self._hop[mi, ti]
        top = st[0]
        for x in st[1:]:
            top = np.maximum(top, x)
        bubble = np.maximum(0.0, m * top - trav)
        return (trav + bubble) + self._overhead

    def decode_times(self, decode_seqs: float, decode_context: F64) -> F64:
        """Pure-decode steps of `decode_seqs` sequences over each total context in `decode_context`:
        `step_time_arrays` with no prefill, bit for bit, minus the work that is constant along the run
        (at pp = 1 the token and logit rows are both `decode_seqs`, and prefill attention is +0.0)."""
        b = float(decode_seqs)
        if self.pp != 1 or not (0.0 <= b <= MAX_TABLE_TOKENS) or int(b) != b:
            k = decode_context.size
            zeros = np.zeros(k)
            return self.step_time_arrays(zeros, zeros, zeros, np.full(k, b), decode_context)
        if b >= self._n:
            self._grow(int(b) + 1)
        t: F64 | float = self._ta1[int(b)] + self._la1[int(b)]
        for w, cnt in self._groups1:
            t = t + cnt * decode_attention_time(self.attention, b, decode_context, w)
        return np.asarray(t + self._overhead, dtype=np.float64)

    def decode_times_batch(self, decode_seqs: np.ndarray, decode_context: F64) -> F64:
        """`decode_times` of steps with different batch sizes at once (pp = 1, every batch size inside the
        tables): step i has decode_seqs[i] sequences over total context decode_context[i]. Same numbers."""
        b = np.asarray(decode_seqs, dtype=np.int64)
        if self.pp != 1 or (b.size and not (int(b.min()) >= 0 and int(b.max()) < self._n)):
            raise ValueError("decode_times_batch needs pp = 1 and batch sizes inside the tables")
        fb = b.astype(np.float64)
        t = self._ta[0, 0][b] + self._la[0, 0][b]
        for w, cnt in self._groups1:
            t = t + cnt * decode_attention_time(self.attention, fb, decode_context, w)
        return np.asarray(t + self._overhead, dtype=np.float64)

    def timing_form(self) -> CompiledRoofline:
        return self

    def step_time(self, batch: StepBatch) -> F64:
        """Seconds per engine iteration for every batch in `batch` (`RooflineModel.step_time`, fast)."""
        b = batch
        return self.step_time_arrays(
            b.prefill_tokens, b.prefill_pairs, b.prefill_seqs, b.decode_seqs, b.decode_context, b.decode_max_context
        )

    def breakdown(self, batch: StepBatch, index: int = 0) -> list[OpCost]:
        """Per-op costs come from the exact model (tables keep only sums)."""
        return self.exact.breakdown(batch, index)

    # what callers read off a RooflineModel
    @property
    def model(self) -> ModelSpec:
        return self.exact.model

    @property
    def gpu(self) -> GpuSpec:
        return self.exact.gpu

    @property
    def parallelism(self) -> Parallelism:
        return self.exact.parallelism

    @property
    def params(self) -> RooflineParams:
        return self.exact.params
