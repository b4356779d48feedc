"""Format auto-detection from the first bytes of a file, with clear errors for unusable files."""

from __future__ import annotations

import csv
import io
import json
from dataclasses import dataclass
from pathlib import Path

from llmcap.errors import InputFileError
from llmcap.trace._lines import UTF8_BOM
from llmcap.trace.source import require_file

SNIFF_BYTES = 64 * 1024
PARQUET_MAGIC = b"PAR1"


@dataclass(frozen=True)
class Sniff:
    container: str  # "csv" | "jsonl" | "json" (one document of per-request lists) | "parquet"
    fields: tuple[
        str, ...
    ]  # CSV header (names stripped of surrounding spaces) / first JSON object's keys / parquet columns
    bom: bool
    raw_fields: tuple[str, ...] = ()  # CSV: the header names as written

    def __post_init__(self) -> None:
        if not self.raw_fields:
            object.__setattr__(self, "raw_fields", self.fields)


def sniff(path: Path) -> Sniff:
    """Look at the start of `path`; raise one clear error when it cannot be a trace at all."""
    require_file(path)
    with path.open("rb") as fh:
        head = fh.read(SNIFF_BYTES)
    if head.startswith(PARQUET_MAGIC):
        import pyarrow.parquet as pq

        try:
            return Sniff("parquet", tuple(pq.read_schema(path).names), False)
        except Exception as exc:  # pyarrow raises several types for broken footers
            raise InputFileError(path, f"unreadable Parquet file ({exc})") from None
    if head.startswith((b"\xff\xfe", b"\xfe\xff")):
        raise InputFileError(path, "UTF-16 text; llmcap reads UTF-8 (convert it: iconv -f UTF-16 -t UTF-8)", line=1)
    bom = head.startswith(UTF8_BOM)
    body = head[3:] if bom else head
    if not body.strip():
        raise InputFileError(path, "file is empty", line=1)
    nul = body.find(b"\x00")
    if nul >= 0:
        raise InputFileError(
            path, f"binary data (NUL byte at offset {nul}), not a text trace", line=body.count(b"\n", 0, nul) + 1
        )
    text = _decode_prefix(path, body)
    first = next(line for line in text.splitlines() if line.strip())
    first_line_no = text.splitlines().index(first) + 1
    if first.lstrip().startswith("{"):
        try:
            keys = tuple(json.loads(first))
        except json.JSONDecodeError as exc:
            document = _json_document_keys(path) if first.strip() == "{" else None  # pretty-printed: one document
            if document is None:
                raise InputFileError(path, f"first record is not valid JSON ({exc.msg})", line=first_line_no) from None
            return Sniff("json", document, bom)
        # one JSON document of per-request lists (`vllm bench serve --save-detailed`), not one record per line
        if set(keys) >= JSON_DOCUMENT_KEYS:
            return Sniff("json", keys, bom)
        return Sniff("jsonl", flat_keys(json.loads(first)), bom)
    header = next(csv.reader(io.StringIO(first)))
    if len(header) == 1:
        for delim, name in ((";", "semicolon"), ("\t", "tab"), ("|", "pipe")):
            if delim in first:
                raise InputFileError(
                    path, f"header is {name}-separated; llmcap reads comma-separated CSV", line=first_line_no
                )
    return Sniff("csv", tuple(h.strip() for h in header), bom, raw_fields=tuple(header))


def flat_keys(obj: dict, prefix: str = "") -> tuple[str, ...]:
    """A JSON record's field names, nested objects' fields by their dotted path (`response.usage.prompt_tokens`)."""
    out: list[str] = []
    for key, value in obj.items():
        name = f"{prefix}{key}"
        out.extend(flat_keys(value, name + ".") if isinstance(value, dict) and value else (name,))
    return tuple(out)


#: Keys of a JSON document that holds a trace as per-request lists (vLLM's benchmark results).
JSON_DOCUMENT_KEYS = frozenset({"input_lens", "output_lens"})
MAX_JSON_DOCUMENT_BYTES = 1 << 30


def _json_document_keys(path: Path) -> tuple[str, ...] | None:
    """The top-level keys of a pretty-printed JSON document of per-request lists, else None."""
    if path.stat().st_size > MAX_JSON_DOCUMENT_BYTES:
        return None
    try:
        doc = json.loads(path.read_bytes())
    except (json.JSONDecodeError, UnicodeDecodeError):
        return None
    return tuple(doc) if isinstance(doc, dict) and set(doc) >= JSON_DOCUMENT_KEYS else None


def _decode_prefix(path: Path, body: bytes) -> str:
    # The sniff window may cut a multi-byte character at its end: ignore only that tail.
    try:
        return body.decode("utf-8")
    except UnicodeDecodeError as exc:
        if exc.start >= len(body) - 3 and len(body) == SNIFF_BYTES:
            return body[: exc.start].decode("utf-8")
        line = body.count(b"\n", 0, exc.start) + 1
        raise InputFileError(
            path, f"not UTF-8 text (byte 0x{body[exc.start]:02x} at offset {exc.start})", line=line
        ) from None


#: Known formats: the container they come in and the header fields that identify them.
SIGNATURES: dict[str, tuple[str, frozenset[str]]] = {
    "mooncake": ("jsonl", frozenset({"timestamp", "input_length", "output_length"})),
    "azure": ("csv", frozenset({"TIMESTAMP", "ContextTokens", "GeneratedTokens"})),
    "burstgpt": ("csv", frozenset({"Timestamp", "Request tokens", "Response tokens"})),
    "lengths": ("csv", frozenset({"num_prefill_tokens", "num_decode_tokens"})),
    "vllm-bench": ("json", frozenset({"input_lens", "output_lens"})),
    "guidellm": ("jsonl", frozenset({"prompt_tokens_count", "output_tokens_count"})),
}


def detect_format(path: Path, forced: str = "auto") -> tuple[str, Sniff]:
    """The trace format of `path`: a known one when its fields match, else the generic container."""
    found = sniff(path)
    if forced != "auto":
        expected = SIGNATURES[forced][0] if forced in SIGNATURES else forced
        if expected != found.container:
            raise InputFileError(
                path, f"--format {forced} expects {expected}, but the file looks like {found.container}"
            )
        return forced, found
    fields = set(found.fields)
    for name, (container, signature) in SIGNATURES.items():
        if container == found.container and signature <= fields:
            return name, found
    # Near misses are the common mistake: say which identifying column is missing.
    for name, (container, signature) in SIGNATURES.items():
        if container == found.container and len(signature & fields) >= 2:
            missing = sorted(signature - fields)[0]
            raise InputFileError(
                path, f"looks like a {name} trace but the required column is missing", line=1, field=missing
            )
    return found.container, found
