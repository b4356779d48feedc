"""Disaggregated prefill/decode: KV handoff over modelled links.

Every prefill replica owns one outgoing link. A handoff is posted when prefill finishes; it waits
FIFO behind earlier handoffs on the same link, occupies the link for bytes / bandwidth, and lands
`latency_s` after it leaves the link. The decode replica is chosen at posting time (the KV must be
sent somewhere) and admits the request when it has blocks for it. Recorded per request:
transfer_s (time on the link + latency), visible_wait_s (prefill done -> decode admission: link
queueing + transfer + waiting for decode blocks) and, beside the records (`SimResult.handoff_post_s`),
the post time (prefill done -> its KV starts on the link: the FIFO queue behind earlier handoffs).
"""

from __future__ import annotations

from dataclasses import dataclass

from llmcap.sim.config import LinkConfig


@dataclass
class Link:
    cfg: LinkConfig
    free_at: float = 0.0
    busy_s: float = 0.0
    transfers: int = 0

    def send(self, t: float, nbytes: float) -> tuple[float, float, float]:
        """Post nbytes at t: (landing time, transfer seconds = occupancy + latency, post seconds = start − t)."""
        occupy = nbytes / self.cfg.bandwidth_bytes_s
        start = max(t, self.free_at)
        self.free_at = start + occupy
        self.busy_s += occupy
        self.transfers += 1
        return start + occupy + self.cfg.latency_s, occupy + self.cfg.latency_s, start - t
