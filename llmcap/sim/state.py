"""The state of one replica (`ReplicaState`): its parts — the waiting queue (`queues`), the KV cache
(`kvcache`), the admission policy (`admission`) — and what the scheduler, the decode clock and the step
log keep of its requests (`request.Req`). The behaviour is layered on top, one concern per module: `steplog.StepLog` (the
step log and per-request ITL statistics), `decoding.DecodeRuns` (the decoding set, runs of pure-decode
steps, the time-series samples) and `engine.Replica` (the scheduler: admission, preemption, KV blocks).
"""

from __future__ import annotations

from array import array

import numpy as np

from llmcap.sim.admission import AdmissionPolicy, AdmissionView, make_admission
from llmcap.sim.config import EngineConfig
from llmcap.sim.histogram import HIST_BINS_PER_DECADE, HIST_DECADES
from llmcap.sim.kvcache import KVCache
from llmcap.sim.queues import create_request_queue
from llmcap.sim.recorder import Recorder
from llmcap.sim.request import Req
from llmcap.sim.segments import SegmentIndex
from llmcap.sim.steptime import StepTimer

INF = float("inf")


class ReplicaState:
    """Every field of one engine, set up here; the layers above read and change them."""

    # long: mypyc knows a field set in __init__ itself (not in a method it calls) is always defined: reads skip a check
    def __init__(
        self,
        index: int,
        cfg: EngineConfig,
        timer: StepTimer,
        rec: Recorder,
        *,
        role: str = "both",
        reference: bool = False,
        max_run_steps: int = 1 << 16,
        resolution_s: float = 1.0,
        first_token_at_handoff: bool = False,
        segments: SegmentIndex | None = None,
        itl_exact: bool = True,
    ) -> None:
        self.index = index
        self.gid = index  # position in the whole cluster (the cluster sets it; heap ties)
        self.horizon = INF  # set by the cluster: the next outside event, a hint for planning run lengths
        self.cfg = cfg
        self.bs = cfg.block_size
        self.max_batched = cfg.max_num_batched_tokens  # plain ints: read every step
        self.max_seqs = cfg.max_num_seqs
        self.timer = timer
        self.rec = rec
        self.role = role  # "both" | "prefill" (leaves after the first token, blocks held) | "decode"
        self.caching = cfg.enable_prefix_caching and role != "decode"
        # singleton segments kept as one LRU entry per finished request (kvcache.Run) when the index says
        # where they start (the cluster asks for that unless a host tier or the reference mode is on)
        self.lazy = self.caching and segments is not None and segments.singles is not None
        self.max_run = 1 if reference else max_run_steps
        self.first_token_at_handoff = first_token_at_handoff
        self.segments_of = segments  # request index -> (chain hashes, segment block ends), fetched at admission
        tiers = cfg.offload_tiers() if self.caching else ()
        self.kv = KVCache(cfg.num_blocks, tuple(t.blocks for t in tiers))
        self.admission: AdmissionPolicy = make_admission(cfg.admission_policy)
        self.admission_view = AdmissionView()  # what the policy is shown of the replica (reused, filled per question)
        # each offload tier: seconds to load one block into HBM, lookup latency; and what this replica took from it
        self.tier_s_per_block = [cfg.block_size * cfg.kv_bytes_per_token / t.bandwidth_bytes_s for t in tiers]
        self.tier_lookup_s = [t.lookup_s for t in tiers]
        self.tier_hit_tokens = [0] * len(tiers)
        self.tier_load_s = [0.0] * len(tiers)
        self.tier_lookups = [0] * len(tiers)
        self.running: dict[int, Req] = {}  # stamp -> request, admission order
        self.partials: dict[int, Req] = {}  # running requests still prefilling
        self.waiting = create_request_queue(cfg.scheduling_policy)
        self.max_loras = cfg.max_loras
        self.held: dict[int, Req] = {}  # prefill role: done, blocks kept until the handoff lands
        self.stamps = 0
        # decoding set, advanced by the step clock
        self.step_clock = 0  # steps completed = index of the next step
        self.decode_batch = 0
        self.ctx_sum = 0  # Σ context (prompt + generated) of decodes at step `step_clock`
        self.phase = [
            0
        ] * self.bs  # decodes by (computed_at_join - joined_at_step) mod bs: who needs a block at which step
        self.fin_heap: list[tuple[int, int, int, Req]] = []  # (last step, stamp, version, request)
        self.outstanding = 0  # Σ tokens still to process: isl + osl - 1 - n_comp
        self.inbound = (
            0  # P/D decode side: tokens of handoffs sent to it that have not landed yet (the router counts them)
        )
        # the plan in progress: a step or a run of pure-decode steps [done, k) starting at t0
        self.busy = False
        self.t = 0.0  # time of the last decision
        self.run_ends: list[float] = []
        self.run_durs: array[float] = array("d")
        self.run_k = 0
        self.run_done = 0
        self.run_alloc = 0  # steps of the run whose blocks are allocated
        self.run_S = 0
        self.run_decode = False
        # a decode run timed on demand (StepTimer.on_demand): no per-step lists, only its start, first
        # context and a cursor (step cursor_step starts at cursor_start) that the monotone outside queries move forward;
        # the time-series grid has its own (sample_step, sample_start): the two sequences are each monotone, not together
        self.run_lazy = False
        self.run_t0 = 0.0
        self.run_ctx0 = 0
        self.cursor_step = 0
        self.cursor_start = 0.0
        self.sample_step = 0
        self.sample_start = 0.0
        self.entries: list[tuple[Req, int]] = []  # prefill chunks (and handoff first decodes) of a single step
        self.entry_B = 0  # decodes of that step with a regular gap (their last token ended the previous step)
        self.next_time = INF
        self.version = 0
        # logs and counters
        self.tokens = 0
        self.hit_tokens = 0
        self.preemptions = 0
        self.finished = 0
        self._host_load = 0.0
        self.outputs: list[Req] = []  # prefill role: requests that finished prefill this advance
        self.res = resolution_s
        self.grid_i = 0
        self.ts = array("q")  # 8 ints per grid time (see state_at); row i is at time i·resolution
        # step log: duration and regular-gap decode count per step, from step index log_base on, as the
        # chunks `flush_log` wrote (chunk i holds steps from chunk_at[i] on; no copying as it grows). Steps
        # reach it through `pending_*` (a segment: n steps of a decode run from context ctx, b >= 0; or n
        # literal durations in pending_literal, b = -1; weight w each); the ITL stats of requests that finished
        # (`stats_due`) wait for the flush.
        self.log_base = 0
        self.log_n = 0  # steps in the chunks
        self.chunk_d: list[np.ndarray] = []
        self.chunk_w: list[np.ndarray] = []
        self.chunk_at: list[int] = []
        # (lists: a compiled list append is a C call; array('q').append parses its argument)
        self.pending_batch: list[int] = []
        self.pending_context: list[int] = []
        self.pending_count: list[int] = []
        self.pending_weight: list[int] = []
        self.pending_literal = array("d")
        self.pending_steps = 0
        self.stats_due: list[Req] = []
        self.trim_at = 0  # histogram mode: log length of the next trim attempt (at least steplog.TRIM_STEPS)
        self.hist = None if itl_exact else np.zeros(HIST_BINS_PER_DECADE * HIST_DECADES, dtype=np.int64)
