"""The native decoder stack (engine/models/native_stack.py) gives bitwise the per-op forward's
logits and KV cache: prefill, chunked prefill, decode, several requests in one batch, tree masks;
float32 and int8 activations; Llama and Qwen2 (attention biases); a self-draft's first layers."""

from __future__ import annotations

import gguf
import pytest
import torch

from engine.models.llama import LlamaForCausalLM
from engine.models.loader import load_model
from engine.models.native_stack import NativeStack
from kernels.cpu.paged_attention import CpuPagedBackend
from kernels.reference import ReferenceBackend
from tests import kquants
from tests.engine.models.test_gguf_loader import write_gguf

Q = gguf.GGMLQuantizationType


@pytest.fixture(autouse=True)
def needs_native():
    from kernels.cpu import native_available

    if not native_available():
        pytest.skip("the native CPU kernels are unavailable here (see the logged warning)")


def load_pair(path, weights):
    """The same file loaded twice: per-op forward and native stack, each with its own cache."""
    models = []
    for native in (False, True):
        model, _ = load_model(path, torch.float32, "cpu", CpuPagedBackend(), weights=weights)
        model.native_stack_enabled = native
        models.append(model)
    return models


def tree_mask() -> torch.Tensor:
    # root, two children of the root, a grandchild under the first child
    parents = [-1, 0, 0, 1]
    mask = torch.eye(4, dtype=torch.bool)
    for node, parent in enumerate(parents):
        while parent >= 0:
            mask[node, parent] = True
            parent = parents[parent]
    return mask


SCHEDULE = [
    ({"a": list(range(3, 14))}, None),  # prefill
    ({"a": [20], "b": list(range(30, 37))}, None),  # decode + a new prefill
    ({"a": [21, 22, 23], "b": [40, 41]}, None),  # a verify chain + a chunk
    ({"a": [24, 25, 26, 27], "b": [42]}, {"a": tree_mask()}),  # a tree + a decode
    ({"b": [43]}, None),
]


def run_schedule(model, models_helpers, num_layers=None):
    driver = models_helpers.PagedDriver(model, num_blocks=32, block_size=4)
    if num_layers is not None:  # a self-draft: only the first layers, then the final norm
        forward = model.forward
        model.forward = lambda ids, pos: forward(ids, pos, num_layers=num_layers)
    return [driver.step(chunks, masks) for chunks, masks in SCHEDULE]


def assert_bitwise_same(per_op, native, models_helpers, num_layers=None):
    assert native.native_stack() is not None and per_op.native_stack() is None
    want = run_schedule(per_op, models_helpers, num_layers)
    got = run_schedule(native, models_helpers, num_layers)
    for step, (expected, actual) in enumerate(zip(want, got, strict=True)):
        for rid in expected:
            assert torch.equal(expected[rid], actual[rid]), (step, rid)
    for layer, (a, b) in enumerate(zip(per_op.backend.kv_caches, native.backend.kv_caches)):
        assert torch.equal(a, b), layer


@pytest.mark.parametrize("weights", ["gguf", "gguf-f32", "gguf-int8"])
@pytest.mark.parametrize("qtype", [Q.Q4_1, Q.Q8_0], ids=lambda q: q.name)
def test_native_stack_is_bitwise_the_per_op_forward(tmp_path, models_helpers, weights, qtype):
    hf_dir, _ = models_helpers.build_hf_model(tmp_path / "hf", tie_word_embeddings=True)
    per_op, native = load_pair(write_gguf(tmp_path / "m.gguf", hf_dir, qtype=qtype), weights)
    assert_bitwise_same(per_op, native, models_helpers)


def kquant_model(tmp_path, models_helpers):
    """A model in llama.cpp's Q4_K_M mix (Q4_K and Q6_K blocks), head untied."""
    hf_dir, _ = models_helpers.build_hf_model(tmp_path / "hf", **models_helpers.KQUANT_DIMS)
    return write_gguf(tmp_path / "k.gguf", hf_dir, qtype=kquants.q4_k_m)


@pytest.mark.parametrize("weights", ["gguf", "gguf-f32"])
def test_native_stack_runs_k_quants_bitwise_the_per_op_forward(tmp_path, models_helpers, weights):
    per_op, native = load_pair(kquant_model(tmp_path, models_helpers), weights)
    formats = {run.type_name for run in native.layers[0].mlp.down_proj.runs}
    formats |= {run.type_name for run in native.layers[0].self_attn.qkv_proj.runs}
    assert formats == {"Q4_K", "Q6_K"}
    assert_bitwise_same(per_op, native, models_helpers)


def test_native_stack_with_attention_biases(tmp_path, models_helpers):
    hf_dir, _ = models_helpers.build_hf_model(tmp_path / "hf", model_type="qwen2")
    path = write_gguf(tmp_path / "q.gguf", hf_dir, qtype=Q.Q8_0, arch="qwen2")
    per_op, native = load_pair(path, "gguf")
    assert per_op.layers[0].self_attn.qkv_proj.bias is not None
    assert_bitwise_same(per_op, native, models_helpers)


def test_native_stack_with_sliding_windows_and_fused_projections(tmp_path, models_helpers):
    """Phi-3 (window 6 on every layer, fused qkv and gate|up): SCHEDULE runs past the window."""
    hf_dir, _ = models_helpers.build_hf_model(tmp_path / "hf", model_type="phi3")
    path = write_gguf(tmp_path / "p.gguf", hf_dir, qtype=Q.Q8_0, arch="phi3")
    per_op, native = load_pair(path, "gguf")
    assert per_op.config.layer_windows == (6, 6)
    assert_bitwise_same(per_op, native, models_helpers)


