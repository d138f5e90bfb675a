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
# at first use (about a minute per module on 16 cores); the cache lives in .bench/ (ignored),
# which survives between calls while the machine stays warm: run `tests` and `bench` as two
# calls if one would exceed the 10-minute limit.
set -uo pipefail
cd "$(dirname "$0")/.."
MODE="${1:-all}"
shift || true
OUT="${OUT:-/tmp/gpu_bench_out}"
mkdir -p "$OUT" .bench

SITE=/tmp/site
if compgen -G ".whl/*.whl" >/dev/null; then
    python3 -m pip install -q --no-index --no-deps --target "$SITE" .whl/*.whl
fi
export PYTHONPATH="$SITE:$PWD:${PYTHONPATH:-}"

# Known traps when nvcc and the CUDA runtime come from pip wheels (see /work/shared/GPU.md):
# curand.h not found, and `cannot find -lcudart` at link time.
read -r CUDA_INCLUDE CUDART_LIB < <(python3 - <<'EOF'
import glob, sys
inc = [p for s in sys.path for p in glob.glob(f"{s}/nvidia/*/include") if glob.glob(f"{p}/curand.h")]
lib = [p for s in sys.path for p in glob.glob(f"{s}/nvidia/*/lib/libcudart.so*")]
print(inc[0] if inc else "-", lib[0] if lib else "-")
EOF
)
if [ "$CUDA_INCLUDE" != "-" ]; then
    export FLASHINFER_EXTRA_CUDAFLAGS="-isystem $CUDA_INCLUDE"
fi
if [ "$CUDART_LIB" != "-" ]; then
    mkdir -p /tmp/cudart_link && ln -sf "$CUDART_LIB" /tmp/cudart_link/libcudart.so
    export FLASHINFER_EXTRA_LDFLAGS="-L/tmp/cudart_link"
fi
# FlashInfer compiles for the visible GPU's arch only (sm_90a on H100/H200) by default.
export FLASHINFER_WORKSPACE_BASE="$PWD/.bench"
export MAX_JOBS="${MAX_JOBS:-$(nproc)}"

{
    date -u
    nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv
    python3 -c 'import sys, torch; print("python", sys.version.split()[0], "torch", torch.__version__, "cuda", torch.version.cuda)'
    python3 -c 'import flashinfer; print("flashinfer", flashinfer.__version__)' 2>&1 | tail -1
    echo "FLASHINFER_EXTRA_CUDAFLAGS=${FLASHINFER_EXTRA_CUDAFLAGS:-}"
    echo "FLASHINFER_EXTRA_LDFLAGS=${FLASHINFER_EXTRA_LDFLAGS:-}"
} >"$OUT/env.txt" 2>&1
cat "$OUT/env.txt"

RC=0
if [ "$MODE" = all ] || [ "$MODE" = tests ]; then
    python3 -m pytest -q -p no:cacheprovider -m "gpu or not slow" \
        tests/kernels/test_flashinfer_gpu.py \
        tests/kernels/test_flashinfer_backend_cpu.py \
        tests/kernels/test_flashinfer_sampling_cpu.py \
        tests/kernels/test_flashinfer_metadata.py 2>&1 | tee "$OUT/gpu_tests.txt"
    RC=${PIPESTATUS[0]}
fi
if [ "$MODE" = all ] || [ "$MODE" = bench ]; then
    python3 benchmarks/gpu_bench.py --out "$OUT" "$@" 2>&1 | tee "$OUT/bench_log.txt"
    [ "${PIPESTATUS[0]}" -eq 0 ] || RC=1
fi
exit "$RC"
