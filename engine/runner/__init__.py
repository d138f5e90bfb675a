"""The runner: owns the model and the paged KV cache; packs a step's inputs, runs one forward
(replayed CUDA graphs where captured) and hands the logits to the sampler (engine/sample).
Tensors start here."""