@pytest.mark.parametrize("weights", ["gguf", "gguf-f32"])
@pytest.mark.parametrize("model_type, arch", [("qwen3", "qwen3"), ("gemma3_text", "gemma3")])
def test_native_stack_runs_qk_norm_and_gemma_bitwise(
    tmp_path, models_helpers, model_type, arch, weights
):
    """QK-norm (Qwen3); Gemma's sandwich norms, GeGLU, scaled embeddings, a sliding layer with its
    own RoPE table beside a global one: the stack gives the per-op forward's bytes."""
    hf_dir, _ = models_helpers.build_hf_model(tmp_path / "hf", model_type=model_type)
    path = write_gguf(tmp_path / "m.gguf", hf_dir, qtype=Q.Q8_0, arch=arch)
    per_op, native = load_pair(path, weights)
    assert native.config.qk_norm
    assert_bitwise_same(per_op, native, models_helpers)


def test_native_stack_runs_a_self_drafts_first_layers(tmp_path, models_helpers):
    hf_dir, _ = models_helpers.build_hf_model(tmp_path / "hf", tie_word_embeddings=True)
    per_op, native = load_pair(write_gguf(tmp_path / "m.gguf", hf_dir, qtype=Q.Q4_0), "gguf")
    assert_bitwise_same(per_op, native, models_helpers, num_layers=1)


def test_native_stack_follows_the_activation_setting(tmp_path, models_helpers):
    from engine.models.linear import set_activations

    hf_dir, _ = models_helpers.build_hf_model(tmp_path / "hf", tie_word_embeddings=True)
    _, native = load_pair(write_gguf(tmp_path / "m.gguf", hf_dir, qtype=Q.Q4_0), "gguf")
    assert native.native_stack().activations == "int16"
    for mode in ("int8", "float32"):
        set_activations(native, mode)
        assert native.native_stack().activations == mode


def test_where_the_native_stack_does_not_apply(tmp_path, models_helpers):
    hf_dir, _ = models_helpers.build_hf_model(tmp_path / "hf", tie_word_embeddings=True)
    path = write_gguf(tmp_path / "m.gguf", hf_dir, qtype=Q.Q4_0)
    dense, _ = load_model(path, torch.float32, "cpu", CpuPagedBackend(), weights="float32")
    assert dense.native_stack() is None  # float linears: the per-op forward
    quantized, _ = load_model(path, torch.float32, "cpu", ReferenceBackend(), weights="gguf")
    residual = torch.zeros(1, quantized.config.hidden_size)
    assert quantized.native_stack() is not None
    with torch.inference_mode():
        assert not NativeStack.runs_on(quantized.backend, residual)  # reference attention
        assert NativeStack.runs_on(CpuPagedBackend(), residual)
    assert not NativeStack.runs_on(CpuPagedBackend(), residual)  # autograd is recording
    assert LlamaForCausalLM.native_stack_enabled  # on by default


def test_the_stack_times_its_phases_without_changing_results(tmp_path, models_helpers):
    hf_dir, _ = models_helpers.build_hf_model(tmp_path / "hf", tie_word_embeddings=True)
    per_op, native = load_pair(write_gguf(tmp_path / "m.gguf", hf_dir, qtype=Q.Q4_1), "gguf")
    stack = native.native_stack()
    stack.timings = torch.zeros(len(stack.phase_names), dtype=torch.float64)
    assert_bitwise_same(per_op, native, models_helpers)
    assert stack.phase_names[:2] == ["norms", "qkv"] and "attention" in stack.phase_names
    assert (stack.timings >= 0).all() and stack.timings.sum() > 0
    stack.timings = torch.zeros(3, dtype=torch.float64)
    with pytest.raises(RuntimeError, match="timings"), torch.inference_mode():
        native(torch.tensor([1]), torch.tensor([0]))


def test_native_stack_on_the_avx2_kernels(tmp_path, models_helpers, monkeypatch):
    """float32 activations without the AVX-512 tiles (CPUs that lack them): the stack runs the
    blocks on the AVX2 kernels, still bitwise the per-op forward."""
    import engine.models.linear as linear_module

    monkeypatch.setattr(linear_module, "float_tiles_run", lambda weight, rows=None: False)
    hf_dir, _ = models_helpers.build_hf_model(tmp_path / "hf", tie_word_embeddings=True)
    path = write_gguf(tmp_path / "m.gguf", hf_dir, qtype=Q.Q4_1)
    per_op, native = load_pair(path, "gguf-f32")
    layer = native.layers[0].mlp.down_proj
    assert [layer.tiles_of(run) for run in layer.runs] == [None]
    assert_bitwise_same(per_op, native, models_helpers)


@pytest.mark.parametrize("weights", ["gguf", "gguf-int8"])
def test_integer_activations_give_the_same_bytes_on_every_isa(tmp_path, models_helpers, weights):
    """The integer paths compute the same bytes on AVX-512, AVX2 and scalar (kernels/cpu): a
    whole model capped to each ISA gives bitwise the same hidden states and KV cache."""
    from kernels.cpu import ISA, set_linear_isa_cap

    path = kquant_model(tmp_path, models_helpers)
    reference, _ = load_pair(path, weights)
    want = run_schedule(reference, models_helpers, None)
    try:
        for isa in ("avx2", "scalar"):
            set_linear_isa_cap(ISA[isa])
            _, native = load_pair(path, weights)
            got = run_schedule(native, models_helpers, None)
            for step, (expected, actual) in enumerate(zip(want, got, strict=True)):
                for rid in expected:
                    assert torch.equal(expected[rid], actual[rid]), (isa, step, rid)
    finally:
        set_linear_isa_cap(ISA["auto"])
