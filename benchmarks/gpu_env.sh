# Set-up for running goodspeed on the GPU machine; source it from the repo root:
#   source benchmarks/gpu_env.sh
# Installs the carried wheels (.whl/) into /tmp/site once, loads FlashInfer modules carried in
# .gpu/jit_cache.tgz as AOT artifacts, and sets the variables FlashInfer's JIT needs.
SITE=/tmp/site
if compgen -G ".whl/*.whl" >/dev/null && [ ! -d "$SITE/flashinfer" ]; then
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

# Built modules carried in .gpu/jit_cache.tgz (an earlier run's $OUT/jit_cache.tgz) are loaded
# as FlashInfer AOT artifacts (<site>/flashinfer/data/aot/<name>/<name>.so): no nvcc build.
AOT_DIR="$SITE/flashinfer/data/aot"
if [ -f .gpu/jit_cache.tgz ] && [ -d "$SITE/flashinfer" ]; then
    mkdir -p "$AOT_DIR" && tar xzf .gpu/jit_cache.tgz -C "$AOT_DIR" && ls "$AOT_DIR"
fi
