"""llmcap: LLM inference capacity planning."""

from llmcap import _native

CORE = _native.select()  # "native": the mypyc-compiled simulator core is in use; "source": the Python sources
