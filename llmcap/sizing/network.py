"""P→D network provisioning: does one prefill instance's link carry its KV handoffs, per NIC?

The mean bandwidth (λ·E[payload]) is not what a link must carry: bursts and concurrent flows are
(docs/domain.md, the fourth ledger). Per prefill instance:

- burst: the planning traffic's windowed peak rate (`headroom.traffic_window_s`), shared by the N_P
  instances, × E[payload];
- concurrent flows: a burst queues prompts at an instance, which then prefills flat out and posts each
  handoff as its prompt finishes, so the flows in flight at once leave at its flat-out prefill rate (its
  analytic prefill bound) × E[payload];
- required = max(burst, concurrent flows) × `size.pd_network_overhead` (transport framing, retransmits,
  ranks' NICs not evenly loaded), against the link: the instance's GPUs' NICs (catalog `nic_bytes_s`, one
  per GPU; each rank sends its shard of the KV through its own), so per NIC it is required ÷ GPUs against
  one NIC. The verdict: fits (with the share of the link it needs) or over by X%.

E[payload] is the whole prompt's KV (the decode instance keeps no prefix cache), as the simulator moves it.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

from llmcap.sizing.units import SizedRow

GBPS = 1e9 / 8  # bytes/s in one Gbit/s


@dataclass(frozen=True)
class Provisioning:
    """One prefill instance's handoff bandwidth against its link (module docstring)."""

    payload_bytes: float  # E[payload] per request
    peak_rps: float  # the planning traffic's windowed peak, whole deployment
    instances: int  # N_P
    flat_out_rps: float  # one instance's analytic prefill bound
    overhead: float
    nics: int  # per instance: one per GPU
    nic_bytes_s: float  # one NIC

    @property
    def burst_bytes_s(self) -> float:
        return self.peak_rps / self.instances * self.payload_bytes

    @property
    def flows_bytes_s(self) -> float:
        return self.flat_out_rps * self.payload_bytes

    @property
    def required_bytes_s(self) -> float:
        return max(self.burst_bytes_s, self.flows_bytes_s) * self.overhead

    @property
    def link_bytes_s(self) -> float:
        return self.nic_bytes_s * self.nics

    @property
    def share(self) -> float:
        """Required ÷ link (the same per NIC: both divide by the NICs)."""
        return self.required_bytes_s / self.link_bytes_s

    @property
    def fits(self) -> bool:
        return self.share <= 1.0

    def verdict(self) -> str:
        if self.fits:
            return f"fits ({self.share:.0%} of the link)"
        return f"over by {self.share - 1:.0%}"

    def line(self) -> str:
        binding = "burst" if self.burst_bytes_s >= self.flows_bytes_s else "concurrent flows"
        return (
            f"P→D link per prefill instance: max(burst {self.burst_bytes_s / GBPS:,.1f} Gbit/s = {self.peak_rps:.4g} req/s peak ÷ "
            f"{self.instances} × {self.payload_bytes / 1e6:,.1f} MB, concurrent flows {self.flows_bytes_s / GBPS:,.1f} Gbit/s = "
            f"{self.flat_out_rps:.4g} req/s flat out × {self.payload_bytes / 1e6:,.1f} MB) × {self.overhead:g} overhead = "
            f"{self.required_bytes_s / GBPS:,.1f} Gbit/s ({binding}); per NIC {self.required_bytes_s / self.nics / GBPS:,.1f} of "
            f"{self.nic_bytes_s / GBPS:,.0f} Gbit/s ({self.nics} NIC(s), link {self.link_bytes_s / GBPS:,.0f} Gbit/s): {self.verdict()}"
        )

    def as_dict(self) -> dict[str, Any]:
        return {
            "payload_mb": self.payload_bytes / 1e6,
            "peak_rps": self.peak_rps,
            "prefill_instances": self.instances,
            "flat_out_rps": self.flat_out_rps,
            "burst_gbps": self.burst_bytes_s / GBPS,
            "flows_gbps": self.flows_bytes_s / GBPS,
            "overhead": self.overhead,
            "required_gbps": self.required_bytes_s / GBPS,
            "nics": self.nics,
            "required_gbps_per_nic": self.required_bytes_s / self.nics / GBPS,
            "nic_gbps": self.nic_bytes_s / GBPS,
            "link_gbps": self.link_bytes_s / GBPS,
            "fits": self.fits,
            "verdict": self.verdict(),
            "line": self.line(),
        }


def handoff_line(metrics: dict[str, float]) -> str:
    """The handoff percentiles (`llmcap.sizing.simeval.handoff_metrics`) as one line; "" without handoffs."""
    parts = [
        (label, name)
        for label, name in (
            ("post", "handoff_post"),
            ("transfer", "handoff_transfer"),
            ("visible wait", "visible_wait"),
        )
        if f"{name}_ms_p50" in metrics
    ]
    return "; ".join(
        f"{label} p50 {metrics[f'{name}_ms_p50']:,.1f} ms, p99 {metrics[f'{name}_ms_p99']:,.1f} ms"
        for label, name in parts
    )


def provision(row: SizedRow, mean_isl: float, peak_rps: float, overhead: float) -> Provisioning | None:
    """The provisioning of a sized P/D row's prefill instances (None: aggregated, or not sized)."""
    if row.decode is None or row.plan is None:
        return None
    pre = row.unit
    flat_out = pre.bounds.prefill_compute
    if (
        not math.isfinite(flat_out) and row.pd_roles is not None
    ):  # every prompt cached: no compute bound, its searched rate G_P
        flat_out = row.pd_roles[0].rate
    return Provisioning(
        pre.engine.kv_bytes_per_token * mean_isl,
        peak_rps,
        row.plan.pool("prefill").instances,
        flat_out,
        overhead,
        pre.gpus,
        pre.gpu.nic_bytes_s,
    )


def table_columns(p: Provisioning | None) -> dict[str, Any]:
    """The capacity table's network columns of a row (`llmcap.sizing.table.NETWORK_COLUMNS`)."""
    if p is None:
        return {"pd_link_required_gbps": None, "pd_link_gbps": None, "pd_link_verdict": None}
    return {
        "pd_link_required_gbps": p.required_bytes_s / GBPS,
        "pd_link_gbps": p.link_bytes_s / GBPS,
        "pd_link_verdict": p.verdict(),
    }
