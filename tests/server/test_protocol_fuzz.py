"""Property test over the request models (issue 16): any JSON body shaped by a route's own
schema, with hostile leaves, is either refused with a 4xx naming a field, or becomes
SamplingParams and prompts that the engine accepts and that sample a valid token."""

from __future__ import annotations

import json
import os

import torch
from hypothesis import HealthCheck, event, example, given, settings
from pydantic import ValidationError

from engine.request import Request, check_prompt, check_token_ids
from engine.sample.batch_verify import sampling_row
from engine.sample.rng import race_keys
from engine.sample.sampler import Sampler
from server.errors import APIError, from_validation_errors, from_value_error
from server.openapi import json_body
from server.protocol import ChatCompletionRequest, CompletionRequest
from tests.strategies import CONDITIONAL_FIELDS, hostile_bodies

VOCAB, MAX_MODEL_LEN = 64, 512
EXAMPLES = int(os.environ.get("GOODSPEED_FUZZ_EXAMPLES", "300"))
SAMPLER = Sampler()
LOGITS = torch.randn(1, VOCAB, generator=torch.Generator().manual_seed(1)) * 8
ENGINE_CHECKED = {"prompt", "max_tokens", "stop_token_ids", "logit_bias"}
FUZZ = settings(max_examples=EXAMPLES, deadline=None, suppress_health_check=list(HealthCheck))


def body_schema(model) -> dict:
    return json_body(model)["requestBody"]["content"]["application/json"]["schema"]


def assert_client_error(error: APIError, body: dict) -> None:
    event(f"refused: {error.status_code}")
    assert 400 <= error.status_code < 500, (error.message, body)
    assert error.message and set(error.body()["error"]) == {"message", "type", "param", "code"}


def refused_or_params(model, body):
    """(None, refusal) when the server would refuse `body`; (request, None) otherwise."""
    try:
        request = model.model_validate_json(json.dumps(body))
        request.check_api_rules()
        return request, None
    except ValidationError as exc:
        return None, from_validation_errors(list(exc.errors()))
    except APIError as exc:
        return None, exc


def sample_or_refuse(request, prompts: list[list[int]], body) -> None:
    try:
        params = request.sampling_params(VOCAB)
        for prompt in prompts:
            check_prompt(prompt, params.max_tokens, VOCAB, MAX_MODEL_LEN)
        check_token_ids(params, VOCAB)
    except APIError as exc:
        assert_client_error(exc, body)
        return
    except ValueError as exc:  # what ServingContext turns into a 400 naming the field
        assert from_value_error(exc).param in ENGINE_CHECKED, exc
        event("refused by the engine's checks")
        return
    row = sampling_row(Request("fuzz", prompts[0], params, eos_token_ids=(2,), seed=params.seed))
    probs = SAMPLER.process(LOGITS, [row])
    keys = torch.from_numpy(race_keys([params.seed or 0], [len(prompts[0])]))
    token = int(SAMPLER.sample(probs, keys))
    assert bool(SAMPLER.valid_rows(LOGITS, probs)[0]) and 0 <= token < VOCAB
    event("sampled")


@FUZZ
@given(body=hostile_bodies(body_schema(CompletionRequest), omit=CONDITIONAL_FIELDS))
@example(body={"prompt": [1, 2], "temperature": 1e-50})
@example(body={"prompt": [1, 2], "top_k": 10**20})
@example(body={"prompt": [1, 2], "logit_bias": {"²": 1}})
@example(body={"prompt": [1, 2], "stop_token_ids": [10**20]})
def test_completion_bodies_are_refused_or_sample(body):
    request, refusal = refused_or_params(CompletionRequest, body)
    if refusal is not None:
        return assert_client_error(refusal, body)
    try:
        prompts = request.prompt_list()
    except APIError as exc:
        return assert_client_error(exc, body)
    if not all(isinstance(p, list) for p in prompts):
        prompts = [[1, 2]]  # text: the tokenizer's business, not the sampler's
    sample_or_refuse(request, prompts, body)


@FUZZ
@given(body=hostile_bodies(body_schema(ChatCompletionRequest), omit=CONDITIONAL_FIELDS))
@example(body={"messages": [{"role": "user"}]})
@example(body={"messages": [{"role": "user", "content": "hi"}], "temperature": 5e-324})
def test_chat_bodies_are_refused_or_sample(body):
    request, refusal = refused_or_params(ChatCompletionRequest, body)
    if refusal is not None:
        return assert_client_error(refusal, body)
    sample_or_refuse(request, [[1, 2]], body)
