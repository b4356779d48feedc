#!/usr/bin/env bash
# Prometheus for the PromQL gate tests (tests/rollout): Debian's
# `prometheus` package; the tests start it themselves on loopback with their own config and data
# directory (never the system service). Idempotent: does nothing when `prometheus` is already on PATH.
set -euo pipefail
if command -v prometheus >/dev/null 2>&1; then exit 0; fi
if [ "$(id -u)" = 0 ]; then
    SUDO=()
elif command -v sudo >/dev/null 2>&1 && sudo -n true 2>/dev/null; then
    SUDO=(sudo -n)
else
    echo "WARNING: prometheus is not installed and apt-get needs root; the PromQL gate test will fail" \
         "until 'apt-get install prometheus' is run" >&2
    exit 0
fi
export DEBIAN_FRONTEND=noninteractive
"${SUDO[@]}" apt-get install -y -q --no-install-recommends prometheus >/dev/null \
    || { "${SUDO[@]}" apt-get update -q >/dev/null && "${SUDO[@]}" apt-get install -y -q --no-install-recommends prometheus >/dev/null; }
