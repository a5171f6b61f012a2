# The two commands of the quickstart: `make demo` and `make test`. Both create .venv when it is missing.
PYTHON ?= python3
VENV ?= .venv
BIN := $(VENV)/bin
# The lock: every install pins the versions CI passed with (`make lock` rebuilds it; `CONSTRAINTS=` installs without).
CONSTRAINTS ?= constraints.txt
# --no-compile: Python compiles a module when it is first imported, not all of the ~210 packages at install (CI's
# set-up: 125-134 s in one pip run with compiling, 59 s without; the first import of the trainer, torch and
# transformers then takes 9 s instead of 4, once).
PIP_INSTALL = $(BIN)/pip install --quiet --no-compile $(if $(CONSTRAINTS),--constraint $(CONSTRAINTS))
# What CI installs beside the dev extra (.ci/run), and what `make lock` freezes.
CI_EXTRAS := dev,ray,wandb,tpu
CI_PACKAGES := torch==2.13.0 transformers safetensors peft

.PHONY: demo test lint docs walkthrough serve lock clean

$(BIN)/python:
	@$(PYTHON) -c 'import sys; sys.exit(0 if sys.version_info >= (3, 11) else "Tradewind needs Python 3.11 or newer; set PYTHON=python3.11")'
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip

$(VENV)/.installed: pyproject.toml $(CONSTRAINTS) | $(BIN)/python
	$(PIP_INSTALL) -e .
	touch $@

$(VENV)/.installed-dev: pyproject.toml $(CONSTRAINTS) | $(BIN)/python
	$(PIP_INSTALL) -e '.[dev]'
	touch $@ $(VENV)/.installed

# One pip run for all of CI's packages: pip resolves once and installs once (three runs: 147 s; one: 125-134 s).
$(VENV)/.installed-ci: pyproject.toml $(CONSTRAINTS) | $(BIN)/python
	$(PIP_INSTALL) -e '.[$(CI_EXTRAS)]' $(CI_PACKAGES)
	touch $@ $(VENV)/.installed-dev $(VENV)/.installed

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

# Two processes (pytest-xdist), each test file whole in one of them (module fixtures and fixed ports stay in one
# process): on the 2-core machine 0.65 of one process's time (benchmarks.md); the 20 slowest tests are listed at the end.
# Files go out in the order tests/conftest.py gives them (the most slow tests first), not xdist's (the most tests).
test: lint docs
	$(BIN)/pytest -n 2 --dist loadfile --no-loadscope-reorder --durations=20

serve: $(VENV)/.installed
	$(BIN)/tradewind serve

# Rewrite constraints.txt: what CI installs, resolved afresh without the lock in .venv-lock, then frozen
# (its header comment kept; `+cpu` dropped from torch's version so the pin matches PyPI's wheel too).
lock:
	rm -rf .venv-lock
	$(MAKE) VENV=.venv-lock CONSTRAINTS= .venv-lock/.installed-ci
	{ awk '!/^#/ {exit} {print}' constraints.txt; \
	  .venv-lock/bin/pip freeze --exclude-editable | grep -v '^#' | sed -E 's/^([^=]+==[^+]+)\+.*/\1/'; } >constraints.txt.new
	mv constraints.txt.new constraints.txt
	rm -rf .venv-lock

clean:
	rm -rf $(VENV) .venv-lock site .pytest_cache .ruff_cache
