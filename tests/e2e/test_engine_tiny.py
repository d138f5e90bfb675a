"""End-to-end engine behaviour on a tiny random-weight Llama (seconds, no tokenizer: token ids)."""

from __future__ import annotations

import random

import pytest
import torch

from engine.config import EngineConfig
from engine.front.llm import LLM
from engine.sampling_params import SamplingParams

GREEDY = SamplingParams(max_tokens=24, temperature=0, ignore_eos=True)


def make_llm(model_dir, **flat) -> LLM:
    base = dict(
        model=str(model_dir),
        dtype="float32",
        num_kv_blocks=256,
        block_size=16,
        max_num_batched_tokens=512,
    )
    base.update(flat)
    return LLM(config=EngineConfig.from_flat(base))


def prompts(count: int, seed: int = 0, low: int = 5, high: int = 90) -> list[list[int]]:
    rng = random.Random(seed)
    return [[rng.randrange(3, 256) for _ in range(rng.randrange(low, high))] for _ in range(count)]


def tokens(outputs) -> list[list[int]]:
    return [o.output_token_ids for o in outputs]


@pytest.fixture(scope="module")
def llm(tiny_model_dir) -> LLM:
    return make_llm(tiny_model_dir)


@pytest.fixture(scope="module")
def alone(llm) -> list[list[int]]:
    """Greedy output of each of 16 prompts run on its own: the reference for batching tests."""
    return [llm.generate(p, GREEDY, use_tqdm=False)[0].output_token_ids for p in prompts(16)]


def assert_pool_restored(llm: LLM) -> None:
    stats = llm.engine.stats()
    assert not llm.engine.has_unfinished_requests()
    assert stats.num_free_blocks == stats.num_total_blocks


def test_batch_invariance_with_small_chunks(tiny_model_dir, alone):
    small_chunks = make_llm(tiny_model_dir, max_num_batched_tokens=32)
    batched = small_chunks.generate(prompts(16), GREEDY, use_tqdm=False)
    assert tokens(batched) == alone
    assert all(len(t) == 24 for t in alone)
    assert_pool_restored(small_chunks)


def test_preemption_completes_every_request_identically(tiny_model_dir, alone):
    # 16 requests of up to ~110 tokens each need ~100 blocks; give the pool 12.
    tight = make_llm(tiny_model_dir, num_kv_blocks=12, max_num_batched_tokens=64)
    outputs = tight.generate(prompts(16), GREEDY, use_tqdm=False)
    assert tokens(outputs) == alone
    assert tight.engine.stats().num_preemptions_total > 0
    assert_pool_restored(tight)


