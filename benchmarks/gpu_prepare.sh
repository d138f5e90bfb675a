#!/usr/bin/env bash
# Prepare, on the CPU machine, what benchmarks/gpu_session.sh carries to the GPU machine
# (everything under .gpu/, which git ignores: add `/.gpu/` to .git/info/exclude):
#   .gpu/site.tgz       FlashInfer 0.6.18.post1 without its JIT sources (cutlass, cccl, include),
#                       with the attention kernels we use compiled ahead for sm_90a (H100/H200)
#                       in flashinfer/data/aot, plus apache-tvm-ffi (cp312) and gguf; ~13 MB
#   .gpu/m.part1/.part2 SmolLM2-135M-Instruct.Q4_1.gguf cut in two (98 MB; 64 MiB per call)
#   .gpu/data           the shared workloads (../shared/data)
# The kernels compile with this machine's nvcc (CUDA 13.0) on two cores in a few minutes; the
# build needs no GPU (FLASHINFER_CUDA_ARCH_LIST) and links against a stub libcuda.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=.venv/bin/python
WORK="${GPU_PREPARE_DIR:-/tmp/gpu_prepare}"
FI=flashinfer-python==0.6.18.post1
FFI=apache-tvm-ffi==0.1.15.post2
mkdir -p .gpu "$WORK"

# 1. Wheels: cp312 for the GPU machine, and the local Python's tvm-ffi to run the generator here.
$PY -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
    --platform manylinux_2_28_x86_64 -d "$WORK/whl312" "$FI" "$FFI" gguf==0.19.0
$PY -m pip download -q --no-deps --only-binary=:all: -d "$WORK/whl_local" "$FFI"
$PY -m pip install -q --no-deps --target "$WORK/local" "$WORK"/whl312/flashinfer*.whl \
    "$WORK"/whl_local/*.whl
$PY -m pip install -q --target "$WORK/local_deps" nvidia-ml-py einops tabulate cuda-python

# 2. The attention modules (batch prefill, fa2; the tensor-core decode uses them too), per
#    (dtype, head_dim) that the engine and the GPU tests run, and the bit-packing module.
mkdir -p "$WORK/stub"
echo "" >"$WORK/stub/s.c" && gcc -shared -Wl,-soname,libcuda.so.1 -o "$WORK/stub/libcuda.so" "$WORK/stub/s.c"
export PYTHONPATH="$WORK/local:$WORK/local_deps" FLASHINFER_CUDA_ARCH_LIST=9.0 \
    CUDA_HOME="${CUDA_HOME:-/usr/local/cuda}" MAX_JOBS=2 \
    FLASHINFER_WORKSPACE_BASE="${FLASHINFER_WORKSPACE_BASE:-$WORK/ws}" \
    FLASHINFER_EXTRA_LDFLAGS="-L$WORK/stub"
$PY - <<'EOF'
import torch
from flashinfer.jit.attention.modules import gen_batch_prefill_module

for dtype, head_dim in ((torch.bfloat16, 64), (torch.bfloat16, 128), (torch.float16, 64)):
    spec = gen_batch_prefill_module(
        "fa2", dtype, dtype, dtype, torch.int32, head_dim, head_dim, 0, False, False, False
    )
    if not spec.is_compiled:
        spec.build()
    print("built", spec.get_library_path())
from flashinfer.jit.quantization import gen_quantization_module

spec = gen_quantization_module()  # segment_packbits: the prefill plan packs tree masks with it
if not spec.is_compiled:
    spec.build()
print("built", spec.get_library_path())
EOF
unset PYTHONPATH

# 3. The slim site.
SITE="$WORK/site"
rm -rf "$SITE" && mkdir -p "$SITE"
for wheel in "$WORK"/whl312/*.whl; do (cd "$SITE" && unzip -q -o "$wheel"); done
rm -rf "$SITE"/flashinfer/data/{cutlass,cccl,include,spdlog}  # csrc stays: specs read its templates
AOT="$SITE/flashinfer/data/aot"
for lib in "$FLASHINFER_WORKSPACE_BASE"/.cache/flashinfer/*/90a/cached_ops/*/*.so; do
    name=$(basename "$lib" .so)
    mkdir -p "$AOT/$name" && cp "$lib" "$AOT/$name/"
done
tar czf .gpu/site.tgz -C "$SITE" .

# 4. The model in two halves, and the workloads.
GGUF=$(find .venv -name "SmolLM2-135M-Instruct.Q4_1.gguf" | head -1)
head -c 48000000 "$GGUF" >.gpu/m.part1
tail -c +48000001 "$GGUF" >.gpu/m.part2
cat .gpu/m.part1 .gpu/m.part2 | cmp - "$GGUF"
rm -rf .gpu/data && cp -r ../shared/data .gpu/data
ls -la .gpu .gpu/data
