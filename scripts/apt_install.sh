#!/usr/bin/env bash
# apt_install.sh PACKAGE "BINARY ..." WHAT: install Debian's PACKAGE unless one of the BINARY names is on
# PATH; WHAT says which tests need it (the warning when apt-get needs root and we are not). Idempotent;
# never fails the build: a missing package fails the tests that need it, loudly.
set -euo pipefail
package=$1 binaries=$2 what=$3
for bin in $binaries; do
    if command -v "$bin" >/dev/null 2>&1; then exit 0; fi
done
if [ "$(id -u)" = 0 ]; then
    SUDO=()
elif command -v sudo >/dev/null 2>&1 && sudo -n true 2>/dev/null; then
    SUDO=(sudo -n)
else
    echo "WARNING: $package is not installed and apt-get needs root; $what will fail until 'apt-get install $package' is run" >&2
    exit 0
fi
export DEBIAN_FRONTEND=noninteractive
"${SUDO[@]}" apt-get install -y -q --no-install-recommends "$package" >/dev/null \
    || { "${SUDO[@]}" apt-get update -q >/dev/null && "${SUDO[@]}" apt-get install -y -q --no-install-recommends "$package" >/dev/null; }
