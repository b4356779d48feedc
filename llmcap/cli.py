"""The `llmcap` command line (typer + rich).

Sub-commands live in `llmcap.commands.*`, one module per concept; this file only wires them up, lazily:
a command's module (and the numpy/pandas/simulator stack it needs) is imported only when that command
runs or shows its own help, so `llmcap --help` and every command start fast. `COMMANDS` holds each
command's one-line help for the top-level listing (tests/test_cli_start.py keeps it equal to the
command's own). User errors print one line on stderr and exit with code 2 (`commands._common.user_errors`).
"""

from __future__ import annotations

import importlib
from typing import Annotated, Any, NamedTuple, cast

import typer
from typer.core import TyperCommand, TyperGroup  # typer carries its own click: no `import click` here


class Entry(NamedTuple):
    module: str  # under llmcap.commands
    attribute: str  # the command function, or a typer.Typer of sub-commands
    help: str  # its first help line


COMMANDS: dict[str, Entry] = {
    "trace": Entry("trace", "app", "Inspect, clean and synthesise request traces."),
    "twin": Entry(
        "twin", "app", "The digital twin: the simulator behind an OpenAI-compatible API (not a measurement)."
    ),
    "plan": Entry(
        "plan",
        "plan",
        "Run the planning loop (DVC pipeline under the Prefect flow `replan`) and print where results are.",
    ),
    "history": Entry(
        "decisions",
        "history",
        "Past decisions, newest first: date, commit, target rate, chosen config, GPUs, cost, approved by.",
    ),
    "reproduce": Entry(
        "decisions",
        "reproduce",
        "Re-run REV's pipeline in a clean worktree with its locked environment; exit 0 if every output is byte-identical.",
    ),
    "diff": Entry(
        "decisions",
        "diff",
        "What changed in the decision between A and B (GPUs, configuration, cost, headroom, max rates) and which inputs explain it.",
    ),
    "approve": Entry(
        "decisions",
        "approve",
        "Approve (or --reject) a re-plan waiting in the Prefect flow `promote`, or a rollout's next step in `rollout`.",
    ),
    "correct": Entry(
        "decisions",
        "correct",
        "Write the last plan's step-time corrections back: a new version per configuration (file + MLflow registry).",
    ),
    "memory": Entry(
        "memory", "memory", "Memory per rank: weights, runtime, KV budget and KV token capacity for MODEL on GPU."
    ),
    "simulate": Entry(
        "simulate",
        "simulate",
        "Simulate serving TRACE on REPLICAS x (MODEL on GPU, TP) and report TTFT / ITL / throughput.",
    ),
    "calibrate": Entry(
        "calibrate",
        "calibrate",
        "Fit the roofline's efficiencies for GPU to timed operations; print the cross-validation; --write ships them.",
    ),
    "perf": Entry(
        "perf",
        "perf",
        "Roofline prefill and decode step times, max batch by KV and max output throughput for MODEL on GPU.",
    ),
    "profile": Entry(
        "profile",
        "profile",
        "Profile ENDPOINT over ISL x concurrency; write points/steps parquet, fit.json and fingerprint.json to OUT.",
    ),
    "gateway": Entry(
        "gateway",
        "gateway",
        "Split traffic between a baseline and a candidate by weight, mirror a share to shadows, record every request.",
    ),
    "rollout": Entry(
        "rollout",
        "app",
        "Gradual traffic: predict each step's gates, export them for Argo Rollouts, run the rollout flow.",
    ),
    "replay": Entry(
        "replay",
        "replay",
        "Replay TRACE open loop against ENDPOINT: every request accounted for, latencies, lateness, attainment.",
    ),
    "reconcile": Entry(
        "reconcile",
        "reconcile",
        "Reconcile predicted with measured request records: e_TTFT / e_ITL per bucket and what to do about them.",
    ),
    "autoscale": Entry(
        "autoscale",
        "autoscale",
        "What-if: a diurnal day on a static pool vs autoscaled pools (simulated): GPU-hours, attainment, the floor that keeps it.",
    ),
    "pools": Entry(
        "pools",
        "pools",
        "The P/D starting count by hand: N_P = ⌈λ·H_P/G_P⌉, N_D = ⌈λ·H_D/G_D⌉, GPUs = N_P·g_P + N_D·g_D.",
    ),
    "size": Entry(
        "size",
        "size",
        "Size a deployment for a trace under its SLOs (TTFT, ITL, TPOT, E2E): candidates, simulated max rates, GPU count, cost.",
    ),
}


def load_command(name: str) -> TyperCommand | TyperGroup:
    """The click command `name` runs, its module imported now."""
    entry = COMMANDS[name]
    obj = getattr(importlib.import_module(f"llmcap.commands.{entry.module}"), entry.attribute)
    if isinstance(obj, typer.Typer):
        group = typer.main.get_group(obj)  # a group even with one sub-command (`twin serve`)
        group.name = name
        return group
    single = typer.Typer()
    single.command(name)(obj)
    return cast(TyperCommand, typer.main.get_command(single))  # one command, no callback: typer's TyperCommand


class LazyGroup(TyperGroup):
    """Lists the commands from `COMMANDS` and imports one only when it is invoked or asked for its help."""

    listing = False  # while the top-level help is drawn: stand-ins carrying the one-line help

    # ctx: typer's own click Context (typer.Context subclasses it), which typer does not export
    def list_commands(self, ctx: Any) -> list[str]:
        return list(COMMANDS)

    def get_command(self, ctx: Any, cmd_name: str) -> TyperCommand | TyperGroup | None:
        if cmd_name not in COMMANDS:
            return None
        if self.listing:
            return TyperCommand(cmd_name, help=COMMANDS[cmd_name].help)
        return load_command(cmd_name)

    def format_help(self, ctx: Any, formatter: Any) -> None:
        self.listing = True
        try:
            super().format_help(ctx, formatter)
        finally:
            self.listing = False


app = typer.Typer(
    name="llmcap",
    cls=LazyGroup,
    help="LLM inference capacity planning: from a request trace to a GPU count that meets latency SLOs.",
    no_args_is_help=True,
    pretty_exceptions_enable=False,
    add_completion=False,
)


DISTRIBUTION = "llmcap-planner"  # the name on PyPI (`llmcap` there is another program); the import package is llmcap


def _version(value: bool) -> None:
    if value:
        from importlib.metadata import PackageNotFoundError, version

        try:
            print(f"{DISTRIBUTION} {version(DISTRIBUTION)}")
        except PackageNotFoundError:  # run from a checkout that was never installed
            print(f"{DISTRIBUTION} (not installed)")
        raise typer.Exit()


@app.callback()
def _main(
    show_version: Annotated[
        bool, typer.Option("--version", callback=_version, is_eager=True, help="Print the version and exit.")
    ] = False,
    log_level: Annotated[
        str,
        typer.Option(
            "--log-level",
            envvar="LLMCAP_LOG_LEVEL",
            help="debug | info | warning | error: what the library logs on stderr.",
        ),
    ] = "warning",
) -> None:
    """LLM inference capacity planning: from a request trace to a GPU count that meets latency SLOs."""
    from llmcap.commands._common import configure_logging, user_errors

    user_errors(configure_logging)(log_level)


def main() -> None:
    app()
