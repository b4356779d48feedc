"""The digital twin: the simulator behind an OpenAI-compatible HTTP API, in real time.

For loop and CI tests of what talks to engines (replay, probes, autoscalers) and for fleets without
GPUs: `llmcap twin serve`. Its timings are the simulator's, never a measurement of an engine.

Public API:
    Twin(spec).start(host, port) -> base URL; .stop(); .crash()
    TwinSpec                the deployment, its step-time model and the fault knobs
    TwinClock               wall time <-> twin time (dilation) <-> engine time (slowdown, stalls)
    OnlineCluster, Flight   the simulator's event loop fed one request at a time
"""

from llmcap.twin.clock import TwinClock
from llmcap.twin.online import Flight, OnlineCluster
from llmcap.twin.server import TWIN_VERSION, Twin, TwinSpec

__all__ = ["TWIN_VERSION", "Flight", "OnlineCluster", "Twin", "TwinClock", "TwinSpec"]
