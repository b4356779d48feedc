"""Prefect flows: the planning loop, schedules and approvals. They orchestrate; the work is in stages/ and llmcap/."""
