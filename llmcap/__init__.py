"""llmcap: LLM inference capacity planning."""
