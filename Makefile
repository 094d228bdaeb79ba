# Everything a fresh machine with Python 3.11+ and make needs: `make test`, `make run`.
PYTHON ?= python3
VENV   := .venv
BIN    := $(VENV)/bin
STAMP  := $(VENV)/.installed

.PHONY: test run lint typecheck unit crds proto histories e2e clean

$(STAMP): pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install --quiet --upgrade pip
	$(BIN)/pip install --quiet -e '.[test]'
	touch $(STAMP)

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

proto: $(STAMP)
	$(BIN)/python -m proto.generate

# Re-record tests/histories/ (only for an intended, drained incompatibility: see tests/test_replay.py).
histories: $(STAMP)
	rm -f tests/histories/*.json
	HOMELAB_RECORD_HISTORIES=1 $(BIN)/pytest -q tests/test_workflows.py

# kind end-to-end (docker engine, kind, kubectl; ~20 min): adoption, scale-down, scale-up from zero, power-off.
e2e: $(STAMP)
	$(BIN)/pytest -m e2e tests/e2e -v -rs --timeout 3600

run: $(STAMP)
	$(BIN)/homelab-autoscaler dev --simulate --demo

clean:
	rm -rf $(VENV)
