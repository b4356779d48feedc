"""Which side serves a request: a weight on the candidate, applied to a stable hash of the request's key.

The key is the session (an `x-session-id` / `x-llmcap-session` header or the body's `user`), else the
prompt's first block (the prefix key): requests that share it land on the same side, so the prefix cache
that served the session's earlier turns stays warm. A key sits at a fixed point of [0, 1); it goes to the
candidate while that point is below the weight. Raising the weight therefore only ever moves keys from the
baseline to the candidate (never back and forth), and lowering it to 0 sends everything back.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass

SIDES = ("baseline", "candidate")
SESSION_HEADERS = ("x-session-id", "x-llmcap-session")
PREFIX_TOKENS = 256  # default prefix key: the prompt's first blocks, what a prefix cache keys on
CHARS_PER_TOKEN = 4  # the same for a text prompt or chat messages


def point(key: bytes, salt: bytes = b"") -> float:
    """A uniform, stable point of [0, 1) for a key (the same on every run, machine and process)."""
    digest = hashlib.blake2b(salt + key, digest_size=8).digest()
    return int.from_bytes(digest, "big") / 2**64


def sticky_key(headers: dict[str, str], body: dict, fallback: int, prefix_tokens: int = PREFIX_TOKENS) -> bytes:
    """The request's routing key: session, else the prompt's first `prefix_tokens` (0: no prefix key),
    else `fallback` (the arrival number). A long prefix key splits finely but keeps fewer requests
    together; a short one keeps a shared system prompt's requests on one side."""
    for h in SESSION_HEADERS:
        if headers.get(h):
            return b"session:" + headers[h].encode()
    if isinstance(body.get("user"), str) and body["user"]:
        return b"session:" + body["user"].encode()
    if prefix_tokens <= 0:
        return b"arrival:%d" % fallback
    chars = prefix_tokens * CHARS_PER_TOKEN
    prompt = body.get("prompt")
    if isinstance(prompt, list) and prompt and all(isinstance(t, int) for t in prompt[:prefix_tokens]):
        return b"prefix:" + json.dumps(prompt[:prefix_tokens]).encode()
    if isinstance(prompt, str) and prompt:
        return b"prefix:" + prompt[:chars].encode()
    messages = body.get("messages")
    if isinstance(messages, list) and messages:
        return b"prefix:" + json.dumps(messages, sort_keys=True)[:chars].encode()
    return b"arrival:%d" % fallback


@dataclass
class TrafficSplit:
    """The candidate's share of traffic (0 = all on the baseline, 1 = all on the candidate)."""

    candidate_weight: float = 0.0

    def __post_init__(self) -> None:
        self.set(self.candidate_weight)

    def set(self, weight: float) -> None:
        if not 0.0 <= weight <= 1.0:
            raise ValueError(f"the candidate weight is a share of traffic in [0, 1], not {weight}")
        self.candidate_weight = float(weight)

    def side(self, key: bytes) -> str:
        return "candidate" if point(key) < self.candidate_weight else "baseline"

    @staticmethod
    def mirrored(key: bytes, share: float, target: str) -> bool:
        """Whether a shadow target gets a copy; salted by the target so two shadows see different samples."""
        return point(key, salt=target.encode() + b"\0") < share
