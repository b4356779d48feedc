"""The four-ledger sanity line: what the trace asks of the chosen configuration, at 100% busy, no SLO, no headroom.

From the trace's per-request lengths at the target rate λ (`llmcap.sizing.analytic.demand`) and the chosen
configuration's own capacities:
- prefill: λ·E[ISL − cached] tokens/s ÷ one instance's prefill tokens/s → busy instances × its GPUs;
- decode:  λ·E[OSL] tokens/s ÷ one instance's decode tokens/s at its largest batch → busy GPUs;
- KV:      Little's law, λ·E[KV token-seconds] at that batch's step time ÷ one instance's KV tokens → GPUs;
- transfer (P/D only): λ·E[ISL]·KV bytes per token ÷ one GPU's NIC bytes/s → GPUs whose NICs it fills.
The ledger's answer, each pool rounded up to whole instances (as any deployment is): aggregated,
max(prefill + decode (the same GPUs do both in turn), KV); disaggregated, max(prefill, transfer) for the
prefill pool + max(decode, KV) for the decode pool.

It is a floor, not a plan: the simulated count must be at least it, and within `FACTOR` = 6 of it:
- × 3 for the SLOs: per-request tail targets hold only well below saturation — a prefill pool under a
  TTFT target on a heavy-tailed prompt mix queues short prompts behind long ones and is measured 30–50%
  busy at its max rate (25% on the Mooncake conversation trace); decode batches stay below the largest
  under an ITL target — and
- × 2 for the headroom of a deployment of a few nodes (one node of a small pool holds a third to a half
  of it; one upgrade step of a two-instance pool is half of it).
A count outside [1, FACTOR] × the ledger points at a modelling error on one side or the other.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

from numpy.typing import ArrayLike

from llmcap.sizing.analytic import demand

FACTOR = 6.0


@dataclass(frozen=True)
class Ledger:
    rate_rps: float
    prefill_gpus: float  # busy GPU-equivalents
    decode_gpus: float
    kv_gpus: float
    transfer_gpus: float  # 0 for aggregated
    disaggregated: bool
    final_gpus: int  # the simulated plan's count, compared
    prefill_gpus_per_instance: int = 1
    decode_gpus_per_instance: int = 1  # aggregated: the instance's

    def pool_floors(self) -> dict[str, int]:
        """The floor per pool in whole instances: prefill = max(prefill, transfer), decode = max(decode, KV);
        aggregated: one pool "instances" = max(prefill + decode, KV)."""

        def whole(busy: float, g: int) -> int:
            return max(1, math.ceil(busy / g - 1e-9)) * g

        if self.disaggregated:
            return {
                "prefill": whole(max(self.prefill_gpus, self.transfer_gpus), self.prefill_gpus_per_instance),
                "decode": whole(max(self.decode_gpus, self.kv_gpus), self.decode_gpus_per_instance),
            }
        return {
            "instances": whole(max(self.prefill_gpus + self.decode_gpus, self.kv_gpus), self.decode_gpus_per_instance)
        }

    @property
    def gpus(self) -> int:
        return sum(self.pool_floors().values())

    @property
    def ratio(self) -> float:
        return self.final_gpus / self.gpus if self.gpus > 0 else float("inf")

    @property
    def within(self) -> bool:
        return 1.0 <= self.ratio <= FACTOR

    def line(self) -> str:
        rule = "max(prefill, transfer) + max(decode, KV)" if self.disaggregated else "max(prefill + decode, KV)"
        transfer = f", transfer {self.transfer_gpus:.3g}" if self.disaggregated else ""
        verdict = "within" if self.within else "OUTSIDE"
        return (
            f"four-ledger sanity at {self.rate_rps:.4g} req/s (100% busy, no SLO, no headroom): prefill {self.prefill_gpus:.3g} GPUs, "
            f"decode {self.decode_gpus:.3g}, KV {self.kv_gpus:.3g}{transfer} busy GPUs → {rule} in whole instances = {self.gpus} GPUs; "
            f"the simulated plan's {self.final_gpus} GPUs are {self.ratio:.2f}× that ({verdict} [1, {FACTOR:g}]×: ×3 SLO-bound utilisation × 2 headroom)"
        )

    def as_dict(self) -> dict[str, Any]:
        return {
            "prefill_gpus": self.prefill_gpus,
            "decode_gpus": self.decode_gpus,
            "kv_gpus": self.kv_gpus,
            "transfer_gpus": self.transfer_gpus,
            "gpus": self.gpus,
            "final_gpus": self.final_gpus,
            "ratio": self.ratio,
            "factor": FACTOR,
            "within": self.within,
            "line": self.line(),
        }


def four_ledgers(
    rate_rps: float,
    isl: ArrayLike,
    osl: ArrayLike,
    cached: ArrayLike,
    *,
    prefill_tokens_s: float,
    prefill_gpus: int,
    decode_tokens_s: float,
    decode_gpus: int,
    decode_step_s: float,
    kv_tokens_per_instance: float,
    kv_bytes_per_token: float,
    nic_bytes_s_per_gpu: float,
    disaggregated: bool,
    final_gpus: int,
) -> Ledger:
    """The module docstring's four ledgers (capacities are one instance's; GPUs per instance convert)."""
    d = demand(rate_rps, isl, osl, decode_step_s, kv_bytes_per_token, cached_tokens=cached)
    transfer = d.pd_bandwidth_avg_bytes_s / nic_bytes_s_per_gpu if disaggregated else 0.0
    return Ledger(
        rate_rps,
        d.prefill_tokens_s / prefill_tokens_s * prefill_gpus,
        d.decode_tokens_s / decode_tokens_s * decode_gpus,
        d.active_tokens / kv_tokens_per_instance * decode_gpus,
        transfer,
        disaggregated,
        final_gpus,
        prefill_gpus,
        decode_gpus,
    )
