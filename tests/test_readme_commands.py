"""Every command in the README runs as written.

The commands are read from README.md itself: the `bash` blocks, the command-line synopsis (a `text` block:
grammar, not a command) and inline code that starts with a tool's name. For each one:

- an `llmcap` command names a real (sub)command and only options it has; one in a `bash` block also parses
  as written, arguments and values included;
- a `make` target exists in the Makefile;
- a `dvc`, `git`, `uv`, `pip` or `mlflow` command is accepted by that tool up to its help, and each option
  it names is in that help.

The first section's block ("Plan for your own trace") is run as written, in bash, on the shipped trace, and
the answer the README states after it is compared with the plan it wrote. The other blocks start servers
or the whole pipeline; tests/pipeline runs what they do.
"""

from __future__ import annotations

import json
import os
import re
import shlex
import shutil
import subprocess
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from functools import cache
from pathlib import Path
from typing import Any

import pytest
import typer
from typer._click.exceptions import UsageError  # typer carries its own click
from typer.core import TyperGroup

from llmcap.cli import app

ROOT = Path(__file__).resolve().parents[1]
README = ROOT / "README.md"
TOOLS = ("llmcap", "make", "dvc", "git", "uv", "pip", "mlflow")
FENCE = re.compile(r"^\s*```(\w*)\s*$")
INLINE = re.compile(rf"`((?:{'|'.join(TOOLS)}) [^`]+)`")
OPTION = re.compile(r"(?<![\w/.-])(--?[A-Za-z][\w-]*)")
QUICK_START = "Plan for your own trace"


@dataclass(frozen=True)
class Command:
    line: int  # where it starts in README.md
    text: str  # continuations joined; in a bash block, the variables of the block's assignments substituted
    kind: str  # "bash" (runs as written), "text" (synopsis grammar) or "inline"
    section: str  # the `##` heading above it

    @property
    def tool(self) -> str:
        return self.text.split()[0]


def _bash_commands(block: list[tuple[int, str]], section: str) -> Iterator[Command]:
    """A bash block's commands: continuations joined, comments dropped, `a && b` split, `$VAR` filled in."""
    variables: dict[str, str] = {}
    pending: list[str] = []
    start = 0
    for number, raw in block:
        if not pending:
            start = number
        pending.append(raw.rstrip().removesuffix("\\"))
        if raw.rstrip().endswith("\\"):
            continue
        tokens, pending = shlex.split(" ".join(pending), comments=True), []
        while tokens:
            head, tokens = (
                (tokens[: tokens.index("&&")], tokens[tokens.index("&&") + 1 :]) if "&&" in tokens else (tokens, [])
            )
            if len(head) == 1 and re.fullmatch(r"[A-Za-z_]\w*=\S+", head[0]):
                name, value = head[0].split("=", 1)
                variables[name] = value
                continue
            filled = [variables.get(t[1:], t) if t.startswith("$") else t for t in head]
            yield Command(start, shlex.join(filled), "bash", section)


def _synopsis_commands(block: list[tuple[int, str]], section: str) -> Iterator[Command]:
    """The synopsis's `llmcap …` entries, each with its indented continuation lines."""
    current: tuple[int, list[str]] | None = None
    for number, raw in block:
        if raw.startswith("llmcap "):
            if current:
                yield Command(current[0], " ".join(current[1]), "text", section)
            current = (number, [raw.strip()])
        elif raw.startswith(" ") and current:
            current[1].append(raw.strip())
        elif current:
            yield Command(current[0], " ".join(current[1]), "text", section)
            current = None
    if current:
        yield Command(current[0], " ".join(current[1]), "text", section)


def readme_commands() -> list[Command]:
    commands: list[Command] = []
    section, fence = "", None
    block: list[tuple[int, str]] = []
    for number, raw in enumerate(README.read_text(encoding="utf-8").splitlines(), 1):
        opened = FENCE.match(raw)
        if fence is None and opened:
            fence, block = opened.group(1), []
            continue
        if fence is not None:
            if opened:
                if fence == "bash":
                    commands.extend(_bash_commands(block, section))
                elif fence == "text":
                    commands.extend(_synopsis_commands(block, section))
                fence = None
            else:
                block.append((number, raw.strip() if fence == "bash" else raw))
            continue
        if raw.startswith("## "):
            section = raw[3:].strip()
        commands.extend(
            Command(number, part.strip(), "inline", section)
            for m in INLINE.finditer(raw)
            for part in m.group(1).split(" && ")
        )
    return commands


