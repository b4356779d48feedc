#!/usr/bin/env bash
# Prometheus for the PromQL gate test (tests/rollout/test_promql_gates.py): Debian's `prometheus`
# package; the test starts it itself on loopback with its own config and data directory (never the
# system service). Idempotent: does nothing when `prometheus` is already on PATH.
exec "$(dirname "$0")/apt_install.sh" prometheus prometheus "the PromQL gate test"
