"""The workload section of the plan report, as Markdown, from the `characterise` summary."""

from __future__ import annotations


def _row(cells: list[str]) -> str:
    return "| " + " | ".join(cells) + " |"


def render_markdown(summary: dict, plot_files: list[str]) -> str:
    s = summary
    lines = [
        "# Workload",
        "",
        f"{s['rows']:,} requests over {s['duration_s']:,.1f} s (start {s['start']}), mean {s['mean_rps'] or 0:.3f} req/s.",
        f"Correlation ISL↔OSL: Pearson {s['corr_pearson']:.3f}, Spearman {s['corr_spearman']:.3f}. "
        f"Inter-arrival CV {s['interarrival_cv'] or 0:.2f}.",
        "",
        "## Lengths (tokens)",
        "",
    ]
    keys = [k for k in s["isl"] if k != "min"]
    lines += [_row(["", *keys]), _row(["---"] * (len(keys) + 1))]
    for name in ("isl", "osl"):
        lines.append(_row([name.upper(), *(f"{s[name][k]:,.1f}" for k in keys)]))
    lines += [
        "",
        "## Arrival rate per window (req/s)",
        "",
        _row(["window", "windows", "p50", "p90", "p99", "max", "CV", "index of dispersion", "peak/mean"]),
    ]
    lines.append(_row(["---"] * 9))
    for w, r in s["rps_windows"].items():
        if not r.get("windows"):
            lines.append(_row([w, "0", *["–"] * 7]))
            continue
        vals = [r.get(k) for k in ("p50", "p90", "p99", "max", "cv", "index_of_dispersion", "peak_to_mean")]
        lines.append(_row([w, str(r["windows"]), *("–" if v is None else f"{v:.2f}" for v in vals)]))
    if "prefix" in s:
        p = s["prefix"]
        lines += [
            "",
            f"## Prefix reuse (block size {p['block_size']})",
            "",
            f"Ideal token hit ratio (unbounded cache): **{p['ideal_hit_ratio']:.1%}** (blocks {p['ideal_block_hit_ratio']:.1%}); "
            f"requests reusing ≥1 block {p['requests_reusing_ge1_block']:.2%}, ≥2 blocks {p['requests_reusing_ge2_blocks']:.1%}; "
            f"{p['unique_blocks']:,} unique of {p['total_blocks']:,} blocks.",
            "",
            _row(["LRU capacity (blocks)", "token hit ratio"]),
            _row(["---", "---"]),
            *(_row([f"{int(c):,}", f"{v:.1%}"]) for c, v in p["lru_hit_ratio"].items()),
        ]
    for label, shares in s["mix"].items():
        lines += ["", f"## {label.capitalize()} mix", "", _row([label, "share"]), _row(["---", "---"])]
        lines += [_row([k, f"{v:.1%}"]) for k, v in shares.items()]
    if plot_files:
        lines += ["", "## Plots", ""] + [f"![{f}]({f})" for f in plot_files]
    return "\n".join(lines) + "\n"
