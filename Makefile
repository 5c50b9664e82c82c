# AstraFlow: the two commands a newcomer needs are `make demo` and `make test`.
VENV ?= $(HOME)/.cache/astraflow/venv
PY := $(VENV)/bin/python
RECIPE ?= recipes/arithmetic.yaml

.DEFAULT_GOAL := help
.PHONY: help install demo test test-fast lint format bench chaos

help: ## Show this help
	@grep -E '^[a-z-]+:.*## ' $(MAKEFILE_LIST) | awk -F':.*## ' '{printf "  make %-10s %s\n", $$1, $$2}'

install: ## Install Python deps (venv outside the clone), Java/Maven/kcat if missing, Kafka jars
	@scripts/bootstrap.sh >/dev/null

demo: install ## Train the default recipe end to end on the local broker
	@scripts/demo.sh $(RECIPE)

test: ## Run the whole test suite against a throw-away Kafka broker
	@scripts/test.sh

test-fast: install ## Only the tests that need no broker
	@PYTHONPATH=. $(PY) -m pytest -m "not broker and not e2e" -q

lint: install ## ruff (rules and format) and mypy
	@$(VENV)/bin/ruff check astraflow workers streams trainer tests bench examples
	@$(VENV)/bin/ruff format --check astraflow workers streams trainer tests bench examples
	@$(VENV)/bin/mypy astraflow

format: install ## Format with ruff
	@$(VENV)/bin/ruff format astraflow workers streams trainer tests bench examples

bench: install ## Run the benchmarks in bench/
	@PYTHONPATH=. $(PY) -m bench.run_all

chaos: install ## Long fault injection: 10 SIGKILLs per component, supervisor and 2 broker restarts (~8 min)
	@PYTHONPATH=. nice -n 10 $(PY) -m bench.chaos
