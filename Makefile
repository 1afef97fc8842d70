# CrossAudit — `make help` lists the targets. Every target creates .venv on first use.
SHELL := /bin/bash
PYTHON ?= python3.11
VENV := .venv
PY := $(VENV)/bin/python
PIP := $(PY) -m pip --disable-pip-version-check
STAMP := $(VENV)/.installed
MODELS_STAMP := $(VENV)/.models-installed
EXPORT_STAMP := $(VENV)/.export-installed
HOST ?= 127.0.0.1
PORT ?= 50051
PYTEST_ARGS ?=

.DEFAULT_GOAL := help
.PHONY: help venv models export-deps images image test-images browser postgres proto settings-docs serve run check test test-unit test-integration test-e2e test-security bench lint typecheck schema clean

help: ## List targets
	@grep -hE '^[a-zA-Z0-9_-]+:.*## ' $(MAKEFILE_LIST) | awk 'BEGIN{FS=":.*## "}{printf "  \033[36m%-18s\033[0m %s\n", $$1, $$2}'

$(STAMP): pyproject.toml
	@test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PIP) install -q --upgrade "pip>=24" "setuptools>=68" wheel
	$(PIP) install -q -e '.[dev]'
	@touch $@

venv: $(STAMP) ## Create .venv and install CrossAudit with dev tools

# Serving: onnxruntime + tokenizers, no torch.
$(MODELS_STAMP): $(STAMP)
	$(PIP) install -q -e '.[dev,models]'
	@touch $@

models: $(MODELS_STAMP) ## Install what serving the builtin models needs (onnxruntime, tokenizers; no torch)

# Exporting Detoxify to ONNX (and the torch serving path, which tests compare against): torch and
# transformers are large (PyPI ships CUDA wheels): an explicit, pip-cached step.
$(EXPORT_STAMP): $(MODELS_STAMP)
	$(PIP) install -q -e '.[dev,models,export]'
	@touch $@

export-deps: $(EXPORT_STAMP) ## Install the export extra too (torch, transformers, detoxify, onnx)

images: $(STAMP) ## Build the sandbox base image (locally, no registry needed) if a Docker daemon answers
	$(PY) -m sandbox.docker build-base

# The orchestrator image FROM the local base: a wheel of the working tree plus its dependencies'
# wheels, fetched by the host's pip (the docker build needs no network). Deploying it: docs/deploy.md.
image: images ## Build crossaudit/orchestrator:<content hash> (and :latest) FROM the local base image
	$(PY) -m crossaudit.service.image build

SUDO := $(if $(filter 0,$(shell id -u)),,sudo)
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
	$(VENV)/bin/crossaudit serve --dev --host $(HOST) --port $(PORT)

run: serve ## Alias of serve

# Every image the tests use, built before any test runs (a build never runs inside a test's timeout):
# tagged by content, so a run where nothing changed only finds them (tests/images.py).
test-images: images ## Build every image the test suites use (content-tagged: found, not rebuilt, when unchanged)
	$(PY) -m tests.images

check: $(STAMP) ## Fast tier, no Docker (a few minutes): ruff, layering contract, unit, engine cases, security
	$(VENV)/bin/ruff check .
	$(VENV)/bin/lint-imports
	$(PY) -m pytest $(XDIST) tests/unit tests/cases tests/security -m "not docker" $(PYTEST_ARGS)

# The whole truth, on every core (pytest-xdist; a test file stays on one worker, so its module's
# server starts once). The test images build in the background while the unit tests and engine cases
# run (those need none); the suites that use Docker start once the images are there.
XDIST ?= -n auto --maxprocesses 4 --dist loadfile
IMAGES_LOG := .crossaudit/test-images.log
test: $(EXPORT_STAMP) images browser postgres ## The whole truth: ruff, layering contract, every suite (real Docker, PostgreSQL, Chromium)
	$(VENV)/bin/ruff check .
	$(VENV)/bin/lint-imports
	@mkdir -p $(dir $(IMAGES_LOG)); echo "building the test images in the background (log: $(IMAGES_LOG))"
	@$(PY) -m tests.images > $(IMAGES_LOG) 2>&1 & images=$$!; \
	$(PY) -m pytest $(XDIST) tests/unit tests/cases $(PYTEST_ARGS); fast=$$?; \
	wait $$images; built=$$?; cat $(IMAGES_LOG); \
	if [ $$built -ne 0 ]; then echo "error: the test images were not built (above)"; exit 1; fi; \
	$(PY) -m pytest $(XDIST) tests/security tests/integration tests/e2e $(PYTEST_ARGS); rest=$$?; \
	if [ $$fast -ne 0 ]; then echo "error: the unit tests or engine cases failed (the first pytest run above)"; exit $$fast; fi; \
	exit $$rest

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
	@$(MAKE) --no-print-directory $(EXPORT_STAMP)
	$(PIP) install -q -e '.[dev,models,export,bench]'
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

clean: ## Remove .venv and caches
	rm -rf $(VENV) .pytest_cache .mypy_cache .ruff_cache
