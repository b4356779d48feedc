"""What `llmcap simulate` prints for a run: latency percentiles, throughput, prefix tiers, goodput."""

from __future__ import annotations

from typing import Any

from rich.table import Table

from llmcap.commands._common import out_console
from llmcap.engine_presets import EnginePreset


def print_simulation(s: dict[str, Any], title: str, steps: str, preset: EnginePreset | None) -> None:
    """The run's summary `s` as the console table and lines."""
    t = Table(title=title)
    t.add_column("metric")
    t.add_column("p50", justify="right")
    t.add_column("p90", justify="right")
    t.add_column("p99", justify="right")
    for key in ("ttft_ms", "itl_ms", "tpot_ms", "e2e_ms"):
        t.add_row(key, *(f"{v:,.1f}" if v is not None else "-" for v in s[key].values()))
    console = out_console()
    console.print(t)
    console.print(f"step times: {steps}")
    if preset is not None:
        console.print(
            f"engine preset: {preset.line()}"
            + (
                f" (given instead: {', '.join(s['engine_preset']['overridden'])})"
                if s["engine_preset"]["overridden"]
                else ""
            ),
            highlight=False,
        )
    thr = s["throughput"]
    console.print(
        f"requests {s['requests']:,} (completed {s['completed']:,}, rejected {s['rejected']:,} of which "
        f"{s['rejected_over_max_model_len']:,} longer than max_model_len {s['max_model_len']}, unfinished {s['unfinished']:,}); "
        f"duration {s['duration_s']:,.1f} s; output {thr['output_tok_s'] or 0:,.0f} tok/s, {thr['req_s'] or 0:,.2f} req/s; "
        f"preemptions {s['preemptions']:,}; prefix hit ratio {s['prefix_hit_ratio']:.3f}; "
        f"wall {s['wall_s']:.2f} s ({s['requests_per_wall_s'] or 0:,.0f} req/wall-s)"
    )
    for t in s.get("prefix_tiers", ()):
        console.print(
            f"tier {t['tier']}: {t['hit_tokens']:,} prompt tokens loaded ({t['hit_ratio']:.1%} of all), load {t['load_s']:,.2f} s, "
            f"{t['lookups']:,} lookups {t['lookup_s']:,.2f} s; saved prefill ≈ {t['saved_prefill_s']:,.2f} s, "
            f"net {t['net_gain_s']:+,.2f} s",
            highlight=False,
        )
    if "goodput" in s:
        g = s["goodput"]
        console.print(
            f"goodput: {g['good']:,} of {g['requests']:,} requests meet every target (attainment {g['attainment']:.4f}), "
            f"{g['goodput_rps']:,.3g} req/s over the arrival span" + (f"; {g['token_itl']}" if g["token_itl"] else "")
        )
        for name, definition in g["slo_definitions"].items():
            console.print(f"  SLO {name}: {definition}")
