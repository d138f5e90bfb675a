"""Sampling, owned by the runner: the sampler (logits -> distributions -> tokens), the
counter-based RNG, and batched lossless verification of drafts (chains and trees)."""