COMMANDS = readme_commands()


def _ids(commands: list[Command]) -> list[str]:
    return [f"L{c.line}-{c.kind}-{c.text[:48]}" for c in commands]


# -- llmcap ------------------------------------------------------------------------------------------------

ROOT_GROUP = typer.main.get_command(app)
ROOT_OPTIONS = {o for p in ROOT_GROUP.params for o in (*p.opts, *p.secondary_opts)} | {"--help"}


def _resolve(words: list[str]) -> tuple[list[Any], list[str], list[str]]:
    """The commands `llmcap words…` reaches (several for `history|reproduce|diff`), the words left, and the names not found."""
    ctx = typer.Context(ROOT_GROUP, info_name="llmcap")
    reached: list[Any] = [ROOT_GROUP]
    rest = list(words)
    while rest and isinstance(reached[0], TyperGroup) and re.fullmatch(r"[a-z]+(\|[a-z]+)*", rest[0]):
        names = rest.pop(0).split("|")
        found = [reached[0].get_command(ctx, name) for name in names]
        missing = [n for n, c in zip(names, found, strict=True) if c is None]
        if missing:
            return [], rest, missing
        reached = found
    return reached, rest, []


def _options(command: Any) -> set[str]:
    return {
        o for p in command.params if p.param_type_name == "option" for o in (*p.opts, *p.secondary_opts)
    } | ROOT_OPTIONS


def llmcap_problems(command: Command) -> list[str]:
    """What is wrong with an `llmcap` command: a command or option that does not exist; in a bash block, not parsing as written."""
    words = shlex.split(command.text)[1:] if command.kind == "bash" else command.text.split()[1:]
    reached, rest, missing = _resolve(words)
    if missing:
        return [f"llmcap has no command {' '.join(missing)}"]
    named = set(OPTION.findall(command.text))
    problems = [
        f"{t.name} has no option {', '.join(sorted(named - _options(t)))}" for t in reached if named - _options(t)
    ]
    if command.kind == "bash" and not problems:
        (target,) = reached
        try:
            target.make_context(target.name, rest, parent=typer.Context(ROOT_GROUP, info_name="llmcap"))
        except UsageError as exc:  # BadParameter and NoSuchOption included
            problems.append(f"does not parse: {exc.format_message()}")
    return problems


LLMCAP = [c for c in COMMANDS if c.tool == "llmcap"]


@pytest.mark.parametrize("command", LLMCAP, ids=_ids(LLMCAP))
def test_llmcap_commands_name_real_commands_and_options(command: Command) -> None:
    assert not llmcap_problems(command), f"README line {command.line}: `{command.text}`: {llmcap_problems(command)}"


def test_the_readme_has_commands_of_every_kind() -> None:
    """The reader above finds what it is meant to: a broken fence or pattern would leave the tests with nothing to check."""
    kinds = {(c.kind, c.tool) for c in COMMANDS}
    assert {
        ("bash", "llmcap"),
        ("text", "llmcap"),
        ("inline", "llmcap"),
        ("bash", "make"),
        ("inline", "dvc"),
        ("inline", "git"),
    } <= kinds
    assert any(c.section == QUICK_START and c.kind == "bash" and " size " in c.text for c in LLMCAP)
    synopsis = {c.text.split()[1] for c in COMMANDS if c.kind == "text"}
    assert {"size", "simulate", "replay", "trace", "rollout"} <= synopsis


# -- make and the other tools ------------------------------------------------------------------------------

MAKE_TARGETS = set(re.findall(r"^([\w-]+):", (ROOT / "Makefile").read_text(encoding="utf-8"), re.MULTILINE))


def make_problems(command: Command) -> list[str]:
    target = command.text.split()[1]
    return (
        []
        if target in MAKE_TARGETS or not re.fullmatch(r"[\w-]+", target)
        else [f"the Makefile has no target {target}"]
    )


