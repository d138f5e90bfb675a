"""No valid SamplingParams can break the sampler (issue 16): the edge values that used to make
NaN probabilities or overflow, then a property test over any values a client can send: each
is refused with a ValueError naming its field, or samples a valid token without changing the
distribution of the row batched beside it."""

from __future__ import annotations

import os
import re

import torch
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from engine.request import Request, check_token_ids
from engine.sample.batch_verify import sampling_row
from engine.sample.rng import race_keys
from engine.sample.sampler import Sampler, SamplingRow
from engine.sampling_params import SamplingParams
from tests.strategies import sampling_kwargs

SAMPLER = Sampler()
VOCAB = 64
FIELDS = {f for f in SamplingParams.__dataclass_fields__}
EXAMPLES = int(os.environ.get("GOODSPEED_FUZZ_EXAMPLES", "300"))
LOGITS = torch.randn(2, VOCAB, generator=torch.Generator().manual_seed(0)) * 5


def probs_of(logits: torch.Tensor, **params) -> torch.Tensor:
    return SAMPLER.process(logits, [SamplingRow(SamplingParams(**params))] * len(logits))


def test_a_tiny_temperature_is_greedy_not_nan():
    probs = probs_of(LOGITS, temperature=1e-50)
    assert torch.equal(probs.argmax(-1), LOGITS.argmax(-1))
    assert torch.equal(probs.sum(-1), torch.ones(2))
    assert SamplingParams(temperature=1e-5).greedy is False


def test_top_k_beyond_the_vocabulary_keeps_every_token():
    clamped, off = probs_of(LOGITS, top_k=2**31 - 1), probs_of(LOGITS, top_k=0)
    assert bool((clamped > 0).all()) and torch.allclose(clamped, off, rtol=1e-6, atol=0)


def test_a_top_p_that_rounds_to_zero_keeps_the_best_token():
    probs = probs_of(LOGITS, top_p=1e-300)
    assert torch.equal(probs.argmax(-1), LOGITS.argmax(-1)) and bool((probs.amax(-1) == 1).all())


def test_the_smallest_repetition_penalty_stays_finite():
    row = SamplingRow(
        SamplingParams(repetition_penalty=0.01, temperature=1e-5, logit_bias={3: 100}),
        prompt_token_ids=list(range(VOCAB)),
    )
    probs = SAMPLER.process(LOGITS[:1] * 1e3, [row])
    assert bool(SAMPLER.valid_rows(LOGITS[:1], probs).all())


def test_valid_rows_flags_non_finite_rows_greedy_or_not():
    logits = LOGITS.repeat(2, 1)
    logits[1, 5] = torch.nan
    logits[2, 7] = torch.inf
    rows = [SamplingRow(SamplingParams(temperature=t)) for t in (0, 0, 1, 1)]
    valid = SAMPLER.valid_rows(logits, SAMPLER.process(logits, rows))
    assert valid.tolist() == [True, False, False, True]


def test_range_errors_name_the_field():
    for kwargs, field in [
        (dict(top_k=2**63 - 1), "top_k"),
        (dict(stop_token_ids=[10**20]), "stop_token_ids"),
        (dict(logit_bias={"²": 1}), "logit_bias"),
        (dict(seed=2**64), "seed"),
        (dict(repetition_penalty=1e-300), "repetition_penalty"),
        (dict(stop=None), "stop"),
    ]:
        try:
            SamplingParams(**kwargs)
        except ValueError as exc:
            assert str(exc).startswith(field), exc
        else:
            raise AssertionError(f"{kwargs} was accepted")


ISSUE_POISON = [  # the values of issue 16, always tried first
    {"temperature": 1e-50},
    {"temperature": 1e-30, "top_p": 1e-300, "logit_bias": {5: 100.0}},
    {"top_k": 10**20},
    {"top_k": 2**63 - 1},
    {"stop_token_ids": [10**20]},
    {"logit_bias": {"²": 1}},
    {"repetition_penalty": 5e-324, "temperature": 1e-5},
]
token_lists = st.lists(st.integers(0, VOCAB - 1), min_size=1, max_size=6)


def _with_examples(test):
    for kwargs in ISSUE_POISON:
        test = example(kwargs=kwargs, scale=30.0, prompt=[3, 4], output=[5])(test)
    return test


@settings(max_examples=EXAMPLES, deadline=None, suppress_health_check=list(HealthCheck))
@given(
    kwargs=sampling_kwargs(),
    scale=st.sampled_from([1e-3, 1.0, 30.0, 1e4]),
    prompt=token_lists,
    output=token_lists,
)
@_with_examples
def test_any_values_are_refused_by_name_or_sample_a_valid_token(kwargs, scale, prompt, output):
    try:
        params = SamplingParams(**kwargs)
        check_token_ids(params, VOCAB)
    except ValueError as exc:  # the server's 400: from_value_error names the first word
        assert re.match(r"[a-z_]+", str(exc)).group(0) in FIELDS, exc
        return
    request = Request("fuzz", prompt, params, eos_token_ids=(2,), seed=params.seed)
    request.output_token_ids = output
    neighbour = SamplingRow(SamplingParams(temperature=0.8, top_p=0.9))
    logits = LOGITS * scale
    probs = SAMPLER.process(logits, [sampling_row(request), neighbour])
    assert SAMPLER.valid_rows(logits, probs).tolist() == [True, True]
    assert torch.equal(probs[1], SAMPLER.process(logits[1:], [neighbour])[0])
    u = torch.from_numpy(race_keys([params.seed or 0, 1], [7, 7]))
    token = SAMPLER.sample(probs, u).tolist()
    assert 0 <= token[0] < VOCAB and probs[0, token[0]] > 0
