"""One replica: a vLLM-v1-like continuous-batching scheduler, advanced event by event.

Each step the scheduler runs the decoding sequences first (one token each), then continues partially
prefilled requests, then admits waiting requests in the queue's order (`queues`: FCFS or priority) — all within `max_num_batched_tokens` and
`max_num_seqs`; prompts are chunked to fit the budget. KV blocks are allocated for the tokens a step
computes (at admission and on growth); when they run out the newest running request is preempted and
later recomputed; blocks are freed at completion (see `kvcache` for the prefix cache). The admission
policy (`admission`: vLLM's, or TensorRT-LLM's that reserve whole lives) may hold a request back further,
except on a replica with no other request running or held.

A step with no prefill work and nothing admissible starts a run of pure-decode steps planned at once
(`decoding`); steps reach the step log in bulk (`steplog`); the replica's fields are in `state`.
`reference=True` plans runs of one step, calling the scheduler every step; both produce identical
results (tests/sim).
"""

from __future__ import annotations

from array import array
from collections.abc import Hashable

from llmcap.sim.admission import CLIP_NEW_TOKENS, lifetime_blocks
from llmcap.sim.decoding import DecodeRuns
from llmcap.sim.kvcache import Run, Seg
from llmcap.sim.recorder import OK
from llmcap.sim.request import Req
from llmcap.sim.state import INF

__all__ = ["INF", "Replica", "Req"]


