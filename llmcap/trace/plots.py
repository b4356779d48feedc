"""Workload plots (PNG): arrivals per window, ISL/OSL joint hexbin with marginals, prefix-reuse CDF.

matplotlib with the Agg backend; PNG metadata is fixed so the same data gives the same bytes.
"""

from __future__ import annotations

from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402
import pyarrow as pa  # noqa: E402

from llmcap.trace import schema  # noqa: E402
from llmcap.trace.prefix import hit_tokens, reuse_at, stack_distances  # noqa: E402
from llmcap.trace.stats import window_counts  # noqa: E402

_PNG_META = {"Software": "llmcap"}


def _save(fig, path: Path) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110, metadata=_PNG_META)
    plt.close(fig)
    return path


def plot_arrivals(table: pa.Table, windows_s: list[float], path: Path) -> Path:
    arrival = table.column("arrival_s").to_numpy()
    fig, axes = plt.subplots(len(windows_s), 1, figsize=(9, 2.2 * len(windows_s)), sharex=True, squeeze=False)
    for ax, w in zip(axes[:, 0], windows_s, strict=True):
        counts = window_counts(arrival, w)
        if counts.size:
            t = np.arange(counts.size) * w
            ax.step(t, counts / w, where="post", lw=0.8)
            ax.axhline(counts.mean() / w, color="k", ls="--", lw=0.8, label=f"mean {counts.mean() / w:.2f}")
            ax.legend(loc="upper right", fontsize=8)
        ax.set_ylabel(f"req/s ({w:g} s)")
    axes[-1, 0].set_xlabel("time since first request (s)")
    fig.suptitle(f"Arrivals per window — {table.num_rows:,} requests")
    fig.tight_layout()
    return _save(fig, path)


def plot_joint(table: pa.Table, path: Path) -> Path:
    isl = table.column("isl").to_numpy()
    osl = table.column("osl").to_numpy()
    fig = plt.figure(figsize=(7, 7))
    grid = fig.add_gridspec(4, 4, hspace=0.05, wspace=0.05)
    main = fig.add_subplot(grid[1:, :3])
    top = fig.add_subplot(grid[0, :3], sharex=main)
    right = fig.add_subplot(grid[1:, 3], sharey=main)
    hb = main.hexbin(isl, osl, gridsize=40, xscale="log", yscale="log", bins="log", mincnt=1, cmap="viridis")
    main.set_xlabel("ISL (input tokens)")
    main.set_ylabel("OSL (output tokens)")
    xbins = np.geomspace(max(isl.min(), 1), isl.max() + 1, 50)
    ybins = np.geomspace(max(osl.min(), 1), osl.max() + 1, 50)
    top.hist(isl, bins=xbins, color="tab:blue")  # type: ignore[arg-type]  # matplotlib's stubs: bins takes an array too
    right.hist(osl, bins=ybins, orientation="horizontal", color="tab:orange")  # type: ignore[arg-type]  # (as above)
    top.tick_params(labelbottom=False)
    right.tick_params(labelleft=False)
    fig.colorbar(hb, ax=right, label="requests (log)")
    top.set_title("ISL × OSL joint distribution")
    return _save(fig, path)


def plot_prefix_cdf(table: pa.Table, lru_capacities: list[int], path: Path) -> Path | None:
    """CDF over requests of the reusable share of each prompt; None when the trace has no hashes."""
    block_size = schema.block_size_of(table)
    if not block_size or table.column("prefix_hit_tokens").null_count == table.num_rows:
        return None
    isl = table.column("isl").to_numpy()
    curves = {"unbounded cache": table.column("prefix_hit_tokens").to_numpy()}
    distances = stack_distances(table.column("hash_ids"))  # one pass for every capacity
    for c in lru_capacities:
        curves[f"LRU {c:,} blocks"] = hit_tokens(reuse_at(*distances, c), isl, block_size)
    fig, ax = plt.subplots(figsize=(7, 4.5))
    ys = np.arange(1, isl.size + 1) / isl.size
    for label, hits in curves.items():
        ax.step(np.sort(hits / isl), ys, where="post", label=f"{label} (token hit {hits.sum() / isl.sum():.1%})")
    ax.set_xlabel("reusable prefix share of the prompt")
    ax.set_ylabel("fraction of requests ≤ x")
    ax.set_title(f"Prefix reuse CDF (block size {block_size})")
    ax.legend(fontsize=8)
    ax.grid(alpha=0.3)
    return _save(fig, path)


def plot_workload(table: pa.Table, windows_s: list[float], lru_capacities: list[int], out_dir: Path) -> list[Path]:
    """All workload plots into `out_dir`; returns the files written."""
    paths = [
        plot_arrivals(table, windows_s, out_dir / "arrivals.png"),
        plot_joint(table, out_dir / "isl_osl_joint.png"),
    ]
    prefix = plot_prefix_cdf(table, lru_capacities, out_dir / "prefix_reuse_cdf.png")
    return paths + ([prefix] if prefix else [])
