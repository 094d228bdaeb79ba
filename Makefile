# Everything a fresh machine with Python 3.11+ and make needs: `make test`, `make run`.
PYTHON ?= python3
VENV   := .venv
BIN    := $(VENV)/bin
# Two installs in one venv: `make run` needs the operator and the simulated homelab only (the `sim` extra);
# `make test` adds the test toolchain (the `test` extra, which includes `sim`).
RUN_STAMP := $(VENV)/.run-installed
STAMP     := $(VENV)/.installed

.PHONY: test run lint typecheck unit crds docs proto histories e2e soak chaos bench bytecode clean

$(VENV)/bin/python:
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install --quiet --upgrade pip

$(RUN_STAMP): pyproject.toml sim/pyproject.toml | $(VENV)/bin/python
	$(BIN)/pip install --quiet -e '.[sim]' -e ./sim
	$(MAKE) --no-print-directory bytecode
	touch $(RUN_STAMP)

$(STAMP): pyproject.toml sim/pyproject.toml | $(VENV)/bin/python
	$(BIN)/pip install --quiet -e '.[test]' -e ./sim
	$(MAKE) --no-print-directory bytecode
	touch $(RUN_STAMP) $(STAMP)

# Temporal's sandbox imports workflow modules afresh for every workflow it starts: with bytecode on disk that is
# a load, without it (PYTHONDONTWRITEBYTECODE, an editable install) a compile. Written explicitly, whatever the
# environment says; Python recompiles in memory any file edited since.
bytecode:
	$(BIN)/python -m compileall -q api domain workflows activities kube watchers provider homelab_autoscaler proto sim/homelab_sim bench

lint: $(STAMP)
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .

typecheck: $(STAMP)
	$(BIN)/mypy

unit: $(STAMP)
	$(BIN)/pytest

test: lint typecheck unit

crds: $(STAMP)
	$(BIN)/python -m api.crds

# docs/configuration.md from the resource models and the settings sections; a test fails when it is stale.
docs: $(STAMP)
	$(BIN)/python -m homelab_autoscaler.docs

proto: $(STAMP)
	$(BIN)/python -m proto.generate

# Add a generation of recorded histories (make histories TAG=v3) when workflow code changed behind a patch:
# the older generations stay, so every version that may still be running is replayed by tests/test_replay.py.
TAG ?=
histories: $(STAMP)
	@test -n "$(TAG)" || (echo "make histories TAG=<generation>: older generations are kept"; exit 2)
	HOMELAB_RECORD_HISTORIES=1 HOMELAB_HISTORY_TAG=$(TAG) $(BIN)/pytest -q tests/test_workflows.py

# The model-based adversary for as long as asked (tests/model.py): prints every seed, the examples and the steps.
SOAK_MINUTES ?= 30
soak: $(STAMP)
	MODEL_BUDGET_SECONDS=$$(( $(SOAK_MINUTES) * 60 )) MODEL_STEPS=$${MODEL_STEPS:-60} \
		$(BIN)/pytest -q -s -p no:cacheprovider tests/test_model.py

# The chaos suite (tests/chaos.py): the roles as processes, kill -9s, API faults, a Temporal outage; prints the table.
CHAOS_ARGS ?= --lifecycles 50 --kills 20 --outage 60
chaos: $(STAMP)
	$(BIN)/python -m tests.chaos $(CHAOS_ARGS)

# Issue 14's figures beside floors measured in the same run (bench/, docs/performance.md); ~5 min on 2 cores at
# these sizes. The issue's sizes: BENCH_ARGS='--p1-claims 200 --p2-slots 1000 --p3-groups 10 --p3-slots 100 --p3-calls 500'
BENCH_ARGS ?=
bench: $(STAMP)
	$(BIN)/python -m bench $(BENCH_ARGS)

# kind end-to-end (docker engine, kind, kubectl; ~20 min): adoption, scale-down, scale-up from zero, power-off.
e2e: $(STAMP)
	$(BIN)/pytest -m e2e tests/e2e -v -rs --timeout 3600

run: $(RUN_STAMP)
	$(BIN)/homelab-autoscaler dev --simulate --demo

clean:
	rm -rf $(VENV)