def _tool(name: str) -> list[str]:
    """How this checkout runs `name`: its venv's dvc and mlflow, the uv `make` found, git, the base interpreter's pip."""
    if name in ("dvc", "mlflow"):
        return [str(ROOT / ".venv" / "bin" / name)]
    if name == "uv":
        return [os.environ.get("UV") or shutil.which("uv") or str(ROOT / ".tools" / "bin" / "uv")]
    if name == "pip":  # the venv (uv's) has no pip: the interpreter it was made from, as a user's pip is
        return [str(Path(sys.base_prefix) / "bin" / "python3"), "-m", "pip"]
    return [name]


@cache
def _help(argv: tuple[str, ...]) -> tuple[int, str]:
    done = subprocess.run(
        argv,
        capture_output=True,
        text=True,
        timeout=120,
        cwd=ROOT,
        env=os.environ | {"NO_COLOR": "1", "COLUMNS": "200"},
    )
    return done.returncode, done.stdout + done.stderr


def tool_problems(command: Command) -> list[str]:
    """What dvc, git, uv, pip or mlflow say of the command up to their help, and the options their help lacks."""
    words = [w for w in shlex.split(command.text.replace("[", " ").replace("]", " "))[1:] if w != "|"]
    asked = "-h" if command.tool == "git" else "--help"  # git's --help opens a man page; -h prints the usage
    code, text = _help((*_tool(command.tool), *words, asked))
    if code not in ((0, 129) if command.tool == "git" else (0,)):
        return [f"{command.tool} exits {code}: {text[-400:]}"]
    return [
        f"{command.tool}'s help has no {o}"
        for o in OPTION.findall(command.text)
        if o.startswith("--") and o not in text
    ]


CHECKS = {"llmcap": llmcap_problems, "make": make_problems} | dict.fromkeys(
    ("dvc", "git", "uv", "pip", "mlflow"), tool_problems
)
OTHER = [c for c in COMMANDS if c.tool != "llmcap"]


@pytest.mark.parametrize("command", OTHER, ids=_ids(OTHER))
def test_other_commands_are_accepted(command: Command) -> None:
    assert not CHECKS[command.tool](command), (
        f"README line {command.line}: `{command.text}`: {CHECKS[command.tool](command)}"
    )


@pytest.mark.parametrize(
    ("text", "kind"),
    [
        ("llmcap sizes --trace T", "inline"),  # no such command
        ("llmcap history|reproduc", "inline"),  # one of the alternatives misspelt
        ("llmcap size --trace FILE [--no-such-flag]", "text"),  # no such option
        ("llmcap approve RUN --by", "bash"),  # an option without its value
        ("llmcap simulate --trace t.csv --seed many", "bash"),  # a value of the wrong type
        ("make plans", "bash"),
        ("dvc repro --no-such-flag", "inline"),
        ("git commit --no-such-flag", "inline"),
        ("mlflow ui --no-such-flag", "inline"),
        ("dvc no-such-command", "inline"),
    ],
)
def test_each_check_finds_a_planted_mistake(text: str, kind: str) -> None:
    command = Command(0, text, kind, "")
    assert CHECKS[command.tool](command)


# -- the first section, run as written ------------------------------------------------------------------


def _quick_start_block() -> str:
    """The first `bash` block of the quick-start section, verbatim."""
    lines = README.read_text(encoding="utf-8").split(f"## {QUICK_START}", 1)[1].splitlines()
    start = next(i for i, line in enumerate(lines) if FENCE.match(line) and FENCE.match(line).group(1) == "bash")  # type: ignore[union-attr]
    end = next(i for i in range(start + 1, len(lines)) if FENCE.match(lines[i]))
    return "\n".join(line.strip() for line in lines[start + 1 : end])


def _stated_answer() -> re.Match[str]:
    """The answer the README says the block prints."""
    section = README.read_text(encoding="utf-8").split(f"## {QUICK_START}", 1)[1].split("\n## ", 1)[0]
    stated = re.search(
        r"(\d+) prefill instances of (\S+) TP(\d+) and\s+(\d+) decode instances of (\S+) TP(\d+), (\d+) GPUs, \$(\d+)/h",
        section,
    )
    assert stated, "the quick start no longer states the answer its block prints"
    return stated


@dataclass(frozen=True)
class QuickStart:
    done: subprocess.CompletedProcess[str]
    cwd: Path


