# Everything a fresh machine with Python 3.11+ and make needs: `make test`, `make run`.
PYTHON ?= python3
VENV   := .venv
BIN    := $(VENV)/bin
# Two installs in one venv: `make run` needs the operator and the simulated homelab only (the `sim` extra);
# `make test` adds the test toolchain (the `test` extra, which includes `sim`).
RUN_STAMP := $(VENV)/.run-installed
STAMP     := $(VENV)/.installed

FUZZ_SECONDS ?= 60

.PHONY: fuzz help test quick run system lint typecheck unit crds docs proto histories upgrade e2e e2e-real e2e-pods e2e-power power-images cluster-bins node-bins temporal-bins soak chaos bench bytecode clean

help: ## what each target does
	@awk 'BEGIN {FS = ":.*## "} /^[a-z0-9-]+:.*## / {printf "  make %-12s %s\n", $$1, $$2}' $(MAKEFILE_LIST)

$(VENV)/bin/python:
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install --quiet --upgrade pip

$(RUN_STAMP): pyproject.toml sim/pyproject.toml | $(VENV)/bin/python
	@tools/pip-install.sh $(BIN)/pip -e '.[sim]' -e ./sim
	$(MAKE) --no-print-directory bytecode
	touch $(RUN_STAMP)

$(STAMP): pyproject.toml sim/pyproject.toml | $(VENV)/bin/python
	@tools/pip-install.sh $(BIN)/pip -e '.[test]' -e ./sim
	$(MAKE) --no-print-directory bytecode
	touch $(RUN_STAMP) $(STAMP)

# Temporal's sandbox imports workflow modules afresh for every workflow it starts: with bytecode on disk that is
# a load, without it (PYTHONDONTWRITEBYTECODE, an editable install) a compile. Written explicitly, whatever the
# environment says; Python recompiles in memory any file edited since. The tests too: every pytest-xdist worker
# imports them all, and pytest's assertion rewriting of the test modules (its own bytecode, which it only reads
# under PYTHONDONTWRITEBYTECODE) was half of each worker's start.
bytecode:
	$(BIN)/python -m compileall -q api domain workflows activities kube watchers provider admission homelab_autoscaler proto sim/homelab_sim bench tests
	@test ! -x $(BIN)/pytest || env -u PYTHONDONTWRITEBYTECODE $(BIN)/pytest -q -p no:cacheprovider --collect-only >/dev/null \
		|| echo "make bytecode: pytest could not collect the tests; their bytecode is left to the first run"

lint: $(STAMP) ## ruff, formatting, and the import contract (.importlinter: the layers)
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .
	$(BIN)/lint-imports --no-cache

fuzz: $(STAMP) ## the provider's request decoding and the webhook's review handling under atheris, FUZZ_SECONDS each
	$(BIN)/python -m tests.fuzz.run $(FUZZ_SECONDS)

typecheck: $(STAMP) ## mypy
	$(BIN)/mypy

# The suite in two parts: the independent tests spread over TEST_WORKERS pytest-xdist workers (most of them wait on
# servers and processes, so more workers than cores), each handed one test at a time, the `long` ones first
# (tests/conftest.py); then the tests marked `serial` in one process (they read what the whole run did, or are
# timed against a deadline). Each part prints its ten slowest tests; both always run, and a failure in either
# fails the target. The tests marked `system` (a whole system of real processes for a minute or more: the model
# adversary, the chaos run, the bench, the Web UI in Chromium, `dev` end to end) are `make system`'s, in .ci/run.
TEST_WORKERS ?= 4
unit: $(STAMP) ## the pytest suite but the system runs: in parallel, then the serial tests (~4 min on 2 cores)
	@usage=$$(mktemp -d) && trap 'rm -rf "$$usage"' EXIT && export HOMELAB_RBAC_USAGE="$$usage" && \
	echo "$(BIN)/pytest -n $(TEST_WORKERS) -m 'not serial and not system' --durations=10" && \
	$(BIN)/pytest -n $(TEST_WORKERS) --dist load --maxschedchunk 1 -m 'not serial and not system' --durations=10; parallel=$$?; \
	echo "$(BIN)/pytest -m serial --durations=10" && \
	$(BIN)/pytest -p no:xdist -m 'serial and not system' --durations=10; serial=$$?; \
	test $$parallel -eq 0 && test $$serial -eq 0

# Whole systems of real processes, each a minute or more of the machine: not the edit loop, but CI's (.ci/run).
SYSTEM_WORKERS ?= 2
system: $(STAMP) ## the whole-system runs: model adversary, chaos, bench, Web UI, `dev` end to end (~5 min)
	$(BIN)/pytest -n $(SYSTEM_WORKERS) --dist load --maxschedchunk 1 -m system --durations=0 -rs -p no:cacheprovider

