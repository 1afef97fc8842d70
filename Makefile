# CrossAudit — `make help` lists the targets. Every target creates .venv on first use.
SHELL := /bin/bash
PYTHON ?= python3.11
VENV := .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed
MODELS_STAMP := $(VENV)/.models-installed
EXPORT_STAMP := $(VENV)/.export-installed
HOST ?= 127.0.0.1
PORT ?= 50051
PYTEST_ARGS ?=

.DEFAULT_GOAL := help
.PHONY: help venv lock models export-deps images image compose test-images browser postgres proto settings-docs serve run check test test-unit test-integration test-e2e test-security bench lint typecheck schema clean

help: ## List targets
	@grep -hE '^[a-zA-Z0-9_-]+:.*## ' $(MAKEFILE_LIST) | awk 'BEGIN{FS=":.*## "}{printf "  \033[36m%-18s\033[0m %s\n", $$1, $$2}'

# Every Python package comes from uv.lock (hashes for every file; docs/dependencies.md). uv itself is
# bootstrapped from tools/uv.requirements.txt (its pin and hashes, taken from the lock by `make lock`)
# with the system pip, then `uv sync --locked` makes .venv exactly the lock: nothing is resolved at
# install time, and a second set-up reuses uv's cache (seconds). The extras a target needs are added
# to those .venv already has ($(EXTRAS_FILE)), so `make serve` after `make test` keeps torch.
UV_DIR := .crossaudit/uv
UV := $(UV_DIR)/bin/uv
EXTRAS_FILE := $(VENV)/.extras
UV_ENV := UV_PYTHON_DOWNLOADS=never UV_PROJECT_ENVIRONMENT=$(VENV)
define sync
	@want=$$(printf '%s\n' $(1) $$(cat $(EXTRAS_FILE) 2>/dev/null) | sort -u); \
	echo "installing .venv exactly as uv.lock pins it (extras: $$(echo $$want))"; \
	$(UV_ENV) $(UV) sync --quiet --locked --python $(PYTHON) $$(printf -- '--extra %s ' $$want) \
		&& printf '%s\n' $$want > $(EXTRAS_FILE)
endef

$(UV): tools/uv.requirements.txt
	@rm -rf $(UV_DIR)
	$(PYTHON) -m pip --disable-pip-version-check install -q --root-user-action=ignore --require-hashes --no-deps --target $(UV_DIR) -r $<
	@touch $@

$(STAMP): pyproject.toml uv.lock $(UV)
	$(call sync,dev)
	@touch $@

venv: $(STAMP) ## Create .venv and install CrossAudit with dev tools, exactly as uv.lock says

# Serving: onnxruntime + tokenizers, no torch.
$(MODELS_STAMP): $(STAMP)
	$(call sync,dev models)
	@touch $@

models: $(MODELS_STAMP) ## Install what serving the builtin models needs (onnxruntime, tokenizers; no torch)

# Exporting Detoxify to ONNX (and the torch serving path, which tests compare against): torch and
# transformers are large (PyPI ships CUDA wheels): an explicit, cached step.
$(EXPORT_STAMP): $(MODELS_STAMP)
	$(call sync,dev models export)
	@touch $@

export-deps: $(EXPORT_STAMP) ## Install the export extra too (torch, transformers, detoxify, onnx)

# Refresh the lock to the newest versions pyproject.toml's ranges allow, then everything derived
# from it: .venv, uv's own pin, the images' hashed requirement files, the gRPC stubs (made by the
# locked grpcio-tools). Run the whole suite before committing the result (docs/dependencies.md).
lock: $(UV) ## Refresh uv.lock (newest versions within pyproject.toml's ranges) and what is derived from it
	$(UV_ENV) $(UV) lock --upgrade --python $(PYTHON)
	$(call sync,dev)
	@touch $(STAMP)
	$(PY) -m tools.lockfiles
	$(PY) -m tools.generate_protos

images: $(STAMP) ## Build the sandbox base image (locally, no registry needed) if a Docker daemon answers
	$(PY) -m sandbox.docker build-base

# The orchestrator image FROM the local base: a wheel of the working tree plus its dependencies'
# wheels, fetched by the host's pip (the docker build needs no network). Deploying it: docs/deploy.md.
image: images ## Build crossaudit/orchestrator:<content hash> (and :latest) FROM the local base image
	$(PY) -m crossaudit.service.image build

