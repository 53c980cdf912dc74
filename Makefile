# Two entry points, each bootstraps .venv on a fresh machine (and the Debian tools the sandbox
# runs, skopeo and docker-registry: deploy/dev/install-tools.sh; and helm for the chart's tests:
# deploy/dev/install-helm.sh):
#   make demo   the embedded default: Temporal dev server + controlplane, pools reconciling
#   make test   ruff (lint + format), mypy, pytest
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed

.PHONY: demo test lint typecheck pytest down clean mutation properties screenshots

$(STAMP): pyproject.toml
	deploy/dev/install-tools.sh
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip
	$(BIN)/python -m pip install --quiet -e '.[dev]'
	deploy/dev/install-helm.sh $(BIN)
	touch $(STAMP)

demo: $(STAMP)
	$(BIN)/levers9 dev demo

down: $(STAMP)
	$(BIN)/levers9 dev down

lint: $(STAMP)
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .
	$(BIN)/lint-imports --no-cache

typecheck: $(STAMP)
	$(BIN)/mypy .

# Three processes on two cores: the suite mostly waits (timers, servers, polling), and a module
# keeps its fixtures in one process (--dist loadscope).
pytest: $(STAMP)
	$(BIN)/pytest -n 3 --dist loadscope --durations=30

test: lint typecheck pytest

# Not part of `make test`: the mutation check (mutmut over capacity, placement, task_records and
# PoolWorkflow; about 17 minutes on 2 cores) and the property tests drawn at length.
mutation: $(STAMP)
	$(BIN)/python benchmarks/mutation.py

properties: $(STAMP)
	$(BIN)/python benchmarks/properties.py

# The dashboard's pages as docs/dashboard.md shows them: its browser tests, saving each page.
screenshots: $(STAMP)
	mkdir -p docs/dashboard
	LEVERS9_SCREENSHOTS=docs/dashboard $(BIN)/pytest -n 0 -p no:cacheprovider tests/dashboard

clean:
	rm -rf $(VENV) .mypy_cache .ruff_cache .pytest_cache *.egg-info
