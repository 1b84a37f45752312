# Two commands set everything up on a fresh machine:
#   make serve   install (once) and serve the bundled all-MiniLM-L6-v2 on http://127.0.0.1:8000
#   make test    install (once) and run the whole test suite
#   make bench   the benchmark: the service over HTTP against the reference libraries in-process
PYTHON ?= python3
VENV ?= .venv
BIN := $(VENV)/bin
# Installed before anything else: an unpinned torch would resolve to a multi-GB CUDA build.
TORCH_VERSION ?= 2.13.0
HOST ?= 127.0.0.1
PORT ?= 8000
export HF_HUB_OFFLINE := 1
export TRANSFORMERS_OFFLINE := 1

.PHONY: serve test bench install clean

install: $(VENV)/.installed

$(VENV)/.installed: pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip
	$(BIN)/python -m pip install --quiet torch==$(TORCH_VERSION)
	$(BIN)/python -m pip install --quiet -e '.[dev]'
	touch $@

serve: install
	$(BIN)/uvicorn app.main:app --host $(HOST) --port $(PORT)

test: install
	$(BIN)/python -m pytest

bench: install
	$(BIN)/python -m bench.run $(BENCH_ARGS)

clean:
	rm -rf $(VENV) .pytest_cache
