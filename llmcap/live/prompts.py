"""What each replayed request says: prompts with the trace's prefix sharing, and their request bodies.

Completions get the prompt as token ids (exact ISL, no tokenizer round trip). A chat message is
text, so there each token id becomes one of a few common English words that are one token in the
usual tokenizers: the ISL is approximate (the chat template adds its own tokens too), and equal
token blocks are still equal text blocks, so prefix sharing survives.
"""

from __future__ import annotations

import json

import numpy as np

from llmcap.live.client import FIRST_ORDINARY_ID, completion_body, token_prompt

APIS = {"completions": "/v1/completions", "chat": "/v1/chat/completions"}
_WORDS = [
    "the",
    "of",
    "and",
    "to",
    "in",
    "is",
    "that",
    "it",
    "for",
    "on",
    "with",
    "as",
    "was",
    "at",
    "by",
    "be",
    "this",
    "from",
    "or",
    "an",
    "are",
    "not",
    "but",
    "had",
    "his",
    "they",
    "you",
    "were",
    "her",
    "all",
    "she",
    "there",
    "one",
    "their",
    "we",
    "him",
    "been",
    "has",
    "when",
    "who",
    "will",
    "more",
    "no",
    "if",
    "out",
    "so",
    "said",
    "what",
    "up",
    "its",
    "about",
    "into",
    "than",
    "them",
    "can",
    "only",
    "other",
    "new",
    "some",
    "could",
    "time",
    "these",
    "two",
    "may",
    "then",
    "do",
    "first",
    "any",
    "my",
    "now",
    "such",
    "like",
    "our",
    "over",
]


def prompts(
    isl: np.ndarray, hash_ids: list | None, block_tokens: int | None, vocab_size: int, seed: int
) -> list[list[int]]:
    """Token ids, exactly isl[i] per request; equal hash ids give equal leading blocks of `block_tokens`."""
    out = []
    for i, n in enumerate(isl):
        unique = token_prompt(int(n), vocab_size, seed * 1_000_003 + i + 1)
        if hash_ids is None or block_tokens is None or not hash_ids[i]:
            out.append(unique)
            continue
        shared: list[int] = []
        for h in hash_ids[i]:  # a block hash always maps to the same tokens
            shared += token_prompt(block_tokens, vocab_size, (int(h) * 7919 + 17) % (2**63))
        prompt = (shared + unique)[: int(n)]
        # the tail past the shared blocks stays request-specific (unique tokens after them)
        out.append(prompt if len(prompt) == int(n) else prompt + [FIRST_ORDINARY_ID] * (int(n) - len(prompt)))
    return out


def chat_text(prompt: list[int]) -> str:
    """About one token per id: the id picks a common word."""
    return "".join(" " + _WORDS[t % len(_WORDS)] for t in prompt).lstrip()


def request_body(api: str, model: str, prompt: list[int], max_tokens: int) -> bytes:
    """The JSON body of one streamed request: exact OSL via max_tokens + ignore_eos, token ids and usage asked for."""
    body = completion_body(model, prompt, max_tokens)
    if api == "chat":
        del body["prompt"]
        body["messages"] = [{"role": "user", "content": chat_text(prompt)}]
    elif api != "completions":
        raise ValueError(f"api must be one of {sorted(APIS)}, not {api!r}")
    return json.dumps(body, separators=(",", ":")).encode()
