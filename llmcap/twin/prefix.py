"""Prefix-cache keys of a prompt, the way vLLM names its KV blocks: a hash per full block of
`block_size` token ids, chained (each block's hash covers its parent's), so two prompts share the
keys of exactly their common full-block prefix. The simulator's engine takes these as the prompt's
segments, one block each.

blake2b rather than Python's `hash`: the keys are the same in every process and run.
"""

from __future__ import annotations

import hashlib
from array import array

_KEY_BITS = 63  # positive int64: the simulator's keys are plain ints


def block_keys(token_ids: list[int], block_size: int) -> list[int]:
    """One chained key per full block of the prompt (a partial last block has none: it is never shared)."""
    keys: list[int] = []
    parent = b""
    for lo in range(0, len(token_ids) - block_size + 1, block_size):
        block = array("q", token_ids[lo : lo + block_size]).tobytes()
        digest = hashlib.blake2b(parent + block, digest_size=8).digest()
        keys.append(int.from_bytes(digest, "little") >> (64 - _KEY_BITS))
        parent = digest
    return keys


def text_token_ids(text: str) -> list[int]:
    """Stand-in token ids for a text prompt (the twin has no tokenizer): one id per 4 bytes of UTF-8,
    about what BPE tokenizers average on English. Equal text prefixes give equal ids."""
    raw = text.encode("utf-8")
    return [int.from_bytes(raw[i : i + 4], "little") for i in range(0, len(raw), 4)]
