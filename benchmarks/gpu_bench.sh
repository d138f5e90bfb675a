#!/usr/bin/env bash
# GPU run of the FlashInfer backend: install the carried wheels, run the GPU tests, benchmark
# decode (reference vs FlashInfer vs FlashInfer + CUDA graphs) on a Llama-1B-shaped model.
#
#   bash benchmarks/gpu_bench.sh [all|tests|bench] [extra gpu_bench.py args...]
#
# Results go to $OUT (the device tool's output folder; /tmp/gpu_bench_out otherwise):
#   env.txt, gpu_tests.txt, gpu_bench.json, gpu_bench.md, bench_log.txt
#
# Wheels: the GPU image has no flashinfer. On the CPU machine, once (.whl/ is git-ignored):
#   python3 -m pip download --no-deps --only-binary=:all: --python-version 3.12 \
#     --implementation cp --platform manylinux_2_28_x86_64 -d .whl \
#     flashinfer-python==0.6.18.post1 apache-tvm-ffi==0.1.15.post2
#   (+ pytest pluggy iniconfig packaging if the image lacks pytest)
# and call the device tool with carry [".whl"]. FlashInfer JIT-compiles its kernels with nvcc
# at first use (about three minutes for all of ours on 16 cores, built in parallel by
# gpu_warmup.py); the cache lives in .bench/ (ignored) and its modules come back as
# $OUT/jit_cache.tgz: carry that as .gpu/jit_cache.tgz and later runs load them without nvcc.
# Other scripts run with the same set-up after `source benchmarks/gpu_env.sh`.
set -uo pipefail
cd "$(dirname "$0")/.."
MODE="${1:-all}"
shift || true
OUT="${OUT:-/tmp/gpu_bench_out}"
mkdir -p "$OUT" .bench

source benchmarks/gpu_env.sh

{
    date -u
    nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv
    python3 -c 'import sys, torch; print("python", sys.version.split()[0], "torch", torch.__version__, "cuda", torch.version.cuda)'
    python3 -c 'import flashinfer; print("flashinfer", flashinfer.__version__)' 2>&1 | tail -1
    echo "FLASHINFER_EXTRA_CUDAFLAGS=${FLASHINFER_EXTRA_CUDAFLAGS:-}"
    echo "FLASHINFER_EXTRA_LDFLAGS=${FLASHINFER_EXTRA_LDFLAGS:-}"
    python3 -m pip list 2>/dev/null | grep -iE '^(fastapi|uvicorn|pydantic|gguf|pytest|transformers|accelerate|tokenizers|safetensors|numpy|prometheus.client|httpx|openai) '
} >"$OUT/env.txt" 2>&1
cat "$OUT/env.txt"

RC=0
if [ "$MODE" = all ] || [ "$MODE" = tests ] || [ "$MODE" = warmup ]; then
    python3 benchmarks/gpu_warmup.py 2>&1 | tee "$OUT/warmup.txt"
    (cd .bench/.cache/flashinfer/*/*/cached_ops 2>/dev/null && tar czf "$OUT/jit_cache.tgz" */*.so) \
        && ls -la "$OUT/jit_cache.tgz"
fi
if [ "$MODE" = all ] || [ "$MODE" = tests ]; then
    timeout "${TESTS_TIMEOUT:-400}" python3 -m pytest -q -p no:cacheprovider -m "gpu or not slow" \
        tests/kernels/test_flashinfer_gpu.py tests/e2e/test_gpu_engine.py \
        tests/kernels/test_flashinfer_backend_cpu.py \
        tests/kernels/test_flashinfer_metadata.py 2>&1 | tee "$OUT/gpu_tests.txt"
    RC=${PIPESTATUS[0]}
fi
if [ "$MODE" = all ] || [ "$MODE" = bench ]; then
    timeout "${BENCH_TIMEOUT:-300}" python3 benchmarks/gpu_bench.py --out "$OUT" "$@" 2>&1 | tee "$OUT/bench_log.txt"
    [ "${PIPESTATUS[0]}" -eq 0 ] || RC=1
fi
exit "$RC"
