#!/usr/bin/env bash
# Headless Chromium for the report-rendering test (tests/report/test_report_chromium.py): Debian's
# `chromium` package, driven by its CLI (--headless --screenshot / --dump-dom); no browser download
# of its own. Idempotent: does nothing when a chromium binary is already on PATH.
set -euo pipefail
for bin in chromium chromium-browser; do
    if command -v "$bin" >/dev/null 2>&1; then exit 0; fi
done
if [ "$(id -u)" = 0 ]; then
    SUDO=()
elif command -v sudo >/dev/null 2>&1 && sudo -n true 2>/dev/null; then
    SUDO=(sudo -n)
else
    echo "WARNING: chromium is not installed and apt-get needs root; the report-rendering test will fail" \
         "until 'apt-get install chromium' is run" >&2
    exit 0
fi
export DEBIAN_FRONTEND=noninteractive
"${SUDO[@]}" apt-get install -y -q --no-install-recommends chromium >/dev/null \
    || { "${SUDO[@]}" apt-get update -q >/dev/null && "${SUDO[@]}" apt-get install -y -q --no-install-recommends chromium >/dev/null; }
