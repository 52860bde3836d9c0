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

unit: install
	$(BIN)/pytest -q

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
