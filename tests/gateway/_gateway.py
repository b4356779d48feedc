"""A gateway in this test's event loop, in front of twins (also in this loop)."""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

import numpy as np

from llmcap.gateway import Gateway, GatewayConfig


@asynccontextmanager
async def running_gateway(config: GatewayConfig, **kw) -> AsyncIterator[Gateway]:
    gw = Gateway(config, **kw)
    await gw.start("127.0.0.1", 0)
    try:
        yield gw
    finally:
        await gw.stop()


def columns(table) -> dict[str, np.ndarray]:
    return {k: np.asarray(v) for k, v in table.to_pydict().items()}
