"""The catalog, memory and candidates modules stay pure: no orchestration imports."""

import subprocess
import sys


def test_no_orchestration_imports():
    code = (
        "import sys, llmcap.catalog, llmcap.memory, llmcap.candidates, llmcap.commands.memory\n"
        "bad = [m for m in ('prefect', 'dvc', 'mlflow', 'great_expectations') if m in sys.modules]\n"
        "assert not bad, bad\n"
    )
    subprocess.run([sys.executable, "-c", code], check=True)
