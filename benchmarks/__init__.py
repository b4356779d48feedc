"""Benchmarks (`make bench`): print figures, never assert on timing (these machines are shared and noisy)."""
