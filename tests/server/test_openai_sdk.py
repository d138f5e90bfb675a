"""The official openai SDK against a real uvicorn server on the fake engine."""

from __future__ import annotations

import pytest
from openai import OpenAI

MODEL = "fake-model"
PROMPT = "Once upon a time"


@pytest.fixture(scope="module")
def client(fake_server) -> OpenAI:
    return OpenAI(base_url=fake_server.api, api_key="unused", max_retries=0, timeout=30)


def greedy_text(client: OpenAI, max_tokens: int = 12, **kwargs) -> str:
    response = client.completions.create(
        model=MODEL, prompt=PROMPT, max_tokens=max_tokens, temperature=0, **kwargs
    )
    return response.choices[0].text


def test_completion(client):
    response = client.completions.create(
        model=MODEL, prompt=PROMPT, max_tokens=7, temperature=0, extra_body={"ignore_eos": True}
    )
    choice = response.choices[0]
    assert response.object == "text_completion" and response.id.startswith("cmpl-")
    assert len(choice.text) == 7  # one character per fake token
    assert choice.finish_reason == "length"
    num_prompt = len(PROMPT) + 1  # + BOS
    assert (response.usage.prompt_tokens, response.usage.completion_tokens) == (num_prompt, 7)
    assert response.usage.total_tokens == num_prompt + 7


def test_streamed_completion_matches_non_streamed(client):
    chunks = list(
        client.completions.create(
            model=MODEL, prompt=PROMPT, max_tokens=12, temperature=0, stream=True
        )
    )
    assert "".join(c.choices[0].text for c in chunks) == greedy_text(client)
    assert chunks[-1].choices[0].finish_reason == "length"
    assert all(c.choices[0].finish_reason is None for c in chunks[:-1])


def test_n_two_choices_with_usage(client):
    response = client.completions.create(
        model=MODEL, prompt=PROMPT, max_tokens=6, n=2, seed=3, temperature=1.0
    )
    assert sorted(c.index for c in response.choices) == [0, 1]
    assert all(len(c.text) == 6 for c in response.choices)
    assert response.usage.completion_tokens == 12
    assert response.usage.prompt_tokens == len(PROMPT) + 1  # counted once, not per choice


def test_batch_of_prompts_orders_choices_by_prompt(client):
    response = client.completions.create(
        model=MODEL, prompt=["a", "bb", "ccc"], max_tokens=2, n=2, temperature=0
    )
    assert [c.index for c in response.choices] == list(range(6))
    assert response.usage.prompt_tokens == 2 + 3 + 4
    assert response.usage.completion_tokens == 12


def test_logprobs(client):
    response = client.completions.create(
        model=MODEL, prompt=PROMPT, max_tokens=5, temperature=0, logprobs=3
    )
    choice = response.choices[0]
    logprobs = choice.logprobs
    assert len(logprobs.tokens) == len(logprobs.token_logprobs) == 5
    assert "".join(logprobs.tokens) == choice.text
    assert all(len(top) == 3 for top in logprobs.top_logprobs)
    assert logprobs.text_offset == list(range(5))


def test_echo_with_zero_max_tokens_returns_prompt_logprobs(client):
    response = client.completions.create(
        model=MODEL, prompt=PROMPT, max_tokens=0, echo=True, logprobs=1
    )
    choice = response.choices[0]
    assert choice.text == PROMPT
    assert choice.logprobs.token_logprobs[0] is None
    assert len(choice.logprobs.tokens) == len(PROMPT) + 1
    assert all(isinstance(v, float) for v in choice.logprobs.token_logprobs[1:])
    assert response.usage.completion_tokens == 0


def test_stop_string_truncates_in_both_modes(client):
    full = greedy_text(client, max_tokens=16)
    stop = full[5:8]
    expected = full[: full.index(stop)]
    response = client.completions.create(
        model=MODEL, prompt=PROMPT, max_tokens=16, temperature=0, stop=[stop, "never"]
    )
    assert response.choices[0].text == expected
    assert response.choices[0].finish_reason == "stop"
    stream = client.completions.create(
        model=MODEL, prompt=PROMPT, max_tokens=16, temperature=0, stop=stop, stream=True
    )
    assert "".join(c.choices[0].text for c in stream) == expected


def test_seed_reproducibility(client):
    def sample(seed: int) -> str:
        response = client.completions.create(
            model=MODEL, prompt=PROMPT, max_tokens=16, temperature=1.0, seed=seed
        )
        return response.choices[0].text

    assert sample(42) == sample(42)
    assert sample(42) != sample(43)


def test_chat_completion(client):
    response = client.chat.completions.create(
        model=MODEL, messages=[{"role": "user", "content": "Hi"}], max_tokens=5, temperature=0
    )
    assert response.object == "chat.completion"
    message = response.choices[0].message
    assert message.role == "assistant" and len(message.content) == 5
    assert response.usage.completion_tokens == 5


def test_chat_stream_first_delta_carries_role(client):
    chunks = list(
        client.chat.completions.create(
            model=MODEL,
            messages=[
                {"role": "system", "content": "Be brief."},
                {"role": "user", "content": [{"type": "text", "text": "Hi"}]},
            ],
            max_tokens=5,
            temperature=0,
            stream=True,
            stream_options={"include_usage": True},
        )
    )
    assert chunks[0].choices[0].delta.role == "assistant"
    content = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert len(content) == 5
    assert chunks[-1].choices == [] and chunks[-1].usage.completion_tokens == 5
    assert chunks[-2].choices[0].finish_reason == "length"


def test_chat_logprobs(client):
    response = client.chat.completions.create(
        model=MODEL,
        messages=[{"role": "user", "content": "Hi"}],
        max_tokens=4,
        temperature=0,
        logprobs=True,
        top_logprobs=2,
    )
    content = response.choices[0].logprobs.content
    assert "".join(t.token for t in content) == response.choices[0].message.content
    assert all(len(t.top_logprobs) == 2 for t in content)


def test_models_list(client):
    models = client.models.list()
    assert [m.id for m in models.data] == [MODEL]
    assert client.models.retrieve(MODEL).id == MODEL
