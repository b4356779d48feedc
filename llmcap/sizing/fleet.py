"""A trace of several models sized as a pool per model, and what one total rate would have hidden.

Different models share no weights and no KV cache (the source article's first warning about mixed traffic):
each model's requests are a class sized on their own, at their own rate with their own bursts, and the fleet is
the sum of the classes' plans. Planned as one total rate for one model (the single-model view: the most
requested model's pools for all the traffic), the same trace needs another count; the difference is what the
split costs or saves: each pool rounds its instances up and carries its own headroom and weights, while the
single view prices every request at one model's cost.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from llmcap.errors import LlmcapError


def class_traffic(table: pa.Table) -> dict[str, Any]:
    """A class's adapters (requests each) and its ideal prefix hit ratio, as ClassPlan keeps them."""
    adapters: dict[str, int] = {}
    if "adapter" in table.column_names and table.column("adapter").null_count < table.num_rows:
        adapters = {
            vc["values"]: vc["counts"] for vc in pc.value_counts(table.column("adapter").drop_null()).to_pylist()
        }
    hits = table.column("prefix_hit_tokens") if "prefix_hit_tokens" in table.column_names else None
    ratio = None
    if hits is not None and hits.null_count < table.num_rows and table.num_rows:
        ratio = float(pc.sum(hits).as_py() or 0) / float(pc.sum(table.column("isl")).as_py())
    return {"adapters": dict(sorted(adapters.items())), "prefix_hit_ratio": ratio}


def split_by_model(table: pa.Table, labels: Sequence[str], by: str = "model") -> dict[str, pa.Table]:
    """Each label's requests (the trace's `by` column, `model` by default), in the order of `labels`; every request must
    carry one of them, and every label must have requests. Each class is renumbered 0..n−1 with its own arrival times."""
    column = table.column(by)
    if column.null_count:
        raise LlmcapError(
            f"{column.null_count:,} requests carry no model label: a pool per model needs every request's `model`"
        )
    counts = {vc["values"]: vc["counts"] for vc in pc.value_counts(column).to_pylist()}
    unmapped = {k: v for k, v in sorted(counts.items()) if k not in labels}
    if unmapped:
        listed = ", ".join(f"{k} ({v:,} requests)" for k, v in unmapped.items())
        raise LlmcapError(f"the trace's model labels {listed} have no --model LABEL=MODEL: give one for each")
    absent = [label for label in labels if label not in counts]
    if absent:
        raise LlmcapError(
            f"--model {', '.join(absent)}: no request of the trace carries that model label (it has {', '.join(sorted(counts))})"
        )
    out = {}
    for label in labels:
        part = table.filter(pc.equal(column, label))
        out[label] = part.set_column(
            part.schema.get_field_index("request_id"), "request_id", pa.array(np.arange(part.num_rows, dtype=np.int64))
        )
    return out


@dataclass(frozen=True)
class ClassPlan:
    """One class's answer: its model, traffic, chosen deployment and cost (no plan: `gpus` None and why)."""

    label: str
    model: str
    requests: int
    rate_rps: float | None
    chosen: str | None
    gpus: int | None
    usd_per_hour: float | None
    verdict: str  # "passes", "fails" (the closest miss), or "no plan: <why>"
    adapters: dict[str, int] = field(default_factory=dict)  # requests per LoRA adapter served inside this pool
    adapter_cost: str = ""  # what the adapters cost the pool (slots' memory, the batching limit), "" without adapters
    prefix_hit_ratio: float | None = (
        None  # Σ reusable prefix tokens ÷ Σ prompt tokens (infinite cache, scoped ids); None: no hashes
    )

    @classmethod
    def of(cls, label: str, model: str, requests: int, summary: Mapping[str, Any], **traffic: Any) -> ClassPlan:
        return cls(
            label,
            model,
            requests,
            float(summary["target_rps"]),
            f"{summary['chosen']} ({summary['mode']})",
            int(summary["gpus"]),
            float(summary["usd_per_hour"]),
            str(summary["verdict"]),
            **traffic,
        )

    @property
    def passes(self) -> bool:
        return self.verdict == "passes"

    def line(self) -> str:
        if self.gpus is None:
            return f"{self.label} ({self.model}): {self.requests:,} requests: {self.verdict}"
        miss = "" if self.passes else " — fails a scenario: not an answer"
        return (
            f"{self.label} ({self.model}): {self.requests:,} requests at {self.rate_rps:.3g} req/s → {self.chosen}: "
            f"{self.gpus} GPUs, ${self.usd_per_hour:,.2f}/h{miss}"
        )

    def details(self) -> list[str]:
        """The class's adapters with their cost, and the prefix reuse its own cache can have."""
        out = [self.adapter_cost] if self.adapter_cost else []
        if self.prefix_hit_ratio is not None:
            out.append(
                f"prefix reuse within the pool's scopes: {self.prefix_hit_ratio:.1%} of prompt tokens (infinite cache)"
            )
        return out


@dataclass(frozen=True)
class Fleet:
    """The classes' plans, and the single-model view of the same trace (None: not computed or no plan)."""

    classes: tuple[ClassPlan, ...]
    single: ClassPlan | None
    by: str = "model"  # the label the classes are values of (model, or one model's tenant / feature)

    @property
    def passes(self) -> bool:
        return all(c.passes for c in self.classes)

    @property
    def gpus(self) -> int | None:
        return None if any(c.gpus is None for c in self.classes) else sum(c.gpus or 0 for c in self.classes)

    @property
    def usd_per_hour(self) -> float | None:
        return (
            None
            if any(c.usd_per_hour is None for c in self.classes)
            else sum(c.usd_per_hour or 0.0 for c in self.classes)
        )

    def lines(self) -> list[str]:
        total = (
            "no total: a class has no plan" if self.gpus is None else f"{self.gpus} GPUs, ${self.usd_per_hour:,.2f}/h"
        )
        noun, why = (
            ("model", "models share no weights, KV or headroom, and each prices its own requests")
            if self.by == "model"
            else (
                f"{self.by} class",
                "pools share no instances, KV or headroom, and each is sized for its own requests",
            )
        )
        kind = "models" if self.by == "model" else f"{self.by} classes"
        out = [f"fleet: {len(self.classes)} {kind} in their own pools: {total}"]
        single = self.single
        if single is not None and single.gpus is not None and self.gpus is not None:
            out.append(
                f"fragmentation: the whole trace as one total of {single.rate_rps:.3g} req/s for {single.model} alone would "
                f"need {single.gpus} GPUs (${single.usd_per_hour:,.2f}/h); a pool per {noun} needs {self.gpus} "
                f"({self.gpus - single.gpus:+d} GPUs): {why}"
            )
        elif single is not None:
            out.append(f"fragmentation: the whole trace as one total for {single.model} alone: {single.verdict}")
        return out

    def to_dict(self) -> dict[str, Any]:
        single = self.single
        return {
            "by": self.by,
            "classes": [vars(c) for c in self.classes],
            "gpus": self.gpus,
            "usd_per_hour": self.usd_per_hour,
            "passes": self.passes,
            "single_model_view": None if single is None else vars(single),
            "fragmentation_gpus": None
            if single is None or single.gpus is None or self.gpus is None
            else self.gpus - single.gpus,
        }
