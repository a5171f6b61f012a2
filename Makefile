# The two commands of the quickstart: `make demo` and `make test`. Both create .venv when it is missing.
PYTHON ?= python3
VENV ?= .venv
BIN := $(VENV)/bin

.PHONY: demo test lint docs walkthrough serve clean

$(BIN)/python:
	@$(PYTHON) -c 'import sys; sys.exit(0 if sys.version_info >= (3, 11) else "Tradewind needs Python 3.11 or newer; set PYTHON=python3.11")'
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip

$(VENV)/.installed: pyproject.toml | $(BIN)/python
	$(BIN)/pip install --quiet -e .
	touch $@

$(VENV)/.installed-dev: pyproject.toml | $(BIN)/python
	$(BIN)/pip install --quiet -e '.[dev]'
	touch $@ $(VENV)/.installed

demo: $(VENV)/.installed
	$(BIN)/tradewind demo

lint: $(VENV)/.installed-dev
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .
	$(BIN)/lint-imports

docs: $(VENV)/.installed-dev
	NO_MKDOCS_2_WARNING=1 $(BIN)/mkdocs build --strict --quiet

# Rewrite docs/observability-example.md from two real runs (about a minute); a test checks its structure.
walkthrough: $(VENV)/.installed-dev
	$(BIN)/python -m tradewind.tools.walkthrough --write

test: lint docs
	$(BIN)/pytest --durations=20

serve: $(VENV)/.installed
	$(BIN)/tradewind serve

clean:
	rm -rf $(VENV) site .pytest_cache .ruff_cache
