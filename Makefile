# Interlock: the two commands a new user needs are `make demo` and `make test`.
PYTHON ?= python3
VENV   := .venv
BIN    := $(VENV)/bin
STAMP  := $(VENV)/.installed

.PHONY: install test lint typecheck unit demo bench clean contracts mutation

# The package is installed editable (its sources are the checkout), so pip writes no
# bytecode for it: compileall does, on every install (quick when nothing changed). Without
# it each command compiles the modules it imports, every time, wherever Python may not
# write __pycache__ (PYTHONDONTWRITEBYTECODE, a read-only checkout): tens of ms of CPU a command.
install: $(STAMP)
	$(BIN)/python -m compileall -q orchestrator agents >/dev/null

$(STAMP): pyproject.toml
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip
	$(BIN)/python -m pip install --quiet -e '.[dev]'
	touch $(STAMP)

lint: install
	$(BIN)/ruff check orchestrator agents tests bench
	$(BIN)/ruff format --check orchestrator agents tests bench

typecheck: install
	$(BIN)/mypy

# The suite in TEST_WORKERS processes (pytest-xdist), each taking a whole test module at a
# time (module-scoped fixtures stay shared, tests of a module keep their order), modules in
# the order collected; TEST_WORKERS=0 runs it in one process. Tests marked serial
# (timing-sensitive) run afterwards, alone; both parts always run. The serial part collects
# only the modules that say mark.serial (tests/conftest.py stops a run where a serial test's
# module does not), not the whole suite again. docs/testing.md says what it costs and why.
TEST_WORKERS ?= 2
SERIAL_MODULES = $(shell grep -rl --include='test_*.py' 'mark\.serial' tests)
unit: install
	@status=0; \
	$(BIN)/pytest -q -n $(TEST_WORKERS) --dist loadfile --no-loadscope-reorder -m 'not serial' \
		|| status=$$?; \
	$(BIN)/pytest -q -m serial $(SERIAL_MODULES) || [ $$? -eq 5 ] || status=1; \
	exit $$status

test: lint typecheck unit

contracts: install
	$(BIN)/python -m interlock.contracts

demo: install
	$(BIN)/python -m interlock.cli.demo

bench: install
	$(BIN)/python -m bench

# Mutation testing of the pure core: mutmut, one run over the chosen modules, one worker, against
# tests/core and tests/golden. Slow (tens of minutes for the engine), so not part of `make test`.
# MODULES="state expr" limits it to some modules of interlock.core.
mutation: install
	$(BIN)/python -m pip install --quiet 'mutmut==3.8.1'
	$(BIN)/python tests/mutation/run.py $(MODULES)

clean:
	rm -rf $(VENV) .pytest_cache .mypy_cache .ruff_cache .interlock .mutation