test: lint typecheck unit ## lint, typecheck and the suite (CI adds `make system` and the real tiers: .ci/run)

# The pure rules and the tables, in seconds: the loop while editing domain/, api/ or a workflow's tables.
QUICK_TESTS := tests/test_law.py tests/test_claims.py tests/test_fsm.py tests/test_history.py tests/test_group_choice.py \
	tests/test_api_models.py tests/test_hygiene.py tests/test_crds.py tests/test_proto.py tests/test_docs.py \
	tests/test_tables.py
quick: $(STAMP) ## the pure and fast tests (seconds)
	$(BIN)/pytest -q -p no:cacheprovider $(QUICK_TESTS)

crds: $(STAMP) ## regenerate the CRDs from api/v2alpha1.py
	$(BIN)/python -m api.crds

# docs/configuration.md from the resource models and the settings sections; a test fails when it is stale.
docs: $(STAMP) ## regenerate docs/configuration.md and the chart's README
	$(BIN)/python -m homelab_autoscaler.docs
	$(BIN)/python tools/chart_readme.py

proto: $(STAMP) ## regenerate the externalgrpc stubs
	$(BIN)/python -m proto.generate

# The replay corpus of this release: every story of tests/test_workflows.py and tests/test_record.py recorded as
# tests/histories/r<release>-<story>-NN.json (the release of pyproject.toml's version; TAG=... names it otherwise).
# This release's files are replaced; the previous release's stay, replayed by tests/test_replay.py until the release
# after this one (docs/upgrades.md: the supported upgrade is from the previous release).
TAG ?=
histories: $(STAMP) ## record this release's workflow histories (tests/histories/r<release>-*.json)
	@set -e; tag="$(TAG)"; tag=$${tag:-$$($(BIN)/python -m tests.releases history-tag)}; \
		rm -f tests/histories/$$tag-*.json; \
		HOMELAB_RECORD_HISTORIES=1 HOMELAB_HISTORY_TAG=$$tag $(BIN)/pytest -q -p no:cacheprovider \
			tests/test_workflows.py tests/test_record.py; \
		echo "recorded $$(ls tests/histories/$$tag-*.json | wc -l) histories as tests/histories/$$tag-*.json"

# The upgrade from the previous release (tests/upgrade/): the previous release's wheel, built from its tag (or the
# commit tests/releases.py records) into a virtualenv cached in ~/.cache/homelab-autoscaler/upgrade/, runs the operator
# with a claim in every phase; this checkout's operator takes over on the same Temporal and homelab. ~2 min, plus
# ~40 s the first time (the build). Not in `make test`: real processes in real time; CI runs it (.ci/run).
upgrade: $(STAMP) ## upgrade from the previous release with claims in every phase in flight (tests/upgrade)
	HOMELAB_UPGRADE=1 $(BIN)/pytest -v -s -rs -p no:cacheprovider tests/upgrade

# The model-based adversary for as long as asked (tests/model.py): prints every seed, the examples and the steps.
SOAK_MINUTES ?= 30
soak: $(STAMP) ## the model-based adversary for SOAK_MINUTES
	MODEL_BUDGET_SECONDS=$$(( $(SOAK_MINUTES) * 60 )) MODEL_STEPS=$${MODEL_STEPS:-60} \
		$(BIN)/pytest -q -s -p no:cacheprovider tests/test_model.py

# The chaos suite (tests/chaos.py): the roles as processes, kill -9s, API faults, a Temporal outage, Temporal's database
# wiped (each wipe timed into a running Job of a machine whose Jobs take --slow-jobs seconds); prints the table.
CHAOS_ARGS ?= --lifecycles 50 --kills 20 --outage 60 --wipes 2 --slow-jobs 150 --workers 2
chaos: $(STAMP) ## the chaos suite: real processes, kill -9s, API faults, an outage, database wipes
	$(BIN)/python -m tests.chaos $(CHAOS_ARGS)

# Issue 14's figures beside floors measured in the same run (bench/, docs/performance.md); ~5 min on 2 cores at
# these sizes. The issue's sizes: BENCH_ARGS='--p1-claims 200 --p2-slots 1000 --p3-groups 10 --p3-slots 100 --p3-calls 500'
BENCH_ARGS ?=
bench: $(STAMP) ## the four performance figures beside same-run floors (docs/performance.md)
	$(BIN)/python -m bench $(BENCH_ARGS)

# kind end-to-end (docker engine, kind, kubectl; ~20 min): adoption, scale-down, scale-up from zero, power-off.
e2e: $(STAMP) ## the kind end-to-end suite (docker, kind)
	$(BIN)/pytest -m e2e tests/e2e -v -rs --timeout 3600

