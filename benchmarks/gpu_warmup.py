"""Build FlashInfer's JIT modules for the shapes goodspeed uses, several processes at once.

FlashInfer compiles each kernel module with nvcc at its first use (about a minute each on a
16-core GPU machine). Building them one after the other inside the tests would serialise
those minutes; this script starts one process per (dtype, head_dim) that runs a decode step, a
causal prefill step and a custom-mask (tree) step through FlashInferBackend, so nvcc runs for
all of them in parallel.

    python3 benchmarks/gpu_warmup.py [--shapes bfloat16:64,bfloat16:128,float16:64]
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import time

import torch

DEFAULT_SHAPES = "bfloat16:64,bfloat16:128,float16:64"


def warm_attention(dtype_name: str, head_dim: int) -> None:
    from kernels.attention import AttentionMetadata, KVCacheSpec
    from kernels.flashinfer_backend import FlashInferBackend

    cuda, dtype = torch.device("cuda"), getattr(torch, dtype_name)
    backend = FlashInferBackend(cuda)
    backend.allocate(KVCacheSpec(1, 8, 16, 2, head_dim, dtype, cuda))
    tree = torch.tensor([[1, 0, 0], [1, 1, 0], [1, 0, 1]], dtype=torch.bool)
    for q_len, mask in ((1, None), (3, None), (3, tree)):
        metadata = AttentionMetadata(
            query_start_loc=torch.tensor([0, q_len], dtype=torch.int32, device=cuda),
            seq_lens=torch.tensor([q_len + 5], dtype=torch.int32, device=cuda),
            block_tables=torch.tensor([[0]], dtype=torch.int32, device=cuda),
            slot_mapping=torch.arange(5, 5 + q_len, device=cuda),
            query_lens_host=(q_len,),
            seq_lens_host=(q_len + 5,),
            tree_masks=(mask.to(cuda) if mask is not None else None,),
        )
        backend.plan(metadata)
        q = torch.randn(q_len, 4, head_dim, device=cuda, dtype=dtype)
        kv = torch.randn(q_len, 2, head_dim, device=cuda, dtype=dtype)
        backend.forward(0, q, kv, kv, head_dim**-0.5)
    torch.cuda.synchronize()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--shapes", default=DEFAULT_SHAPES)
    parser.add_argument("--one", default=None, help=argparse.SUPPRESS)  # child: one job
    args = parser.parse_args()
    if args.one is not None:
        dtype_name, head_dim = args.one.split(":")
        warm_attention(dtype_name, int(head_dim))
        return
    jobs = args.shapes.split(",")
    start = time.perf_counter()
    children = {
        job: subprocess.Popen([sys.executable, __file__, "--one", job], stderr=subprocess.PIPE)
        for job in jobs
    }
    failed = 0
    for job, child in children.items():
        _, err = child.communicate()
        status = "ok" if child.returncode == 0 else f"FAILED (exit {child.returncode})"
        print(f"warm-up {job}: {status} at {time.perf_counter() - start:.0f} s", flush=True)
        if child.returncode != 0:
            failed += 1
            print(err.decode(errors="replace")[-4000:], flush=True)
    sys.exit(1 if failed else 0)


if __name__ == "__main__":
    main()
