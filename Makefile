# The two commands of the README. Each creates .venv from nothing when it is missing.
PY ?= python3
VENV := .venv
BIN := $(VENV)/bin

.PHONY: demo test lint bench clean

$(BIN)/activate:
	$(PY) -m venv $(VENV)
	$(BIN)/pip install -q --upgrade pip

$(VENV)/.installed: pyproject.toml | $(BIN)/activate
	$(BIN)/pip install -q -e .
	touch $@

$(VENV)/.installed-test: pyproject.toml | $(BIN)/activate
	$(BIN)/pip install -q -e ".[test]"
	touch $@

demo: $(VENV)/.installed
	$(BIN)/braze demo

test: $(VENV)/.installed-test
	$(BIN)/python -m pytest -n 2 tests

lint: $(VENV)/.installed-test
	$(BIN)/ruff check braze tests bench

bench: $(VENV)/.installed
	$(BIN)/python bench/fusion_speed.py

clean:
	rm -rf $(VENV) build *.egg-info
