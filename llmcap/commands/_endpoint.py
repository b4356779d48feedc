"""Commands that talk to a serving endpoint: which model it serves when the user did not say."""

from __future__ import annotations

import asyncio

from llmcap.errors import LlmcapError
from llmcap.live.client import endpoint_client, served_models


def first_served_model(base_url: str, shown_url: str, api_key: str | None) -> str:
    """The first model `GET /v1/models` lists (vLLM serves one); `shown_url` is the redacted URL for errors."""

    async def listed() -> list[dict]:
        url, client = endpoint_client(base_url, api_key)
        async with client:
            return await served_models(client, url)

    models = asyncio.run(listed())
    if not models:
        raise LlmcapError(f"{shown_url}/v1/models lists no model (is the server up?); pass --model")
    return str(models[0]["id"])
