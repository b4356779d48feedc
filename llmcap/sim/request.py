"""A request inside one replica: its lengths, its progress and what the scheduler keeps of it."""

from __future__ import annotations

from llmcap.sim.kvcache import Seg


class Req:
    """A request inside one replica (created when it arrives there, dropped when it leaves)."""

    __slots__ = (
        "i",
        "isl",
        "osl",
        "generated",
        "n_comp",
        "alloc",
        "keys",
        "block_ends",
        "segs",
        "seg_blocks",
        "published",
        "stamp",
        "joined_at_step",
        "generated_at_join",
        "computed_at_join",
        "last_step",
        "ver",
        "last_tok",
        "decode_spans",
        "times_preempted",
        "xfer",
        "decoding",
        "admitted",
        "handoff_t",
        "single",
        "lazy_lo",
        "cap",
        "adapter",
        "lazy_n",
        "lazy_blocks",
        "priority",
    )

    def __init__(
        self, i: int, isl: int, osl: int, keys: list[int] | None = None, block_ends: list[int] | None = None
    ) -> None:
        self.i = i
        self.isl = isl
        self.osl = osl  # tokens this replica generates before the request leaves it
        self.cap = osl  # the output the scheduler knows of (the client's max_tokens): what reserving admission holds
        self.adapter = -1  # its LoRA adapter (-1: the base model)
        self.priority = 0  # its scheduling priority, lower first (the `priority` queue policy)
        self.generated = 0  # tokens generated so far
        self.n_comp = 0  # tokens whose KV is computed (or loaded)
        self.alloc = 0  # tokens with KV slots allocated
        self.keys = keys  # None until admission (waiting requests hold no lists)
        self.block_ends = block_ends if block_ends is not None else []
        self.segs: list[Seg] = []  # prefix segments this request holds a reference to
        self.seg_blocks = 0
        self.published = 0  # next own segment to publish
        self.single = 0  # chain position where the singleton suffix starts (set at admission)
        self.lazy_lo = -1  # first singleton segment counted instead of published (segments [lazy_lo, reg))
        self.lazy_n = 0  # ... of them non-empty
        self.lazy_blocks = 0
        self.stamp = 0
        self.joined_at_step = self.generated_at_join = self.computed_at_join = self.last_step = 0
        self.ver = 0
        self.last_tok = 0.0
        self.decode_spans: list[tuple[int, int]] = []  # decode episodes [S_a, S_b) on the replica's step log
        self.times_preempted = 0
        self.xfer = False  # arrived by KV transfer (P/D decode side)
        self.decoding = False
        self.admitted = False
        self.handoff_t = 0.0
