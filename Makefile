# Set-up and main jobs in a local virtual environment (.venv).
# CPU torch is installed first from the machine's local wheel (see DEVELOPERS.md), or pip would
# pull a multi-GB CUDA build as a dependency of stable-baselines3.
PYTHON ?= python3
VENV ?= .venv
BIN = $(VENV)/bin
STAMP = $(VENV)/.installed

.PHONY: install demo test bench clean

install: $(STAMP)

$(STAMP): pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --upgrade pip
	$(BIN)/python -m pip install torch==2.13.0
	$(BIN)/python -m pip install -e '.[dev]'
	touch $(STAMP)

demo: $(STAMP)
	$(BIN)/mooncake-gym compare

test: $(STAMP)
	$(BIN)/python -m pytest -q

bench: $(STAMP)
	$(BIN)/mooncake-gym bench

clean:
	rm -rf $(VENV) build dist *.egg-info
