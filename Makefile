# snapanalyze — run `make help` for the targets.
PYTHON ?= python3
PIP ?= $(PYTHON) -m pip

.PHONY: help install test test-fast test-unit test-integration lint bench fixtures check-fixtures fuzz bench-fleet zoo zoo-fixtures estimate-check

help: ## Show this help
	@grep -E '^[a-z-]+:.*## ' $(MAKEFILE_LIST) | awk -F':.*## ' '{printf "  %-16s %s\n", $$1, $$2}'

install: ## Install snapanalyze with the dev tools (editable)
	$(PIP) install -e '.[dev]'

test: ## Run the test suite
	$(PYTHON) -m pytest -q

estimate-check: ## The estimate against real GPU snapshots: the cs336 programs of fixtures/real at their own shapes
	$(PYTHON) tools/estimate_check.py

test-fast: ## The suite without the tests marked slow (browser, notebooks, Dask, fuzz, bombs): for the edit loop
	$(PYTHON) -m pytest -q -m "not slow"

test-unit: ## tests/unit: one module each, on inputs built in the test or the shipped fixtures
	$(PYTHON) -m pytest -q tests/unit

test-integration: ## tests/integration: the tool as users run it (commands, report, browser, notebooks, agents, Dask, packaging)
	$(PYTHON) -m pytest -q tests/integration

fuzz: ## The loader/CLI fuzz at length (FUZZ_EXAMPLES, default 5000): every input analyses with its invariants or fails in one line
	SNAPANALYZE_FUZZ_EXAMPLES=$(or $(FUZZ_EXAMPLES),5000) $(PYTHON) -m pytest -q -s tests/integration/test_validate.py tests/integration/test_fuzz_families.py -k fuzz -p no:cacheprovider

lint: ## ruff + mypy
	$(PYTHON) -m ruff check snapanalyze tests benchmarks fixtures tools zoo examples
	$(PYTHON) -m mypy snapanalyze

bench: ## peaks/attribute vs a bare pickle.load (time and peak RSS, paired runs) on 1M-event snapshots: few segments and 250k segments
	$(PYTHON) benchmarks/run.py --events 1000000 --segments 250000
	@if $(PYTHON) -c "import transformers" 2>/dev/null; then $(PYTHON) benchmarks/estimate_7b.py; \
	else echo "bench: the 7B estimate needs transformers (the zoo extra): skipped"; fi

bench-fleet: ## Time `snapanalyze ranks` over 32 generated ranks x 100k events: --jobs 1, --jobs 2, a 2-worker Dask cluster
	$(PYTHON) benchmarks/fleet.py --ranks 32 --events 100000 --workers 2 --repeat 3

zoo: ## Capture the program zoo on the CPU into build/zoo and grade attribute against its truth (needs the zoo extra)
	$(PYTHON) -m zoo.run --out build/zoo

zoo-fixtures: ## Copy the zoo's one-program-per-family subset and its grades into fixtures/zoo (after make zoo)
	$(PYTHON) -m zoo.fixtures

fixtures: ## Regenerate the scenario, run and sweep fixtures and their expected answers
	$(PYTHON) fixtures/generate.py --out fixtures/scenarios
	$(PYTHON) fixtures/runs.py
	$(PYTHON) fixtures/sweeps.py
	$(PYTHON) fixtures/whatif.py

check-fixtures: ## Fail if the checked-in fixtures differ from what the generators make
	$(PYTHON) fixtures/generate.py --check
	$(PYTHON) fixtures/runs.py --check
	$(PYTHON) fixtures/sweeps.py --check
	$(PYTHON) fixtures/whatif.py --check
