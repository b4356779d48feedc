# llmcap — two commands on a fresh machine: `make plan` and `make test`.
SHELL := /bin/bash
ROOT := $(abspath $(dir $(lastword $(MAKEFILE_LIST))))
VENV := $(ROOT)/.venv
PY := $(VENV)/bin/python
WORK := $(ROOT)/.work

# uv: $UV when given (a path or a command name), else the one on PATH, else bootstrap it with pip into
# .tools/ (no manual installs). With uv and the locked packages already present nothing needs the network;
# UV_OFFLINE=1 makes sure of it.
ifneq ($(origin UV),undefined)
UV_GIVEN := $(UV)
override UV := $(shell command -v $(UV_GIVEN) 2>/dev/null)
$(if $(UV),,$(error UV=$(UV_GIVEN) is not an executable uv))
else
UV := $(shell command -v uv 2>/dev/null || echo $(ROOT)/.tools/bin/uv)
endif
export UV

# Measured gotchas of the stack (docs/stack-notes.md): everything writable lives in .work/. The list is
# stages/env.py's (the one the stages, flows and tests apply too); only what must be set before Python starts is here.
# The MLflow store is not: stages/env.py takes it from params.yaml `stores:` (or MLFLOW_TRACKING_URI when set).
$(foreach setting,$(shell python3 $(ROOT)/stages/env.py $(WORK)),$(eval export $(setting)))
export PREFECT_LOGGING_LEVEL := WARNING
export GIT_AUTHOR_NAME ?= llmcap
export GIT_AUTHOR_EMAIL ?= llmcap@localhost
export GIT_COMMITTER_NAME ?= llmcap
export GIT_COMMITTER_EMAIL ?= llmcap@localhost
export PYTHONHASHSEED := 0
export PATH := $(VENV)/bin:$(PATH)

.PHONY: plan test bench mutants setup dist clean-work server server-stop serve store store-stop

setup: $(VENV)/.synced $(VENV)/.native
	@$(PY) -m compileall -q -j 0 llmcap stages flows > /dev/null  # bytecode of our own sources too (written even where PYTHONDONTWRITEBYTECODE is set)

# The simulator core compiled with mypyc (scripts/build_native.py, llmcap/_native.py); rebuilt when
# one of its sources changes. On failure the sources run (slower) and tests/sim/test_native.py says so.
$(VENV)/.native: $(VENV)/.synced $(wildcard llmcap/sim/*.py) llmcap/perf/roofline_scalar.py llmcap/trace/lru.py llmcap/_native.py scripts/build_native.py
	@$(PY) scripts/build_native.py > $(WORK)/native-build.log 2>&1 && touch $@ \
		|| { tail -20 $(WORK)/native-build.log; echo "WARNING: the simulator core did not compile; see $(WORK)/native-build.log"; }

$(ROOT)/.tools/bin/uv:
	python3 -m venv $(ROOT)/.tools
	$(ROOT)/.tools/bin/pip install --quiet uv

$(VENV)/.synced: pyproject.toml uv.lock | $(UV)
	$(UV) sync --frozen --python 3.11 --extra pipeline --compile-bytecode  # every process would otherwise recompile every module
	@mkdir -p $(WORK) $(PREFECT_HOME) $(DVC_SITE_CACHE_DIR) $(MPLCONFIGDIR)
	@touch $@

plan: setup
	$(PY) -m flows.replan

# Two passes: first the tests that judge wall-clock timing (marks `live`: the real engine against its own
# repeatability; `timing`: the twin and the load generator), one at a time, alone on the machine, where
# other work would be noise; then every other test on both cores (pytest-xdist, a file per worker: a
# module-scoped project is set up once and its tests run in order; each worker has its own
# state dir, tests/conftest.py). Both always run; either failing fails.
# `make test PYTEST_ARGS="tests/x.py -k y"` runs just those, in one pass.
test: setup
	@scripts/install_chromium.sh  # the report-rendering test's browser (Debian's chromium; idempotent)
	@scripts/install_prometheus.sh  # the PromQL gate tests' server (Debian's prometheus; idempotent)
ifeq ($(strip $(PYTEST_ARGS)),)
	@t0=$$(date +%s); $(PY) -m pytest -m "live or timing"; timed=$$?; t1=$$(date +%s); \
	$(PY) -m pytest -m "not live and not timing" -n 2 --dist loadfile; rest=$$?; t2=$$(date +%s); \
	echo "make test: timed pass exit $$timed in $$((t1 - t0)) s, the rest exit $$rest in $$((t2 - t1)) s"; test $$timed -eq 0 -a $$rest -eq 0
else
	$(PY) -m pytest $(PYTEST_ARGS)
endif

# Schedules and approvals need a Prefect server (`make plan` does not: it runs on an ephemeral one).
server: setup
	$(PY) -m flows.server start

server-stop:
	$(PY) -m flows.server stop

serve: setup
	$(PY) -m flows.serve

# The team's decision stores (ops/mlflow_server.py, README "Team stores"): an MLflow tracking server (SQL
# backend and artifacts in STORE_DIR, default .work/store; port LLMCAP_MLFLOW_PORT, default 5000; PID in
# .work/mlflow-server/server.json, stopped by it). Clones use it through params.yaml `stores:`.
store: setup
	$(PY) -m ops.mlflow_server start $(if $(STORE_DIR),--dir $(STORE_DIR))

store-stop:
	$(PY) -m ops.mlflow_server stop

bench: setup
	$(PY) -m benchmarks

# Wheels in dist/ (ops/dist.py): the pure-Python one, and one with the compiled core for this CPython on
# manylinux x86_64 (hatch_build.py packs it; auditwheel tags it). pip picks the compiled one where it fits.
dist: setup
	$(PY) -m ops.dist dist

# Mutation testing of the decision code by its fast tests ([tool.mutmut] in pyproject.toml; not part of
# make test): mutmut remembers finished mutants in mutants/, so a re-run only checks what changed.
mutants: setup
	@# the simulator is not mutated: its sources run (mutants/ keeps copies of the compiled core that go stale)
	LLMCAP_SIM_PURE=1 $(PY) -m mutmut run --max-children 2; $(PY) scripts/mutants_report.py

clean-work:
	rm -rf $(WORK)
