# Two commands do all the set-up: `make demo` and `make test` create .venv on first use.
# torch==2.13.0 is installed first and exactly: a looser spec pulls a multi-GB CUDA build.

PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed
DEMO_DIR ?= demo

.PHONY: demo test lint bench clean

$(STAMP): pyproject.toml
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/pip install --quiet --upgrade pip
	$(BIN)/pip install --quiet torch==2.13.0
	$(BIN)/pip install --quiet -e '.[dev]'
	touch $(STAMP)

# Trains a VAE (or reuses the cached one) and DALL-E on the built-in shapes, then prints
# "caption fidelity: F over N images" as its last line.
demo: $(STAMP)
	$(BIN)/dalle-dist train --dalle_output_file_name $(DEMO_DIR)/dalle

lint: $(STAMP)
	$(BIN)/ruff check src tests bench

test: $(STAMP) lint
	$(BIN)/pytest -q

bench: $(STAMP)
	$(BIN)/python bench/train_step.py

clean:
	rm -rf $(VENV) $(DEMO_DIR) .pytest_cache .ruff_cache
