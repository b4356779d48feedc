"""The command line starts fast: `llmcap --help` imports no command, a command imports only its own module.

(How fast is `make bench`'s figure; here, what makes it fast: which modules a process has loaded.)"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
from typer.testing import CliRunner

from llmcap.cli import COMMANDS, app, load_command

ROOT = Path(__file__).resolve().parents[1]
HEAVY = ("numpy", "pandas", "pyarrow", "scipy", "matplotlib", "llmcap.sim", "llmcap.sizing", "llmcap.commands.size")


def _loaded_after(args: list[str]) -> dict:
    code = (
        "import sys, json\nfrom llmcap.cli import main\nsys.argv = ['llmcap', *json.loads(sys.argv[1])]\n"
        "try:\n    main()\nexcept SystemExit as e:\n    code = e.code\n"
        f"print(json.dumps({{'heavy': sorted(m for m in {HEAVY!r} if m in sys.modules), 'commands': sorted(m for m in sys.modules if m.startswith('llmcap.commands.'))}}))"
    )
    out = subprocess.run(
        [sys.executable, "-c", code, json.dumps(args)], capture_output=True, text=True, check=True, cwd=ROOT
    )
    return json.loads(out.stdout.strip().splitlines()[-1])


def test_top_level_help_lists_every_command_and_imports_none():
    loaded = _loaded_after(["--help"])
    assert loaded == {"heavy": [], "commands": []}
    shown = CliRunner().invoke(app, ["--help"]).stdout
    assert all(name in shown for name in COMMANDS)


def test_a_command_imports_its_own_module_only():
    loaded = _loaded_after(["memory", "--help"])
    assert (
        loaded["commands"] == ["llmcap.commands._common", "llmcap.commands.memory"]
        and "llmcap.sim" not in loaded["heavy"]
    )


@pytest.mark.parametrize("name", list(COMMANDS))
def test_the_listing_says_what_the_command_says(name):
    cmd = load_command(name)
    assert cmd.name == name and (cmd.help or "").strip().splitlines()[0] == COMMANDS[name].help
    assert CliRunner().invoke(app, [name, "--help"]).exit_code == 0


def test_an_unknown_command_is_a_usage_error():
    r = CliRunner().invoke(app, ["sizes"])
    assert r.exit_code == 2 and "No such command 'sizes'" in r.output
