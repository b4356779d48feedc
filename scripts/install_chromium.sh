#!/usr/bin/env bash
# Headless Chromium for the report-rendering test (tests/sizing/test_report_chromium.py): Debian's
# `chromium` package, driven by its CLI (--headless --screenshot / --dump-dom); no browser download
# of its own. Idempotent: does nothing when a chromium binary is already on PATH.
exec "$(dirname "$0")/apt_install.sh" chromium "chromium chromium-browser" "the report-rendering test"
