"""What a GPU decode step could cost at best, and the HF transformers baseline.

- hbm_bandwidth(): bytes read + written per second by a large device-to-device copy.
- graph_node_seconds(): time per kernel inside a replayed CUDA graph of tiny kernels, the
  floor any captured step pays per launch.
- count_kernels(): CUDA kernels one call launches (torch.profiler), e.g. one eager decode step.
- hf_decode_tok_s(): transformers `generate` decode throughput for a batch (greedy, KV cache):
  the time of steps + 1 new tokens minus the time of 1, so the prefill is not counted.
"""

from __future__ import annotations

import time
from collections.abc import Callable

import torch


def _median_seconds(fn: Callable[[], object], repeats: int) -> float:
    times = []
    for _ in range(repeats):
        torch.cuda.synchronize()
        start = time.perf_counter()
        fn()
        torch.cuda.synchronize()
        times.append(time.perf_counter() - start)
    return sorted(times)[len(times) // 2]


def hbm_bandwidth(num_bytes: int = 2 * 2**30, repeats: int = 10) -> float:
    """Bytes per second (read + write) of a device-to-device copy of num_bytes."""
    src = torch.empty(num_bytes, dtype=torch.uint8, device="cuda").random_(0, 255)
    dst = torch.empty_like(src)
    dst.copy_(src)
    return 2 * num_bytes / _median_seconds(lambda: dst.copy_(src), repeats)


def graph_node_seconds(num_nodes: int = 1000, repeats: int = 20) -> float:
    """Seconds per kernel of a replayed graph of num_nodes one-element kernels."""
    x = torch.zeros(1, device="cuda")
    stream = torch.cuda.Stream()
    with torch.cuda.stream(stream):
        x.add_(1)
    torch.cuda.current_stream().wait_stream(stream)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        for _ in range(num_nodes):
            x.add_(1)
    graph.replay()
    return _median_seconds(graph.replay, repeats) / num_nodes


def count_kernels(fn: Callable[..., object], args: tuple) -> int:
    """CUDA kernels launched by one call fn(*args) (after a warm-up call)."""
    from torch.profiler import ProfilerActivity, profile

    fn(*args)
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        fn(*args)
        torch.cuda.synchronize()
    return sum(
        1
        for event in prof.events()
        if event.device_type == torch.autograd.DeviceType.CUDA and "Memcpy" not in event.name
    )


def weight_bytes(model: torch.nn.Module) -> int:
    return sum(p.numel() * p.element_size() for p in model.parameters())


@torch.inference_mode()
def hf_decode_tok_s(hf_model, batch_size: int, context: int, steps: int, vocab: int) -> float:
    """Decode tokens per second of transformers' generate for batch_size prompts of `context`."""
    ids = torch.randint(3, vocab, (batch_size, context), device="cuda")
    mask = torch.ones_like(ids)
    hf_model.generation_config.eos_token_id = None  # every request runs all steps

    def generate(num_new: int):
        return hf_model.generate(
            input_ids=ids,
            attention_mask=mask,
            max_new_tokens=num_new,
            do_sample=False,
            pad_token_id=0,
        )

    generate(2)  # warm-up
    one = _median_seconds(lambda: generate(1), 3)
    full = _median_seconds(lambda: generate(steps + 1), 3)
    return batch_size * steps / max(full - one, 1e-9)


def hf_model_for(model_spec: str, dtype: torch.dtype, llama_shape: dict):
    """transformers' model on the GPU: random weights for 'llama1b', else the GGUF/HF path."""
    import transformers

    if model_spec == "llama1b":
        config = transformers.LlamaConfig(
            vocab_size=llama_shape["vocab_size"],
            hidden_size=llama_shape["hidden_size"],
            intermediate_size=llama_shape["intermediate_size"],
            num_hidden_layers=llama_shape["num_layers"],
            num_attention_heads=llama_shape["num_heads"],
            num_key_value_heads=llama_shape["num_kv_heads"],
            head_dim=llama_shape["head_dim"],
            max_position_embeddings=llama_shape["max_position_embeddings"],
            rope_theta=llama_shape["rope_theta"],
            tie_word_embeddings=True,
        )
        with torch.device("cuda"):
            model = transformers.LlamaForCausalLM(config).to(dtype)
        return model.eval()
    from pathlib import Path

    path = Path(model_spec)
    kwargs = {"gguf_file": path.name} if path.suffix == ".gguf" else {}
    directory = path.parent if path.suffix == ".gguf" else path
    model = transformers.AutoModelForCausalLM.from_pretrained(directory, dtype=dtype, **kwargs)
    return model.to("cuda").eval()
