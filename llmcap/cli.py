"""The `llmcap` command line (typer + rich).

Sub-commands live in `llmcap.commands.*`, one module per concept; this file only wires them up.
User errors print one line on stderr and exit with code 2 (see `commands._common.user_errors`).
"""

from __future__ import annotations

from typing import Annotated

import typer

from llmcap.commands import decisions as decisions_cmd
from llmcap.commands import memory as memory_cmd
from llmcap.commands import perf as perf_cmd
from llmcap.commands import plan as plan_cmd
from llmcap.commands import profile as profile_cmd
from llmcap.commands import reconcile as reconcile_cmd
from llmcap.commands import replay as replay_cmd
from llmcap.commands import simulate as simulate_cmd
from llmcap.commands import size as size_cmd
from llmcap.commands import trace as trace_cmd
from llmcap.commands import twin as twin_cmd

app = typer.Typer(
    name="llmcap",
    help="LLM inference capacity planning: from a request trace to a GPU count that meets latency SLOs.",
    no_args_is_help=True,
    pretty_exceptions_enable=False,
    add_completion=False,
)


def _version(value: bool) -> None:
    if value:
        from importlib.metadata import PackageNotFoundError, version

        try:
            print(f"llmcap {version('llmcap')}")
        except PackageNotFoundError:  # run from a checkout that was never installed
            print("llmcap (not installed)")
        raise typer.Exit()


@app.callback()
def _main(
    show_version: Annotated[bool, typer.Option("--version", callback=_version, is_eager=True, help="Print the version and exit.")] = False,
) -> None:
    """LLM inference capacity planning: from a request trace to a GPU count that meets latency SLOs."""


app.add_typer(trace_cmd.app, name="trace")
app.add_typer(twin_cmd.app, name="twin")
app.command("plan")(plan_cmd.plan)
app.command("history")(decisions_cmd.history)
app.command("reproduce")(decisions_cmd.reproduce)
app.command("diff")(decisions_cmd.diff)
app.command("approve")(decisions_cmd.approve)
app.command("memory")(memory_cmd.memory)
app.command("simulate")(simulate_cmd.simulate)
app.command("perf")(perf_cmd.perf)
app.command("profile")(profile_cmd.profile)
app.command("replay")(replay_cmd.replay)
app.command("reconcile")(reconcile_cmd.reconcile)
app.command("size")(size_cmd.size)


def main() -> None:
    app()