@pytest.fixture(scope="module")
def quick_start(tmp_path_factory: pytest.TempPathFactory) -> QuickStart:
    """The quick start's block run in bash as written, in a directory whose `data` is the checkout's."""
    cwd = tmp_path_factory.mktemp("quick_start")
    (cwd / "data").symlink_to(ROOT / "data")  # the block's relative paths, its outputs kept out of the checkout
    env = {k: v for k, v in os.environ.items() if k != "COLUMNS"} | {
        "PATH": f"{ROOT / '.venv' / 'bin'}{os.pathsep}{os.environ['PATH']}"
    }
    done = subprocess.run(
        ["bash", "-euo", "pipefail", "-c", _quick_start_block()],
        cwd=cwd,
        env=env,
        capture_output=True,
        text=True,
        timeout=1800,
    )
    return QuickStart(done, cwd)


@pytest.mark.slow
def test_quick_start_runs_as_written_and_prints_the_answer_it_states(quick_start: QuickStart) -> None:
    done = quick_start.done
    assert done.returncode == 0, (
        f"the quick start exited {done.returncode}:\n{done.stdout[-2000:]}\n{done.stderr[-2000:]}"
    )
    summary = json.loads((quick_start.cwd / "my_plan" / "summary.json").read_text(encoding="utf-8"))
    p_count, p_gpu, p_tp, d_count, d_gpu, d_tp, gpus, usd = _stated_answer().groups()
    pools = summary["pool_plans"]
    for pool, count, gpu, tp in (("prefill", p_count, p_gpu, p_tp), ("decode", d_count, d_gpu, d_tp)):
        configuration = pools[pool]["configuration"]
        assert pools[pool]["instances"] == int(count), (
            f"{pool}: {pools[pool]['instances']} instances, the README says {count}"
        )
        assert configuration.startswith(gpu) and f"/tp{tp}pp" in configuration, (
            f"{pool}: {configuration}, the README says {gpu} TP{tp}"
        )
    assert (summary["gpus"], summary["usd_per_hour"]) == (int(gpus), float(usd)), "the README's GPUs and $/h"
    assert f"{int(gpus)} GPUs" in done.stdout and f"${float(usd):.2f}/h" in done.stdout, (
        "the console states the same answer"
    )
    assert (quick_start.cwd / "my_plan" / "capacity.html").is_file()
    assert re.search(r"scenario 'traffic' .*→ pass", done.stdout), "`simulate --plan` replays the plan and it passes"


@pytest.mark.slow
def test_simulate_plan_exits_slo_missed_on_the_plans_own_one_fewer_evidence(
    quick_start: QuickStart, tmp_path: Path
) -> None:
    """`simulate --plan` is a check: the sizer's own one-fewer count for a scenario, replayed outside it, misses (exit 6)."""
    assert quick_start.done.returncode == 0, "the quick start did not write a plan"
    trace = ROOT / "data" / "raw" / "mooncake" / "conversation_trace.jsonl"
    summary = json.loads((quick_start.cwd / "my_plan" / "summary.json").read_text(encoding="utf-8"))
    evidence = next(line for line in summary["minimality"] if "node loss: prefill" in line)
    counts = {
        pool: int(n)
        for pool, n in re.findall(r"(prefill|decode) (\d+)", evidence.split("node loss: prefill", 1)[1].split("]")[0])
    }
    summary["deployment"]["scenarios"]["node loss: prefill"] = counts
    one_fewer = tmp_path / "one_fewer.json"
    one_fewer.write_text(json.dumps(summary), encoding="utf-8")
    done = subprocess.run(
        [
            str(ROOT / ".venv" / "bin" / "llmcap"),
            "simulate",
            "--plan",
            str(one_fewer),
            "--trace",
            str(trace),
            "--scenario",
            "node loss: prefill",
            "--json",
        ],
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert done.returncode == 6, f"one fewer exited {done.returncode}: {done.stderr[-2000:]}"
    replayed = json.loads(done.stdout)
    assert replayed["counts"] == counts and replayed["plan_check"]["passes"] is False
    stated = float(re.search(r"attainment (\d\.\d+)", evidence).group(1))  # type: ignore[union-attr]
    assert replayed["plan_check"]["attainment"] == pytest.approx(stated, abs=5e-5), (
        "the replay reproduces the sizer's own figure"
    )
