"""Which model a serving endpoint serves, for a caller that was not told (`replay`, `profile`, the replay stage)."""

from __future__ import annotations

import asyncio

import httpx

from llmcap.credentials import DEFAULT_API_KEY_ENV
from llmcap.errors import LlmcapError, UnreachableError
from llmcap.live.client import endpoint_client


def first_served_model(base_url: str, shown_url: str, api_key: str | None) -> str:
    """The first model `GET /v1/models` lists (vLLM serves one); `shown_url` is the redacted URL for errors.
    A server that does not answer at all is UNREACHABLE (exit 4), not a usage error."""

    async def listed() -> list[dict]:
        url, client = endpoint_client(base_url, api_key)
        async with client:
            try:
                r = await client.get(f"{url}/v1/models", timeout=30.0)
            except httpx.HTTPError as exc:
                raise UnreachableError(
                    f"{shown_url}: no answer ({type(exc).__name__}: {str(exc) or 'no response'}): is the server up?"
                ) from None
        try:
            doc = r.json() if r.status_code == 200 else None
        except ValueError:
            doc = None
        if r.status_code in (401, 403):
            raise LlmcapError(
                f"{shown_url}/v1/models answered HTTP {r.status_code}: the endpoint wants credentials "
                f"(an API key in ${DEFAULT_API_KEY_ENV} or --api-key-env, or user:password in the URL)"
            )
        if doc is None:
            raise LlmcapError(f"{shown_url}/v1/models answered HTTP {r.status_code} without a model list; pass --model")
        return list(doc.get("data") or []) if isinstance(doc, dict) else []

    models = asyncio.run(listed())
    if not models:
        raise LlmcapError(f"{shown_url}/v1/models lists no model; pass --model")
    return str(models[0]["id"])
