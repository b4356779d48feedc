"""The per-request record: what the simulator predicts and what a live replay measures, one schema.

Both `llmcap.sim` and `llmcap.live`'s open-loop replay produce a pyarrow table with exactly
`REQUEST_SCHEMA`, so SLO attainment, goodput and reconciliation code reads either without caring
where it came from. Times are seconds on the trace's clock (the first arrival is the trace's zero);
durations are seconds. A request that never got a first token / never finished (e.g. the run
ended or the engine rejected it) has null there and `status` says why.

Columns
- request_id: the trace's row order (int64); arrival_s: when the request arrived.
- admitted_s: first scheduled for prefill; first_token_s: first output token visible to the client;
  finish_s: last token.
- isl, osl: prompt and generated tokens; cached_tokens: prompt tokens served from the prefix cache
  (final admission), host_cached_tokens: those loaded from the host-memory tier.
- preemptions: times evicted and recomputed.
- prefill_replica, decode_replica: the replica index per role (aggregated: both the same; P/D:
  prefill pool index and decode pool index).
- queue_s = admitted − arrival; prefill_s = prefill done − admitted; transfer_s = KV handoff time on
  the link (P/D; 0 aggregated); visible_wait_s = the part of the handoff the request waited for
  (post + queueing on the link + transfer + waiting for decode blocks); decode_s = finish − first token.
- ttft_s = first_token − arrival; e2e_s = finish − arrival; tpot_s = (finish − first_token)/(osl − 1)
  (null for osl = 1).
- itl_p50_s, itl_p99_s, itl_max_s: this request's inter-token gaps (null for osl = 1).
- status: "ok" | "unfinished" | "rejected".
"""

from __future__ import annotations

import math

import pyarrow as pa
import pyarrow.compute as pc

REQUEST_SCHEMA = pa.schema(
    [
        pa.field("request_id", pa.int64(), nullable=False),
        pa.field("arrival_s", pa.float64(), nullable=False),
        pa.field("admitted_s", pa.float64()),
        pa.field("first_token_s", pa.float64()),
        pa.field("finish_s", pa.float64()),
        pa.field("isl", pa.int64(), nullable=False),
        pa.field("osl", pa.int64(), nullable=False),
        pa.field("cached_tokens", pa.int64(), nullable=False),
        pa.field("host_cached_tokens", pa.int64(), nullable=False),
        pa.field("preemptions", pa.int32(), nullable=False),
        pa.field("prefill_replica", pa.int32()),
        pa.field("decode_replica", pa.int32()),
        pa.field("queue_s", pa.float64()),
        pa.field("prefill_s", pa.float64()),
        pa.field("transfer_s", pa.float64()),
        pa.field("visible_wait_s", pa.float64()),
        pa.field("decode_s", pa.float64()),
        pa.field("ttft_s", pa.float64()),
        pa.field("tpot_s", pa.float64()),
        pa.field("e2e_s", pa.float64()),
        pa.field("itl_p50_s", pa.float64()),
        pa.field("itl_p99_s", pa.float64()),
        pa.field("itl_max_s", pa.float64()),
        pa.field("status", pa.string(), nullable=False),
    ]
)

STATUSES = ("ok", "unfinished", "rejected")


_CLIENT_SHIFTED = ("first_token_s", "finish_s", "ttft_s", "e2e_s")


def with_client_latency(records: pa.Table, latency_s: float) -> pa.Table:
    """The records as a client `latency_s` away from the engine would see them.

    The simulator times the engine: a token exists when its step ends. A client also pays a roughly
    constant per-request latency for the way in and out (HTTP, the API server, the gateway) — e.g. the
    `client_overhead_s` an endpoint calibration fits (`llmcap.perf.CalibratedFit`). The whole of it is
    put on the way out: every token becomes visible `latency_s` later, so first_token_s, finish_s,
    ttft_s and e2e_s grow by it, while arrival_s and everything measured between tokens or inside
    the engine (admitted_s, queue_s, prefill_s, transfer_s, visible_wait_s, decode_s, tpot_s, the
    per-request ITLs) stay as they are (a constant shift leaves gaps alone). Nulls stay null.
    """
    if not math.isfinite(latency_s) or latency_s < 0:
        raise ValueError(f"client latency must be finite and >= 0, got {latency_s}")
    out = records
    for name in _CLIENT_SHIFTED:
        i = out.schema.get_field_index(name)
        out = out.set_column(i, out.schema.field(i), pc.add(out.column(i), pa.scalar(float(latency_s))))
    return out