def test_prefix_cache_computes_only_new_tokens(tiny_model_dir):
    cached = make_llm(tiny_model_dir)
    shared = prompts(1, seed=7, low=200, high=201)[0]
    first = cached.generate(shared + [10, 11, 12], GREEDY, use_tqdm=False)[0]
    before = cached.engine.stats()
    second = cached.generate(shared + [20, 21, 22, 23], GREEDY, use_tqdm=False)[0]
    after = cached.engine.stats()
    full_blocks = (len(shared) // 16) * 16
    assert second.num_cached_tokens == full_blocks
    assert after.prompt_tokens_total - before.prompt_tokens_total == len(shared) + 4 - full_blocks
    assert after.prefix_cache_hits_total - before.prefix_cache_hits_total == full_blocks
    uncached = make_llm(tiny_model_dir, enable_prefix_caching=False)
    assert (
        second.output_token_ids
        == uncached.generate(shared + [20, 21, 22, 23], GREEDY, use_tqdm=False)[0].output_token_ids
    )
    assert first.num_cached_tokens == 0


def test_seeded_sampling_is_batch_invariant(llm):
    params = SamplingParams(max_tokens=16, temperature=1.0, seed=1234, ignore_eos=True)
    target = prompts(1, seed=3)[0]
    alone_out = llm.generate(target, params, use_tqdm=False)[0].output_token_ids
    others = [
        SamplingParams(max_tokens=16, temperature=0.8, seed=i, ignore_eos=True) for i in range(5)
    ]
    batch = llm.generate([target, *prompts(5, seed=9)], [params, *others], use_tqdm=False)
    assert batch[0].output_token_ids == alone_out
    other_seed = llm.generate(
        target,
        SamplingParams(max_tokens=16, temperature=1.0, seed=99, ignore_eos=True),
        use_tqdm=False,
    )
    assert other_seed[0].output_token_ids != alone_out


def test_n_greater_than_one_shares_prompt_and_differs(llm):
    outs = llm.generate(
        prompts(1, seed=5)[0],
        SamplingParams(n=3, max_tokens=12, temperature=1.0, seed=7, ignore_eos=True),
        use_tqdm=False,
    )
    assert [o.index for o in outs] == [0, 1, 2]
    assert all(len(o.output_token_ids) == 12 for o in outs)
    assert len({tuple(o.output_token_ids) for o in outs}) > 1
    assert_pool_restored(llm)


def test_logprobs_and_prompt_logprobs(llm):
    prompt = prompts(1, seed=11)[0]
    out = llm.generate(
        prompt,
        SamplingParams(max_tokens=5, temperature=0, logprobs=3, prompt_logprobs=2, ignore_eos=True),
        use_tqdm=False,
    )[0]
    assert len(out.logprobs) == 5
    for entry, token in zip(out.logprobs, out.output_token_ids):
        assert entry.token_id == token and entry.logprob <= 0
        assert len(entry.top) == 3 and entry.top[0][1] >= entry.top[-1][1]
        assert entry.logprob == pytest.approx(entry.top[0][1], abs=1e-5)  # greedy picks the best
    assert len(out.prompt_logprobs) == len(prompt) and out.prompt_logprobs[0] is None
    assert all(e.token_id == t for e, t in zip(out.prompt_logprobs[1:], prompt[1:]))


@pytest.mark.parametrize(
    "kwargs, field",
    [
        (dict(max_tokens=-1), "max_tokens"),
        (dict(top_p=0.0), "top_p"),
        (dict(top_p=1.5), "top_p"),
        (dict(temperature=-0.1), "temperature"),
        (dict(logprobs=100), "logprobs"),
        (dict(n=0), "n"),
    ],
)
def test_invalid_sampling_params_name_the_field(kwargs, field):
    with pytest.raises(ValueError, match=field):
        SamplingParams(**kwargs)


def test_bad_requests_rejected_and_engine_keeps_serving(llm):
    engine = llm.engine
    with pytest.raises(ValueError, match="max_tokens"):
        engine.add_request("too-long", [5] * 10, SamplingParams(max_tokens=engine.max_model_len))
    with pytest.raises(ValueError, match="empty"):
        engine.add_request("empty", [], SamplingParams())
    with pytest.raises(ValueError, match="token ids"):
        engine.add_request("oov", [5, 100000], SamplingParams())
    assert not engine.has_unfinished_requests()
    assert len(llm.generate([5, 6, 7], GREEDY, use_tqdm=False)[0].output_token_ids) == 24


def test_failure_in_one_request_fails_only_that_request(llm, monkeypatch):
    verifier = llm.engine.runner.verifier
    original = verifier._accept

    def flaky(rows, *args):
        if rows.scheduled.request.sampling_params.max_tokens == 13:
            raise RuntimeError("injected fault")
        return original(rows, *args)

    monkeypatch.setattr(verifier, "_accept", flaky)
    bad = SamplingParams(max_tokens=13, temperature=0, ignore_eos=True)
    outs = llm.generate(prompts(3, seed=21), [GREEDY, bad, GREEDY], use_tqdm=False)
    assert outs[1].finish_reason == "error" and "injected fault" in outs[1].error
    assert [len(outs[0].output_token_ids), len(outs[2].output_token_ids)] == [24, 24]
    assert_pool_restored(llm)


def test_abort_frees_blocks(llm):
    engine = llm.engine
    engine.add_request("to-abort", prompts(1)[0], SamplingParams(max_tokens=50, ignore_eos=True))
    engine.step()
    engine.abort_request("to-abort")
    [output] = engine.step()
    assert output.request_id == "to-abort" and output.finished and output.finish_reason == "abort"
    assert_pool_restored(llm)


def test_steps_leave_the_global_random_generator_alone(llm):
    """The engine seeds torch's global generator once, at build: a step that reseeded it (the
    adaptive thread check once did, every step) reset the caller's random stream and cost a
    stack capture per step."""
    torch.manual_seed(99)
    torch.rand(3)
    llm.generate(prompts(2, seed=5), GREEDY, use_tqdm=False)
    after = torch.rand(3)
    torch.manual_seed(99)
    torch.rand(3)
    assert torch.equal(after, torch.rand(3))
