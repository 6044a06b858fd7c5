# ledgerstore: `make run` shows the system working, `make test` proves it. Both bootstrap a fresh machine.
VENV ?= .venv
PY := $(VENV)/bin/python
LS := $(VENV)/bin/ledgerstore
STATE ?= .ledgerstore
PYTEST_ARGS ?=

.PHONY: bootstrap run demo test lint typecheck unit sim integration faults containers bench cluster-up cluster-down docker-images docker-up docker-down clean

bootstrap:
	@scripts/bootstrap.sh

run: bootstrap
	@$(LS) cluster up --bookies 3 --state-dir $(STATE)
	@$(LS) demo --state-dir $(STATE)

lint: bootstrap
	$(VENV)/bin/ruff check .
	$(VENV)/bin/ruff format --check .
	$(VENV)/bin/lint-imports --no-cache --no-logo .importlinter

typecheck: bootstrap
	$(VENV)/bin/mypy

test: lint typecheck
	$(VENV)/bin/pytest -q -p no:cacheprovider --durations=30 tests $(PYTEST_ARGS)

unit: bootstrap
	$(VENV)/bin/pytest -q tests/unit

bench: bootstrap
	$(LS) bench bookie

docker-images: bootstrap
	scripts/docker-engine.sh
	docker/build-offline.sh

docker-up: docker-images
	$(LS) cluster up --docker

docker-down: bootstrap
	$(LS) cluster down --docker

containers: docker-images
	$(VENV)/bin/pytest -q tests/containers

sim: bootstrap
	$(VENV)/bin/pytest -q tests/sim

faults: bootstrap
	$(VENV)/bin/pytest -q tests/faults

cluster-up: bootstrap
	$(LS) cluster up --bookies 3 --state-dir $(STATE)

cluster-down: bootstrap
	$(LS) cluster down --state-dir $(STATE)

clean:
	-$(LS) cluster down --state-dir $(STATE) 2>/dev/null
	rm -rf $(STATE) .pytest_cache .mypy_cache .ruff_cache