SUDO := $(if $(filter 0,$(shell id -u)),,sudo)
# The many-machines stack on this machine: both replicas sign the shared log with the evidence key
# that `crossaudit config secrets` makes (with every other missing secret file) before the first start.
SECRETS_DIR ?= deploy/secrets
compose: image ## Start deploy/compose.yaml (2 replicas + PostgreSQL): images, every missing secret file (signing key first), up -d
	$(PY) -m crossaudit.service.image build-postgres
	$(SUDO) $(VENV)/bin/crossaudit config secrets $(SECRETS_DIR) --owners
	DOCKER_GID=$$(stat -c %g /var/run/docker.sock) CROSSAUDIT_SECRETS_DIR=$(abspath $(SECRETS_DIR)) \
		docker-compose -f deploy/compose.yaml up -d

# The store contract and replica tests start a private PostgreSQL (tests/pgserver.py) from
# Debian's server binaries.
postgres: ## Install Debian's PostgreSQL server when missing (store and replica tests)
	@if ls /usr/lib/postgresql/*/bin/initdb >/dev/null 2>&1; then :; else \
		$(SUDO) apt-get update -qq && DEBIAN_FRONTEND=noninteractive $(SUDO) apt-get install -y -qq postgresql; fi

# The review console's browser tests drive Debian's headless Chromium through chromedriver
# (selenium, in the dev extra); nothing is downloaded by selenium itself.
browser: ## Install Debian's chromium and chromium-driver when missing (browser tests)
	@if command -v chromium >/dev/null && command -v chromedriver >/dev/null; then :; else \
		$(SUDO) apt-get update -qq && $(SUDO) apt-get install -y -qq chromium chromium-driver; fi

proto: $(STAMP) ## Regenerate the committed gRPC stubs (crossaudit/v1/) from protos/crossaudit/v1/*.proto
	$(PY) -m tools.generate_protos

settings-docs: $(STAMP) ## Regenerate the settings tables of docs/limits.md and docs/configuration.md from the fields
	$(PY) -m tools.generate_settings_docs

schema: $(STAMP) ## Regenerate policies/policy.schema.json
	$(VENV)/bin/crossaudit policy schema > policies/policy.schema.json

serve: $(STAMP) images ## Run the service on embedded defaults (SQLite, docker sandbox if a daemon answers)
	$(VENV)/bin/crossaudit serve --dev --retain-inputs 7d --host $(HOST) --port $(PORT)

run: serve ## Alias of serve

# Every image the tests use, built before any test runs (a build never runs inside a test's timeout):
# tagged by content, so a run where nothing changed only finds them (tests/images.py).
test-images: images ## Build every image the test suites use (content-tagged: found, not rebuilt, when unchanged)
	$(PY) -m tests.images

check: $(STAMP) ## Fast tier, no Docker, no server (about 2 min): ruff, layering contract, unit, engine cases, security
	$(VENV)/bin/ruff check .
	$(VENV)/bin/lint-imports
	$(PY) -m pytest $(XDIST) tests/unit tests/cases tests/security -m "not docker and not e2e" $(PYTEST_ARGS)

# The whole truth, on every core (pytest-xdist; a test file stays on one worker, so its module's
# server starts once). The test images build in the background while the unit tests and engine cases
# run (those need none). The Docker suites start once every image but the deployment ones (the
# orchestrator's and PostgreSQL's, the longest builds) is there; the few tests that run those
# images (marker deploy_image) come last.
XDIST ?= -n auto --maxprocesses 4 --dist loadfile
# The suites start hundreds of Python processes (servers, workers, the CLI as a user types it): with
# PYTHONDONTWRITEBYTECODE set in the caller's environment each would compile every module it imports
# from source again (a server's imports: 1.5 s of CPU instead of 0.5). The test targets cache
# bytecode, as Python does by default (__pycache__ is ignored by git).
test check test-unit test-integration test-e2e test-security bench: export PYTHONDONTWRITEBYTECODE :=
# Each tier ends with its ten slowest tests: where the suite's time goes, in every CI log.
DURATIONS ?= --durations=10
IMAGES_LOG := .crossaudit/test-images.log
CORE_READY := .crossaudit/test-images.core-ready
TIERS := tests/security tests/integration tests/e2e
test: $(EXPORT_STAMP) images browser postgres ## The whole truth: ruff, layering contract, every suite (real Docker, PostgreSQL, Chromium)
	$(VENV)/bin/ruff check .
	$(VENV)/bin/lint-imports
	@mkdir -p $(dir $(IMAGES_LOG)); rm -f $(CORE_READY); echo "building the test images in the background (log: $(IMAGES_LOG))"
	@$(PY) -m tests.images --core-ready $(CORE_READY) > $(IMAGES_LOG) 2>&1 & images=$$!; \
	$(PY) -m pytest $(XDIST) $(DURATIONS) tests/unit tests/cases $(PYTEST_ARGS); fast=$$?; \
	while [ ! -e $(CORE_READY) ] && kill -0 $$images 2>/dev/null; do sleep 1; done; \
	if [ ! -e $(CORE_READY) ]; then wait $$images; cat $(IMAGES_LOG); echo "error: the test images were not built (above)"; exit 1; fi; \
	$(PY) -m pytest $(XDIST) $(DURATIONS) $(TIERS) -m "not deploy_image" $(PYTEST_ARGS); rest=$$?; \
	if [ $$rest -eq 5 ]; then rest=0; fi; \
	wait $$images; built=$$?; cat $(IMAGES_LOG); \
	if [ $$built -ne 0 ]; then echo "error: the deployment images were not built (above)"; exit 1; fi; \
	$(PY) -m pytest $(XDIST) $(DURATIONS) $(TIERS) -m deploy_image $(PYTEST_ARGS); deploy=$$?; \
	if [ $$deploy -eq 5 ]; then deploy=0; fi; \
	if [ $$fast -ne 0 ]; then echo "error: the unit tests or engine cases failed (the first pytest run above)"; exit $$fast; fi; \
	if [ $$rest -ne 0 ]; then exit $$rest; fi; \
	exit $$deploy

test-unit: $(STAMP) ## Fast unit tests and engine cases (tests/cases)
	$(PY) -m pytest tests/unit tests/cases $(PYTEST_ARGS)

test-integration: $(EXPORT_STAMP) images test-images postgres ## Integration tests (real Docker daemon, real model loading)
	$(PY) -m pytest tests/integration $(PYTEST_ARGS)

test-e2e: $(STAMP) images browser postgres ## End-to-end tests against the real gRPC server
	$(PY) -m pytest tests/e2e $(PYTEST_ARGS)

test-security: $(STAMP) images test-images ## Hostile programs and inputs
	$(PY) -m pytest tests/security $(PYTEST_ARGS)

BENCH_STAMP := $(VENV)/.bench-installed
$(BENCH_STAMP):
	@echo "make bench installs, once: the export extra into .venv (torch, transformers, detoxify, onnx: ~3 GB from PyPI),"
	@echo "  the bench extra (matplotlib, py-spy), Debian's PostgreSQL server (make postgres), the sandbox images,"
	@echo "  and Guardrails AI from PyPI into .venv-bench/ (the peer measured beside CrossAudit)."
	@$(MAKE) --no-print-directory $(UV)
	$(call sync,dev models export bench)
	@touch $@

# Every benchmark in one run: targets printed beside their figures; docs/bench/results.json and
# results.png written (the README's figures come from them). Not tests: nothing is asserted.
bench: $(BENCH_STAMP) images postgres ## Benchmarks: side-by-side figures, targets, docs/bench/results.{json,png}
	$(PY) -m tests.bench --out docs/bench

lint: $(STAMP) ## ruff, and the layering contract (import-linter, pyproject.toml [tool.importlinter])
	$(VENV)/bin/ruff check .
	$(VENV)/bin/lint-imports

typecheck: $(STAMP) ## mypy
	$(VENV)/bin/mypy crossaudit

clean: ## Remove .venv, the bootstrapped uv and caches
	rm -rf $(VENV) $(UV_DIR) .pytest_cache .mypy_cache .ruff_cache
	find . -name __pycache__ -type d -not -path './.git/*' -prune -exec rm -rf {} +