class Replica(DecodeRuns):
    """One engine. Drive it with `add`, `release`, and `advance` at `next_time` (its fields: `ReplicaState`)."""

    def prefix_hit_tokens(self, keys: list[int], block_ends: list[int], isl: int) -> int:
        """Tokens of a prompt with these segments that this replica's HBM cache would serve now."""
        if not self.caching:
            return 0
        return self.kv.cached_prefix_blocks(keys, block_ends, (isl - 1) // self.bs) * self.bs

    def _wake(self, t: float) -> bool:
        """Truncate the plan so the scheduler runs at the end of the step in progress at t (or at t
        when idle). True when `next_time` changed."""
        if not self.busy:
            self.busy = True
            self.run_decode = False
            self.entries = []
            self.run_k = self.run_done = 0
            self.t = t
            self.next_time = t
            self.version += 1
            return True
        if self.run_decode:
            m = self._steps_before(t)
            if m + 1 < self.run_k:
                self.run_k = m + 1
                self.next_time = self._run_end(m)
                self.version += 1
                return True
        return False

    def add(self, req: Req, t: float) -> bool:
        """A request arrives (or its KV lands, P/D). True when `next_time` changed."""
        self.sample_until(t)
        self.outstanding += req.isl + req.osl - 1 - req.n_comp
        self.waiting.add(req)
        return self._wake(t)

    def release(self, req: Req, t: float) -> bool:
        """Prefill role: the handoff of `req` landed; free its blocks."""
        self.sample_until(t)
        del self.held[req.stamp]
        self._free(req, preempted=False)
        return self._wake(t) if self.waiting.size() else False

    def advance(self) -> None:
        """Finish the plan ending at `next_time`, then schedule the next step (or go idle)."""
        t = self.next_time
        self.sample_until(t)
        if self.run_decode:
            self._commit(self.run_k)
            if self.run_k > self.run_alloc:
                self.kv.alloc(self._allocs(self.run_alloc, self.run_k))
            self._finish_decodes(t)
        elif self.run_k:
            self._commit_step(t)
        self.t = t
        self._decide(t)

    def _commit_step(self, t: float) -> None:
        """A single (mixed) step ended at t: decodes emit, prefill chunks advance."""
        b = self.decode_batch
        self.pending_literal.append(self.run_durs[0])
        self._log(-1, 0, 1, self.entry_B)
        self.step_clock += 1
        self.ctx_sum += b
        done = b
        emitted = []
        for req, c in self.entries:
            req.n_comp += c
            done += c
            if req.n_comp == req.isl + req.generated:  # the step computed the last known token: one more comes out
                emitted.append(req)
        self.outstanding -= done
        self.tokens += done
        self.run_k = self.run_done = 1
        self._finish_decodes(t)
        for req in emitted:
            self._emit(req, t)
        for req in emitted:
            if req.generated < req.osl and self.role != "prefill":
                self._join_decode(req)
        self.entries = []

    def _emit(self, req: Req, t: float) -> None:
        """`req` produced a token at the end of a non-decode step (prefill, recompute, handoff entry)."""
        rec = self.rec
        req.generated += 1
        if req.stamp in self.partials:
            del self.partials[req.stamp]
        if req.generated == 1:
            rec.prefill_done[req.i] = t
            if not (self.role == "prefill" and self.first_token_at_handoff):
                rec.first_token[req.i] = t
        else:
            rec.extra_gaps.append(t - req.last_tok)
            req.decode_spans.append((-1, len(rec.extra_gaps) - 1))  # marks one explicit gap
        req.last_tok = t
        if self.role == "prefill":
            del self.running[req.stamp]
            self.held[req.stamp] = req
            self.outputs.append(req)
        elif req.generated >= req.osl:
            self._complete(req, t)

    def _complete(self, req: Req, t: float) -> None:
        rec = self.rec
        rec.finish[req.i] = t
        rec.status[req.i] = OK
        self.stats_due.append(req)
        del self.running[req.stamp]
        self.partials.pop(req.stamp, None)
        self._free(req, preempted=False)
        self.finished += 1

    def _free(self, req: Req, preempted: bool) -> None:
        kv = self.kv
        self.admission.released(lifetime_blocks(req.isl, req.cap, self.bs))
        own = -(-req.alloc // self.bs) - req.seg_blocks
        counted = req.lazy_n
        if req.lazy_lo >= 0:  # the singleton tail first, as the release below goes
            if counted:
                self._free_singletons(req, preempted)
            req.lazy_lo = -1
            req.lazy_n = req.lazy_blocks = 0
        kv.release_segments(req.segs)
        if preempted and self.caching:
            chain = sum(1 for j, hi in enumerate(req.block_ends) if hi > (req.block_ends[j - 1] if j else 0))
            if len(req.segs) + counted == chain:  # own blocks continue the cached chain: keep them for recompute
                private = req.alloc // self.bs - (req.block_ends[-1] if req.block_ends else 0)
                if private > 0:
                    kv.keep_private(("p", req.i), private)
                    own -= private
        kv.release(own)
        req.segs = []
        req.seg_blocks = 0
        req.published = 0
        req.alloc = 0

    def _free_singletons(self, req: Req, preempted: bool) -> None:
        """Free the request's counted singleton segments [lazy_lo, reg) as evictable: one `Run` entry, or,
        preempted, kept one by one, tail first, for its recompute to hit (private to it: nobody else can)."""
        kv = self.kv
        run = Run(req.keys if req.keys is not None else [], req.block_ends, req.lazy_lo, req.published, req.lazy_blocks)
        if not preempted:
            kv.unpin_run(run, req.lazy_n)
            return
        for key, nb in run.members():  # tail first
            kv.keep_private(key, nb)

    def _preempt(self, req: Req, allocated_this_step: bool) -> None:
        if req.decoding:
            self._leave_decode(req, self.step_clock)
            req.last_tok = self.t
            if allocated_this_step:
                req.alloc += 1
        del self.running[req.stamp]
        self.partials.pop(req.stamp, None)
        self.outstanding += req.n_comp
        self._free(req, preempted=True)
        req.n_comp = 0
        req.times_preempted += 1
        self.rec.preemptions[req.i] = req.times_preempted
        self.preemptions += 1
        self.waiting.put_back(req)

    def _make_room(self, need: int, req: Req, allocated: bool) -> bool:
        """Preempt running requests (the newest, or as the queue policy orders them) until `need` blocks are
        free; False if `req` itself went."""
        while self.kv.free < need:
            victim = self.waiting.victim(self.running)
            self._preempt(victim, allocated and victim.decoding)
            if victim is req:
                return False
        return True

    def _register(self, req: Req) -> None:
        """Publish the request's segments that its allocated blocks now fully cover."""
        block_ends, kv = req.block_ends, self.kv
        keys = req.keys if req.keys is not None else []
        full = req.alloc // self.bs
        j, n = req.published, len(block_ends)
        lo = block_ends[j - 1] if j else 0
        segs = req.segs
        added = 0
        single = req.single if self.lazy and req.times_preempted == 0 else n  # a preempted request publishes them all
        while j < n:
            hi = block_ends[j]
            if hi > full:
                break
            if j >= single:  # a singleton: counted here, queued with the others at the end (kvcache.Run)
                if req.lazy_lo < 0:
                    req.lazy_lo = j
                if hi > lo:
                    req.lazy_n += 1
                    req.lazy_blocks += hi - lo
                    added += hi - lo
            elif hi > lo:
                seg = kv.publish(keys[j], hi - lo)
                if seg is not None:  # else another request published it first: these stay ours
                    segs.append(seg)
                    added += hi - lo
            lo = hi
            j += 1
        req.seg_blocks += added
        req.published = j

    # long: compiled hot path, tried for the waiting head at each step with room; a split passes a dozen locals per call
    def _admit(self, req: Req, budget: int, t: float) -> int:
        """Try to admit the waiting head; tokens scheduled, or 0 when it does not fit now."""
        bs, kv = self.bs, self.kv
        n_tok = req.isl + req.generated
        hits: list[Seg] = []
        host_hits: list[tuple[Hashable, int, int]] = []
        tier_blocks: list[int] = []
        hit_blocks = lru_blocks = host_blocks = searched = 0
        private = None
        reg = 0
        if self.caching and req.keys is None:
            req.keys, req.block_ends = self.segments_of.of(req.i) if self.segments_of is not None else ([], [])
        if self.lazy and not req.admitted and self.segments_of is not None:
            req.single = self.segments_of.single_from(req.i)
        if self.caching and not req.xfer:
            cap = (n_tok - 1) // bs
            m = kv.match_prefix(req.keys if req.keys is not None else [], req.block_ends, cap)
            hits, host_hits, reg = m.hits, m.host_hits, m.matched
            hit_blocks, lru_blocks, host_blocks = m.hit_blocks, m.lru_blocks, m.host_blocks
            tier_blocks, searched = m.tier_blocks, m.searched
            if m.chained and not host_hits:
                kept = kv.private_blocks(("p", req.i))
                if kept >= 0:
                    private = min(kept, cap - hit_blocks)
        hit_tok = (hit_blocks + host_blocks + (private or 0)) * bs
        if req.xfer:
            hit_tok = req.n_comp
        c = min(n_tok - hit_tok, budget)
        need = -(-(hit_tok + c) // bs) - hit_blocks - (private or 0)
        if need > kv.free - lru_blocks - (private or 0):  # hits leave the free pool when taken
            return 0
        policy = self.admission
        lifetime = lifetime_blocks(req.isl, req.cap, bs)  # what the engine knows: the cap, not the output to come
        new_tokens = n_tok - hit_tok + min(req.cap - req.generated, CLIP_NEW_TOKENS) + bs
        # an otherwise empty replica admits whatever fits: nothing it runs could ever free more, so a policy
        # that held the head back here would stall the queue for good (admission.py, `sglang`)
        if self.running or self.held:
            view = self.admission_view
            view.lifetime_blocks, view.num_blocks, view.free_tokens, view.new_tokens = (
                lifetime,
                kv.num_blocks,
                kv.free * bs,
                new_tokens,
            )
            view.running_remaining = self._outputs_left() if policy.tracks_progress else 0
            view.step = self.step_clock
            if not policy.admits(view):
                return 0
        policy.admitted(lifetime)
        for seg in hits:
            kv.acquire(seg)
            req.segs.append(seg)
        req.seg_blocks = hit_blocks
        if private is not None:
            nb = kv.take_private(("p", req.i))
            kv.release(nb - private)  # whatever the cap leaves out is plain free space again
        kv.alloc(need)
        for key, nb, level in host_hits:
            kv.tier_take(key, level)
            req.segs.append(kv.register(key, nb))
            req.seg_blocks += nb
        req.n_comp = hit_tok
        req.alloc = hit_tok + c
        req.published = reg
        if self.caching and req.block_ends:
            self._register(req)
        if not req.xfer:
            cached = min(hit_tok, req.isl)
            self.rec.cached[req.i] = cached
            self.rec.host_cached[req.i] = min(host_blocks * bs, cached)
            self.hit_tokens += hit_tok
            self.outstanding -= hit_tok
        if not req.admitted:
            req.admitted = True
            if self.role != "decode":
                self.rec.admitted[req.i] = t
            else:
                self.rec.decode_admitted[req.i] = t
                if self.first_token_at_handoff:
                    self.rec.first_token[req.i] = t
                    req.last_tok = t
        self.stamps += 1
        req.stamp = self.stamps
        self.running[req.stamp] = req
        if searched:
            self._host_load += self._onboard_s(tier_blocks, searched)
        return c

    def _onboard_s(self, tier_blocks: list[int], searched: int) -> float:
        """Seconds an admission spends on the offload tiers — the lookups in the first `searched` tiers and
        loading `tier_blocks` from each — added to its step, and counted per tier."""
        bs, load = self.bs, 0.0
        for level in range(searched):
            self.tier_lookups[level] += 1
            load += self.tier_lookup_s[level]
            nb = tier_blocks[level]
            if nb:
                secs = nb * self.tier_s_per_block[level]
                self.tier_hit_tokens[level] += nb * bs
                self.tier_load_s[level] += secs
                load += secs
        return load

    def _decide(self, t: float) -> None:
        """Schedule the step starting at t (vLLM v1 order), or a run of pure-decode steps, or go idle."""
        bs, kv, max_seqs = self.bs, self.kv, self.max_seqs
        S = self.step_clock
        budget = self.max_batched
        preempted_before = self.preemptions
        self._host_load = 0.0
        entries: list[tuple[Req, int]] = []
        # 1. decodes, one token each, in admission order
        if self.decode_batch:
            need = self.phase[(-S) % bs]
            if need <= kv.free:
                kv.alloc(need)
            else:
                for req in [r for r in self.running.values() if r.decoding]:
                    if not req.decoding or (req.computed_at_join - req.joined_at_step + S) % bs:
                        continue
                    if self._make_room(1, req, allocated=False):
                        kv.alloc(1)
            budget -= self.decode_batch
        # 2. partially prefilled requests
        for stamp in list(self.partials):
            part = self.partials.get(stamp)
            if part is None:
                continue
            if budget <= 0:
                break
            c = min(part.isl + part.generated - part.n_comp, budget)
            need = -(-(part.n_comp + c) // bs) - (-(-part.alloc // bs))
            if not self._make_room(need, part, allocated=True):
                continue
            kv.alloc(need)
            part.alloc = part.n_comp + c
            if self.caching and part.block_ends:
                self._register(part)
            entries.append((part, c))
            budget -= c
        budget = self.max_batched - self.decode_batch - sum(c for _, c in entries)  # victims give theirs back
        if self.preemptions != preempted_before and self.admission.tracks_progress:
            left = self.running.values()
            self.admission.retracted(
                S, sum(self._generated_now(r) for r in left), sum(r.cap for r in left), len(self.running)
            )
        # 3. waiting requests in the queue's order, unless this step preempted; as vLLM, one whose LoRA adapter
        # would make the batch hold more than max_loras adapters is skipped (it keeps its place), the next one tried
        if self.preemptions == preempted_before:
            waiting = self.waiting
            loras = {r.adapter for r in self.running.values() if r.adapter >= 0} if self.max_loras else None
            skipped: list[Req] = []
            while waiting.size() and budget > 0 and len(self.running) < max_seqs:
                req = waiting.peek()
                if loras is not None and req.adapter >= 0 and req.adapter not in loras and len(loras) >= self.max_loras:
                    skipped.append(waiting.pop())
                    continue
                c = self._admit(req, budget, t)
                if c == 0:
                    break
                waiting.pop()
                if loras is not None and req.adapter >= 0:
                    loras.add(req.adapter)
                entries.append((req, c))
                if req.n_comp + c < req.isl + req.generated:
                    self.partials[req.stamp] = req
                budget -= c
            waiting.put_back_all(skipped)
        if entries:
            self._plan_step(t, entries)
        elif self.decode_batch:
            self._plan_run(t, single=self.preemptions != preempted_before)
        else:
            self.busy = False
            self.run_decode = False
            self.run_k = self.run_done = 0
            self.next_time = INF
            self.version += 1

    def _plan_step(self, t: float, entries: list[tuple[Req, int]]) -> None:
        p_tok = p_pairs = p_seqs = 0.0
        d_seqs, d_ctx = self.decode_batch, self.ctx_sum
        d_max = 0
        if not self.timer.linear and self.decode_batch:
            d_max = max(
                r.computed_at_join + (self.step_clock - r.joined_at_step) + 1
                for r in self.running.values()
                if r.decoding
            )
        for req, c in entries:
            if (
                c == 1 and req.generated >= 1 and req.n_comp == req.isl + req.generated - 1
            ):  # a decode token (handoff entry)
                d_seqs += 1
                d_ctx += req.n_comp + 1
                d_max = max(d_max, req.n_comp + 1)
            else:
                p_tok += c
                p_pairs += c * req.n_comp + c * (c + 1) / 2.0
                p_seqs += 1
        dur = self.timer.one(p_tok, p_pairs, p_seqs, float(d_seqs), float(d_ctx), float(d_max)) + self._host_load
        self.entries = entries
        self.entry_B = self.decode_batch
        self.run_decode = False
        self.run_durs = array("d", (dur,))
        self.run_ends = [t + dur]
        self.run_k, self.run_done = 1, 0
        self.busy = True
        self.next_time = t + dur
        self.version += 1
