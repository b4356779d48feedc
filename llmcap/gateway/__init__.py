"""The traffic gateway: an OpenAI-compatible pass-through that splits traffic between a baseline and a
candidate deployment by weight, mirrors a share to shadow targets, and records every request it saw.
Steps 6-7 of the loop (shadow traffic, gradual rollout) stand on it."""

from llmcap.gateway.proxy import Gateway, GatewayConfig, ShadowTarget
from llmcap.gateway.split import TrafficSplit

__all__ = ["Gateway", "GatewayConfig", "ShadowTarget", "TrafficSplit"]
