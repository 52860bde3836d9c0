# Interlock: the two commands a new user needs are `make demo` and `make test`.
PYTHON ?= python3
VENV   := .venv
BIN    := $(VENV)/bin
STAMP  := $(VENV)/.installed

.PHONY: install test lint typecheck unit demo bench clean contracts

install: $(STAMP)

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
	$(BIN)/python -m interlock.contracts_gen

demo: install
	$(BIN)/python -m interlock.demo

bench: install
	$(BIN)/python -m bench

clean:
	rm -rf $(VENV) .pytest_cache .mypy_cache .ruff_cache .interlock
