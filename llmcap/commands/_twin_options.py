"""The options of `llmcap twin serve` (`llmcap.commands.twin`) beyond the deployment's (`_deployment`), as types:
where it listens and how the twin behaves (`llmcap.twin.TwinSpec`); the defaults stay in the command's signature."""

from __future__ import annotations

from typing import Annotated

import typer

HostOpt = Annotated[str, typer.Option(help="address to bind (fault knobs answer loopback clients only)")]
PortOpt = Annotated[int, typer.Option(min=0, max=65535, help="port (0: any free one; the printed URL says which)")]
ServedModelNameOpt = Annotated[str | None, typer.Option(help="model id clients send (default: the catalog name)")]
DilationOpt = Annotated[
    float, typer.Option(min=1e-6, help="wall seconds per simulated second (10: ten times slower than real time)")
]
SlowdownOpt = Annotated[
    float, typer.Option(min=1e-6, help="fault: every engine step takes this many times its simulated time")
]
ErrorRateOpt = Annotated[
    float, typer.Option(min=0.0, max=1.0, help="fault: share of completion requests answered HTTP 500 (seeded)")
]
CrashAfterOpt = Annotated[
    int | None, typer.Option(min=0, help="fault: the request after this many kills the twin (streams cut, exit 3)")
]
StallSOpt = Annotated[
    float, typer.Option(min=0.0, help="fault: the engine produces nothing for this many simulated seconds ...")
]
StallAtOpt = Annotated[float, typer.Option(min=0.0, help="... starting this many simulated seconds after start")]
LongPromptSlowdownOpt = Annotated[
    float,
    typer.Option(
        min=1e-6,
        help="fault: steps whose prefill reaches past --long-prompt-tokens take this many times their simulated time",
    ),
]
LongPromptTokensOpt = Annotated[
    int, typer.Option(min=1, help="... the context length from which --long-prompt-slowdown applies")
]
TwinSeedOpt = Annotated[int, typer.Option(help="seed of the error draws and the power-of-two router")]
MaxInFlightOpt = Annotated[int, typer.Option(min=1, help="requests in flight at once; more are answered 503")]
EngineVersionOpt = Annotated[
    str, typer.Option(help="the version GET /version reports (another value stands for an engine upgrade)")
]
