"""Presets: which source column of a trace file feeds which canonical column, and the unit of its arrival clock.

Known formats are presets; the generic containers take the mapping from params (default: the canonical names
themselves, so llmcap's own outputs read back), and a generic file's arrival clock and max_tokens cap are found by
name when not mapped (`source_columns`). `llmcap.trace.readers` reads the columns named here.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

from llmcap.errors import InputFileError
from llmcap.trace.detect import Sniff
from llmcap.trace.params import CANONICAL_MAPPABLE, TraceParams

REQUIRED = ("isl", "osl")


@dataclass(frozen=True)
class Preset:
    container: str
    columns: dict[str, str]  # canonical -> source column
    time_unit: str  # s | ms | us | ns | datetime | auto
    block_size: int | None = None
    zero_osl_reason: str = "osl_below_1"  # BurstGPT marks failed requests with 0 response tokens


PRESETS: dict[str, Preset] = {
    "mooncake": Preset(
        "jsonl",
        {"arrival": "timestamp", "isl": "input_length", "osl": "output_length", "hash_ids": "hash_ids"},
        "ms",
        block_size=512,
    ),
    "azure": Preset("csv", {"arrival": "TIMESTAMP", "isl": "ContextTokens", "osl": "GeneratedTokens"}, "datetime"),
    "burstgpt": Preset(
        "csv",
        {
            "arrival": "Timestamp",
            "isl": "Request tokens",
            "osl": "Response tokens",
            "model": "Model",
            "tenant": "Log Type",
        },
        "s",
        zero_osl_reason="failed_request",
    ),
    "lengths": Preset("csv", {"isl": "num_prefill_tokens", "osl": "num_decode_tokens"}, "s"),
    # `vllm bench serve --save-result --save-detailed`: start_times are perf_counter seconds at send (newer
    # vLLM); a failed request has 0 output tokens. The file keeps no request's max_tokens (only the lengths it
    # measured), so its caps read as unknown
    "vllm-bench": Preset(
        "json",
        {"arrival": "start_times", "isl": "input_lens", "osl": "output_lens"},
        "s",
        zero_osl_reason="failed_request",
    ),
    # guidellm's request data (its synthetic/preprocessed datasets): lengths only, arrivals generated. guidellm sends
    # output_tokens_count as the request's max_tokens with ignore_eos (backends/openai/request_handlers.py): it is the
    # cap and, the end of sequence ignored, the output too
    "guidellm": Preset(
        "jsonl", {"isl": "prompt_tokens_count", "osl": "output_tokens_count", "max_tokens": "output_tokens_count"}, "s"
    ),
}

_DEFAULT_GENERIC = {"arrival": "arrival_s", **{c: c for c in CANONICAL_MAPPABLE if c != "arrival"}}


def preset_for(fmt: str, params: TraceParams, canonical: dict[bytes, bytes] | None) -> Preset:
    if fmt in PRESETS:
        return PRESETS[fmt]
    block_size = params.block_size
    if canonical is not None and block_size is None and canonical.get(b"llmcap.block_size"):
        block_size = int(canonical[b"llmcap.block_size"])
    return Preset(fmt, {**_DEFAULT_GENERIC, **params.columns}, params.time_unit, block_size)


def source_columns(path: Path, fmt: str, found: Sniff, preset: Preset, params: TraceParams) -> dict[str, str]:
    """Canonical -> source column for the file at `path`: the preset's mapping (a generic file: only the mapped
    columns it has, the required ones must be there), with a generic file's max_tokens and arrival clock found by name
    where not mapped; each named once in the header."""
    source_cols = {canon: src for canon, src in preset.columns.items()}
    if fmt not in PRESETS:  # generic: only the mapped columns that exist; required ones must
        source_cols = {c: s for c, s in source_cols.items() if s in found.fields or c in params.columns}
    for canon in REQUIRED:
        if canon not in source_cols or source_cols[canon] not in found.fields:
            wanted = source_cols.get(canon, _DEFAULT_GENERIC[canon])
            raise InputFileError(
                path,
                f"required column for '{canon}' is missing (have: {', '.join(found.fields)})",
                line=1,
                field=wanted,
            )
    if fmt == "vllm-bench" and "start_times" not in found.fields:
        del source_cols["arrival"]  # older vLLM wrote no send times: a length-only file, arrivals generated (and said)
    if "arrival" in source_cols and source_cols["arrival"] not in found.fields:
        if fmt in PRESETS or "arrival" in params.columns:
            raise InputFileError(
                path,
                f"the arrival-time column is missing (have: {', '.join(found.fields)})",
                line=1,
                field=source_cols["arrival"],
            )
        del source_cols["arrival"]
    if fmt not in PRESETS and "max_tokens" not in source_cols:
        cap = _cap_column(path, found)
        if cap is not None:
            source_cols["max_tokens"] = cap
    if fmt not in PRESETS and "arrival" not in source_cols:
        clock = _clock_column(path, found, params.generate_arrivals)
        if clock is not None:
            source_cols["arrival"] = clock

    _require_unique_columns(path, found, source_cols)
    return source_cols


def _require_unique_columns(path: Path, found: Sniff, source_cols: dict[str, str]) -> None:
    """A mapped column whose name appears twice in the header is ambiguous: which one is meant is not guessed."""
    for canon, name in source_cols.items():
        where = [i + 1 for i, f in enumerate(found.fields) if f == name]
        if len(where) > 1:
            raise InputFileError(
                path,
                f"the header names '{name}' {len(where)} times (columns {', '.join(map(str, where))}), so which one is "
                f"'{canon}' is ambiguous: rename or drop one",
                line=1 if found.container != "parquet" else None,
                field=name,
            )


#: Column names a generic file's arrival clock goes by (lower-cased), besides the canonical `arrival_s`.
CLOCK_NAME = re.compile(
    r"(arrival|arrived|timestamp|time|ts|t|created|created_at|start|start_time|started_at|request_time|"
    r"send_time|sent_at|submit_time|submitted_at)(_(s|ms|us|ns|sec|secs|seconds|time|timestamp|at))?"
)


def _clock_column(path: Path, found: Sniff, generate: bool) -> str | None:
    """The arrival clock of a generic file without an `arrival_s` column: the one column whose name
    says it is a clock, or None when arrivals are to be generated (asked for). Anything else is an
    error naming the candidates: an arrival process is never invented silently."""
    candidates = [f for f in found.fields if CLOCK_NAME.fullmatch(f.strip().lower())]
    if generate:
        if candidates:
            raise InputFileError(
                path,
                f"arrivals were asked to be generated, but the file has a clock column ({', '.join(candidates)}): "
                "drop --generate-arrivals or map it with -c arrival=COLUMN",
                line=1,
                field=candidates[0],
            )
        return None
    if len(candidates) == 1:
        return candidates[0]
    if candidates:
        raise InputFileError(
            path,
            f"several columns could be the arrival clock ({', '.join(candidates)}): map one with "
            "-c arrival=COLUMN (trace.columns.arrival)",
            line=1,
            field="arrival_s",
        )
    raise InputFileError(
        path,
        f"no arrival-time column (have: {', '.join(found.fields)}): map one with -c arrival=COLUMN "
        "(trace.columns.arrival), or pass --generate-arrivals (trace.generate_arrivals) to draw them from trace.arrivals",
        line=1,
        field="arrival_s",
    )


#: What OpenAI-style request bodies call the cap on output tokens: `max_tokens`, and `max_completion_tokens`, which
#: OpenAI's chat API now documents in its place (vLLM reads either).
CAP_NAMES = ("max_tokens", "max_completion_tokens")


def _cap_column(path: Path, found: Sniff) -> str | None:
    """A generic file's max_tokens column when it is not named `max_tokens` at the top level: the one field whose
    name, or the last part of its dotted path (`request.max_completion_tokens`), is a cap's name; None when there is
    none; an error naming them when there are several (which one the engine honoured is not guessed)."""
    candidates = [f for f in found.fields if f.rsplit(".", 1)[-1] in CAP_NAMES]
    if len(candidates) > 1:
        raise InputFileError(
            path,
            f"several columns could be max_tokens ({', '.join(candidates)}): map one with -c max_tokens=COLUMN",
            line=1,
            field=candidates[0],
        )
    return candidates[0] if candidates else None
