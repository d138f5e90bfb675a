"""CUDA-side kernels of our own (Triton): kernels/gpu/triton_fused.py."""