# The real control plane, built from Go modules (Go >= 1.26 and the module proxy; ~12 min cold on 2 cores, seconds when cached
# in ~/.cache/homelab-autoscaler/cluster-bins/<versions>): kube-apiserver, controller-manager, scheduler, kubectl,
# etcd, KWOK, helm and promlint (promtool's metrics lint); and cluster-autoscaler, from the module proxy or else from the source tarball
# HOMELAB_CLUSTER_AUTOSCALER_SOURCE names (.ci/run finds it in ../shared). tests/realcluster/versions.env holds the
# versions and the tarball's sha256.
cluster-bins: ## build (or reuse) the real control plane's binaries and cluster-autoscaler
	tests/realcluster/build.sh

# The story on that control plane, driven by cluster-autoscaler with deploy/cluster-autoscaler's flags (the real one
# when one can be had, else the project's stand-in: the run's first line says which; HOMELAB_E2E_DRIVER=ca, as CI
# sets it, fails a run without the real one), with the RBAC audit and the emulator-versus-real diff.
# First the Helm chart against deploy/ (tests/test_chart.py) and the lint of `promtool check metrics` on the operator's
# /metrics (tests/test_metrics_lint.py): `make test` skips them until helm and promlint are built, here a missing binary
# fails.
e2e-real: $(STAMP) cluster-bins ## the whole story on a real control plane and cluster-autoscaler (~6 min)
	HOMELAB_E2E_REAL=1 $(BIN)/pytest tests/test_chart.py tests/test_metrics_lint.py -q -rs -p no:cacheprovider
	HOMELAB_E2E_REAL=1 $(BIN)/pytest -m realcluster tests/realcluster -v -s -rs -p no:cacheprovider

# The power examples against real BMCs (issue 31; root, network namespaces, runc): tests/machineroom/setup.sh installs
# Debian's ipmi_sim, runc, buildah and mmdebstrap and sushy-tools in a Python of its own; images.sh builds the examples'
# images from deploy/examples/power/images for amd64 and arm64 (cached by content; ~8 min cold, arm64 under
# emulation), each image's `image <name> <platform> <MB> MB` line; the run prints a table with each
# method's time. Two sides: the script side (test_power.py) runs each example's container under runc in the machine
# room; the claim side (test_claims_real.py) applies each example's slot to the product on the real node of
# `make e2e-pods` (so it needs that tier's binaries and packages), joined to the room's LAN. docs/power-methods.md.
power-images: ## build (or reuse) the power examples' images and the machine room's OS image
	tests/machineroom/setup.sh >/dev/null
	tests/machineroom/images.sh

e2e-power: $(STAMP) power-images cluster-bins node-bins ## every power example against its real protocol: scripts and claims
	tests/realcluster/node-packages.sh
	HOMELAB_E2E_POWER=1 $(BIN)/pytest -m machineroom tests/machineroom -v -s -rs -p no:cacheprovider

# The real node (kubelet, kube-proxy, CoreDNS, local-path-provisioner, the Pod sandbox, kube-network-policies: ~3 min
# cold alone), built from Go modules into the same cache, keyed by tests/realcluster/versions.env.
node-bins: ## build (or reuse) the real node's programs from the Go module proxy
	tests/realcluster/build-node.sh

# The bundled Temporal's programs for the stand-ins of its official images (temporal-server, temporal-sql-tool, the
# Web UI's server), built from Go modules into the same cache, keyed by tests/realcluster/versions.env (~4 min cold).
temporal-bins: ## build (or reuse) the bundled Temporal's server, SQL tool and Web UI server from Go modules
	tests/realcluster/build-temporal.sh

# The product as a user installs it, on a real node (root; Debian's containerd, runc, CNI plugins, buildah...; the
# packages are installed when missing): images built from the Dockerfile, the Helm chart installed, upgraded and
# uninstalled by helm (~2.5 min), deploy/ applied by docs/install.md's commands, the story through real Pods; the
# operator's image for amd64 and arm64 (one index), its arm64 image installed by digest under emulation and booting a
# machine through the power examples' arm64 image (power-images). docs/realcluster.md, "The real node".
e2e-pods: $(STAMP) cluster-bins node-bins temporal-bins power-images ## the product's images (amd64 and arm64), the chart and deploy/ on a real kubelet (root, ~20 min warm)
	tests/realcluster/node-packages.sh
	HOMELAB_E2E_PODS=1 $(BIN)/pytest -m realpods tests/realcluster -v -s -rs -p no:cacheprovider

run: $(RUN_STAMP) ## the operator, an embedded Temporal server and the simulated homelab, with the demo
	$(BIN)/homelab-autoscaler dev --simulate --demo

clean: ## remove the virtualenv
	rm -rf $(VENV)
